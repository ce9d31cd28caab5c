"""The user guide's generated tables, as Markdown: the checks, their inventory settings, cluster.history.

Each table is made from the declarations alone (the CHECK and Setting declarations, inventory.HISTORY_SETTINGS),
never written by hand: `preflight checks --markdown` prints the first two, and tests/docs/test_docs.py compares
all three with the blocks between their markers in docs/ (and rewrites those blocks when run as a script).
"""

from __future__ import annotations

from preflight import checks as catalogue
from preflight.inventory import HISTORY_FLAP_CHECKS, HISTORY_SETTINGS


def _cell(text: str) -> str:
    """One table cell: whitespace folded to single spaces, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float) -> str:
    return "%d" % value if value == int(value) else "%g" % value


def checks_markdown() -> str:
    """docs/checks.md's check table, from the CHECK declarations (no check's code imported)."""
    lines = ["| check | claim | why it matters | fix |", "|---|---|---|---|"]
    for name, check in catalogue.entries().items():
        lines.append("| `%s` | %s | %s | %s |" % (name, _cell(check.claim), _cell(check.why), _cell(check.fix)))
    return "\n".join(lines) + "\n"


def settings_markdown() -> str:
    """docs/inventory.md's table of the `cluster:` keys the checks read, from their Setting declarations."""
    lines = ["| `cluster:` key | value | default | read by | what it asks |", "|---|---|---|---|---|"]
    for key, setting in catalogue.settings().items():
        value = setting.kind
        if setting.kind in ("int", "number"):
            value = "%s %s-%s%s" % (setting.kind, _number(setting.low), _number(setting.high),
                                    " " + setting.unit if setting.unit else "")
        default = "(none)" if setting.default in (None, [], ()) else str(setting.default).lower()
        lines.append("| `%s` | %s | %s | %s | %s |" % (
            key, value, default, ", ".join("`%s`" % n for n in catalogue.readers(key)), _cell(setting.doc)))
    return "\n".join(lines) + "\n"


def history_markdown() -> str:
    """docs/history.md's table of the `cluster.history` keys, from inventory.HISTORY_SETTINGS (their one source)."""
    lines = ["| `cluster.history` key | default | accepted | what it is |", "|---|---|---|---|"]
    for key, (default, low, high, doc) in HISTORY_SETTINGS.items():
        unit = " seconds" if key.endswith("_s") else " days" if key.endswith("_days") else ""
        shown = "(none)" if default is None else _number(default) + unit
        lines.append("| `%s` | %s | %s-%s%s | %s |" % (key, shown, _number(low), _number(high), unit, _cell(doc)))
    lines.append("| `flap_checks` | %s | check names | checks known to flap: even their hardware faults drain only once seen in "
                 "`drain_after` runs |"
                 % ", ".join("`%s`" % n for n in HISTORY_FLAP_CHECKS))
    return "\n".join(lines) + "\n"

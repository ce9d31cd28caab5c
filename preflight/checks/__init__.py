"""The check catalogue. One module per check; each exports CHECK (a preflight.model.Check).

Standard library only at import time: these modules travel to the
nodes in the probe bundle (their probe halves run there), and the controller imports the same files
for their rule halves.

The catalogue is every module here (not starting with "_"), in the order its CHECK declares: adding a
check is adding its module (and its fixtures); tests/test_catalogue.py names what a new one forgot.

What the controller needs to know about the checks before it runs any (names and order, `needs`, phase,
whether a probe runs on the nodes, claims, settings) is read from preflight/check_index.py, a literal
written from the CHECK declarations by write_index(): `preflight --help`, `preflight node` and the
inventory's validation then import only the check modules that run (importing all of them costs the
controller 0.1-0.3 s of CPU). tests/test_catalogue.py fails when the index drifts from the
declarations and names the command that rewrites it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from preflight.model import Check, Setting

INDEX_MODULE = "preflight.check_index"


@dataclass(frozen=True)
class Entry:
    """A check's declaration without its code: what CHECK says, read from the index (no check module imported).

    probes     a probe runs on the nodes (CHECK.probe is set)
    crossnode  a cross-node test runs after the node checks (CHECK.crossnode is set)
    The other fields are CHECK's own (preflight.model.Check).
    """

    name: str
    claim: str
    why: str
    fix: str
    phase: int
    needs: Tuple[str, ...]
    action: str
    order: int
    reads: str
    takes: str
    settings: Tuple[Setting, ...]
    probes: bool
    crossnode: bool


_entries: List[Dict[str, Entry]] = []

#: Entry fields copied from CHECK as they are (the rest are derived in entry_of)
_PLAIN = ("name", "claim", "why", "fix", "phase", "action", "order", "reads", "takes")
_SETTING_FIELDS = ("key", "kind", "doc", "default", "low", "high", "unit")


def module_names() -> List[str]:
    """The check modules in this package, by file name."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(n[:-3] for n in os.listdir(here) if n.endswith(".py") and not n.startswith("_"))


def entry_of(check: Check) -> Entry:
    """The Entry a CHECK declaration makes (what write_index records)."""
    return Entry(needs=tuple(check.needs), settings=tuple(check.settings), probes=check.probe is not None,
                 crossnode=check.crossnode is not None, **{f: getattr(check, f) for f in _PLAIN})


def entries() -> Dict[str, Entry]:
    """Every check's Entry, in CHECK_NAMES order (the order the checks run and are reported), from the index."""
    if not _entries:
        index = importlib.import_module(INDEX_MODULE)
        table = {}
        for row in index.CHECKS:
            fields = dict(row)
            fields["needs"] = tuple(fields["needs"])
            fields["settings"] = tuple(Setting(**dict(zip(_SETTING_FIELDS, s))) for s in fields["settings"])
            table[fields["name"]] = Entry(**fields)
        _entries.append(table)
    return _entries[0]


def entry(name: str) -> Entry:
    """The Entry of check `name` (KeyError: no such check)."""
    return entries()[name]


def __getattr__(name: str) -> Any:
    """CHECK_NAMES: stable check names, in the order they run and are reported."""
    if name == "CHECK_NAMES":
        return tuple(entries())
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def get(name: str) -> Check:
    """The CHECK declared by module preflight.checks.<name> (imports that module alone)."""
    if name not in entries():
        raise KeyError(name)
    return importlib.import_module(__name__ + "." + name).CHECK


def catalogue() -> Dict[str, Check]:
    """Every check, in CHECK_NAMES order (imports every check module)."""
    return {name: get(name) for name in entries()}


def closure(names: Sequence[str]) -> List[str]:
    """The selected checks plus every check their rules need, in CHECK_NAMES order."""
    table = entries()
    wanted = set(names)
    todo = list(names)
    while todo:
        for dep in table[todo.pop()].needs:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [n for n in table if n in wanted]


def settings() -> Dict[str, Setting]:
    """Every inventory key a check declares ({"mtu_full_mesh": Setting, "expect.mtu": Setting, ...}), sorted.

    Two checks may read one key (xid and ib_errors: xid_window_s); they declare it alike, which
    tests/test_catalogue.py guards, and the first declaration (in CHECK_NAMES order) is the one used.
    """
    out: Dict[str, Setting] = {}
    for e in entries().values():
        for setting in e.settings:
            out.setdefault(setting.key, setting)
    return dict(sorted(out.items()))


def readers(key: str) -> List[str]:
    """The checks that declare inventory key `key`, in CHECK_NAMES order."""
    return [name for name, e in entries().items() if any(s.key == key for s in e.settings)]


# ------------------------------------------------------------------------------------------ the index


def declared() -> List[Entry]:
    """The Entries the check modules declare now (imports every module): the truth the index is written from."""
    found = [entry_of(importlib.import_module(__name__ + "." + name).CHECK) for name in module_names()]
    return sorted(found, key=lambda e: (e.order, e.name))


def index_text(found: Sequence[Entry]) -> str:
    """preflight/check_index.py's text for these Entries: one literal, diff-friendly (one field a line)."""
    lines = [
        '"""The check catalogue without its code: each CHECK declaration\'s fields, in the order the checks run.',
        "",
        "Written by preflight.checks.write_index() from the modules in preflight/checks; do not edit: after",
        "changing a CHECK declaration run `python3 -c 'import preflight.checks as c; c.write_index()'`",
        "(tests/test_catalogue.py fails while this file is stale). Settings are tuples of",
        "preflight.model.Setting's fields %s." % (_SETTING_FIELDS,),
        '"""',
        "",
        "CHECKS = (",
    ]
    for e in found:
        lines.append("    {")
        for f in _PLAIN + ("needs", "probes", "crossnode"):
            value = getattr(e, f)
            lines.append("        %r: %r," % (f, list(value) if f == "needs" else value))
        lines.append("        'settings': [")
        for s in e.settings:
            lines.append("            %r," % (tuple(getattr(s, f) for f in _SETTING_FIELDS),))
        lines.append("        ],")
        lines.append("    },")
    lines.append(")")
    return "\n".join(lines) + "\n"


def index_path() -> str:
    """Where the index lives: preflight/check_index.py (beside this package; not sent to the nodes)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "check_index.py")


def write_index() -> str:
    """Rewrite preflight/check_index.py from the check modules' declarations; returns its path."""
    path = index_path()
    with open(path, "w") as fh:
        fh.write(index_text(declared()))
    del _entries[:]
    return path

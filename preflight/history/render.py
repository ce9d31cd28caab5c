"""`preflight history` as text tables (plain columns, node-read text made printable) or one JSON document."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Dict, Iterable, List, Optional, Sequence

from preflight.common import printable
from preflight.history import queries
from preflight.history.db import History

SECTIONS = ("timeline", "flapping", "lemons", "repeats", "rates", "incidents", "actions")


def _when(ts: Optional[float]) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _days(value: Optional[float]) -> str:
    return "-" if value is None else "%.1f d" % value


def _table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[str]:
    rows = [[printable(str(c), keep_newlines=False) for c in row] for row in rows]
    if not rows:
        return ["%s: none" % title, ""]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    return [title] + [("  " + fmt % tuple(header)).rstrip()] + [("  " + fmt % tuple(r)).rstrip() for r in rows] + [""]


def gather(h: History, sections: Sequence[str], node: Optional[str], window_runs: int, limit: int) -> Dict[str, Any]:
    """The asked sections as data (the --json document)."""
    out: Dict[str, Any] = {"runs": h.conn.execute("SELECT count(*) FROM runs").fetchone()[0]}
    if "timeline" in sections and node:
        out["timeline"] = {"node": node, "runs": queries.timeline(h, node, limit)}
    if "flapping" in sections:
        out["flapping"] = queries.flapping(h, window_runs)
    if "lemons" in sections:
        out["lemons"] = queries.lemons(h)
    if "repeats" in sections:
        out["repeats"] = queries.repeat_faults(h)
    if "rates" in sections:
        out["rates"] = queries.failure_rates(h, window_runs)
    if "incidents" in sections:
        out["incidents"] = queries.incidents(h)
    if "actions" in sections:
        out["actions"] = actions(h, limit)
    return out


def actions(h: History, limit: int) -> List[Dict[str, Any]]:
    """The latest escalations, holds, drains and breaker trips, newest first."""
    sql = ("SELECT r.started_at, n.name, a.kind, a.subject, a.reason, a.shadow FROM actions a JOIN runs r ON"
           " r.id = a.run_id LEFT JOIN nodes n ON n.id = a.node_id ORDER BY r.started_at DESC, a.rowid DESC LIMIT ?")
    return [{"at": at, "node": node, "kind": kind, "subject": subject, "reason": reason, "shadow": bool(shadow)}
            for at, node, kind, subject, reason, shadow in h.conn.execute(sql, (limit,))]


def to_json(data: Dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def lines(data: Dict[str, Any]) -> List[str]:
    """The gathered sections as text tables."""
    out = ["history: %d runs" % data["runs"], ""]
    if "timeline" in data:
        rows = [(_when(r["started_at"]), r["status"], "; ".join("%s %s: %s" % (p["check"], p["status"], p["message"][:80])
                                                                for p in r["problems"]) or "-",
                 "; ".join("%s%s" % ("(shadow) " if a["shadow"] else "", a["kind"]) for a in r["actions"]) or "-")
                for r in data["timeline"]["runs"]]
        out += _table("timeline of %s (newest first)" % data["timeline"]["node"], ("run", "status", "problems", "actions"), rows)
    if "flapping" in data:
        out += _table("flapping nodes (F = failed run, oldest first)", ("node", "flips", "failed", "pattern"),
                      [(d["node"], d["flips"], "%d/%d" % (d["failed_runs"], d["runs"]), d["pattern"]) for d in data["flapping"]])
    if "lemons" in data:
        out += _table("lemons: GPU boards that keep failing (by serial, across slots and nodes)",
                      ("serial", "uuid", "failed runs", "failed in", "slots seen"),
                      [(d["serial"] or "-", d["uuid"] or "-", d["failed_runs"], ", ".join(d["failed_in"]), ", ".join(d["slots"]))
                       for d in data["lemons"]])
    if "repeats" in data:
        out += _table("repeat faults (same fault on the same part)", ("subject", "fault", "runs", "nodes", "last seen"),
                      [(d["subject"], d["fault"], d["runs"], ", ".join(d["nodes"]), _when(d["last_seen"])) for d in data["repeats"]])
    if "rates" in data:
        out += _table("failure rate per check (the last runs of --window-runs)", ("check", "node findings", "failed/errored", "rate"),
                      [(d["check"], d["findings"], d["problems"], "%.2f%%" % (100 * d["rate"])) for d in data["rates"] if d["problems"]])
    if "incidents" in data:
        fleet = data["incidents"]["fleet"]
        rate = fleet["incidents_per_1000_node_days"]
        out += ["fleet: %d incidents over %.0f node-days (%s per 1,000 node-days), %s between incidents" % (
            fleet["incidents"], fleet["node_days"], "-" if rate is None else "%.1f" % rate,
            _days(fleet["mean_days_between_incidents"])), ""]
        nodes = sorted(((n, d) for n, d in data["incidents"]["nodes"].items() if d["incidents"]),
                       key=lambda nd: (-nd[1]["incidents"], nd[0]))
        out += _table("time between incidents per node", ("node", "incidents", "mean between", "since last", "failing now"),
                      [(n, d["incidents"], _days(d["mean_days_between"]), _days(d["days_since_last"]),
                        "%d runs" % d["consecutive_failures"] if d["consecutive_failures"] else "-") for n, d in nodes])
    if "actions" in data:
        out += _table("decisions (newest first)", ("run", "node", "kind", "why"),
                      [(_when(a["at"]), a["node"] or "-", ("shadow " if a["shadow"] else "") + a["kind"], a["reason"] or "")
                       for a in data["actions"]])
    return out

"""Questions asked of the history: a node's timeline, flapping nodes, lemons, repeat faults, failure
rates, time between incidents. Each returns plain data (lists of dicts) for the table and for --json.

Words, as the answers use them:
- a node *fails* a run when its node status is fail (a finding failed or errored there);
- an *incident* is a run a node fails after a run it did not fail (or its first run): three failing
  nights in a row are one incident, fail-pass-fail is two;
- a node *flaps* when its status changes between failing and not failing; `flips` counts the changes
  within the fleet's last `window_runs` runs;
- a *lemon* is a GPU board (by serial, else UUID) the gpu check failed in `min_failures` runs or more,
  or in more than one slot (node, index): the board, not the slot, is at fault when it fails wherever
  it goes;
- *node-days*: each run of a node counts until that node's next run (its last run: the median gap
  between the fleet's runs), so nightly runs count one day each.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from preflight.history.db import NODE_NAME, NODE_RANK, PROBLEM, STATUS_NAME, History

DAY = 86400.0
FAILED = NODE_RANK["fail"]


def _node_series(h: History, node: Optional[str] = None) -> Dict[str, List[tuple]]:
    """{node: [(run id, started_at, node status), ...] oldest first}."""
    sql = ("SELECT n.name, r.id, r.started_at, nr.status FROM node_runs nr JOIN nodes n ON n.id = nr.node_id"
           " JOIN runs r ON r.id = nr.run_id")
    args: tuple = ()
    if node is not None:
        sql += " WHERE n.name = ?"
        args = (node,)
    out: Dict[str, List[tuple]] = {}
    for name, run, started, status in h.conn.execute(sql + " ORDER BY nr.node_id, r.started_at, r.id", args):
        out.setdefault(name, []).append((run, started, status))
    return out


def timeline(h: History, node: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
    """The node's runs, newest first: its status, its failing findings and the actions taken on it."""
    row = h.conn.execute("SELECT id FROM nodes WHERE name=?", (node,)).fetchone()
    if row is None:
        return []
    node_id = row[0]
    sql = ("SELECT r.id, r.started_at, nr.status, nr.facts_sha256 FROM node_runs nr JOIN runs r ON r.id = nr.run_id"
           " WHERE nr.node_id=? ORDER BY r.started_at DESC, r.id DESC")
    runs = h.conn.execute(sql + (" LIMIT %d" % int(limit) if limit else ""), (node_id,)).fetchall()
    if not runs:
        return []
    oldest = min(r[0] for r in runs)
    problems: Dict[int, List[Dict[str, Any]]] = {}
    for run, check, status, action, text, subject, fault in h.conn.execute(
            "SELECT f.run_id, c.name, f.status, f.action, m.text, f.subject, f.fault FROM findings f"
            " JOIN checks c ON c.id = f.check_id JOIN messages m ON m.id = f.message_id"
            " WHERE f.node_id=? AND f.run_id>=? AND f.status>=?", (node_id, oldest, PROBLEM)):
        problems.setdefault(run, []).append({"check": check, "status": STATUS_NAME[status], "action": action,
                                             "message": text, "subject": subject, "fault": fault})
    actions: Dict[int, List[Dict[str, Any]]] = {}
    for run, kind, subject, reason, shadow in h.conn.execute(
            "SELECT run_id, kind, subject, reason, shadow FROM actions WHERE node_id=? AND run_id>=?", (node_id, oldest)):
        actions.setdefault(run, []).append({"kind": kind, "subject": subject, "reason": reason, "shadow": bool(shadow)})
    return [{"run": run, "started_at": started, "status": NODE_NAME[status], "facts_sha256": digest,
             "problems": problems.get(run, []), "actions": actions.get(run, [])}
            for run, started, status, digest in runs]


def _recent(h: History, window_runs: int) -> Dict[str, List[bool]]:
    """{node: [failed?, ...] oldest first} over the fleet's last `window_runs` runs (the runs a node
    was not in are left out of its list): read through the node_runs index, not the whole history."""
    runs = [r[0] for r in h.conn.execute("SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT ?", (window_runs,))]
    order = {run: i for i, run in enumerate(reversed(runs))}
    marks = ",".join("?" * len(runs))
    rows: Dict[str, List[tuple]] = {}
    for name, run, status in h.conn.execute("SELECT n.name, nr.run_id, nr.status FROM node_runs nr JOIN nodes n"
                                            " ON n.id = nr.node_id WHERE nr.run_id IN (%s)" % marks, runs):
        rows.setdefault(name, []).append((order[run], status == FAILED))
    return {node: [failed for _, failed in sorted(seq)] for node, seq in rows.items()}


def flapping(h: History, window_runs: int = 30, min_flips: int = 2) -> List[Dict[str, Any]]:
    """Nodes whose failing/not-failing status changed at least `min_flips` times within the fleet's
    last `window_runs` runs, most flips first."""
    out = []
    for node, recent in _recent(h, window_runs).items():
        flips = sum(1 for a, b in zip(recent, recent[1:]) if a != b)
        if flips >= min_flips:
            out.append({"node": node, "flips": flips, "failed_runs": sum(recent), "runs": len(recent),
                        "pattern": "".join("F" if f else "." for f in recent)})
    return sorted(out, key=lambda d: (-d["flips"], d["node"]))


def flip_counts(h: History, window_runs: int = 30) -> Dict[str, int]:
    """{node: flips within the fleet's last window_runs runs} for every node in them (0 included)."""
    return {node: sum(1 for a, b in zip(recent, recent[1:]) if a != b) for node, recent in _recent(h, window_runs).items()}


def lemons(h: History, min_failures: int = 2) -> List[Dict[str, Any]]:
    """GPU boards that failed in min_failures runs or more, or in more than one slot; worst first."""
    names = dict(h.conn.execute("SELECT id, name FROM nodes"))
    failures: Dict[str, Dict[str, Any]] = {}
    for serial, uuid, node_id, idx, runs, first, last in h.conn.execute(
            "SELECT serial, uuid, node_id, idx, count(DISTINCT run_id), min(run_id), max(run_id) FROM gpu_failures"
            " GROUP BY serial, uuid, node_id, idx ORDER BY min(run_id)"):
        board = failures.setdefault(serial or uuid, {"serial": serial, "uuid": uuid, "failed_runs": 0, "failed_in": []})
        board["failed_runs"] += runs
        board["failed_in"].append("%s/%d" % (names.get(node_id, "?"), idx))
    out = []
    for key, board in failures.items():
        if board["failed_runs"] < min_failures and len(board["failed_in"]) < 2:
            continue
        slots = h.conn.execute("SELECT node_id, idx FROM gpus WHERE (serial=? AND serial!='') OR (serial='' AND uuid=?)"
                               " ORDER BY first_run", (board["serial"], board["uuid"])).fetchall()
        board["slots"] = ["%s/%d" % (names.get(n, "?"), i) for n, i in slots]
        out.append(board)
    return sorted(out, key=lambda b: (-b["failed_runs"], -len(b["slots"]), b["serial"] or b["uuid"]))


def repeat_faults(h: History, min_runs: int = 2, since: Optional[float] = None) -> List[Dict[str, Any]]:
    """Faults (check and code) seen on the same subject (GPU serial, port, node) in min_runs runs or
    more (since a Unix time, when given); most runs first."""
    names = dict(h.conn.execute("SELECT id, name FROM nodes"))
    sql = ("SELECT f.subject, f.fault, count(DISTINCT f.run_id), group_concat(DISTINCT f.node_id), max(r.started_at)"
           " FROM findings f JOIN runs r ON r.id = f.run_id WHERE f.subject IS NOT NULL")
    args: tuple = ()
    if since is not None:
        sql += " AND r.started_at >= ?"
        args = (since,)
    out = []
    for subject, fault, runs, nodes, last in h.conn.execute(sql + " GROUP BY f.subject, f.fault HAVING count(DISTINCT f.run_id) >= ?",
                                                             args + (min_runs,)):
        out.append({"subject": subject, "fault": fault, "runs": runs, "last_seen": last,
                    "nodes": sorted(names.get(int(n), "?") for n in str(nodes).split(",") if n)})
    return sorted(out, key=lambda d: (-d["runs"], d["subject"], d["fault"]))


def failure_rates(h: History, window_runs: Optional[int] = None) -> List[Dict[str, Any]]:
    """Per check: node findings, how many failed or errored, and the rate, over the fleet's last
    `window_runs` runs (all runs: None; a year of a 1,000-node fleet is a 7.6 M-row scan); highest first."""
    where, args = "", ()  # type: str, tuple
    if window_runs is not None:
        where = " AND f.run_id IN (SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT ?)"
        args = (window_runs,)
    out = []
    for check, total, bad in h.conn.execute(
            "SELECT c.name, count(*), sum(f.status >= ?) FROM findings f JOIN checks c ON c.id = f.check_id"
            " WHERE f.node_id IS NOT NULL%s GROUP BY f.check_id" % where, (PROBLEM,) + args):
        out.append({"check": check, "findings": total, "problems": bad or 0, "rate": (bad or 0) / total if total else 0.0})
    return sorted(out, key=lambda d: (-d["rate"], d["check"]))


def incidents(h: History, now: Optional[float] = None) -> Dict[str, Any]:
    """Per node: incidents, mean days between them, days since the last, failures in a row now; and
    the fleet's incidents per 1,000 node-days and mean days between incidents (fleet-wide)."""
    series = _node_series(h)
    starts = [r[0] for r in h.conn.execute("SELECT started_at FROM runs ORDER BY started_at")]
    gaps = [b - a for a, b in zip(starts, starts[1:]) if b > a]
    step = statistics.median(gaps) if gaps else DAY
    now = now if now is not None else (starts[-1] if starts else 0.0)
    nodes, all_starts, node_days = {}, [], 0.0
    for node, runs in series.items():
        times = [t for _, t, _ in runs]
        node_days += (sum(b - a for a, b in zip(times, times[1:])) + step) / DAY
        began = [t for i, (_, t, s) in enumerate(runs) if s == FAILED and (i == 0 or runs[i - 1][2] != FAILED)]
        streak = 0
        for _, _, status in reversed(runs):
            if status != FAILED:
                break
            streak += 1
        all_starts.extend(began)
        between = [(b - a) / DAY for a, b in zip(began, began[1:])]
        nodes[node] = {"incidents": len(began), "consecutive_failures": streak,
                       "days_since_last": (now - began[-1]) / DAY if began else None,
                       "mean_days_between": sum(between) / len(between) if between else None}
    all_starts.sort()
    fleet_between = [(b - a) / DAY for a, b in zip(all_starts, all_starts[1:])]
    total = len(all_starts)
    return {"nodes": nodes, "fleet": {
        "incidents": total, "node_days": node_days,
        "incidents_per_1000_node_days": 1000.0 * total / node_days if node_days else None,
        "mean_days_between_incidents": sum(fleet_between) / len(fleet_between) if fleet_between else None}}


def metrics(h: History, since: float, window_runs: int = 30) -> Dict[str, Any]:
    """What the Prometheus textfile carries from the history (preflight.output.prometheus): per node its
    incidents, failures in a row, seconds since its last incident and flips; repeat faults since
    `since`; the fleet's incidents per 1,000 node-days; the last run's actions per node and kind."""
    found = incidents(h)
    now = h.conn.execute("SELECT max(started_at) FROM runs").fetchone()[0] or 0.0
    flips = flip_counts(h, window_runs)
    nodes = {}
    for node, d in found["nodes"].items():
        nodes[node] = {"incidents": d["incidents"], "consecutive_failures": d["consecutive_failures"],
                       "flips": flips.get(node, 0),
                       "seconds_since_last_incident": None if d["days_since_last"] is None else d["days_since_last"] * DAY}
    repeats = [{"node": ",".join(r["nodes"]), "subject": r["subject"], "fault": r["fault"], "runs": r["runs"]}
               for r in repeat_faults(h, 2, since)]
    last_run = "(SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT 1)"
    actions = [{"node": node or "", "kind": kind, "shadow": bool(shadow), "count": count}
               for node, kind, shadow, count in h.conn.execute(
        "SELECT n.name, a.kind, a.shadow, count(*) FROM actions a LEFT JOIN nodes n ON n.id = a.node_id "
        "WHERE a.run_id = " + last_run + " GROUP BY n.name, a.kind, a.shadow ORDER BY n.name, a.kind")]
    return {"now": now, "runs": h.conn.execute("SELECT count(*) FROM runs").fetchone()[0], "nodes": nodes,
            "repeats": repeats, "fleet": found["fleet"], "actions": actions}

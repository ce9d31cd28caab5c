"""One `preflight check --history PATH` run's dealings with the database: open it (importing a JSON
history directory once), decide escalations and drains from what came before, record the run.

The order matters: the ladder and the drain policy count the runs *before* this one, so they are
decided first; the run, its escalations and its drain decisions are then stored in one transaction.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.history import escalation
from preflight.history.db import History, epoch, location

Say = Callable[[str], None]


def open_history(path: str, say: Say) -> Tuple[History, Optional[str]]:
    """The database for `--history PATH` and the JSON directory beside it (None for a database path);
    JSON reports in that directory not yet in the database are imported first."""
    database, directory = location(path)
    os.makedirs(os.path.dirname(os.path.abspath(database)), exist_ok=True)
    h = History(database, say)
    if directory is not None:
        try:
            count = h.import_dir(directory)
        except BaseException:
            h.close()
            raise
        if count:
            say("history: imported %d JSON report%s from %s into %s" % (count, "" if count == 1 else "s", directory, database))
    return h, directory


def decide(h: History, doc: Mapping[str, Any], findings: Sequence[Any], cluster: Mapping[str, Any],
           would_drain: Optional[Callable[[List[Any]], List[str]]], shadow: bool, say: Say,
           kind: str = "drain") -> Tuple[List[Any], List[Dict[str, Any]]]:
    """The findings the drain step should act on, and the actions to record with the run.

    would_drain(findings) -> the nodes the drain step would take out from those findings (None: no
    --drain, only escalations are decided); kind: what the applier's drain is called, recorded as the
    action's kind ("drain" for Slurm, "cordon" for Kubernetes). With shadow, nothing is taken out: the
    returned findings hold every node back, and the decisions are recorded as shadow actions."""
    from preflight.common import printable

    s = escalation.Settings.from_cluster(cluster)
    now = epoch(doc.get("started_at"))
    actions: List[Dict[str, Any]] = []
    shown = say
    say = lambda line: shown(printable(line, keep_newlines=False))  # noqa: E731  (serials are node-read text)
    for e in escalation.escalate(h, doc, now, s):
        say("escalate: %s %s" % (e.node, e.reason))
        actions.append({"node": e.node, "kind": "escalate", "subject": e.subject, "reason": e.reason, "shadow": shadow})
    if would_drain is None:
        return list(findings), actions
    policy = escalation.drain_policy(h, doc, now, s)
    out = escalation.drain_input(findings, policy)
    new = would_drain(out)
    policy.breaker = escalation.breaker(h, now, s, len(doc.get("nodes") or []), new, kind)
    for line in policy.lines():
        say(line)
    for node, why in policy.held.items():
        actions.append({"node": node, "kind": "hold", "reason": why, "shadow": shadow})
    if policy.breaker or shadow:
        held = escalation.DrainPolicy(held={n: "circuit breaker" if policy.breaker else "shadow" for n in new})
        out = escalation.drain_input(out, held)
        decided = "breaker" if policy.breaker else kind
        actions.extend({"node": n, "kind": decided, "reason": policy.breaker or "would %s" % kind, "shadow": shadow}
                       for n in new)
        if shadow and new:
            say("shadow: would have %sed %s; %sed nothing" % (kind, ", ".join(sorted(new)), kind))
    else:
        why = {f.node: "%s: %s" % (f.check, f.message) for f in reversed(out) if f.status.is_problem}
        actions.extend({"node": n, "kind": kind, "reason": policy.confirmed.get(n) or why.get(n), "shadow": False}
                       for n in new)
    return out, actions


def record(h: History, directory: Optional[str], doc: Mapping[str, Any], facts: Optional[Mapping[str, Any]],
           actions: Sequence[Mapping[str, Any]], cluster: Mapping[str, Any], say: Say) -> int:
    """Store the run with its actions (and, with a JSON directory, its JSON report there first: the
    row names that file, so it is never imported a second time), then apply the retention settings."""
    source = None
    if directory is not None:
        from preflight.output import history as json_history

        source = json_history.record(doc, directory).name
    run = h.record(doc, facts=facts, actions=actions, source=source)
    s = escalation.Settings.from_cluster(cluster)
    if s.retention_runs is not None or s.retention_days is not None:
        gone = h.prune(keep_runs=s.retention_runs, max_age_days=s.retention_days, now=epoch(doc.get("started_at")))
        if gone:
            say("history: dropped %d run%s past retention" % (gone, "" if gone == 1 else "s"))
    return run


def metrics(h: History, cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """The history's figures for the Prometheus textfile; repeats counted within the escalation window."""
    from preflight.history import queries

    s = escalation.Settings.from_cluster(cluster)
    last = h.conn.execute("SELECT max(started_at) FROM runs").fetchone()[0] or 0.0
    return queries.metrics(h, last - s.escalation_window_s)

"""Escalation and flap-proof drains, decided from the history before this run is recorded.

The ladder. A fault that comes back on the same part (GPU serial, HCA port: preflight.history.subjects)
within `escalation_window_s` climbs one rung per occurrence:

    reset_gpu x reset_attempts  ->  reboot x reboot_threshold  ->  inspect (hardware inspection / RMA)

starting at the finding's own action (a reboot-class fault starts at reboot). Defaults, from the peers
that do this: reboot_threshold 2, gpud's DefaultRebootThreshold (leptonai/gpud
components/accelerator/nvidia/xid/threshold.go: "the number of reboot events gpud allows ... before
escalating from RebootSystem to HardwareInspection"); a 7-day window and one remediation before a
person is called, NVSentinel's fault-remediation rule (a node remediated more than once in 7 days goes
to a person; docs.nvidia.com/nvsentinel, configuration/fault-remediation).

The drain policy (with --drain and a --history):
- a decided hardware fault (FAIL whose action is isolate, reset_gpu or reboot, of a check not in
  `flap_checks`) drains at once, as without history;
- anything else (a retest-class ERROR, a config fault, a check known to flap: IB counters, ssh, the
  all-reduce) drains only once the same fault was seen on the node in `drain_after` runs within
  `drain_window_s`: one noisy night never drains a node, and a retest-class fault that keeps coming
  back is no longer left in service forever;
- the circuit breaker: when the nodes preflight drained (or cordoned) within `breaker_window_s` plus this run's
  would exceed `breaker_fraction` of the fleet, this run drains nothing new (NVSentinel's circuit
  breaker: 50% of nodes in 5 minutes, docs.nvidia.com/nvsentinel components/circuit-breaker);
- --shadow: every decision is recorded (actions.shadow = 1) and printed, nothing is drained.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.history.db import History
from preflight.history.subjects import gpu_index, subject_of
from preflight.inventory import HISTORY_FLAP_CHECKS, HISTORY_SETTINGS

INSPECT = "inspect"
HARDWARE_ACTIONS = ("isolate", "reset_gpu", "reboot")
LADDER_STARTS = ("reset_gpu", "reboot")


def _default(key: str) -> Any:
    """The inventory's default for cluster.history.KEY: one table holds the defaults and their bounds."""
    return HISTORY_SETTINGS[key][0]


@dataclass(frozen=True)
class Settings:
    """cluster.history as the ladder and the drain policy read it; every default is HISTORY_SETTINGS's."""

    escalation_window_s: float = _default("escalation_window_s")
    reset_attempts: int = _default("reset_attempts")
    reboot_threshold: int = _default("reboot_threshold")
    drain_after: int = _default("drain_after")
    drain_window_s: float = _default("drain_window_s")
    breaker_fraction: float = _default("breaker_fraction")
    breaker_window_s: float = _default("breaker_window_s")
    retention_runs: Optional[int] = _default("retention_runs")
    retention_days: Optional[float] = _default("retention_days")
    flap_checks: Tuple[str, ...] = HISTORY_FLAP_CHECKS

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, Any]) -> "Settings":
        raw = dict(cluster.get("history") or {})
        if "flap_checks" in raw:
            raw["flap_checks"] = tuple(raw["flap_checks"])
        return cls(**raw)


@dataclass(frozen=True)
class Escalation:
    node: str
    subject: str
    fault: str
    seen: int
    action: str  # the rung: reset_gpu, reboot or inspect
    was: str  # the finding's own action

    @property
    def reason(self) -> str:
        return "%s on %s seen in %d runs within the window: %s (the check said %s)" % (
            self.fault, self.subject, self.seen, "inspect/RMA" if self.action == INSPECT else self.action, self.was)


@dataclass
class DrainPolicy:
    held: Dict[str, str] = field(default_factory=dict)  # node -> why it is not drained yet
    confirmed: Dict[str, str] = field(default_factory=dict)  # node -> why a retest-class fault now drains
    breaker: Optional[str] = None  # why this run drains nothing new

    def lines(self) -> List[str]:
        out = ["not drained yet: %s: %s" % (node, why) for node, why in sorted(self.held.items())]
        out += ["drain (confirmed): %s: %s" % (node, why) for node, why in sorted(self.confirmed.items())]
        if self.breaker:
            out.append("drain: circuit breaker: %s" % self.breaker)
        return out


def _seen_runs(h: History, where: str, args: tuple, since: float, before: float) -> int:
    sql = ("SELECT count(DISTINCT f.run_id) FROM findings f JOIN runs r ON r.id = f.run_id WHERE %s"
           " AND f.status >= 3 AND r.started_at >= ? AND r.started_at < ?" % where)
    return int(h.conn.execute(sql, args + (since, before)).fetchone()[0])


def rung(action: str, seen: int, s: Settings) -> str:
    """The ladder's action for the `seen`-th occurrence of a fault whose check asks for `action`."""
    steps = ["reset_gpu"] * s.reset_attempts + ["reboot"] * s.reboot_threshold + [INSPECT]
    start = 0 if action == "reset_gpu" else s.reset_attempts
    return steps[min(start + seen - 1, len(steps) - 1)]


def _problems(doc: Mapping[str, Any]) -> List[Tuple[Dict[str, Any], str, str]]:
    gpus = gpu_index(doc.get("hardware") or {})
    return [(r, *subject_of(r, gpus)) for r in doc.get("results") or []
            if r.get("node") and r["status"] in ("fail", "error")]


def escalate(h: History, doc: Mapping[str, Any], now: float, s: Settings) -> List[Escalation]:
    """The findings of this run whose fault recurs on the same part, with the rung they reached (only
    those above the check's own action)."""
    out, done = [], set()
    for r, subject, fault in _problems(doc):
        if r.get("action") not in LADDER_STARTS or subject.startswith("node:") or (subject, fault) in done:
            continue
        done.add((subject, fault))
        seen = 1 + _seen_runs(h, "f.subject=? AND f.fault=?", (subject, fault), now - s.escalation_window_s, now)
        step = rung(r["action"], seen, s)
        if step != r["action"]:
            out.append(Escalation(r["node"], subject, fault, seen, step, r["action"]))
    return out


def drain_policy(h: History, doc: Mapping[str, Any], now: float, s: Settings) -> DrainPolicy:
    """Which failing nodes wait for confirmation and which retest-class faults are now confirmed."""
    node_ids = dict(h.conn.execute("SELECT name, id FROM nodes"))
    by_node: Dict[str, List[Tuple[Dict[str, Any], str]]] = {}
    for r, _, fault in _problems(doc):
        by_node.setdefault(r["node"], []).append((r, fault))
    policy = DrainPolicy()
    for node, problems in by_node.items():
        if any(r["status"] == "fail" and r.get("action") in HARDWARE_ACTIONS and r["check"] not in s.flap_checks
               for r, _ in problems):
            continue  # a decided hardware fault: drained at once (or not, by drain's own rules)
        best = None
        for r, fault in problems:
            prior = 0 if node not in node_ids else _seen_runs(
                h, "f.node_id=? AND f.fault=?", (node_ids[node], fault), now - s.drain_window_s, now)
            if best is None or prior + 1 > best[0]:
                best = (prior + 1, fault, r)
        assert best is not None
        seen, fault, r = best
        days = s.drain_window_s / 86400.0
        if seen < s.drain_after:
            policy.held[node] = "%s seen in %d of the %d runs needed within %g d (%s)" % (
                fault, seen, s.drain_after, days, "retest-class" if r.get("action") in (None, "retest") else
                "flap-prone check" if r["check"] in s.flap_checks else "not a decided hardware fault")
        elif r.get("action") in (None, "retest"):
            policy.confirmed[node] = "%s seen in %d runs within %g d: no longer a one-off" % (fault, seen, days)
    return policy


def breaker(h: History, now: float, s: Settings, fleet: int, new: Sequence[str], kind: str = "drain") -> Optional[str]:
    """Why taking `new` out now would trip the circuit breaker, or None. Drains and cordons count together;
    kind ("drain" or "cordon", the applier's word) only words the answer."""
    recent = {r[0] for r in h.conn.execute(
        "SELECT n.name FROM actions a JOIN runs r ON r.id = a.run_id JOIN nodes n ON n.id = a.node_id"
        " WHERE a.kind IN ('drain', 'cordon') AND a.shadow=0 AND r.started_at >= ?", (now - s.breaker_window_s,))}
    total = recent | set(new)
    if not new or fleet <= 0 or len(total) <= s.breaker_fraction * fleet:
        return None
    done = "cordoned" if kind == "cordon" else "drained"
    return ("%d nodes %s by preflight within %g s with this run's %d (%.0f%% of %d > breaker_fraction %.0f%%);"
            " %s nothing new: find the common cause" % (len(total), done, s.breaker_window_s, len(new),
                                                      100.0 * len(total) / fleet, fleet, 100 * s.breaker_fraction, done))


def drain_input(findings: Sequence[Any], policy: DrainPolicy) -> List[Any]:
    """The findings the drain step judges: a held node's problems become retest (never drained), a
    confirmed retest-class fault becomes isolate with its evidence; the report keeps the originals."""
    out = []
    for f in findings:
        if f.node in policy.held and f.status.is_problem:
            f = replace(f, action="retest")
        elif f.node in policy.confirmed and f.status.is_problem and f.action in (None, "retest"):
            f = replace(f, action="isolate", message="%s (%s)" % (f.message, policy.confirmed[f.node]))
        out.append(f)
    return out

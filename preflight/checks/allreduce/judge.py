"""How a measured group (a pair, a node alone) is judged: against the fleet, or against a control measured
beside it at the same moment, and how much evidence names a node.

Pure; the controller's localization (preflight.checks.allreduce.localize) and the allreduce check both judge
with these functions, so the check can recompute a verdict from the figures the run recorded.

Sensitivity (issue 23 item 3): a group whose figure is more than `warn` (default WARN_FRACTION, 10%)
below its reference is "low" (WARN), more than `slow` (SLOW_FRACTION, 20%) "slow" (FAIL). SuperBench
flags 5%, NCCL's own diagnostics 30% from the median: a healthy fabric's run-to-run spread sits well
inside 10%, a NIC that trained down or a congested port well outside 20%. On a shared machine (the
simulator: every "node" on the same two cores) one measurement can be 20-40% low by itself, so no single
measurement names a node (see confirmed()).

The figure compared is the more favourable of two (benefit of the doubt): the group's best iteration
(best_gbps: the least disturbed one) and its median iteration (busbw_gbps), each against the same kind of
reference. A slow link is slow on both; a busy neighbour rarely spoils every iteration.

The reference of a round (its "expected rate"): a control group of known-good nodes measured at the same
moment under the same conditions when the round has one, else the screening round's fleet median (the
median over nodes of each node's median figure: a slow node cannot drag it down however many groups it
sits in).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.checks.allreduce.busbw import gbps

#: A group more than this share below its reference is slow: FAIL once confirmed
#: (cluster.allreduce.slow_fraction). WARN at half of it (WARN_FRACTION by default).
SLOW_FRACTION = 0.2
WARN_FRACTION = 0.1

OK, WARN, FAIL = "ok", "warn", "fail"
_KINDS = ("best_gbps", "busbw_gbps")

GroupResult = Dict[str, Any]


def judged_gbps(g: Mapping[str, Any]) -> Optional[float]:
    """The figure a group is reported with: its best iteration's busbw, else its median busbw."""
    return g.get("best_gbps") if g.get("best_gbps") is not None else g.get("busbw_gbps")


def warn_fraction(slow_fraction: float) -> float:
    """The WARN level for a FAIL level: half of it (10% for the default 20%)."""
    return round(slow_fraction / 2.0, 4)


def _node_medians(results: Sequence[GroupResult], key: str) -> Optional[float]:
    by_node: Dict[str, List[float]] = {}
    measured = 0
    for g in results:
        v = g.get(key)
        if g.get("failure") is None and v is not None:
            measured += 1
            for n in g["nodes"]:
                by_node.setdefault(n, []).append(float(v))
    if measured < 2:
        return None
    return statistics.median(statistics.median(v) for v in by_node.values())


def reference(results: Sequence[GroupResult]) -> Dict[str, float]:
    """{kind: the fleet median of that figure} over completed groups (empty with fewer than two)."""
    out = {}
    for key in _KINDS:
        v = _node_medians(results, key)
        if v:
            out[key] = v
    return out


def fleet_median(results: Sequence[GroupResult]) -> Optional[float]:
    """The fleet's figure on the reported kind (best iteration, else median): see reference()."""
    ref = reference(results)
    return ref.get("best_gbps", ref.get("busbw_gbps"))


def control_reference(controls: Sequence[GroupResult]) -> Dict[str, float]:
    """{kind: median} over control groups that completed (one control is enough: it is measured beside)."""
    out = {}
    for key in _KINDS:
        vals = [float(g[key]) for g in controls if g.get("failure") is None and g.get(key) is not None]
        if vals:
            out[key] = statistics.median(vals)
    return out


def ratio(g: Mapping[str, Any], ref: Mapping[str, float]) -> Optional[float]:
    """The group's figure over its reference, the more favourable kind (None: nothing to compare)."""
    vals = [float(g[k]) / ref[k] for k in _KINDS if g.get(k) is not None and ref.get(k)]
    return max(vals) if vals else None


def grade(g: Mapping[str, Any], ref: Mapping[str, float], threshold: Optional[float] = None,
          slow_fraction: float = SLOW_FRACTION, by_bandwidth: bool = True,
          ref_name: str = "the fleet median") -> Tuple[str, str]:
    """(OK | WARN | FAIL, why) for one group against its reference; a failed group is FAIL.
    by_bandwidth=False (a hang or an error localized at a small size): completion only."""
    if g.get("failure"):
        return FAIL, str(g["failure"])
    bw = judged_gbps(g)
    if not by_bandwidth:
        return OK, ("busbw %s" % gbps(bw)) if bw is not None else "ok"
    if threshold is not None and bw is not None and bw < threshold:
        return FAIL, "busbw %s below %g GB/s" % (gbps(bw), threshold)
    r = ratio(g, ref)
    warn = warn_fraction(slow_fraction)
    if r is not None and r < 1.0 - warn:
        shown = ref.get("best_gbps", ref.get("busbw_gbps"))
        level, word, limit = (FAIL, "slow", slow_fraction) if r < 1.0 - slow_fraction else (WARN, "low", warn)
        return level, "%s: busbw %s, %d%% below %s %s (limit %d%%)" % (
            word, gbps(bw), round(100 * (1 - r)), ref_name, gbps(shown), round(100 * limit))
    return OK, "busbw %s" % gbps(bw) if bw is not None else "ok"


def judge(results: Sequence[GroupResult], threshold: Optional[float] = None, by_bandwidth: bool = True,
          slow_fraction: float = SLOW_FRACTION) -> List[Tuple[GroupResult, bool, str]]:
    """(group, passed, why) for groups measured together, each against their fleet median (one round)."""
    ref = reference(results)
    return [(g, level == OK, why) for g in results
            for level, why in [grade(g, ref, threshold, slow_fraction, by_bandwidth)]]


def severity(levels: Sequence[str]) -> str:
    """The level evidence supports: the most favourable of the confirming measurements."""
    return OK if OK in levels else (WARN if WARN in levels else FAIL)


# ------------------------------------------------------------------------------------- partner-free tests
#
# A node round measures every node alone, all at once (pass 0), then re-measures each node more than
# `warn` below the fleet median beside a known-good node measured at the same moment (pass 1, "beside":
# that node): the confirmation. The in-process gloo loopback does both passes in the sweep's own
# processes (bench_worker._node_phase); the NCCL NIC round runs them as two launches (run.py).
# A node round result is a group result of one node with "pass" (0 or 1) and, in pass 1, "beside".


def node_suspects(results: Sequence[GroupResult], slow_fraction: float = SLOW_FRACTION) -> Tuple[List[str], List[str]]:
    """(suspects, known-good nodes fastest first) of a node round's first pass."""
    first = [g for g in results if int(g.get("pass", 0)) == 0]
    ref = reference(first)
    suspects, good = [], []
    for g in first:
        level, _why = grade(g, ref, None, slow_fraction)
        (good if level == OK else suspects).append(g)
    good.sort(key=lambda g: -(judged_gbps(g) or 0.0))
    return [g["nodes"][0] for g in suspects], [g["nodes"][0] for g in good]


def judge_nodes(results: Sequence[GroupResult], threshold: Optional[float] = None,
                slow_fraction: float = SLOW_FRACTION, by_bandwidth: bool = True) -> Dict[str, Dict[str, str]]:
    """{"fail": {node: why}, "warn": {node: why}, "not_confirmed": {node: why}} for one node round.

    A node is named only when it is low in the first pass *and* low beside every known-good node it was
    re-measured beside (each against that node, timed at the same moment: bench_worker.CONFIRMATIONS
    of them); a failed node (did not complete) is named on the spot. by_bandwidth=False: completion only.
    """
    out: Dict[str, Dict[str, str]] = {"fail": {}, "warn": {}, "not_confirmed": {}}
    first = [g for g in results if int(g.get("pass", 0)) == 0]
    second = [g for g in results if int(g.get("pass", 0)) == 1]
    ref = reference(first)
    for g in first:
        node = g["nodes"][0]
        level, why = grade(g, ref, threshold, slow_fraction, by_bandwidth)
        if level == OK:
            continue
        if g.get("failure") or not by_bandwidth:
            out["fail"][node] = why
            continue
        again = [a for a in second if a["nodes"][0] == node and a.get("beside")]
        if not again:
            out["not_confirmed"][node] = "%s; not confirmed (no second measurement)" % why
            continue
        levels, fine, low = [level], [], []
        for a in again:
            beside = a["beside"]
            controls = [c for c in second if c.get("control_for") == node and c["nodes"][0] == beside]
            level2, why2 = grade(a, control_reference(controls) or ref, threshold, slow_fraction,
                                 ref_name="%s measured beside it" % beside)
            levels.append(level2)
            (fine if level2 == OK else low).append("%s beside %s" % (why2, beside))
        if fine:
            out["not_confirmed"][node] = "not confirmed: %s at first, %s" % (why, "; ".join(fine))
        else:
            out[severity(levels)][node] = "%s; confirmed %s" % (why, "; ".join(low))
    return out


"""The tier gate: `--resume --tier standard|burn-in` returns a drained node to service only when that tier's
checks ran on it in this run and passed.

Scheduler-neutral and pure: the run's findings and the nodes that would be returned (drained by preflight
before the run) in, the findings plus one ERROR per node the tier did not prove out. That ERROR carries the
action `retest`, so the drain policy (preflight.slurm.drain.plan) neither resumes the node (it has a
problem) nor drains it for this (no check decided a fault), and a node resumed only for its recheck is
drained again with its old reason.

Proof comes from this run only, not from the history database: a repaired node's earlier pass predates
the repair (a swapped GPU, a reseated cable) and proves nothing about the node now; and the history does
not record which tier a run was. "Passed" means: every check the tier requires has at least one PASS
finding on the node and none of its findings there warns, fails or errors. A check that applies only
where its tool is installed (dcgm's level-3 diagnostic, nvbandwidth) may SKIP with its reason.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from preflight.model import Finding, Status

#: The checks each tier adds and must see pass on a node before it returns to service.
REQUIRED: Dict[str, Tuple[str, ...]] = {
    "quick": (),
    "standard": ("allreduce", "gpu_compute"),
    "burn-in": ("allreduce", "gpu_compute", "dcgm", "nvbandwidth"),
}
#: Checks that run only where their tool exists: a SKIP (dcgmi or nvbandwidth not installed, a CPU node)
#: does not hold the node back.
WHERE_PRESENT = frozenset(("dcgm", "nvbandwidth"))
#: Collective checks whose PASS may be one cluster-wide line (node None).
COLLECTIVE = frozenset(("allreduce",))


def unproven(findings: Sequence[Finding], tier: str, node: str) -> Optional[Tuple[str, str]]:
    """(check, why) for the first check of `tier` that did not pass on `node` in this run; None when all did.

    A cluster-wide finding of a check counts for every node: its warning or failure (the all-reduce soak
    varied between rounds) holds each one back, and its PASS stands for the collective checks whose pass
    is one line for the fleet (the all-reduce on a small fleet; gpu_compute's per-node PASS then proves the
    node's ranks took part)."""
    for check in REQUIRED.get(tier, ()):
        mine = [f for f in findings if f.node == node and f.check == check]
        fleet = [f for f in findings if f.node is None and f.check == check]
        bad = [f for f in mine + fleet if f.status.is_problem or f.status is Status.WARN]
        if bad:
            worst = max(bad, key=lambda f: f.status.rank)
            return check, "%s %s: %s" % (check, worst.status.value, worst.message)
        if any(f.status is Status.PASS for f in mine) or (check in COLLECTIVE and not mine and
                                                          any(f.status is Status.PASS for f in fleet)):
            continue
        if mine and check in WHERE_PRESENT:
            continue
        if mine:
            return check, "%s skipped: %s" % (check, mine[0].message)
        said = [f for f in fleet if f.status is not Status.PASS]
        return check, "%s did not run here%s" % (check, ": " + said[0].message if said else
                                                  " (not selected, or no result from this node)")
    return None


def demanded(args: Any) -> Optional[str]:
    """The tier a run's --resume demands of the nodes it would return (--resume --tier standard|burn-in), None
    when it demands none (no --resume, or the quick tier): what every backend's gate asks first."""
    tier = getattr(args, "tier", "quick")
    return tier if getattr(args, "resume", False) and REQUIRED.get(tier) else None


def hold(findings: Iterable[Finding], tier: str, candidates: Iterable[str]) -> List[Finding]:
    """The findings, plus an ERROR (action retest) for every candidate node the tier did not prove out:
    candidates are the nodes --resume would return (drained by preflight before the run)."""
    out = list(findings)
    for node in sorted(set(candidates)):
        missing = unproven(out, tier, node)
        if missing is None:
            continue
        check, why = missing
        out.append(Finding(check, node, Status.ERROR, "%s not returned to service: --resume --tier %s needs %s to "
                           "pass on it in this run; %s" % (node, tier, ", ".join(REQUIRED[tier]), why),
                           expected="tier %s passed" % tier, actual=why[:200], action="retest",
                           data={"tier_gate": {"tier": tier, "check": check}}))
    return out

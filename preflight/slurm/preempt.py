"""A burn-in run as a preemptible Slurm job: what Slurm says of a job a user's job displaced, and the run's
findings for its nodes (preempted: not failed, not returned to service).

`preflight check --slurm --nodelist N --partition burnin --preemptible` allocates in a partition (or with
`--qos`) that the site configures to yield: slurm.conf `PreemptType=preempt/partition_prio` with a lower
`PriorityTier` on the burn-in partition and `PreemptMode=REQUEUE` (or CANCEL); or `preempt/qos` with the
burn-in QOS in the users' QOS's `Preempt=` list. preflight's allocation is interactive (`salloc
--no-shell`), which Slurm cannot requeue: a preempted burn-in is cancelled, and its job record says
`JobState=PREEMPTED` (Slurm 22.05 `scontrol -o show job`, recorded from tests/sim/slurm.py in
tests/actions/test_slurm_preempt.py; a batch job with `--requeue` would read PENDING with `Restarts=1`,
also read here as preempted). Slurm keeps the record MinJobAge seconds (300 by default) after the end:
the run reads it right after its steps.

Every node of a preempted job gets one finding that marks it unavailable (status skip, `data.unavailable`
with state PREEMPTED), so the drain policy neither drains nor resumes it and it does not fail the run; its
findings that the job's end made (the transport's "not checked" or "gave no result", and the cross-node
checks the preemption cut short) go. A FAIL a node check decided from the facts that arrived stays: a
fault found before the preemption is still a fault.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional

from preflight.model import UNAVAILABLE, Finding, Status, is_consequence
from preflight.slurm.scontrol import SCONTROL, SlurmError, run

#: Checks whose verdict needs the job to last to the end: the transport's (a task killed by the preemption
#: reads "gave no result") and the cross-node runs after the node checks.
CUT_SHORT = frozenset(("ssh", "allreduce", "gpu_compute", "nvbandwidth", "dcgm"))

_FIELD = re.compile(r"(?:^|\s)(JobState|Reason|Restarts|PreemptTime|Partition|EndTime)=(\S*)")


def parse_job(text: str) -> Dict[str, str]:
    """The fields preemption shows in one `scontrol -o show job` line: JobState, Reason, Restarts,
    PreemptTime, Partition, EndTime (absent ones are left out)."""
    return {k: v for k, v in _FIELD.findall(text)}


def preempted(fields: Dict[str, str]) -> bool:
    """The job was displaced by another: cancelled by preemption, or requeued by it. PreemptTime is set
    the moment slurmctld starts the preemption, while JobState may still read COMPLETING (its flag wins
    over the base state in scontrol's output until every node has ended the job): read right after the
    steps died, that is what the run sees."""
    state = fields.get("JobState", "")
    if state == "PREEMPTED" or fields.get("PreemptTime", "None") not in ("None", "Unknown", ""):
        return True
    return state in ("PENDING", "REQUEUED", "REQUEUE_HOLD") and fields.get("Restarts", "0") not in ("", "0")


def read_job(job_id: str) -> Optional[Dict[str, str]]:
    """The job's fields, or None when Slurm no longer knows it (past MinJobAge) or cannot be asked."""
    try:
        out = run([SCONTROL, "-o", "show", "job", job_id])
    except SlurmError:
        return None
    return parse_job(out.stdout) if out.returncode == 0 and out.stdout.strip() else None


def mark(findings: Iterable[Finding], alloc: Any, read=read_job) -> List[Finding]:
    """The findings, with every node of a preempted job marked preempted (see the module docstring);
    unchanged when the job was not preempted (or there is no job preflight can read)."""
    findings = list(findings)
    fields = read(alloc.job_id) if alloc is not None and alloc.job_id else None
    if not fields or not preempted(fields):
        return findings
    nodes = set(alloc.nodes)
    when = fields.get("PreemptTime") or fields.get("EndTime") or "unknown time"
    when = "unknown time" if when in ("None", "Unknown") else when
    said = ("Slurm preempted job %s (partition %s) at %s: a higher-priority job took the node; burn-in not "
            "finished, not judged, not returned to service: run it again when the node is idle" % (
                alloc.job_id, fields.get("Partition", "?"), when))
    out = [f for f in findings if not _cut_short(f, nodes)]
    for node in sorted(nodes):
        out.append(Finding("ssh", node, Status.SKIP, said, data={UNAVAILABLE: {
            "state": ["PREEMPTED"], "reason": "preempted at %s" % when, "job": alloc.job_id}}))
    return out


def _cut_short(f: Finding, nodes: Iterable[str]) -> bool:
    """A finding the job's end made, or a verdict it left unfinished, on (or across) the job's nodes."""
    if f.node is not None and f.node not in nodes:
        return False
    if f.check in CUT_SHORT:
        return True
    return f.status is not Status.PASS and (is_consequence(f) or f.status is not Status.FAIL)

"""A burn-in run as a preemptible Slurm job: what Slurm says of a job a user's job displaced, and the run's
findings for its nodes (preempted: not failed, not returned to service).

`preflight check --slurm --nodelist N --partition burnin --preemptible` allocates in a partition (or with
`--qos`) that the site configures to yield: slurm.conf `PreemptType=preempt/partition_prio` with a lower
`PriorityTier` on the burn-in partition and `PreemptMode=REQUEUE` (or CANCEL); or `preempt/qos` with the
burn-in QOS in the users' QOS's `Preempt=` list. preflight's allocation is interactive (`salloc
--no-shell`), which Slurm cannot requeue: a preempted burn-in is cancelled, and its job record says
`JobState=PREEMPTED` (Slurm 22.05 `scontrol -o show job`, recorded from tests/sim/slurm.py in
tests/actions/test_slurm_preempt.py). Slurm keeps the record MinJobAge seconds (300 by default) after
the end: the run reads it right after its steps.

Inside a batch job (`sbatch --requeue --partition burnin --wrap 'exec preflight check --slurm
--preemptible ...'`, no --partition/--qos: the job's partition is the preemptible one), Slurm requeues
the job instead: SIGTERM to all its processes, preflight's too, SIGKILL after KillWait. yield_to_preemption
reads the record at that SIGTERM (COMPLETING, Restarts above this attempt's SLURM_RESTART_COUNT) and lets
the run finish its report; the next attempt runs when the nodes are free (tests/actions/test_slurm_requeue.py).

Every node of a preempted job gets one finding that marks it unavailable (status skip, `data.unavailable`
with state PREEMPTED), so the drain policy neither drains nor resumes it and it does not fail the run; its
findings that the job's end made (the transport's "not checked" or "gave no result", and the cross-node
checks the preemption cut short) go. A FAIL a node check decided from the facts that arrived stays: a
fault found before the preemption is still a fault.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from preflight.model import UNAVAILABLE, Finding, Status, is_consequence
from preflight.slurm.scontrol import SCONTROL, SlurmError, run

#: Checks whose verdict needs the job to last to the end: the transport's (a task killed by the preemption
#: reads "gave no result") and the cross-node runs after the node checks.
CUT_SHORT = frozenset(("ssh", "allreduce", "gpu_compute", "nvbandwidth", "dcgm"))

log = logging.getLogger(__name__)

_FIELD = re.compile(r"(?:^|\s)(JobState|Reason|Restarts|PreemptTime|Partition|EndTime)=(\S*)")

#: {job: its fields as Slurm's SIGTERM found them, when they said the job was displaced} (yield_to_preemption)
_SEEN: Dict[str, Dict[str, str]] = {}
#: a job's states after Slurm requeued it
REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD")
#: how long the SIGTERM handler waits for scontrol (Slurm's KillWait, 30 s by default, bounds the rest of the run)
SIGTERM_READ_S = 10.0


def parse_job(text: str) -> Dict[str, str]:
    """The fields preemption shows in one `scontrol -o show job` line: JobState, Reason, Restarts,
    PreemptTime, Partition, EndTime (absent ones are left out)."""
    return {k: v for k, v in _FIELD.findall(text)}


def _restarts(fields: Dict[str, str]) -> int:
    value = fields.get("Restarts", "0")
    return int(value) if value.isdigit() else 0


def preempted(fields: Dict[str, str], attempt: Optional[int] = None) -> bool:
    """The job was displaced by another: cancelled by preemption, or requeued by it. PreemptTime is set
    the moment slurmctld starts the preemption, while JobState may still read COMPLETING (its flag wins
    over the base state in scontrol's output until every node has ended the job): read right after the
    steps died, that is what the run sees. A batch job requeued reads COMPLETING with Restarts one more
    than its running attempt's (SLURM_RESTART_COUNT, `attempt`) and no PreemptTime while its processes
    end, then PENDING: a count above the attempt's is a requeue under this attempt (preemption, or
    `scontrol requeue`); the attempt that runs after it reads RUNNING with the same count."""
    state = fields.get("JobState", "")
    if state == "PREEMPTED" or fields.get("PreemptTime", "None") not in ("None", "Unknown", ""):
        return True
    if attempt is not None:
        return _restarts(fields) > attempt
    return state in REQUEUED and _restarts(fields) > 0


def read_job(job_id: str, timeout: float = 30.0) -> Optional[Dict[str, str]]:
    """The job's fields, or None when Slurm no longer knows it (past MinJobAge) or cannot be asked."""
    try:
        out = run([SCONTROL, "-o", "show", "job", job_id], timeout=timeout)
    except SlurmError:
        return None
    log.debug("job %s: %s", job_id, out.stdout.strip())
    return parse_job(out.stdout) if out.returncode == 0 and out.stdout.strip() else None


def yield_to_preemption(job_id: str, environ: Optional[Dict[str, str]] = None,
                        read: Callable[..., Optional[Dict[str, str]]] = read_job) -> bool:
    """Inside a batch job run with --preemptible: the SIGTERM Slurm sends when it preempts the job is no
    interruption. slurmd signals every process of the job (its steps, and the batch script: preflight)
    and SIGKILLs what is left KillWait seconds later; the steps end, and the run goes on to its report,
    which marks the job's nodes preempted (mark). The job record read at the signal says whether it was
    displaced (preempted(), with this attempt's SLURM_RESTART_COUNT); any other SIGTERM (scancel, the
    time limit, a person) goes to the handler it found (the CLI's: interrupted). Returns whether it was
    installed: in the main thread, over a handler that is a function."""
    env = os.environ if environ is None else environ
    attempt = env.get("SLURM_RESTART_COUNT", "0")
    attempt_n = int(attempt) if attempt.isdigit() else 0
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        return False

    def on_sigterm(signum: int, frame: Any) -> None:
        fields = read(job_id, timeout=SIGTERM_READ_S)
        if not fields or not preempted(fields, attempt_n):
            previous(signum, frame)
            return
        requeued = _restarts(fields) > attempt_n
        _SEEN[job_id] = dict(fields, SignalTime=time.strftime("%Y-%m-%dT%H:%M:%S"), Requeued="yes" if requeued else "no")
        log.warning("Slurm %s job %s (SIGTERM): its steps end; the report marks its nodes preempted",
                    "requeues" if requeued else "preempts", job_id)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True


def mark(findings: Iterable[Finding], alloc: Any, read=read_job) -> List[Finding]:
    """The findings, with every node of a preempted job marked preempted (see the module docstring);
    unchanged when the job was not preempted (or there is no job preflight can read)."""
    findings = list(findings)
    fields = read(alloc.job_id) if alloc is not None and alloc.job_id else None
    seen = _SEEN.get(alloc.job_id) if alloc is not None else None  # what the record said at Slurm's SIGTERM
    if seen is None and not (fields and preempted(fields)):
        return findings
    fields = dict(seen or {}, **(fields or {}))
    requeued = seen["Requeued"] == "yes" if seen else fields.get("JobState") in REQUEUED
    nodes = set(alloc.nodes)
    out = [f for f in findings if not _cut_short(f, nodes)]
    when = _when(fields)
    said = _message(alloc.job_id, fields, when, requeued)
    for node in sorted(nodes):
        out.append(Finding("ssh", node, Status.SKIP, said, data={UNAVAILABLE: {
            "state": ["PREEMPTED"], "reason": "preempted at %s" % when, "job": alloc.job_id}}))
    return out


def _when(fields: Dict[str, str]) -> str:
    for key in ("PreemptTime", "SignalTime", "EndTime"):
        if fields.get(key) not in (None, "", "None", "Unknown"):
            return fields[key]
    return "unknown time"


def _message(job: str, fields: Dict[str, str], when: str, requeued: bool) -> str:
    """What the report says of each node of the preempted job: cancelled (salloc) or requeued (sbatch --requeue)."""
    head = "Slurm preempted job %s (partition %s) at %s" % (job, fields.get("Partition", "?"), when)
    if requeued:
        return ("%s and requeued it (restart %d): a higher-priority job took the node; burn-in not finished, not "
                "judged, not returned to service: Slurm runs it again when the nodes are free" % (head, _restarts(fields)))
    return ("%s: a higher-priority job took the node; burn-in not finished, not judged, not returned to service: "
            "run it again when the node is idle" % head)


def _cut_short(f: Finding, nodes: Iterable[str]) -> bool:
    """A finding the job's end made, or a verdict it left unfinished, on (or across) the job's nodes."""
    if f.node is not None and f.node not in nodes:
        return False
    if f.check in CUT_SHORT:
        return True
    return f.status is not Status.PASS and (is_consequence(f) or f.status is not Status.FAIL)

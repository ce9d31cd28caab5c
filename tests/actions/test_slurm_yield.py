"""preflight.slurm.preempt inside a batch job: the SIGTERM Slurm sends when it preempts (requeues) the job
is read against the job record and this attempt's SLURM_RESTART_COUNT, with a real signal to this process.
Records: Slurm 22.05 `scontrol -o show job`, recorded from tests/sim/slurm.py (tests/actions/test_slurm_requeue.py)."""

from __future__ import annotations

import signal

import pytest

from preflight.model import UNAVAILABLE, Finding, Status
from preflight.slurm import preempt
from preflight.slurm.allocation import Allocation

#: read at the SIGTERM of a requeue: COMPLETING, Restarts already one more than the attempt, no PreemptTime
REQUEUING = ("JobId=1 JobName=burnin UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
             "Account=(null) QOS=(null) JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=1 "
             "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
             "SubmitTime=2026-11-28T10:12:19 EligibleTime=2026-11-28T10:12:19 AccrueTime=2026-11-28T10:12:19 "
             "StartTime=2026-11-28T10:12:31 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
             "LastSchedEval=2026-11-28T10:12:21 Scheduler=Main Partition=burnin NodeList=n[001-002] BatchHost=n001")
#: the attempt Slurm started after the requeue, running (SLURM_RESTART_COUNT=1)
RERUN = ("JobId=1 JobName=burnin JobState=RUNNING Reason=None Requeue=1 Restarts=1 BatchFlag=1 "
         "StartTime=2026-11-28T10:13:12 EndTime=Unknown PreemptEligibleTime=2026-11-28T10:13:12 PreemptTime=None "
         "Partition=burnin NodeList=n[001-002]")
#: the rerun cancelled by a person (scancel): COMPLETING, the count unchanged
CANCELLED_RERUN = RERUN.replace("JobState=RUNNING", "JobState=COMPLETING")


def test_a_count_above_the_attempts_is_a_requeue_and_the_rerun_or_a_cancel_is_not():
    assert preempt.preempted(preempt.parse_job(REQUEUING), attempt=0)
    assert not preempt.preempted(preempt.parse_job(RERUN), attempt=1)
    assert not preempt.preempted(preempt.parse_job(CANCELLED_RERUN), attempt=1)
    # outside a batch job (preflight's own salloc), COMPLETING without PreemptTime is no preemption
    assert not preempt.preempted(preempt.parse_job(REQUEUING))


@pytest.fixture
def cli_handler():
    """The CLI's SIGTERM handler (raises), restored after the test."""
    class Interrupted(Exception):
        pass

    def raising(signum, frame):
        raise Interrupted(signum)

    old = signal.signal(signal.SIGTERM, raising)
    try:
        yield Interrupted
    finally:
        signal.signal(signal.SIGTERM, old)


def test_slurms_sigterm_of_a_requeue_lets_the_run_report_its_nodes_preempted(cli_handler):
    assert preempt.yield_to_preemption("101", {"SLURM_RESTART_COUNT": "0"},
                                       read=lambda job, timeout: preempt.parse_job(REQUEUING))
    signal.raise_signal(signal.SIGTERM)  # no exception: the run goes on
    alloc = Allocation("101", ["n001", "n002"])
    findings = [Finding("ssh", "n001", Status.FAIL, "probe bundle gave no result: task 0: Aborted", action="isolate"),
                Finding("driver", "n002", Status.PASS, "ok")]
    out = preempt.mark(findings, alloc, read=lambda job: None)  # the record may be gone by then: what the signal saw
    marked = [f for f in out if (f.data or {}).get(UNAVAILABLE)]
    assert [f.node for f in marked] == ["n001", "n002"]
    assert "Slurm preempted job 101 (partition burnin) at " in marked[0].message
    assert "requeued it (restart 1)" in marked[0].message and "runs it again when the nodes are free" in marked[0].message
    assert not [f for f in out if f.status.is_problem]


def test_any_other_sigterm_still_interrupts(cli_handler):
    """scancel of the rerun, a time limit, a person: the handler found (the CLI's) interrupts as before."""
    assert preempt.yield_to_preemption("102", {"SLURM_RESTART_COUNT": "1"},
                                       read=lambda job, timeout: preempt.parse_job(CANCELLED_RERUN))
    with pytest.raises(cli_handler):
        signal.raise_signal(signal.SIGTERM)
    findings = [Finding("ssh", "n001", Status.FAIL, "probe bundle gave no result", action="isolate")]
    assert preempt.mark(findings, Allocation("102", ["n001"]), read=lambda job: preempt.parse_job(CANCELLED_RERUN)) == findings


def test_slurm_unreachable_at_the_signal_interrupts(cli_handler):
    assert preempt.yield_to_preemption("103", {}, read=lambda job, timeout: None)
    with pytest.raises(cli_handler):
        signal.raise_signal(signal.SIGTERM)


def test_not_installed_over_the_default_action():
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        assert not preempt.yield_to_preemption("104", {}, read=lambda job, timeout: None)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, old)

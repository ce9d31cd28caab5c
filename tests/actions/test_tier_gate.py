"""The tier gate (`--resume --tier standard|burn-in`) and a preempted burn-in, on findings and on Slurm's
job record: which nodes the drain policy may return, and which it holds back."""

from __future__ import annotations

from preflight.actions import tier_gate
from preflight import checks
from preflight.model import Finding, Status, unavailable
from preflight.slurm import drain, preempt
from preflight.slurm.allocation import Allocation

OURS = {"state": ["IDLE", "DRAIN"], "reason": "preflight: gpu_compute: slow GEMM (old run)"}


def _passes(node, checks=("ssh", "gpu", "allreduce", "gpu_compute", "dcgm", "nvbandwidth")):
    return [Finding(c, node, Status.PASS, "%s ok" % c) for c in checks]


def _resumed(findings, tier, node="n1"):
    gated = tier_gate.hold(findings, tier, [node])
    return drain.plan(gated, [node], {node: OURS}, drain=True, resume=True).resume == [node], gated


def test_every_required_check_is_in_the_catalogue():
    for tier, names in tier_gate.REQUIRED.items():
        assert set(names) <= set(checks.catalogue()), tier


def test_a_node_whose_burn_in_passed_returns_to_service():
    ok, gated = _resumed(_passes("n1"), "burn-in")
    assert ok and len(gated) == len(_passes("n1"))


def test_a_node_that_passed_quick_checks_only_is_held_back_not_drained():
    """--skip allreduce (or a run whose all-reduce did not reach this node): no compute proven."""
    findings = _passes("n1", ("ssh", "gpu", "dcgm", "nvbandwidth"))
    ok, gated = _resumed(findings, "burn-in")
    held = [f for f in gated if (f.data or {}).get("tier_gate")]
    assert not ok and len(held) == 1 and held[0].status is Status.ERROR and held[0].action == "retest"
    assert "n1 not returned to service: --resume --tier burn-in needs allreduce" in held[0].message
    p = drain.plan(gated, ["n1"], {"n1": OURS}, drain=True, resume=True)
    assert p.drain == {} and p.undecided == ["n1"]  # held, never drained for it


def test_a_warning_in_the_tier_holds_the_node_and_names_it():
    findings = _passes("n1") + [Finding("gpu_compute", "n1", Status.WARN, "GPU 3 SM clock fell 14% over the soak")]
    ok, gated = _resumed(findings, "burn-in")
    assert not ok and "gpu_compute warn: GPU 3 SM clock fell 14%" in gated[-1].message


def test_tools_that_are_not_installed_may_skip_but_the_compute_may_not():
    skips = [Finding("dcgm", "n1", Status.SKIP, "dcgmi not on PATH"),
             Finding("nvbandwidth", "n1", Status.SKIP, "nvbandwidth not installed")]
    ok, _ = _resumed(_passes("n1", ("ssh", "allreduce", "gpu_compute")) + skips, "burn-in")
    assert ok
    cpu_skip = [Finding("gpu_compute", "n1", Status.SKIP, "not run: --tier quick")]
    ok, gated = _resumed(_passes("n1", ("ssh", "allreduce", "dcgm", "nvbandwidth")) + cpu_skip, "standard")
    assert not ok and "gpu_compute skipped: not run" in gated[-1].message


def test_the_gate_touches_only_the_nodes_being_returned():
    findings = _passes("n1", ("ssh",)) + _passes("n2", ("ssh",))
    gated = tier_gate.hold(findings, "burn-in", ["n1"])
    assert {f.node for f in gated if (f.data or {}).get("tier_gate")} == {"n1"}
    assert tier_gate.hold(findings, "quick", ["n1", "n2"]) == findings


# --- a preempted burn-in job, as Slurm 22.05 reports it (scontrol -o show job, recorded from tests/sim/slurm.py)

PREEMPTED_JOB = ("JobId=7 JobName=preflight-a1b2-4242-1700000000-login1 UserId=root(0) GroupId=root(0) MCS_label=N/A "
                 "Priority=1 Nice=0 Account=(null) QOS=(null) JobState=PREEMPTED Reason=None Dependency=(null) "
                 "Requeue=0 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:15 RunTime=00:00:09 TimeLimit=00:13:00 "
                 "TimeMin=N/A SubmitTime=2026-11-28T08:40:01 EligibleTime=2026-11-28T08:40:01 "
                 "AccrueTime=Unknown StartTime=2026-11-28T08:40:01 EndTime=2026-11-28T08:40:10 Deadline=N/A "
                 "PreemptEligibleTime=2026-11-28T08:40:01 PreemptTime=2026-11-28T08:40:10 SuspendTime=None "
                 "SecsPreSuspend=0 LastSchedEval=2026-11-28T08:40:01 Scheduler=Main Partition=burnin "
                 "AllocNode:Sid=ctl:1234 NodeList=n[001-002] BatchHost=n001 NumNodes=2")
REQUEUED_BATCH = "JobId=9 JobState=PENDING Reason=BeginTime Requeue=1 Restarts=1 Partition=burnin NodeList=(null)"
RUNNING = ("JobId=8 JobState=RUNNING Reason=None Restarts=0 PreemptEligibleTime=2026-11-28T08:40:01 PreemptTime=None "
           "Partition=burnin NodeList=n[001-002]")
#: read while the nodes end the preempted job: the COMPLETING flag shows, PreemptTime is already set
COMPLETING = "JobId=7 JobState=COMPLETING Reason=None Restarts=0 PreemptTime=2026-11-28T08:40:10 Partition=burnin"


def test_slurms_job_record_says_preempted_or_requeued_and_a_running_job_is_neither():
    assert preempt.preempted(preempt.parse_job(PREEMPTED_JOB))
    assert preempt.preempted(preempt.parse_job(REQUEUED_BATCH))
    assert preempt.preempted(preempt.parse_job(COMPLETING))
    assert not preempt.preempted(preempt.parse_job(RUNNING))
    assert not preempt.preempted(preempt.parse_job("JobId=8 JobState=CANCELLED Reason=None Restarts=0 PreemptTime=None"))


def test_a_preempted_job_marks_its_nodes_unavailable_keeping_a_fault_found_before():
    alloc = Allocation("7", ["n001", "n002"], True)
    findings = _passes("n001") + _passes("n002") + [
        Finding("ssh", "n001", Status.FAIL, "probe bundle gave no result: Killed", action="isolate"),
        Finding("allreduce", None, Status.ERROR, "no result from n001", action="retest"),
        Finding("mtu", "n002", Status.FAIL, "jumbo pings lost", action="fix_config"),
        Finding("gpu", "n003", Status.FAIL, "GPU 2 lost", action="isolate")]
    out = preempt.mark(findings, alloc, read=lambda job: preempt.parse_job(PREEMPTED_JOB))
    marked = [f for f in out if unavailable(f)]
    assert {f.node for f in marked} == {"n001", "n002"}
    assert "Slurm preempted job 7 (partition burnin) at 2026-11-28T08:40:10" in marked[0].message
    problems = {(f.check, f.node) for f in out if f.status.is_problem}
    assert problems == {("mtu", "n002"), ("gpu", "n003")}  # the killed task and the cut all-reduce went
    p = drain.plan(out, ["n001", "n002"], {"n001": OURS, "n002": OURS}, drain=True, resume=True)
    assert p.resume == [] and p.drain == {}  # preempted: neither returned nor drained


def test_a_job_that_was_not_preempted_changes_nothing():
    alloc = Allocation("8", ["n001"], True)
    findings = [Finding("ssh", "n001", Status.FAIL, "probe bundle gave no result: Killed", action="isolate")]
    assert preempt.mark(findings, alloc, read=lambda job: preempt.parse_job(RUNNING)) == findings
    assert preempt.mark(findings, alloc, read=lambda job: None) == findings


def test_a_cluster_wide_pass_of_the_all_reduce_counts_and_its_warning_holds_every_node():
    findings = _passes("n1", ("ssh", "gpu_compute", "dcgm", "nvbandwidth")) + [
        Finding("allreduce", None, Status.PASS, "ok")]
    assert _resumed(findings, "burn-in")[0]
    soak = Finding("allreduce", None, Status.WARN, "all-reduce soak: rounds 12.1-15.9 ms (spread 31%)")
    ok, gated = _resumed(findings + [soak], "burn-in")
    assert not ok and "allreduce warn: all-reduce soak" in gated[-1].message
    # a cluster-wide pass does not stand for the compute, whose pass is per node
    assert not _resumed(_passes("n1", ("ssh", "allreduce")) + [Finding("gpu_compute", None, Status.PASS, "x")],
                        "standard")[0]

"""Slurm output parsers (real Slurm 22.05 output recorded from tests/sim/slurm.py) and the drain plan."""

from __future__ import annotations

import os

import pytest

from preflight.slurm import drain
from preflight.model import Finding, Status
from preflight.slurm.scontrol import (LAUNCH_REFUSED_RE, bad_state, gres_gpus, job_gpus, parse_show_node,
                                      parse_srun_stderr)
from tests.paths import TESTS
from tests import builders

HERE = os.path.join(TESTS, "fixtures", "slurm")


def _read(name):
    with open(os.path.join(HERE, name)) as fh:
        return fh.read()


def test_show_node_states_reasons_without_stamp():
    nodes = parse_show_node(_read("show_node_drained.txt"))  # `scontrol -o show node`, Slurm 22.05.8
    assert nodes["n002"] == {"state": ["IDLE", "DRAIN"], "reason": "disk replaced by hand", "gpus": 0}
    assert nodes["n001"]["reason"] is None and nodes["n001"]["state"] == ["IDLE"]
    assert bad_state(nodes["n002"]["state"]) and not bad_state(nodes["n001"]["state"])
    assert bad_state(["IDLE*"]) and bad_state(["DOWN", "NOT_RESPONDING"])


def test_show_node_refuses_other_output():
    with pytest.raises(ValueError, match="not a `scontrol -o show node` line"):
        parse_show_node("PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n")


@pytest.mark.parametrize("gres,gpus", [("(null)", 0), ("gpu:8", 8), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4,gpu:v100:2", 6)])
def testgres_gpus(gres, gpus):
    assert gres_gpus(gres) == gpus


def test_srun_launch_failure_names_the_node():
    launch, exits = parse_srun_stderr(_read("srun_launch_failed.stderr"))
    assert launch == {"n002": "Communication connection failure"}
    assert exits == {}
    _, exits = parse_srun_stderr("srun: error: n003: task 2: Exited with exit code 1\n")
    assert exits == {"n003": "Exited with exit code 1"}


def _f(check, node, status, msg="x"):
    return Finding(check, node, status, msg)


def _state(**kw):
    base = {n: {"state": ["IDLE"], "reason": None} for n in ("a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10")}
    base.update(kw)
    return base


NODES = ["a%d" % i for i in range(1, 11)]


def test_plan_drains_failing_node_with_short_reason_and_leaves_others_drain_alone():
    findings = [_f("ssh", n, Status.PASS) for n in NODES] + [_f("mtu", "a3", Status.FAIL, "jumbo " * 60),
                                                             _f("gpu", "a3", Status.ERROR, "not checked: x")]
    state = _state(a5={"state": ["IDLE", "DRAIN"], "reason": "by hand"})
    p = drain.plan(findings, NODES, state, drain=True, resume=True)
    assert list(p.drain) == ["a3"] and p.drain["a3"].startswith("preflight: mtu: jumbo")
    assert len(p.drain["a3"]) <= drain.REASON_MAX
    assert p.left_alone == {"a5": "drained by someone else: by hand"} and p.resume == [] and p.refused is None
    assert p.commands()[0] == ["scontrol", "update", "nodename=a3", "state=drain", "reason=" + p.drain["a3"]]


def test_plan_resumes_only_our_drained_nodes_that_pass():
    findings = [_f("ssh", n, Status.PASS) for n in NODES] + [_f("mtu", "a2", Status.FAIL)]
    state = _state(a1={"state": ["IDLE", "DRAIN"], "reason": "preflight: mtu: old"},
                   a2={"state": ["IDLE", "DRAIN"], "reason": "preflight: mtu: old"},
                   a4={"state": ["IDLE", "DRAIN"], "reason": "maintenance"})
    p = drain.plan(findings, NODES, state, drain=True, resume=True)
    assert p.resume == ["a1"] and p.drain == {} and "a4" in p.left_alone
    assert drain.plan(findings, NODES, state, drain=True, resume=False).resume == []
    assert ["scontrol", "update", "nodename=a1", "state=resume"] in p.commands()
    p.resumed_already = ["a1"]  # resumed inside the recheck reservation: no second (invalid) resume
    assert p.commands() == [] and "resume: a1" in p.lines()


def test_plan_refuses_when_too_many_fail():
    findings = [_f("mtu", n, Status.FAIL) for n in NODES[:3]] + [_f("ssh", n, Status.PASS) for n in NODES]
    p = drain.plan(findings, NODES, _state(), drain=True, resume=False)
    assert p.drain == {} and "3 nodes of the 10 checked in this run failed (30% > --max-drain-fraction 20%)" in p.refused
    assert "drained nothing (would have drained a[1-3])" in p.refused
    assert set(drain.plan(findings, NODES, _state(), drain=True, resume=False, max_fraction=0.3).drain) == {"a1", "a2", "a3"}


def test_root_cause_not_its_consequence_names_the_drain():
    """nic FAILs (data link down); mtu and ports say "not tested: no data interface" as ERROR. The ERROR
    ranks above the FAIL, yet the drain reason and the first line shown are the nic FAIL."""
    from preflight.output import report

    findings = [_f("ssh", n, Status.PASS) for n in NODES] + [
        _f("nic", "a3", Status.FAIL, "no data interface: ib0 is DOWN (expected UP)"),
        _f("mtu", "a3", Status.ERROR, "not tested: no data interface (see the nic check)"),
        _f("ports", "a3", Status.ERROR, "not tested: no data interface (see the nic check)")]
    p = drain.plan(findings, NODES, _state(), drain=True, resume=False)
    assert p.drain == {"a3": "preflight: nic: no data interface: ib0 is DOWN (expected UP)"}
    assert report.sort_findings(findings)[0].check == "nic"
    # its healthy-but-unusual twin: an ERROR of its own (a probe that crashed) beside no FAIL is the cause
    alone = [_f("ssh", "a3", Status.PASS), _f("mtu", "a3", Status.ERROR, "not tested: x"),
             _f("gpu", "a3", Status.ERROR, "probe failed: nvidia-smi timed out")]
    assert drain.worst_findings(alone)["a3"].check == "gpu"


def test_unavailable_nodes_are_set_aside_not_failed_nor_counted():
    """Slurm had a5 drained by hand and a6 DOWN, and preflight's own drain of a7 was not rechecked (no
    --resume): none is this run's failure; 2 real failures of 7 checked nodes exceed 20%, and the
    refusal says so with those figures."""
    from preflight.output import report

    out = {"a5": {"state": ["IDLE", "DRAIN"], "reason": "disk replaced by hand"},
           "a6": {"state": ["DOWN", "NOT_RESPONDING"], "reason": "Not responding"},
           "a7": {"state": ["IDLE", "DRAIN"], "reason": "preflight: gpu: old"}}
    found = [_f("ssh", n, Status.PASS) for n in NODES if n not in out] + [_f("ssh", n, Status.FAIL, "Slurm reports") for n in out]
    found += [Finding("gpu", n, Status.ERROR, "not checked: node unreachable (see ssh)", data={"not_run": "unreachable"}) for n in out]
    found += [_f("gpu", "a1", Status.FAIL), _f("gpu", "a2", Status.FAIL)]
    findings = drain.set_aside(found, out)
    status = report.node_statuses(findings, NODES)
    assert {n for n, s in status.items() if s == "unavailable"} == {"a5", "a6", "a7"}
    assert [f for f in findings if f.node == "a6"][0].message == "Slurm marked it DOWN+NOT_RESPONDING (reason: Not responding); not checked"
    assert not any(f.status.is_problem for f in findings if f.node in out)
    state = _state(**out)
    p = drain.plan(findings, NODES, state, drain=True, resume=True)
    assert p.left_alone == {"a5": "drained by someone else: disk replaced by hand",
                            "a6": "Slurm marked it DOWN+NOT_RESPONDING: Not responding"}
    assert p.resume == []  # a7 was not checked: it stays drained
    assert "2 nodes of the 7 checked in this run failed (29% > --max-drain-fraction 20%; 3 unavailable" in p.refused
    assert set(drain.plan(findings, NODES, state, drain=True, resume=False, max_fraction=0.3).drain) == {"a1", "a2"}
    # --count-unavailable: they fail (exit 1), but are still never drained again nor resumed
    strict = drain.set_aside(found, out, strict=True)
    assert {n for n, s in report.node_statuses(strict, NODES).items() if s == "fail"} == {"a1", "a2", "a5", "a6", "a7"}
    assert any(line.startswith("leave as Slurm has them (out of service already) 3 nodes: a[5-7]")
               for line in report.actions(strict, NODES))
    assert drain.plan(strict, NODES, state, drain=True, resume=True, max_fraction=0.9).drain.keys() == {"a1", "a2"}


def test_cli_usage_errors_are_one_line(capsys, monkeypatch):
    from preflight import cli

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    assert cli.main(["check", "--drain"]) == 2
    assert "--drain/--resume act on Slurm or Kubernetes nodes; add --slurm or --k8s" in capsys.readouterr().err
    assert cli.main(["check", "--slurm", "--no-progress"]) == 2
    assert "needs an allocation" in capsys.readouterr().err


def test_drain_with_an_ssh_inventory_is_a_usage_error(capsys, tmp_path):
    from preflight import cli

    inv = tmp_path / "hosts.yaml"
    inv.write_text("nodes:\n  - a[1-2]\n")
    assert cli.main(["check", str(inv), "--drain", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "uses transport ssh" in err and "transport: slurm" in err and "Traceback" not in err
    assert cli.main(["check", "--slurm", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needs an allocation (SLURM_JOB_ID is not set)" in err and "Traceback" not in err


@pytest.mark.parametrize("line, gpus", [
    # Slurm 22.05 (recorded from tests/sim/slurm.py): no GRES on the nodes
    ("JobId=1 JobName=preflight UserId=root(0) NumNodes=2 NumCPUs=2 NumTasks=2 TRES=cpu=2,mem=128M,node=2,billing=2 "
     "Socks/Node=* NtasksPerN:B:S:C=0:0:*:*", 0),
    ("JobId=7 ReqTRES=cpu=16,node=2,gres/gpu=16 AllocTRES=cpu=256,node=2,billing=256,gres/gpu=16", 16),
    ("JobId=8 TRES=cpu=64,node=1,gres/gpu=8,gres/gpu:h100=8", 8),
    ("JobId=9 TRES=cpu=64,node=1,gres/gpu:a100=4,gres/gpu:v100=2", 6),
    ("JobId=10 NumNodes=1", 0),
    # Slurm 22.05 `scontrol -d -o show job` (tests/sim/slurm.py with Gres=gpu:2): TRES leaves GRES out
    # unless AccountingStorageTRES tracks gres/gpu; JOB_GRES has the job's total
    ("JobId=1 NumNodes=2 TRES=cpu=2,mem=128M,node=2,billing=2 Socks/Node=* CoreSpec=* JOB_GRES=gpu:4   "
     "Nodes=n[001-002] CPU_IDs=0 Mem=64 GRES=gpu:2(IDX:0-1) MinCPUsNode=1 TresPerNode=gres:gpu:2", 4),
    ("JobId=3 TRES=cpu=2,mem=128M,node=2,billing=2 CoreSpec=* JOB_GRES=(null)   Nodes=n[001-002] GRES= ", 0),
    ("JobId=4 JOB_GRES=gpu:h100:16,gpu:a100:8 Nodes=g[01-02] GRES=gpu:h100:8(IDX:0-7)", 24),
])
def test_job_gpus_from_tres(line, gpus):
    assert job_gpus(line) == gpus


def test_slurm_python_is_validated_before_anything_is_allocated(capsys):
    from preflight import cli
    from preflight.slurm import allocation

    assert cli.main(["check", "--slurm", "--nodelist", "n1", "--python", "python3; rm -rf /", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--python 'python3; rm -rf /' is not an interpreter name or absolute path" in err and len(err.splitlines()) == 1
    assert allocation.checked_python(None) == "python3" and allocation.checked_python("/opt/py/bin/python3") == "/opt/py/bin/python3"
    # the job's time limit and the reservation: the wait plus three phases of the per-node deadline plus a minute
    assert allocation.run_budget(20) == 120 and allocation.run_budget(None) == 240


def test_a_node_no_check_decided_is_not_drained_and_not_in_the_blast_radius():
    """Its worst finding is an ERROR with action retest (a result damaged in transit, a probe that could
    not decide): nothing is known to be broken there, so --drain leaves it in service and says so; its
    twin, a decided FAIL, is drained as before."""
    from preflight.model import with_action

    findings = [_f("ssh", n, Status.PASS) for n in NODES if n not in ("a2", "a3")] + [
        with_action(_f("ssh", "a2", Status.ERROR, "probe bundle exited 0 without a result: result damaged in transit"), "isolate"),
        with_action(_f("ib_hca", "a3", Status.FAIL, "mlx5_0 port 1: state DOWN (expected ACTIVE)"), "isolate")]
    p = drain.plan(findings, NODES, _state(), drain=True, resume=False, max_fraction=0.1)
    assert p.drain == {"a3": "preflight: ib_hca: mlx5_0 port 1: state DOWN (expected ACTIVE)"}  # 1 of 10: within 10%
    assert p.undecided == ["a2"] and p.refused is None
    assert "not drained: a2 (no check decided a fault there: retest)" in p.lines()
    # a preflight-drained node that only errors now is not resumed either: it was not proven healthy
    p = drain.plan(findings, NODES, _state(a2={"state": ["IDLE", "DRAIN"], "reason": "preflight: gpu: x"}),
                   drain=False, resume=True)
    assert p.resume == [] and p.undecided == ["a2"]


def test_a_damaged_result_is_a_retest_for_the_ssh_check_and_a_dead_node_still_fails():
    from preflight.checks.ssh import rule as ssh_rule
    from preflight.model import FAILURE_KINDS, NodeInfo

    nodes = [NodeInfo(name=n, host=n, gpus_per_node=0) for n in ("n1", "n2")]
    view = builders.view({},
                         nodes=nodes,
                         cluster={FAILURE_KINDS: {"n1": "damaged", "n2": "unreachable"}},
                         unreachable={"n1": "probe bundle exited 0 without a result: result damaged in transit: CRC32 1 expected 2",
                                      "n2": "unreachable: connection refused (198.18.0.3:22)"})
    by_node = {f.node: f for f in ssh_rule.rule(view)}
    assert by_node["n1"].status is Status.ERROR and by_node["n1"].action == "retest"
    assert "damaged in transit" in by_node["n1"].message
    assert by_node["n2"].status is Status.FAIL and by_node["n2"].action == "isolate"


def test_srun_failing_for_the_controller_is_no_verdict_on_the_nodes():
    """srun's stderr when slurmctld answers too late (recorded at 512 simulated nodes on 2 cores): every node
    of the step would have read 'probe bundle gave no result' FAIL isolate; it is a retest naming Slurm's
    controller. The twin: a task that a node's slurmd failed to launch still names that node."""
    from preflight.checks.ssh import rule as ssh_rule
    from preflight.model import FAILURE_KINDS, NodeInfo
    from preflight.slurm.scontrol import controller_failure

    said = ("srun: error: Unable to confirm allocation for job 1: Socket timed out on send/recv operation\n"
            "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 1\n")
    assert controller_failure(said) == "Unable to confirm allocation for job 1: Socket timed out on send/recv operation"
    assert controller_failure("srun: error: Unable to create step for job 7: Job/step already completing or "
                              "completed\n").startswith("Unable to create step for job 7: Job/step")
    # the job ended under the step (recorded at 1,000 simulated nodes: Slurm ended it for one DOWN node)
    assert controller_failure("srun: error: Slurm job 1 has expired\n") == "Slurm job 1 has expired"
    node_side = "srun: error: Task launch for StepId=1.2 failed on node n385: Communication connection failure\n"
    assert controller_failure(node_side) is None and parse_srun_stderr(node_side)[0] == {
        "n385": "Communication connection failure"}
    nodes = [NodeInfo(name=n, host=n, gpus_per_node=0) for n in ("n1", "n2")]
    view = builders.view({},
                         nodes=nodes,
                         cluster={FAILURE_KINDS: {"n1": "scheduler", "n2": "protocol"}},
                         unreachable={"n1": "not checked: srun could not run the step (Unable to confirm allocation "
                                            "for job 1: Socket timed out on send/recv operation): Slurm's controller "
                                            "did not answer, not this node",
                                      "n2": "probe bundle gave no result: no output from the task (srun rc 1)"})
    by_node = {f.node: f for f in ssh_rule.rule(view)}
    assert by_node["n1"].status is Status.ERROR and by_node["n1"].action == "retest"
    assert "Slurm's controller" in by_node["n1"].message
    assert by_node["n2"].status is Status.FAIL and by_node["n2"].action == "isolate"
    plan = drain.plan(list(by_node.values()), ["n1", "n2"], _state(), drain=True, resume=False, max_fraction=1.0)
    assert "n1" not in plan.drain and plan.undecided == ["n1"]


def test_sbcast_per_node_errors_are_read_from_its_stderr():
    """sbcast 22.05's stderr (recorded on the simulator: a second sbcast without --force, one node's copy
    removed; a missing destination folder; a dead slurmd): File exists is a node that keeps its copy."""
    from preflight.slurm.broadcast import parse_sbcast_errors

    said = ("sbcast: error: REQUEST_FILE_BCAST(n003): File exists\n"
            "sbcast: error: REQUEST_FILE_BCAST(n004): File exists\n"
            "sbcast: error: REQUEST_FILE_BCAST(n001): No such file or directory\n"
            "sbcast: error: REQUEST_FILE_BCAST(n193): Communication connection failure\n"
            "sbcast: error: something else entirely\n")
    assert parse_sbcast_errors(said) == {"n003": "File exists", "n004": "File exists",
                                         "n001": "No such file or directory", "n193": "Communication connection failure"}
    assert parse_sbcast_errors("") == {}


@pytest.mark.parametrize("text, count, ends", [
    ("n[001-1000]", 1000, ["n001", "n1000"]),  # squeue -o %N on the 1,000-node simulator (Slurm 22.05)
    ("n[001-003,0999-1001]", 6, ["n001", "n1001"]),
    ("gpu-[1-12]", 12, ["gpu-1", "gpu-12"]),
    ("rack[1-2]-n[098-100]", 6, ["rack1-n098", "rack2-n100"]),
    ("n-01-100", 1, ["n-01-100", "n-01-100"]),  # a plain name: only ranges in brackets are read
])
def test_slurm_host_lists_expand_as_slurm_prints_them(text, count, ends):
    from preflight.slurm.scontrol import hostnames

    names = hostnames(text)
    assert len(names) == count and [names[0], names[-1]] == ends
    assert len(set(names)) == count


def test_which_launch_failures_are_about_the_node_itself():
    """srun's launch failures as recorded at 1,000 simulated nodes: a slurmd that is not running (the node's
    own connection refused) against a timeout, which Slurm's forwarding gives every node of a late
    forwarder's subtree (n[104-153] and seven more runs of 50 there, all healthy)."""
    said = ("srun: error: Task launch for StepId=1.0 failed on node n751: Communication connection failure\n"
            "srun: error: Task launch for StepId=2.1 failed on node n104: Socket timed out on send/recv operation\n"
            "srun: error: Application launch failed: Socket timed out on send/recv operation\n")
    launch, _ = parse_srun_stderr(said)
    assert launch == {"n751": "Communication connection failure", "n104": "Socket timed out on send/recv operation"}
    assert LAUNCH_REFUSED_RE.search(launch["n751"]) and not LAUNCH_REFUSED_RE.search(launch["n104"])


def test_a_job_that_lost_a_node_is_slurms_doing():
    """srun's words when the step names more nodes than the job still holds (recorded at 1,000 simulated
    nodes: slurmctld set one DOWN mid-run and --no-kill kept the job): no task ran anywhere, and before this
    every one of the 999 nodes was a FAIL isolate, 'probe bundle gave no result'."""
    from preflight.slurm.scontrol import controller_failure

    said = "srun: error: Only allocated 998 nodes asked for 999\n"
    assert controller_failure(said) == "Only allocated 998 nodes asked for 999"
    assert parse_srun_stderr(said) == ({}, {})


def test_srun_aborting_a_step_for_an_io_error_names_the_node_index_and_no_launch_failure():
    """srun 22.05's words, recorded when one slurmstepd's I/O connection was reset (tests/actions/test_slurm_ops.py):
    the whole step ends and every unfinished task reads "Killed", which alone would blame each node."""
    from preflight.slurm.scontrol import STEP_ABORT_RE

    said = ("srun: error: _server_read: fd 13 error reading header: Connection reset by peer\n"
            "srun: error: step_launch_notify_io_failure: aborting, io error with slurmstepd on node 1\n"
            "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\n"
            "srun: error: n003: task 2: Killed\n"
            "srun: error: n002: task 1: Killed\n")
    assert STEP_ABORT_RE.search(said).group(1) == "1"
    assert STEP_ABORT_RE.search("srun: error: Aborting, io error and missing step on node 7\n").group(1) == "7"
    launch, exits = parse_srun_stderr(said)
    assert launch == {} and exits == {"n003": "Killed", "n002": "Killed"}
    # its twin: a task killed on its node (the OOM killer) with the step going on says no such line
    assert STEP_ABORT_RE.search("srun: error: n227: task 226: Killed\n") is None


def test_sbcast_meeting_a_dropped_connection_names_that_node_instead_of_dying_of_sigpipe(tmp_path):
    """At 1,000 simulated nodes sbcast died of SIGPIPE (rc -13) writing to a slurmd that had dropped its
    connection, and the bundle went on srun's stdin to all 999 nodes (680 MB). An `sbcast` on PATH here gets
    the same signal (kill -PIPE itself): run as preflight runs it, it lives on and names the node, and the
    broadcast file is used for the rest."""
    from preflight.slurm import broadcast

    fake = tmp_path / "sbcast"
    fake.write_text("#!/bin/sh\nkill -PIPE $$\necho 'sbcast: error: REQUEST_FILE_BCAST(n002): Broken pipe' >&2\nexit 1\n")
    fake.chmod(0o755)
    got = broadcast.deliver("7", ["n001", "n002", "n003"], b"zip", env=dict(os.environ, PATH="%s:%s" % (tmp_path, os.environ["PATH"])))
    assert got.file is not None and got.why == "", got.why
    assert got.node_errors == {"n002": "Broken pipe"}

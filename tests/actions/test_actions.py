"""Actions on failing findings (model, engine default, console grouping, JUnit, Prometheus) and the
GPU serial/UUID history (report hardware section, diff: replaced GPUs and lemons)."""

import pytest

from preflight import engine
from preflight.output import diff
from preflight.output import junit
from preflight.output import prometheus
from preflight.output import report
from preflight.model import ACTIONS, Finding, Status, with_action
from tests.history.test_history_diff import _report as diff_report
from tests.output.test_junit import _report as junit_report
from tests.output.test_report import make_report, render
from tests import builders


def test_action_round_trips_and_is_validated():
    f = Finding("gpu", "n1", Status.FAIL, "GPU 3 gone", action="isolate")
    assert Finding.from_json(f.to_json()) == f and f.to_json()["action"] == "isolate"
    assert "action" not in Finding("gpu", "n1", Status.PASS, "ok").to_json()
    with pytest.raises(ValueError, match="use one of isolate"):
        Finding("gpu", "n1", Status.FAIL, "x", action="pray")
    assert ACTIONS == ("isolate", "reboot", "reset_gpu", "fix_config", "check_app", "retest")


def test_default_action_fills_fail_and_error_only():
    assert with_action(Finding("c", "n", Status.FAIL, "m"), "fix_config").action == "fix_config"
    assert with_action(Finding("c", "n", Status.ERROR, "m"), "fix_config").action == "retest"
    assert with_action(Finding("c", "n", Status.FAIL, "m", action="reboot"), "isolate").action == "reboot"
    assert with_action(Finding("c", "n", Status.WARN, "m"), "isolate").action is None


def test_every_check_declares_a_valid_default_action():
    from preflight import checks

    for name, check in checks.catalogue().items():
        assert check.action in ACTIONS, name


def test_engine_judge_applies_the_check_default():
    from preflight.model import NodeInfo

    view = builders.view({"n1": {"ssh": {"probe_error": "boom"}}},
                         nodes=[NodeInfo("n1", "h", 0)], unreachable={"n2": "refused"})
    out = engine.judge(view, ["ssh", "nccl_env"])
    assert all(f.action for f in out if f.status.is_problem), out
    assert any(f.check == "nccl_env" and f.node == "n2" and f.action == "retest" for f in out)


def test_console_groups_failures_by_action():
    findings = [
        Finding("ib_errors", "gpu-0002", Status.FAIL, "link flap", action="isolate"),
        Finding("gpu", "gpu-0003", Status.FAIL, "GPU 1 ECC", action="isolate"),
        Finding("gpu", "gpu-0002", Status.FAIL, "GPU 4 ECC", action="reset_gpu"),
        Finding("xid", "gpu-0004", Status.FAIL, "Xid 79", action="reboot"),
    ] + [Finding("nccl_env", "gpu-%04d" % i, Status.FAIL, "stale", action="fix_config") for i in range(1, 6)]
    lines = report.actions(findings, ["gpu-%04d" % i for i in range(1, 6)])
    assert lines == [
        "drain (isolate) 2 nodes: gpu-[0002-0003] (ib_errors, gpu)",
        "reboot 1 node: gpu-0004 (xid)",
        "fix the config on 2 nodes: gpu-[0001,0005] (nccl_env)",
    ]
    everywhere = report.actions([Finding("nccl_env", "gpu-%04d" % i, Status.FAIL, "s", action="fix_config") for i in range(1, 4)],
                                ["gpu-0001", "gpu-0002", "gpu-0003"])
    assert everywhere == ["fix the config on all 3 nodes (nccl_env)"]
    text = render(make_report(3, [Finding("ssh", "gpu-0002", Status.FAIL, "unreachable", action="isolate")]))
    assert "what to do\n  drain (isolate) 1 node: gpu-0002 (ssh)" in text


def test_junit_and_prometheus_carry_the_action():
    doc = junit_report([
        {"check": "ib_errors", "node": "n001", "status": "fail", "message": "link flap", "action": "isolate"},
        {"check": "ssh", "node": "n001", "status": "pass", "message": "ok"},
    ])
    xml = junit.to_junit(doc)
    assert 'type="fail:isolate"' in xml and "action isolate" in xml
    text = prometheus.to_prometheus(doc)
    assert 'preflight_check_action{check="ib_errors",node="n001",action="isolate"} 1' in text


def _hw(**nodes):
    return {n: {"gpus": [dict(index=i, pci_bus_id="00000000:%02X:00.0" % (0x18 + i), uuid="GPU-%s-%d" % (s, i), serial=s, failed=f)
                         for i, (s, f) in enumerate(gpus)]} for n, gpus in nodes.items()}


def test_diff_names_a_replaced_gpu_and_a_lemon_back_in_the_fleet():
    old = diff_report()
    old["hardware"] = _hw(n001=[("1650923000111", False), ("1650923000222", True)], n002=[("1650923000333", False)])
    new = diff_report(started_at="2026-11-23T13:30:00Z")
    new["hardware"] = _hw(n001=[("1650923000111", False), ("1650923000999", False)], n002=[("1650923000222", False)])
    result = diff.diff(old, new)
    assert [(c.node, c.slot, c.old_serial, c.serial) for c in result.gpus_replaced] == [
        ("n001", "00000000:19:00.0", "1650923000222", "1650923000999"),
        ("n002", "00000000:18:00.0", "1650923000333", "1650923000222"),
    ]
    assert [(c.serial, c.node, c.old_node, c.old_slot) for c in result.lemons] == [
        ("1650923000222", "n002", "n001", "00000000:19:00.0")
    ]
    lines = diff.render_diff(result)
    assert "  serial 1650923000222: now n002 00000000:18:00.0; failed on n001 00000000:19:00.0" in lines
    assert "  n001 00000000:19:00.0: serial 1650923000222 -> 1650923000999" in lines
    assert result.has_changes and not result.has_regressions


def test_diff_without_hardware_sections_reports_no_gpu_changes():
    result = diff.diff(diff_report(), diff_report(started_at="2026-11-23T13:30:00Z"))
    assert result.gpus_replaced == [] and result.lemons == []


def test_report_json_carries_gpu_serials_and_per_gpu_failure():
    from preflight.model import NodeInfo

    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0", "uuid": "GPU-a", "serial": "111", "ecc_uncorrectable_volatile": 2},
            {"index": 1, "pci_bus_id": "00000000:2A:00.0", "uuid": "GPU-b", "serial": "222"}]
    view = builders.view({"n1": {"gpu": {"gpus": gpus}}, "n2": {}},
                         nodes=[NodeInfo("n1", "h", 2), NodeInfo("n2", "h2", 0)])
    hw = report.hardware(view)
    assert hw == {"n1": {"gpus": [
        {"index": 0, "pci_bus_id": "00000000:18:00.0", "uuid": "GPU-a", "serial": "111", "failed": True},
        {"index": 1, "pci_bus_id": "00000000:2A:00.0", "uuid": "GPU-b", "serial": "222", "failed": False},
    ]}}


# --- Slurm: whose a node is just before preflight acts, and whose a leftover is (issue 39 items 3, 5) -------


def test_a_node_someone_drained_or_set_down_is_left_alone_and_resume_needs_preflights_drain():
    from preflight.slurm.scontrol import left_alone_why

    rma = {"state": ["IDLE", "DRAIN"], "reason": "RMA bad DIMM, do not return"}
    assert left_alone_why("drain", rma) == "drained by someone else: RMA bad DIMM, do not return"
    assert left_alone_why("resume", rma) == "drained by someone else: RMA bad DIMM, do not return"
    assert left_alone_why("drain", {"state": ["DOWN*"], "reason": "PSU"}) == "Slurm marked it DOWN*: PSU"
    assert left_alone_why("drain", {"state": ["ALLOCATED", "DRAIN"], "reason": None}) == "drained by someone else: ALLOCATED+DRAIN"
    # the twins: preflight's own drain (also the node-mode wrapper's) and a node in service are preflight's to act on
    ours = {"state": ["IDLE", "DRAIN"], "reason": "preflight: FAIL nic: eth1 down"}
    assert left_alone_why("drain", ours) is None and left_alone_why("resume", ours) is None
    assert left_alone_why("drain", {"state": ["IDLE"], "reason": None}) is None
    assert left_alone_why("resume", {"state": ["IDLE"], "reason": None}) == "not drained any more: Slurm reports it IDLE"


def test_apply_rereads_each_node_and_leaves_a_mid_run_drain_alone():
    import subprocess

    from preflight.slurm import drain
    from preflight.slurm.scontrol import SlurmError

    p = drain.Plan(drain={"n002": "preflight: mtu: lost", "n003": "preflight: mtu: lost"}, resume=["n004"])
    now = {"n002": {"state": ["IDLE"], "reason": None}, "n003": {"state": ["IDLE", "DRAIN"], "reason": "RMA"},
           "n004": {"state": ["IDLE", "DRAIN"], "reason": "preflight: old"}}
    ran = []
    errors = drain.apply(p, lambda argv: ran.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""), now.__getitem__)
    assert errors == [] and [a[2] for a in ran] == ["nodename=n002", "nodename=n004"]
    assert p.lines() == ["drain: n002", "resume: n004", "left alone: n003 (drained by someone else during this run: RMA)"]

    def unreadable(node):
        raise SlurmError("scontrol show node %s failed: timed out" % node)

    p, ran = drain.Plan(drain={"n002": "preflight: x"}), []
    errors = drain.apply(p, lambda argv: ran.append(argv), unreadable)
    assert ran == [] and errors == ["could not re-read n002 before its drain (scontrol show node n002 failed: timed out): "
                                    "left as it is"]


def test_a_leftover_names_its_owner_and_is_dead_only_when_its_process_is_gone_here():
    import os

    from preflight.slurm import leftovers

    mine = leftovers.owner_name()
    pid, start, host = leftovers.owner(mine)
    assert pid == os.getpid() and leftovers.alive(mine) is True
    dead = "preflight-0123abcd-%d-%s-%s" % (pid, int(start) + 1, host)  # the same pid, another process: reused
    assert leftovers.alive(dead) is False
    assert leftovers.alive("preflight-0123abcd-1-2-another-host.example") is None  # cannot be asked from here
    assert leftovers.owner("preflight-test") is None and leftovers.owner("preflight-0123abcd") is None
    assert leftovers.parse_jobs("12 preflight-x\n13 user job\n") == {"preflight-x": ["12"], "user job": ["13"]}
    text = ("ReservationName=preflight-0123abcd-1-2-h StartTime=2026-11-28T05:47:22 EndTime=2027-11-28T05:47:22 "
            "Duration=365-00:00:00 Nodes=n[003-004] NodeCnt=2 Flags=MAINT,FLEX,IGNORE_JOBS,SPEC_NODES\n")
    assert leftovers.parse_reservations(text) == {"preflight-0123abcd-1-2-h": ["n003", "n004"]}
    assert leftovers.parse_reservations("No reservations in the system\n") == {}

"""fabric_manager check: systemctl show / version parsers, NVSwitch detection in sysfs trees, probe, rule."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest

from preflight.checks import fabric_manager as fm
from preflight.checks.fabric_manager import probe as fm_probe
from preflight.checks.fabric_manager import rule as fm_rule
from preflight.model import NodeInfo, ParseError, Status
from preflight.probe.context import NodeContext
from tests.fixture_cases import fixture_dir, meta
from tests.builders import view

FIX = fixture_dir("fabric_manager")
GPU_FIX = fixture_dir("gpu")
#: /sys/module/nvidia/version in each recorded sysfs tree (tests/fixtures/fabric_manager/sysfs/<tree>).
TREE_DRIVER = {"hgx_a100": "535.129.03", "hgx_h100": "550.54.15", "pcie_h100": "550.54.15"}




def gpu_facts(case):
    with open(os.path.join(GPU_FIX, case + ".json")) as fh:
        return json.load(fh)["expected"]


# ---------------------------------------------------------------------------------------------- parsers


# parse_* and find_nvswitches cases: tests/fixtures/fabric_manager/**/*.json, run by tests/checks/test_fixtures.py


def test_systemctl_fixtures_ran_the_command_the_probe_runs():
    for path in sorted(glob.glob(os.path.join(FIX, "systemctl_show_*.json"))):
        with open(path) as fh:
            case = json.load(fh)
        assert case["command"].startswith("systemctl show nvidia-fabricmanager --property=")
        assert case["command"].endswith(",".join(fm_probe.PROPERTIES))


def test_systemctl_show_without_states_is_a_parse_error():
    with pytest.raises(ParseError, match="no LoadState"):
        fm_probe.parse_systemctl_show("Result=success\n")


# ------------------------------------------------------------------------------------------------ probe


def fake_tools(bindir, show_case, version_case):
    os.makedirs(bindir, exist_ok=True)
    for name, text in (
        ("systemctl", '#!/bin/sh\n[ "$1 $2" = "show nvidia-fabricmanager" ] && exec cat "%s"\nexit 1\n'
         % os.path.join(FIX, show_case + ".txt")),
        ("nv-fabricmanager", '#!/bin/sh\n[ "$1" = --version ] && exec cat "%s"\nexit 1\n'
         % os.path.join(FIX, version_case + ".txt")),
    ):
        path = os.path.join(bindir, name)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o755)


@pytest.mark.parametrize(
    "tree,show,version,want_state,want_version",
    [
        ("hgx_h100", "systemctl_show_active", "nv_fabricmanager_version_550", "active", "550.54.15"),
        ("hgx_a100", "systemctl_show_failed", "nv_fabricmanager_version_535", "failed", "535.129.03"),
    ],
)
def test_probe_on_nvswitch_node(tmp_path, monkeypatch, tree, show, version, want_state, want_version):
    fake_tools(str(tmp_path), show, version)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % tmp_path)
    root = os.path.join(FIX, "sysfs", tree)
    facts = fm_probe.probe(NodeContext(sysfs_root=root))
    assert facts["nvswitches"] == meta(root + ".json")["expected"]
    assert facts["driver_version"] == TREE_DRIVER[tree]
    assert facts["service"] == meta(os.path.join(FIX, show + ".txt"))["expected"]
    assert facts["service"]["ActiveState"] == want_state
    assert facts["fm_version"] == want_version and facts["service_error"] is None
    json.dumps(facts)


def test_probe_without_nvswitch_asks_only_for_imex(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither systemctl nor nv-fabricmanager exists
    facts = fm_probe.probe(NodeContext(sysfs_root=os.path.join(FIX, "sysfs", "pcie_h100")))
    assert facts == {
        "nvswitches": [],
        "service": None,
        "service_error": None,
        "fm_version": None,
        "driver_version": "550.54.15",
        "imex": None,  # read for GB200/GB300 trays; judged only where the GPUs report fabric state
        "imex_error": "systemctl not found",
        "imex_channels": [],
    }


def test_probe_without_systemctl(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = fm_probe.probe(NodeContext(sysfs_root=os.path.join(FIX, "sysfs", "hgx_h100")))
    assert facts["service"] is None and facts["service_error"] == "systemctl not found" and facts["fm_version"] is None


# ------------------------------------------------------------------------------------------------- rule

SWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]


def fm_facts(state="active", version="550.54.15", driver="550.54.15", switches=SWITCHES, service=True):
    show = {"active": "systemctl_show_active", "failed": "systemctl_show_failed", "not-found": "systemctl_show_not_found"}[state]
    return {
        "nvswitches": list(switches),
        "service": copy.deepcopy(meta(os.path.join(FIX, show + ".txt"))["expected"]) if service else None,
        "service_error": None if service else "systemctl not found",
        "fm_version": version,
        "driver_version": driver,
    }


def run(facts, gpu="h100_hgx_550", gpus_per_node=8):
    node = NodeInfo("gpu-001", "h", gpus_per_node)
    entry = {"fabric_manager": facts}
    if gpu:
        entry["gpu"] = gpu_facts(gpu)
    return [(f.status, f.message) for f in fm_rule.rule(view({"gpu-001": entry}, nodes=[node]))]


def test_rule_passes_healthy_h100():
    assert run(fm_facts()) == [
        (Status.PASS, "4 NVSwitches, nvidia-fabricmanager active (running), version 550.54.15, fabric Completed on 8 GPUs")
    ]


def test_rule_skips_without_nvswitch_and_on_cpu_nodes():
    assert run(fm_facts(switches=[], service=False), gpu=None) == [
        (Status.SKIP, "no NVSwitch on this node (PCIe/NVLink-bridge system): fabric manager not needed")
    ]
    assert run(fm_facts(), gpu=None, gpus_per_node=0) == [(Status.SKIP, "CPU-only node (gpus_per_node: 0)")]


def test_rule_fails_failed_service_and_stuck_fabric():
    found = run(fm_facts(state="failed"), gpu="h100_fabric_in_progress")
    assert found[0] == (
        Status.FAIL,
        "nvidia-fabricmanager is failed (Result=exit-code, exit status 1); NCCL init will hang on this node",
    )
    assert found[1] == (Status.FAIL, "GPU 0 (0000:18:00.0): fabric state In Progress, status N/A (expected Completed/Success)")
    assert len(found) == 1 + 8


def test_rule_fails_not_installed():
    assert run(fm_facts(state="not-found", version=None), gpu="a100_hgx_535") == [
        (Status.FAIL, "nvidia-fabricmanager is not installed (LoadState=not-found); NCCL init will hang on this node")
    ]


def test_rule_fails_version_mismatch():
    assert run(fm_facts(version="535.129.03")) == [
        (Status.FAIL, "fabric manager 535.129.03 does not match driver 550.54.15 (expected the same version)")
    ]


def test_rule_falls_back_to_gpu_driver_version():
    assert run(fm_facts(version="550.54.14", driver=None)) == [
        (Status.FAIL, "fabric manager 550.54.14 does not match driver 550.54.15 (expected the same version)")
    ]


def test_rule_without_systemctl_judges_by_fabric_state():
    assert run(fm_facts(service=False, version=None)) == [
        (Status.PASS, "4 NVSwitches, fabric Completed on 8 GPUs (nvidia-fabricmanager state unreadable: systemctl not found)")
    ]
    assert run(fm_facts(service=False, version=None), gpu="a100_hgx_535") == [
        (Status.WARN, "cannot verify nvidia-fabricmanager: systemctl not found")
    ]


def test_rule_warns_unknown_version():
    assert run(fm_facts(version=None)) == [
        (Status.WARN, "fabric manager version unknown (nv-fabricmanager --version did not answer)")
    ]


def test_rule_errors_without_facts():
    nodes = [NodeInfo("a", "a", 8), NodeInfo("b", "b", 8)]
    found = fm_rule.rule(view({"a": {"fabric_manager": {"probe_error": "boom"}}, "b": {}}, nodes=nodes))
    assert [(f.node, f.status) for f in found] == [("a", Status.ERROR), ("b", Status.ERROR)]


def test_check_declaration():
    assert fm.CHECK.name == "fabric_manager" and fm.CHECK.needs == ("gpu",)


# ------------------------------------------------------------------------------------ simulated hardware


def test_sim_fabric_manager_failed_and_driver_outlier(tmp_path, monkeypatch):
    from preflight.checks.gpu import probe as gpu_probe
    from tests.sim import gpu_hw
    from tests.builders import StubNode

    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(12)))
    node = StubNode(tmp_path)
    gpu_hw.install_gpus(node, "h100")
    switches = gpu_hw.install_nvswitches(node)
    gpu_hw.install_fabric_manager(node, active=True)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    ctx = NodeContext(sysfs_root=node.sys_dir)

    def judge():
        facts = {"fabric_manager": fm_probe.probe(ctx), "gpu": gpu_probe.probe(ctx)}
        return [(f.status, f.message) for f in fm_rule.rule(view({"n001": facts}, nodes=[NodeInfo("n001", "h", 8)]))]

    assert fm_probe.find_nvswitches(ctx) == switches
    assert judge() == [
        (Status.PASS, "4 NVSwitches, nvidia-fabricmanager active (running), version 550.54.15, fabric Completed on 8 GPUs")
    ]
    gpu_hw.set_driver_version(node, "550.90.07")
    assert judge() == [(Status.FAIL, "fabric manager 550.54.15 does not match driver 550.90.07 (expected the same version)")]
    gpu_hw.install_fabric_manager(node, active=False, version="550.90.07")
    found = judge()
    assert found[0][1].startswith("nvidia-fabricmanager is failed (Result=exit-code")
    assert found[1] == (Status.FAIL, "GPU 0 (0000:18:00.0): fabric state In Progress, status N/A (expected Completed/Success)")
    assert ctx.run(["systemctl", "restart", "nvidia-fabricmanager"]).rc == 1

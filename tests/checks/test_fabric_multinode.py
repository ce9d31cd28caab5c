"""fabric_manager on trays without an NVSwitch PCI function (GB200/GB300), and systemctl messages (issue 12)."""

from __future__ import annotations

import copy
import json
import os

from preflight.checks.fabric_manager import probe as fm_probe
from preflight.checks.fabric_manager import rule as fm_rule
from preflight.model import NodeInfo, Status
from preflight.probe.context import NodeContext
from tests.fixture_cases import fixture_dir, meta
from tests.builders import view

FIX = fixture_dir("fabric_manager")
GPU_FIX = fixture_dir("gpu")


def gb200(healthy=True):
    facts = copy.deepcopy(meta(os.path.join(GPU_FIX, "gb200_tray_fabric_in_progress.xml"))["expected"])
    if healthy:
        facts["gpus"][3]["fabric"].update({"state": "Completed", "status": "Success"})
    return facts


def imex(case):
    return copy.deepcopy(meta(os.path.join(FIX, "imex_systemctl_show_%s.txt" % case))["expected"])


def tray_facts(imex_case="active", imex_error=None):
    return {
        "nvswitches": [],
        "service": None,
        "service_error": None,
        "fm_version": None,
        "driver_version": "570.133.20",
        "imex": imex(imex_case) if imex_case else None,
        "imex_error": imex_error,
    }


def run(fm_facts, gpu_facts, name="tray01"):
    node = NodeInfo(name, "198.18.0.1", len(gpu_facts["gpus"]) if gpu_facts else 4)
    entry = {"fabric_manager": fm_facts}
    if gpu_facts is not None:
        entry["gpu"] = gpu_facts
    return [(f.status, f.message) for f in fm_rule.rule(view({name: entry}, nodes=[node]))]


def test_gb200_tray_is_judged_by_gpu_fabric_and_imex():
    assert run(tray_facts(), gb200()) == [
        (
            Status.PASS,
            "no NVSwitch PCI function (multi-node NVLink tray): fabric Completed on 4 GPUs, clique 32766 of cluster "
            "8f3e2d1c-4b5a-4c6d-9e8f-0a1b2c3d4e5f, nvidia-imex active (running)",
        )
    ]


def test_gb200_gpu_still_registering_fails():
    found = run(tray_facts(), gb200(healthy=False))
    assert found == [
        (Status.FAIL, "GPU 3 (0019:01:00.0): fabric state In Progress, status N/A (expected Completed/Success)")
    ]


def test_gb200_without_imex_fails():
    found = run(tray_facts("not_found"), gb200())
    assert found == [
        (
            Status.FAIL,
            "nvidia-imex is not installed (LoadState=not-found); multi-node NVLink needs it "
            "(expected loaded, active)",
        )
    ]


def test_gb200_gpus_in_different_cliques_fail():
    facts = gb200()
    facts["gpus"][2]["fabric"]["clique_id"] = 7
    found = run(tray_facts(), facts)
    assert found == [(Status.FAIL, "GPUs of this tray report different NVLink cliques: 32766 (GPU 0, 1, 3), 7 (GPU 2) (expected one)")]


def test_gb200_imex_unreadable_warns():
    found = run(tray_facts(None, "systemctl not found"), gb200())
    assert found == [(Status.WARN, "cannot verify nvidia-imex: systemctl not found")]


def test_pcie_node_still_skips():
    pcie = copy.deepcopy(meta(os.path.join(GPU_FIX, "h100_hgx_550.xml"))["expected"])
    for g in pcie["gpus"]:
        g["fabric"] = None
    assert run(tray_facts(None), pcie)[0][0] is Status.SKIP


def _tool(bindir, name, text):
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, name)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o755)


def test_probe_asks_imex_on_a_tray_without_nvswitch(tmp_path, monkeypatch):
    _tool(str(tmp_path / "bin"), "systemctl",
          '#!/bin/sh\n[ "$1 $2" = "show nvidia-imex" ] && exec cat "%s"\nexit 1\n' % os.path.join(FIX, "imex_systemctl_show_active.txt"))
    (tmp_path / "sys" / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "sys" / "module" / "nvidia" / "version").write_text("570.133.20\n")
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = fm_probe.probe(NodeContext(sysfs_root=str(tmp_path / "sys")))
    assert facts["nvswitches"] == [] and facts["imex"] == imex("active") and facts["imex_error"] is None
    json.dumps(facts)


def test_systemctl_failure_message_has_no_line_break(tmp_path, monkeypatch):
    """Real systemctl in a container without systemd: rc 1, two lines on stderr."""
    _tool(str(tmp_path / "bin"), "systemctl",
          "#!/bin/sh\necho \"System has not been booted with systemd as init system (PID 1). Can't operate.\" >&2\n"
          "echo 'Failed to connect to bus: Host is down' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = fm_probe.probe(NodeContext(sysfs_root=os.path.join(FIX, "sysfs", "hgx_h100")))
    assert facts["service_error"] == (
        "systemctl show failed (rc 1): System has not been booted with systemd as init system (PID 1). "
        "Can't operate. / Failed to connect to bus: Host is down"
    )


def test_h100_with_hidden_nvswitches_is_judged_by_fabric_without_imex():
    """An HGX H100 VM whose NVSwitches are not passed through: all-zero cluster UUID, no IMEX needed."""
    h100 = copy.deepcopy(meta(os.path.join(GPU_FIX, "h100_hgx_550.xml"))["expected"])
    assert run(tray_facts(None, "systemctl not found"), h100) == [
        (Status.PASS, "no NVSwitch PCI function visible (fabric managed outside this OS): fabric Completed on 8 GPUs")
    ]
    stuck = copy.deepcopy(meta(os.path.join(GPU_FIX, "h100_fabric_in_progress.xml"))["expected"])
    found = run(tray_facts(None, "systemctl not found"), stuck)
    assert len(found) == 8 and all(s is Status.FAIL for s, _ in found)

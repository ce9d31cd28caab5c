"""The check catalogue end to end over SSH: each fault the catalogue exists for, on simulated nodes,
must fail with a precise message naming the node and the device; a healthy CPU cluster passes."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.sim import aer_hw, dcgm_hw, gpu_hw, ib_hw, pci_hw
from tests.paths import REPO



#: The end-to-end scenario that makes each check FAIL through the whole CLI and the real interfaces (on
#: simulated nodes; a node-local check may use `preflight node` on this machine with a host root):
#: {check: (test module, test function, the parametrize value that is its case, or None)}. A check in the
#: catalogue without an entry here fails test_every_check_has_an_end_to_end_scenario by name.
SCENARIOS = {
    "ssh": ("e2e.test_transport", "test_dead_and_hung_nodes_are_named_and_the_rest_reported", None),
    "gpu": ("e2e.test_catalogue", "test_hardware_fault_is_named", "gpu_missing"),
    "driver": ("e2e.test_catalogue", "test_hardware_fault_is_named", "driver_outlier"),
    "fabric_manager": ("e2e.test_catalogue", "test_hardware_fault_is_named", "fabric_manager_stopped"),
    "xid": ("e2e.test_hw_checks", "test_fault_on_one_node_is_named", "xid"),
    "nic": ("e2e.test_datanet", "test_data_cable_pulled_fails_those_nodes_and_keeps_management_out_of_the_env", None),
    "ib_hca": ("e2e.test_catalogue", "test_hardware_fault_is_named", "ib_port_down"),
    "cloud_fabric": ("checks.test_cloud_fabric", "test_simulated_p5_nodes_over_ssh_one_without_the_plugin", None),
    "gpu_compute": ("checks.test_gpu_compute", "test_standard_tier_end_to_end_names_the_node_whose_library_corrupts_matmul", None),
    "ib_errors": ("e2e.test_checks_v2", "test_ib_errors_names_the_flapping_port_while_it_flaps", None),
    "gpudirect": ("e2e.test_hw_checks", "test_fault_on_one_node_is_named", "gpudirect"),
    "topology": ("e2e.test_hw_checks", "test_fault_on_one_node_is_named", "topology"),
    "mtu": ("e2e.test_catalogue", "test_mtu_black_hole_names_the_node", None),
    "ports": ("e2e.test_catalogue", "test_master_port_held_on_head", None),
    # a short listen backlog is a WARN (it slows the rendezvous, it breaks nothing): its WARN end to end
    "somaxconn": ("e2e.test_somaxconn", "test_a_head_whose_backlog_is_below_the_ranks_warns_and_its_twins_pass", None),
    "nccl_env": ("e2e.test_checks_v2", "test_nccl_env_names_the_stale_line_in_one_nodes_etc_nccl_conf", None),
    "storage": ("e2e.test_checks_v2", "test_storage_names_the_node_whose_shared_path_is_a_local_directory", None),
    "allreduce": ("e2e.test_allreduce_hangs", "test_mtu_black_hole_hangs_at_a_size_and_the_pairs_name_the_node", None),
    "dcgm": ("e2e.test_catalogue", "test_hardware_fault_is_named", "dcgm_isolate"),
    "pcie": ("e2e.test_catalogue", "test_hardware_fault_is_named", "aer_fatal"),
    # NVLS never FAILs (a performance feature: never a drain): its WARN end to end on a GB200 tray without IMEX
    "nvls": ("e2e.test_gb200", "test_gb200_trays_judged_by_fabric_and_imex_and_nvls", None),
    "limits": ("checks.test_limits", "test_preflight_node_under_an_unlimited_stack_on_an_mnnvl_node", None),
    "gpu_state": ("e2e.test_catalogue", "test_hardware_fault_is_named", "leftover_process"),
    "gpu_memory": ("e2e.test_catalogue", "test_hardware_fault_is_named", "retired_pages_limit"),
    # their FAILs need NVML's two reads (the nvidia-smi simulator gives one sample): through FakeNVML
    "nvlink_errors": ("checks.test_gpu_health", "test_nvlink_replay_or_crc_storm_isolates_a_few_crc_warn", None),
    "gpu_pcie": ("checks.test_gpu_health", "test_pcie_replays_during_the_window_isolate_a_few_warn_old_ones_pass", None),
    "nvbandwidth": ("e2e.test_catalogue", "test_burn_in_nvbandwidth_names_the_gpu_whose_host_copies_are_slow", None),
}


def test_every_check_has_an_end_to_end_scenario():
    """Adding a check is its module + fixtures + tests: this names the check whose end-to-end fault is missing,
    and any entry pointing at a test (or parametrize case) that no longer exists."""
    import importlib

    from preflight import checks

    missing = [n for n in checks.CHECK_NAMES if n not in SCENARIOS]
    assert not missing, (
        "no end-to-end scenario for %s: add a test in tests/test_e2e_*.py that makes it FAIL on a simulated node "
        "(tests/sim: faults through PATH, sysfs, NVML) and name it in SCENARIOS" % ", ".join(missing))
    stale = sorted(set(SCENARIOS) - set(checks.CHECK_NAMES))
    assert not stale, "SCENARIOS names checks the catalogue no longer has: %s" % ", ".join(stale)
    wrong = []
    for check, (module, function, case) in SCENARIOS.items():
        test = getattr(importlib.import_module("tests." + module), function, None)
        if not callable(test):
            wrong.append("%s: tests/%s.py has no %s" % (check, module, function))
            continue
        if case is not None:
            values = [v for mark in getattr(test, "pytestmark", []) if mark.name == "parametrize" for v in mark.args[1]]
            if not any(case in (v if isinstance(v, tuple) else (v,)) for v in values):
                wrong.append("%s: %s.%s has no parametrize case %r" % (check, module, function, case))
    assert not wrong, "\n".join(wrong)


def run_preflight(cluster, inv, *args, timeout=240):
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--json", "-", "--no-progress", *args], cwd=REPO, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def results(doc, check, status=None):
    return [r for r in doc["results"] if r["check"] == check and (status is None or r["status"] == status)]


#: Every simulated node really has this machine's locked-memory limit (8 MiB here): without
#: CAP_SYS_RESOURCE the sandbox cannot raise it, so ib_hca rightly fails it on every node with HCAs.
MEMLOCK = "locked-memory limit"


def hgx(cluster):
    """Present every node as an HGX H100 (tests.sim.pci_hw.install_hgx_h100): 8 GPUs, 4 NVSwitches, fabric
    manager, NCCL, two NDR HCA ports under the PCIe switches of GPU 0 and 1, nvidia_peermem, a clean kernel log."""
    for node in cluster.nodes:
        pci_hw.install_hgx_h100(node)


def test_healthy_cpu_cluster_passes_with_gpu_checks_skipped(sim_cluster):
    cluster = sim_cluster(4, docker0=True)
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--skip", "allreduce")
    assert rc == 0, err
    for check in ("gpu", "fabric_manager", "xid", "gpudirect", "topology"):
        assert {r["status"] for r in results(doc, check)} == {"skip"}
        assert all("gpus_per_node: 0" in r["message"] for r in results(doc, check))
    assert {r["status"] for r in results(doc, "ib_hca")} == {"skip"}
    assert {r["status"] for r in results(doc, "ib_errors")} == {"skip"}
    assert {r["status"] for r in results(doc, "storage")} == {"skip"}  # no cluster.shared_paths
    for check, why in (("dcgm", "gpus_per_node: 0"), ("limits", "gpus_per_node: 0"), ("pcie", "no GPU or network controller"),
                       ("nvls", "gpus_per_node: 0")):
        assert {r["status"] for r in results(doc, check)} == {"skip"}, results(doc, check)
        assert all(why in r["message"] for r in results(doc, check)), results(doc, check)
    assert {r["status"] for r in results(doc, "nccl_env")} == {"pass"}
    for check in ("ssh", "nic", "mtu", "ports"):
        assert {r["status"] for r in results(doc, check)} == {"pass"}, results(doc, check)
    assert doc["summary"]["fail"] == doc["summary"]["error"] == 0
    assert cluster.leftover_processes() == {}


def test_docker0_is_never_chosen(sim_cluster):
    cluster = sim_cluster(3, docker0=True)
    rc, doc, _ = run_preflight(cluster, cluster.inventory(), "--only", "nic", "-v")
    assert rc == 0
    for r in results(doc, "nic"):
        assert r["message"].startswith("eth1 198.19."), r["message"]
        assert "skipped docker0 (container bridge)" in r["message"]


def test_mtu_black_hole_names_the_node(sim_cluster):
    cluster = sim_cluster(4)
    cluster.mtu_blackhole(3)
    rc, doc, _ = run_preflight(cluster, cluster.inventory(), "--only", "mtu")
    assert rc == 1
    failed = results(doc, "mtu", "fail")
    assert {r["node"] for r in failed} == {"n003"}, failed
    messages = " | ".join(r["message"] for r in failed)
    assert "n003 is the common end of 2 failing paths" in messages, messages
    assert "n002 → n003: 8972-byte DF ping lost on two tries (1000-byte ping ok): jumbo frames black-holed" in messages, messages
    print(messages)


def test_master_port_held_on_head(sim_cluster):
    cluster = sim_cluster(3)
    pid = cluster.hold_port(1, 29500)
    rc, doc, _ = run_preflight(cluster, cluster.inventory(), "--only", "ports")
    assert rc == 1
    head = [r for r in results(doc, "ports", "fail") if r["node"] == "n001"]
    assert head, doc["results"]
    assert "port 29500 is held by pid %d" % pid in head[0]["message"], head[0]["message"]
    assert "try --master-port" in head[0]["message"]


@pytest.mark.parametrize(
    "fault,check,node,words",
    [
        ("fabric_manager_stopped", "fabric_manager", "n002", ["nvidia-fabricmanager is failed", "NCCL init will hang"]),
        ("driver_outlier", "driver", "n003", ["535.104.05", "majority 550.54.15"]),
        ("ib_port_down", "ib_hca", "n002", ["mlx5_1 port 1", "DOWN"]),
        ("gpu_missing", "gpu", "n003", ["7 GPUs", "expected 8"]),
        ("memlock_low", "ib_hca", "n001", [MEMLOCK, "is 8 MiB: RDMA memory registration will fail"]),
        ("dcgm_isolate", "dcgm", "n002", ["GPU 2 memory: Detected 2 volatile double-bit ECC error(s)", "DCGM says isolate"]),
        ("aer_fatal", "pcie", "n003", ["GPU 0000:", "1 fatal PCIe error since boot (SDES 1): the link was reset; reboot"]),
        ("leftover_process", "gpu_state", "n002", ["GPU 4 (0000:9A:00.0)", "pid 48213 python3 train.py (61440 MiB)"]),
        ("retired_pages_limit", "gpu_memory", "n003", ["GPU 1 (0000:2A:00.0)", "64 pages retired (32 single-bit, 32 double-bit"]),
    ],
)
def test_hardware_fault_is_named(sim_cluster, fault, check, node, words):
    cluster = sim_cluster(3)
    hgx(cluster)
    target = cluster.node(node)
    if fault == "fabric_manager_stopped":
        gpu_hw.install_fabric_manager(target, active=False)
    elif fault == "driver_outlier":
        gpu_hw.set_driver_version(target, "535.104.05")
    elif fault == "ib_port_down":
        ib_hw.install_hcas(target, [{}, {"state": "DOWN", "phys_state": "Disabled"}])
    elif fault == "gpu_missing":
        gpu_hw.install_gpus(target, "h100", count=7)
    elif fault == "leftover_process":
        gpu_hw.install_gpus(target, "h100", faults={4: "leftover_process"})
    elif fault == "retired_pages_limit":
        gpu_hw.install_gpus(target, "h100", faults={1: "retired_pages_limit"})
    elif fault == "memlock_low":
        pass  # the real limit of every simulated node (see MEMLOCK)
    elif fault == "dcgm_isolate":  # dcgmi everywhere, answering like DCGM 4.x; n002's GPU 2 has double-bit errors
        for each in cluster.nodes:
            dcgm_hw.install_dcgmi(each, "dcgm4_r2_dbe_isolate" if each is target else "dcgm4_r1_pass_4gpu", levels=(1,))
    elif fault == "aer_fatal":  # AER statistics on every GPU and HCA; one surprise-down on n003's first GPU
        for each in cluster.nodes:
            devices = os.path.join(each.sys_dir, "bus", "pci", "devices")
            classes = {bdf: open(os.path.join(devices, bdf, "class")).read() for bdf in sorted(os.listdir(devices))}
            gpus = [bdf for bdf, klass in classes.items() if klass.startswith("0x0302")]
            for bdf, klass in classes.items():
                if klass.startswith(("0x0302", "0x0207")):
                    aer_hw.install_aer(each, bdf, fatal={"SDES": 1} if each is target and bdf == gpus[0] else None)
    inv = cluster.inventory(gpus_per_node=8)
    rc, doc, _ = run_preflight(cluster, inv, "--skip", "allreduce")
    assert rc == 1
    failed = [r for r in results(doc, check, "fail") if r["node"] == node]
    assert failed, [r for r in doc["results"] if r["status"] != "pass"]
    text = " ".join(r["message"] for r in failed)
    for word in words:
        assert word in text, text
    other = {r["node"] for r in results(doc, check, "fail") if r["node"] and MEMLOCK not in r["message"]} - {node}
    assert not other, "healthy nodes failed %s: %s" % (check, other)
    if fault == "fabric_manager_stopped":  # NVLS is the consequence, a config warning (never a second drain reason)
        nvls = {r["node"]: r for r in results(doc, "nvls")}
        assert (nvls["n002"]["status"], nvls["n002"]["action"]) == ("warn", "fix_config"), nvls
        assert "nvidia-fabricmanager failed; NCCL 2.21.5 falls back without NVLS" in nvls["n002"]["message"]
        assert nvls["n001"]["status"] == nvls["n003"]["status"] == "pass", nvls
    print("%s → %s" % (fault, text))


def test_hung_dcgm_diagnostic_costs_its_deadline_and_the_others_report(sim_cluster):
    """dcgmi hangs on one node (as level 2 does on some B200/GB200): it is killed before the probe's deadline (20 s),
    that node's dcgm finding is an error naming the level, every other check and node still reports, and
    nothing is left running."""
    cluster = sim_cluster(2)
    hgx(cluster)
    dcgm_hw.install_dcgmi(cluster.node("n001"), "dcgm4_r1_pass_4gpu")
    dcgm_hw.install_dcgmi(cluster.node("n002"), hang=True)
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8), "--skip", "allreduce", "--timeout", "20")
    assert rc == 1, err
    by_node = {r["node"]: r for r in results(doc, "dcgm")}
    assert by_node["n001"]["status"] == "pass", by_node
    assert by_node["n002"]["status"] == "error" and "dcgmi diag -r 1 did not finish within" in by_node["n002"]["message"]
    assert {r["status"] for r in results(doc, "gpu")} <= {"pass", "warn"}, results(doc, "gpu")
    assert cluster.leftover_processes() == {}


#: nvbandwidth v0.6's output on an 8 x H100 node (tests/fixtures/nvbandwidth/: the public captures it follows)
NVBANDWIDTH = os.path.join(REPO, "tests", "fixtures", "nvbandwidth", "h100x8_h2d_d2h_waived_v06.txt")
NVBANDWIDTH_SCRIPT = """#!{python}
import sys
sys.stdout.write({text!r})
"""


def test_burn_in_nvbandwidth_names_the_gpu_whose_host_copies_are_slow(sim_cluster):
    """nvbandwidth on PATH on every node of three HGX nodes; n002's GPU 3 copies from the host at 30 GB/s where
    its peers' GPU 3 do 55 (a link trained narrow): FAIL isolate naming the position; the other two pass. The
    quick tier does not run it (SKIP, named)."""
    cluster = sim_cluster(3)
    hgx(cluster)
    with open(NVBANDWIDTH) as fh:
        healthy = fh.read()
    slow = healthy.replace(" 0     55.20     55.31     55.28     55.19", " 0     55.20     55.31     55.28     30.00")
    assert slow != healthy
    for node in cluster.nodes:
        node.install_executable("nvbandwidth", NVBANDWIDTH_SCRIPT.format(
            python=sys.executable, text=slow if node.name == "n002" else healthy))
    inv = cluster.inventory(gpus_per_node=8)
    rc, doc, err = run_preflight(cluster, inv, "--only", "nvbandwidth", "--tier", "burn-in", "--timeout", "60")
    assert rc == 1, err
    failed = results(doc, "nvbandwidth", "fail")
    assert [r["node"] for r in failed] == ["n002"], results(doc, "nvbandwidth")
    assert "30 GB/s" in failed[0]["message"] and "->3" in failed[0]["message"], failed[0]["message"]
    assert failed[0]["action"] == "isolate", failed[0]
    assert {r["node"]: r["status"] for r in results(doc, "nvbandwidth")} == {"n001": "pass", "n002": "fail", "n003": "pass"}
    rc, doc, err = run_preflight(cluster, inv, "--only", "nvbandwidth")
    assert rc == 0, err
    assert {r["status"] for r in results(doc, "nvbandwidth")} == {"skip"}, results(doc, "nvbandwidth")
    assert cluster.leftover_processes() == {}

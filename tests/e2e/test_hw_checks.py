"""xid, gpudirect and topology end to end over SSH: a fault presented on one simulated HGX node through the
interfaces real hardware uses (kernel log, sysfs module and PCIe tree, lspci) is named there; the others pass."""

from __future__ import annotations

import pytest

from tests.sim import gpu_hw, ib_hw, pci_hw
from tests.e2e.test_catalogue import results, run_preflight


def hgx_pcie(cluster, target, fault):
    for node in cluster.nodes:
        gpu_hw.install_gpus(node, "h100", count=8)
        ib_hw.install_hcas(node, [{}, {}])
        pci_hw.install_pcie(node, faults=fault if node is target else None)


@pytest.mark.parametrize(
    "check,fault,words",
    [
        ("xid", None, ["n002 GPU 2 (0000:3a:00.0): Xid 79 in the last 5 min", "GPU has fallen off the bus", "action: reboot"]),
        ("gpudirect", {"acs": 1}, ["n002 PCIe switch port 0000:29:00.0: ACS ReqRedir+CmpltRedir on", "GPU 1 (0000:2a:00.0)↔mlx5_1"]),
        ("topology", {"hca_width": 0}, ["n002 mlx5_0 (0000:19:00.0): PCIe link x8 at 32 GT/s (expected x16 at 32 GT/s, like the other nodes)"]),
    ],
)
def test_fault_on_one_node_is_named(sim_cluster, check, fault, words):
    cluster = sim_cluster(3)
    target = cluster.node("n002")
    hgx_pcie(cluster, target, fault)
    extra = {}
    if check == "xid":
        # Stamps are seconds since this kernel booted (the simulated nodes share it): n002's Xid is 30 s old,
        # n003's is from boot, outside the 5-minute window.
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        line = "NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off the bus."
        gpu_hw.inject_kernel_log(target, line, max(0.0, uptime - 30))
        if uptime > 400:
            gpu_hw.inject_kernel_log(cluster.node("n003"), line, 0.5)
        extra = {"xid_window_s": 300}
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8, **extra), "--only", check)
    assert rc == 1, err
    failed = results(doc, check, "fail")
    assert {r["node"] for r in failed} == {"n002"}, failed
    text = " | ".join(r["message"] for r in failed)
    for word in words:
        assert word in text, text
    passed = {r["node"] for r in results(doc, check, "pass")}
    assert passed == {"n001", "n003"}, results(doc, check)
    print(text)


def test_healthy_hgx_nodes_pass_the_new_checks(sim_cluster):
    cluster = sim_cluster(2)
    hgx_pcie(cluster, None, None)
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8), "--only", "xid,gpudirect,topology")
    for check in ("xid", "gpudirect", "topology"):
        assert {r["status"] for r in results(doc, check)} == {"pass"}, results(doc, check)
    assert rc == 0, err


def test_narrow_gpu_link_is_reported_once_by_topology(sim_cluster):
    """nvidia-smi (gpu) and sysfs (topology) both show n002's GPU 3 trained at x8: the link has one owner,
    topology, which FAILs it against the fleet; gpu does not add a WARN for the same fact."""
    cluster = sim_cluster(3)
    target = cluster.node("n002")
    for node in cluster.nodes:
        gpu_hw.install_gpus(node, "h100", count=8, faults={3: "pcie_width"} if node is target else None)
        ib_hw.install_hcas(node, [{}, {}])
        pci_hw.install_pcie(node, faults={"gpu_width": 3} if node is target else None)
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8), "--only", "gpu,topology")
    assert rc == 1, err
    problems = [r for r in doc["results"] if r["status"] not in ("pass", "skip")]
    assert [(r["check"], r["node"], r["status"]) for r in problems] == [("topology", "n002", "fail")], problems
    assert "GPU 3" in problems[0]["message"] and "x8" in problems[0]["message"], problems[0]["message"]
    assert {r["status"] for r in results(doc, "gpu")} == {"pass"}, results(doc, "gpu")
    # without topology in the run, gpu still sees the narrow link (from nvidia-smi) and warns
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8), "--only", "gpu")
    warned = results(doc, "gpu", "warn")
    assert [r["node"] for r in warned] == ["n002"] and "GPU 3 (0000:5D:00.0): PCIe link Gen5 x8" in warned[0]["message"], results(doc, "gpu")
    print(problems[0]["message"])

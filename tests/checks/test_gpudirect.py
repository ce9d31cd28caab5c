"""gpudirect check (parser cases: tests/fixtures/gpudirect): the probe over a simulated PCIe tree, the rule."""

from __future__ import annotations

from preflight.checks.gpudirect import probe as gpudirect_probe
from preflight.checks.gpudirect import rule as gpudirect_rule
from preflight.model import Status
from preflight.probe.context import NodeContext
from tests.builders import StubNode
from tests.sim import gpu_hw, ib_hw, pci_hw
from tests.builders import view


def hgx_node(tmp_path, monkeypatch, hcas=2, vm=False, **faults):
    node = StubNode(tmp_path / "n001")
    gpu_hw.install_gpus(node, "h100", count=8)
    if hcas:
        ib_hw.install_hcas(node, [{}] * hcas)
    pci_hw.install_pcie(node, faults=faults, vm=vm)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    return node


def facts_of(node):
    return gpudirect_probe.probe(NodeContext(sysfs_root=node.sys_dir))


def judge(facts, gpus=8, nccl=None):
    driver = {"nccl_python": {"version": nccl}} if nccl else {}
    return gpudirect_rule.rule(view({"n001": {"gpudirect": facts, "driver": driver}}, gpus=gpus))


def test_probe_and_rule_pass_a_healthy_hgx_node(tmp_path, monkeypatch):
    facts = facts_of(hgx_node(tmp_path, monkeypatch))
    assert facts["peermem"] == "nvidia_peermem" and facts["virtual"] is None and facts["iommu"] == "off"
    assert facts["paths"][0] == {"gpu": "0000:18:00.0", "hca": "mlx5_0", "bridges": ["0000:17:00.0", "0000:17:01.0"]}
    assert len(facts["paths"]) == 2  # only GPU 0 and 1 share a switch with an HCA
    out = judge(facts)
    assert [f.status for f in out] == [Status.PASS], out
    assert out[0].message == "NCCL uses nvidia_peermem; no ACS redirect on the 4 switch ports between GPUs and HCAs; IOMMU off"


def test_acs_redirect_on_a_switch_port_fails(tmp_path, monkeypatch):
    out = judge(facts_of(hgx_node(tmp_path, monkeypatch, acs=1)))
    failed = [f for f in out if f.status is Status.FAIL]
    assert len(failed) == 2, out  # the GPU's and the HCA's downstream ports
    assert failed[0].message.startswith("n001 PCIe switch port 0000:29:00.0: ACS ReqRedir+CmpltRedir on (expected off on bare metal)")
    assert "GPU 1 (0000:2a:00.0)↔mlx5_1" in failed[0].message and failed[0].action == "fix_config"


def test_missing_peermem_fails(tmp_path, monkeypatch):
    out = judge(facts_of(hgx_node(tmp_path, monkeypatch, no_peermem=True)))
    assert [f.status for f in out] == [Status.FAIL]
    assert "GPUDirect RDMA module not loaded (expected nvidia_peermem or nv_peer_mem, or DMA-BUF" in out[0].message


def test_missing_peermem_only_warns_with_the_open_module_on_a_new_kernel(tmp_path, monkeypatch):
    node = hgx_node(tmp_path, monkeypatch, no_peermem=True)
    node.write_sys("module/nvidia/taint", "OE\n")  # open module: out-of-tree, unsigned, not proprietary
    monkeypatch.setattr(gpudirect_probe, "kernel_release", lambda: "6.8.0-45-generic")
    out = judge(facts_of(node))
    assert [f.status for f in out] == [Status.WARN] and "DMA-BUF" in out[0].message
    node.write_sys("module/nvidia/taint", "POE\n")  # the proprietary module
    assert [f.status for f in judge(facts_of(node))] == [Status.FAIL]


def test_acs_unreadable_is_an_error(tmp_path, monkeypatch):
    facts = facts_of(hgx_node(tmp_path, monkeypatch, no_lspci=True))
    assert facts["acs"] is None and "lspci -D -vvv: not found" in facts["lspci_error"]
    out = judge(facts)
    assert [f.status for f in out] == [Status.ERROR]


def test_vm_skips_acs_and_no_hca_skips(tmp_path, monkeypatch):
    facts = facts_of(hgx_node(tmp_path, monkeypatch, vm=True, acs=0))
    out = judge(facts)
    assert [f.status for f in out] == [Status.PASS] and "ACS not judged in a VM (DMI sys_vendor 'QEMU')" in out[0].message
    no_hca = facts_of(hgx_node(tmp_path / "x", monkeypatch, hcas=0))
    out = judge(no_hca)
    assert [f.status for f in out] == [Status.SKIP] and "no RDMA HCA" in out[0].message


def test_cpu_node_skips():
    out = judge({"gpus": [], "hcas": []}, gpus=0)
    assert [f.status for f in out] == [Status.SKIP]


def test_dma_buf_is_a_gpudirect_path_and_the_pass_names_the_one_nccl_takes(tmp_path, monkeypatch):
    """Issue 21.7: the open kernel module on Linux >= 5.12 with NCCL 2.19+ needs no nvidia_peermem."""
    facts = facts_of(hgx_node(tmp_path, monkeypatch, no_peermem=True))
    facts.update(dmabuf_possible=True, kernel="6.8.0-45-generic")
    [found] = judge(facts, nccl="2.21.5")
    assert found.status is Status.PASS
    assert found.message.startswith("NCCL uses DMA-BUF (open kernel module, Linux 6.8.0-45-generic, NCCL 2.21.5);")
    facts["peermem"] = "nvidia_peermem"  # both: NCCL prefers DMA-BUF
    assert "NCCL uses DMA-BUF" in judge(facts, nccl="2.21.5")[0].message
    assert "nvidia_peermem loaded too (unused)" in judge(facts, nccl="2.21.5")[0].message


def test_dma_buf_possible_but_nccl_too_old_or_unknown(tmp_path, monkeypatch):
    facts = facts_of(hgx_node(tmp_path, monkeypatch, no_peermem=True))
    facts.update(dmabuf_possible=True, kernel="6.8.0")
    [old] = judge(facts, nccl="2.18.3")
    assert (old.status, old.action) == (Status.FAIL, "fix_config") and "NCCL 2.18.3 predates DMA-BUF (2.19)" in old.message
    [unknown] = judge(facts)
    assert unknown.status is Status.WARN and "the NCCL version is unknown" in unknown.message
    facts["peermem"] = "nvidia_peermem"  # the twin: an old NCCL still has the peer-memory path
    [twin] = judge(facts, nccl="2.18.3")
    assert twin.status is Status.PASS and twin.message.startswith("NCCL uses nvidia_peermem")

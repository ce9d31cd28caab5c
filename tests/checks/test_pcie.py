"""pcie: the AER probe over a sysfs tree in the kernel's layout (counters rising during the window or not),
and the rule's verdicts with their healthy-but-unusual twins (old errors, one noisy sample, VMs, CPU nodes)."""

from __future__ import annotations

import os
import time

from preflight.checks.pcie import probe as pcie_probe
from preflight.checks.pcie import rule as pcie_rule
from preflight.model import Status
from preflight.probe.context import NodeContext
from tests.builders import StubNode, view
from tests.sim.aer_hw import install_aer

GPU, NIC, PORT, NIC_PORT = "0000:18:00.0", "0000:19:00.0", "0000:17:00.0", "0000:17:01.0"


def _tree(tmp_path, aer=True):
    """A GPU and a ConnectX NIC, each below its own switch port, laid out as the kernel does."""
    node = StubNode(tmp_path)
    for chain, attrs in (([PORT], {"class": "0x060400", "vendor": "0x1000"}),
                         ([PORT, GPU], {"class": "0x030200", "vendor": "0x10de", "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"}),
                         ([NIC_PORT], {"class": "0x060400", "vendor": "0x1000"}),
                         ([NIC_PORT, NIC], {"class": "0x020700", "vendor": "0x15b3", "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"})):
        real = os.path.join(node.sys_dir, "devices", "pci0000:16", *chain)
        os.makedirs(real, exist_ok=True)
        for name, text in attrs.items():
            with open(os.path.join(real, name), "w") as fh:
                fh.write(text + "\n")
        link = os.path.join(node.sys_dir, "bus", "pci", "devices", chain[-1])
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(real, os.path.dirname(link)), link)
        if aer:
            install_aer(node, chain[-1])
    return node


def test_probe_reads_device_and_port_and_the_errors_of_the_window(tmp_path):
    node = _tree(tmp_path)
    install_aer(node, GPU, correctable={"RxErr": 4})
    install_aer(node, PORT, correctable={"BadDLLP": 1})

    class Storm(NodeContext):
        """Errors arrive during the window: after the first read, before the second (no timing race)."""
        reads = 0

        def read(self, path):
            if path.endswith(os.path.join(GPU, "aer_dev_correctable")):
                Storm.reads += 1
                if Storm.reads == 2:
                    install_aer(node, GPU, correctable={"RxErr": 40}, nonfatal={"CmpltTO": 1})
            return NodeContext.read(path)

    facts = pcie_probe.probe(Storm({"window_s": 1.5}, sysfs_root=node.sys_dir))
    devs = {d["bdf"]: d for d in facts["devices"]}
    gpu = devs[GPU]
    assert gpu["kind"] == "gpu" and gpu["port"] == PORT and gpu["rate"] == [32.0, 16]
    assert gpu["total"] == {"correctable": 41, "nonfatal": 1, "fatal": 0}
    assert gpu["delta"] == {"correctable": 36, "nonfatal": 1, "fatal": 0}
    assert gpu["counts"] == {"RxErr": 40, "BadDLLP": 1, "CmpltTO": 1}
    assert devs[NIC]["kind"] == "nic" and devs[NIC]["delta"] == {"correctable": 0, "nonfatal": 0, "fatal": 0}
    assert facts["uptime_s"] > 0 and facts["window_s"] == 1.5
    out = pcie_rule.rule(view({"n001": {"pcie": facts}}))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "isolate")]
    assert "n001 GPU 0000:18:00.0: 0 fatal, 1 non-fatal uncorrectable PCIe errors during the 1.5s check" in out[0].message


def test_probe_window_fits_the_deadline_and_a_tree_without_aer_is_skipped(tmp_path):
    node = _tree(tmp_path, aer=False)
    facts = pcie_probe.probe(NodeContext({"window_s": 30}, sysfs_root=node.sys_dir, deadline=time.monotonic() + 2))
    assert facts["window_s"] <= 2 / 4.0  # a quarter of what is left, not the 30 s asked for
    assert all(d["total"] is None for d in facts["devices"])
    out = pcie_rule.rule(view({"n001": {"pcie": facts}}))
    assert [f.status for f in out] == [Status.SKIP] and "no AER statistics in sysfs for its 2 GPUs/NICs" in out[0].message


def test_a_port_above_two_functions_counts_once(tmp_path):
    node = _tree(tmp_path)
    second = NIC[:-1] + "1"  # the dual-port NIC's second function, below the same switch port
    real = os.path.join(os.path.dirname(os.path.realpath(os.path.join(node.sys_dir, "bus", "pci", "devices", NIC))), second)
    os.makedirs(real)
    for name, text in (("class", "0x020700"), ("vendor", "0x15b3")):
        with open(os.path.join(real, name), "w") as fh:
            fh.write(text + "\n")
    os.symlink(os.path.relpath(real, os.path.join(node.sys_dir, "bus", "pci", "devices")),
               os.path.join(node.sys_dir, "bus", "pci", "devices", second))
    install_aer(node, second)
    install_aer(node, NIC_PORT, correctable={"BadDLLP": 5})
    devs = {d["bdf"]: d for d in pcie_probe.probe(NodeContext({"window_s": 0}, sysfs_root=node.sys_dir))["devices"]}
    assert devs[NIC]["port"] == NIC_PORT and devs[NIC]["total"]["correctable"] == 5
    assert devs[second]["port"] is None and devs[second]["total"]["correctable"] == 0


# ------------------------------------------------------------------------------------------------ rule


def _dev(kind="gpu", bdf=GPU, total=(0, 0, 0), delta=(0, 0, 0), counts=None, rate=(32.0, 16)):
    return {"kind": kind, "bdf": bdf, "port": PORT, "rate": list(rate) if rate else None,
            "total": dict(zip(pcie_probe.KINDS, total)), "delta": dict(zip(pcie_probe.KINDS, delta)), "counts": counts or {}}


def _judge(*devices, uptime=86400.0, window=2.0, gpus=8):
    return pcie_rule.rule(view({"n001": {"pcie": {"uptime_s": uptime, "window_s": window, "devices": list(devices)}}}, gpus=gpus))


def test_a_clean_node_passes():
    out = _judge(_dev(), _dev("nic", NIC))
    assert [f.status for f in out] == [Status.PASS]
    assert out[0].message == "n001: no uncorrectable PCIe errors on 1 GPU and 1 NIC over a 2s window"


def test_a_handful_of_old_correctable_errors_is_not_a_fault():
    out = _judge(_dev(total=(7, 0, 0), counts={"RxErr": 7}))
    assert [f.status for f in out] == [Status.PASS]
    assert "below budget: GPU 0000:18:00.0 7 old correctable (0.00/min since boot)" in out[0].message


def test_correctable_storm_during_the_window_isolates():
    out = _judge(_dev(total=(2235, 0, 0), delta=(40, 0, 0), counts={"RxErr": 1841, "BadDLLP": 305}))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "isolate")]
    assert "40 correctable PCIe errors in 2s (1200/min; budget 31/min for 32 GT/s x16 at a 1e-12 bit error rate)" in out[0].message
    assert "(RxErr 1841, BadDLLP 305)" in out[0].message


def test_one_noisy_sample_in_the_window_is_not_a_verdict():
    assert [f.status for f in _judge(_dev(total=(2, 0, 0), delta=(2, 0, 0)))] == [Status.PASS]


def test_a_link_failing_since_boot_isolates_but_a_quiet_old_burst_does_not():
    sustained = _judge(_dev(total=(5_000_000, 0, 0)), uptime=86400.0)  # ~3472/min for a day
    assert [(f.status, f.action) for f in sustained] == [(Status.FAIL, "isolate")]
    assert "since boot, 3472/min on average (budget 31/min" in sustained[0].message
    burst = _judge(_dev(total=(20_000, 0, 0)), uptime=30 * 86400.0)  # 0.46/min over a month
    assert [f.status for f in burst] == [Status.PASS]


def test_fatal_since_boot_asks_for_a_reboot():
    out = _judge(_dev(total=(0, 0, 1), counts={"SDES": 1}))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")]
    assert "1 fatal PCIe error since boot (SDES 1): the link was reset" in out[0].message


def test_old_nonfatal_errors_warn_and_new_ones_fail():
    old = _judge(_dev("nic", NIC, total=(0, 3, 0), counts={"CmpltTO": 3}))
    assert [f.status for f in old] == [Status.WARN] and "3 non-fatal uncorrectable PCIe errors since boot" in old[0].message
    new = _judge(_dev("nic", NIC, total=(0, 3, 0), delta=(0, 1, 0)))
    assert [(f.status, f.action) for f in new] == [(Status.FAIL, "isolate")]


def test_cpu_only_nodes_are_judged_for_their_nics_and_missing_facts_error():
    cpu = view({"c1": {"pcie": {"uptime_s": 10.0, "window_s": 2.0,
                                "devices": [_dev("nic", NIC, total=(0, 0, 2))]}}}, gpus=0)
    assert [f.status for f in pcie_rule.rule(cpu)] == [Status.FAIL]
    assert [f.status for f in pcie_rule.rule(view({"n001": {}}))] == [Status.ERROR]
    assert [f.status for f in pcie_rule.rule(view({"n001": {"pcie": {"probe_error": "x"}}}))] == [Status.ERROR]


def test_budget_follows_dcgm_per_generation_and_width():
    assert pcie_rule.budget_per_min([32.0, 16]) == 31  # Gen5 x16: ceil(1.92 x 16)
    assert pcie_rule.budget_per_min([16.0, 16]) == 16  # Gen4 x16: ceil(0.96 x 16)
    assert pcie_rule.budget_per_min([8.0, 8]) == 4     # Gen3 x8: ceil(0.48 x 8)
    assert pcie_rule.budget_per_min(None) is None

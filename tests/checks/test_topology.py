"""topology check (parser cases: tests/fixtures/topology): the probe over a simulated PCIe tree, the rule."""

from __future__ import annotations

import copy

import pytest

from preflight.checks.topology import probe as topology_probe
from preflight.checks.topology import rule as topology_rule
from preflight.model import NodeInfo, ParseError, Status
from preflight.probe.context import NodeContext
from tests.builders import StubNode
from tests.sim import gpu_hw, ib_hw, pci_hw
from tests import builders


def test_numa_node_parser():
    assert topology_probe.parse_numa_node("1") == 1
    assert topology_probe.parse_numa_node("-1") is None
    with pytest.raises(ParseError):
        topology_probe.parse_numa_node("one")


def hgx_node(tmp_path, name="n001", hcas=8, **faults):
    node = StubNode(tmp_path / name)
    gpu_hw.install_gpus(node, "h100", count=8)
    ib_hw.install_hcas(node, [{}] * hcas)
    pci_hw.install_pcie(node, faults=faults)
    return node


def probe(node):
    return topology_probe.probe(NodeContext(sysfs_root=node.sys_dir))


def test_probe_reads_the_tree(tmp_path):
    facts = probe(hgx_node(tmp_path))
    gpus = [d for d in facts["devices"] if d["kind"] == "gpu"]
    hcas = [d for d in facts["devices"] if d["kind"] == "hca"]
    assert len(gpus) == 8 and len(hcas) == 8
    assert gpus[0]["bdf"] == "0000:18:00.0" and gpus[0]["bridges"] == ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0"]
    assert gpus[0]["link"] == {"cur_width": 16, "max_width": 16, "cur_speed": 32.0, "max_speed": 32.0}
    assert gpus[0]["slot"] == {"max_width": 16, "max_speed": 32.0} and gpus[7]["numa_node"] == 1
    assert hcas[0]["name"] == "mlx5_0" and hcas[0]["bdf"] == "0000:19:00.0"


def _view(facts_by_node):
    nodes = [NodeInfo(n, n, 8) for n in facts_by_node]
    return builders.view({n: {"topology": f} for n, f in facts_by_node.items()}, nodes=nodes)


def test_rule_passes_identical_nodes(tmp_path):
    facts = probe(hgx_node(tmp_path))
    out = topology_rule.rule(_view({"n1": facts, "n2": copy.deepcopy(facts)}))
    assert [f.status for f in out] == [Status.PASS, Status.PASS]
    assert "8 GPUs and 8 HCAs at full PCIe width; each GPU has an HCA on its NUMA node" in out[0].message


def test_rule_fails_a_narrow_nic_link_on_one_node(tmp_path):
    good = probe(hgx_node(tmp_path))
    bad = probe(hgx_node(tmp_path, "n2", hca_width=1))
    out = topology_rule.rule(_view({"n1": good, "n2": bad, "n3": copy.deepcopy(good)}))
    failed = [f for f in out if f.status is Status.FAIL]
    assert [f.node for f in failed] == ["n2"]
    assert "n2 mlx5_1 (0000:2b:00.0): PCIe link x8 at 32 GT/s (expected x16 at 32 GT/s, like the other nodes)" == failed[0].message


def test_rule_narrow_slot_or_fleet_is_not_a_fault(tmp_path):
    facts = probe(hgx_node(tmp_path, gpu_width=2))
    # every node links GPU 2 at x8: the platform is built that way
    out = topology_rule.rule(_view({"n1": facts, "n2": copy.deepcopy(facts), "n3": copy.deepcopy(facts)}))
    assert {f.status for f in out} == {Status.PASS}
    # the slot above is x8: not a fault even on one node
    alone = copy.deepcopy(facts)
    alone["devices"][2]["slot"]["max_width"] = 8
    assert topology_rule.rule(_view({"n1": alone}))[0].status is Status.PASS


def test_rule_affinity_drift_and_numa(tmp_path):
    good = probe(hgx_node(tmp_path))
    moved = probe(hgx_node(tmp_path, "n3", hca_numa={0: 1}))
    out = topology_rule.rule(_view({"n1": good, "n2": copy.deepcopy(good), "n3": moved}))
    failed = [f for f in out if f.status is Status.FAIL]
    assert {f.node for f in failed} == {"n3"}
    text = " | ".join(f.message for f in failed)
    assert "n3: GPU↔NIC affinity differs from 2 of 3 nodes: mlx5_0: NUMA 1 (expected mlx5_0: NUMA 0)" in text, text
    assert "n3 GPU 0 (0000:18:00.0) on NUMA 0" not in text  # other HCAs on NUMA 0 remain
    assert all(f.action == "fix_config" for f in failed)


def test_rule_gpu_without_hca_on_its_numa_node(tmp_path):
    facts = probe(hgx_node(tmp_path, hca_numa={i: 0 for i in range(8)}))
    out = topology_rule.rule(_view({"n1": facts}))
    failed = [f for f in out if f.status is Status.FAIL]
    assert len(failed) == 4 and "GPU 4 (0000:9a:00.0) on NUMA 1 has no HCA on its NUMA node" in failed[0].message


def test_rule_without_gpus_is_an_error_and_cpu_nodes_skip():
    view = builders.view({"n1": {"topology": {"devices": []}}, "c1": {"topology": {"devices": []}}},
                         nodes=[NodeInfo("n1", "n1", 8), NodeInfo("c1", "c1", 0)])
    assert [f.status for f in topology_rule.rule(view)] == [Status.ERROR, Status.SKIP]


def _view_with_rails(facts_by_node, ports):
    """Topology facts plus ib_hca facts whose usable ports (preflight.derived.rails) pick NCCL's rails."""
    nodes = [NodeInfo(n, n, 8) for n in facts_by_node]
    return builders.view({n: {"topology": f, "ib_hca": {"ports": ports}} for n, f in facts_by_node.items()},
                         nodes=nodes)


def with_storage_port(facts, numa):
    """The node's facts plus a ninth HCA, mlx5_8, on its own root port (the simulated tree places one HCA
    per GPU switch): a storage / front-end port."""
    hca = copy.deepcopy(next(d for d in facts["devices"] if d["kind"] == "hca"))
    hca.update(name="mlx5_8", bdf="0000:c1:00.0", numa_node=numa, bridges=["0000:c0:01.0"])
    facts["devices"].append(hca)
    return facts


def test_affinity_counts_only_the_compute_nics(tmp_path):
    """Issue 21.8: eight InfiniBand rails all on NUMA 0 and a storage port (RoCE, 200 Gb/s) on NUMA 1: the
    storage port used to give GPUs 4-7 'an HCA on their NUMA node'; NCCL never sends over it."""
    from tests.builders import ib_port

    facts = with_storage_port(probe(hgx_node(tmp_path, hca_numa={i: 0 for i in range(8)})), numa=1)
    ports = [ib_port("mlx5_%d" % i) for i in range(8)] + [ib_port("mlx5_8", rate=200, layer="roce")]
    assert [f.status for f in topology_rule.rule(_view({"n1": facts}))] == [Status.PASS]  # every HCA counted
    failed = [f for f in topology_rule.rule(_view_with_rails({"n1": facts}, ports)) if f.status is Status.FAIL]
    assert len(failed) == 4 and "GPU 4 (0000:9a:00.0) on NUMA 1 has no HCA on its NUMA node" in failed[0].message
    assert "mlx5_8" not in failed[0].message


def test_storage_port_beside_balanced_rails_is_not_counted_and_passes(tmp_path):
    from tests.builders import ib_port

    facts = with_storage_port(probe(hgx_node(tmp_path)), numa=0)
    ports = [ib_port("mlx5_%d" % i) for i in range(8)] + [ib_port("mlx5_8", rate=200, layer="roce")]
    [finding] = topology_rule.rule(_view_with_rails({"n1": facts}, ports))
    assert finding.status is Status.PASS, finding.message
    assert "each GPU has an HCA on its NUMA node (the 8 HCAs carrying NCCL's rails; mlx5_8 not counted)" in finding.message


def test_vm_without_numa_information_is_not_judged_not_passed(tmp_path):
    facts = probe(hgx_node(tmp_path))
    for dev in facts["devices"]:
        dev["numa_node"] = None  # numa_node -1 in sysfs: a VM
    out = topology_rule.rule(_view({"n1": facts, "n2": copy.deepcopy(facts)}))
    assert sorted(f.status.value for f in out if f.node == "n1") == ["pass", "skip"]
    skip = next(f for f in out if f.status is Status.SKIP)
    assert "GPU↔NIC NUMA affinity not judged: numa_node -1 on 16 devices (a VM" in skip.message
    assert "NUMA affinity not judged" in next(f for f in out if f.status is Status.PASS).message

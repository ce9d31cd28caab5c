"""envvendor (issue 37): Azure ND and OCI tuning in the env file, only what the vendor documents, recognised from
each node's own facts (DMI, the Azure HPC image's per-size files, the RoCE rails), never a metadata service.

Nodes are stand-ins filled by tests/sim/cloud_hw.py (sysfs tree, host files) and probed by the real cloud_fabric
and ib_hca probes; the derivation runs on their facts.
"""

from __future__ import annotations

import sys

import pytest

from preflight.checks.cloud_fabric import probe as cf_probe
from preflight.checks.ib_hca import probe as hca_probe
from preflight.derived import envvendor
from preflight.derived.envvars import Derived
from preflight.probe.context import NodeContext
from tests.builders import view
from tests.paths import TESTS

sys.path.insert(0, TESTS)
from sim import cloud_hw  # noqa: E402


@pytest.fixture
def facts_of(tmp_path, monkeypatch):
    """facts_of(make) -> {"cloud_fabric": ..., "ib_hca": ...} of a stand-in node that make(node) filled."""
    count = [0]

    def run(make):
        count[0] += 1
        node = cloud_hw.StandIn(tmp_path / ("n%d" % count[0]))
        make(node)
        monkeypatch.setenv("PREFLIGHT_HOST_ROOT", node.root_dir)
        monkeypatch.setenv("PATH", node.bin_dir + ":/usr/bin:/bin")
        ctx = NodeContext(sysfs_root=node.sys_dir, config={"interval_s": 0})
        return {"cloud_fabric": cf_probe.probe(ctx), "ib_hca": hca_probe.probe(ctx)}
    return run


def derived_for(facts, nodes=("n001", "n002"), gpu=None):
    per_node = {n: dict(facts) for n in nodes}
    if gpu:
        for n in nodes:
            per_node[n]["gpu"] = {"gpus": [{"index": i, "name": gpu} for i in range(8)]}
    derived = Derived()
    envvendor.tuning(view(per_node), list(nodes), derived)
    return derived


def test_azure_nd_v5_nodes_get_the_images_nccl_conf_lines(facts_of):
    derived = derived_for(facts_of(lambda n: cloud_hw.install_azure_nd(n, "ndv5")))
    assert derived.as_dict() == {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_TOPO_FILE": "/opt/microsoft/ndv5/topo.xml",
                                 "NCCL_IGNORE_CPU_AFFINITY": "1"}
    assert "Azure/azhpc-images components/customizations/ndv5.sh" in derived.variables[0].why[0]


def test_an_azure_vm_without_the_nd_customization_gets_a_note_and_nothing_else(facts_of):
    derived = derived_for(facts_of(lambda n: cloud_hw.install_azure_nd(n, family=None)))
    assert derived.as_dict() == {} and "not on every node" in derived.notes[0]


def test_oci_roce_nodes_get_oracles_tc_sl_and_the_qps_of_their_gpu(facts_of):
    derived = derived_for(facts_of(lambda n: cloud_hw.install_oci(n)), gpu="NVIDIA H100 80GB HBM3")
    assert derived.as_dict() == {"NCCL_IB_TC": "41", "NCCL_IB_SL": "0", "NCCL_IB_QPS_PER_CONNECTION": "1"}
    a100 = derived_for(facts_of(lambda n: cloud_hw.install_oci(n)), gpu="NVIDIA A100-SXM4-40GB")
    assert a100.as_dict()["NCCL_IB_QPS_PER_CONNECTION"] == "4"
    unknown = derived_for(facts_of(lambda n: cloud_hw.install_oci(n)))
    assert "NCCL_IB_QPS_PER_CONNECTION" not in unknown.as_dict() and "per GPU model" in unknown.notes[0]


def test_plain_ib_and_oci_on_infiniband_get_nothing(facts_of):
    from sim import ib_hw
    assert derived_for(facts_of(lambda n: ib_hw.install_hcas(n, [{}] * 8))).as_dict() == {}
    assert derived_for(facts_of(lambda n: cloud_hw.install_oci(n, link_layer="ib"))).as_dict() == {}

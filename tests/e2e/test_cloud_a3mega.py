"""End to end over SSH: an A3-Mega-like node (8 GPU NICs at MTU 8244, the TCPXO RxDM running, the FasTrak plugin
with its nccl-env-profile.sh) and its twin whose third GPU NIC is at MTU 1460 (issue 37's done-when).

Each SimNode runs its own sshd in a network namespace; the fabric is presented through the interfaces a real
A3 Mega has: class/net/ethN with device/uevent DRIVER=gve (a class/net tree of the node's own,
tests/sim/cloud_hw.own_class_net), /proc/<pid>/comm of the RxDM and the plugin files under the node's host
root, DMI product_name "Google Compute Engine".
"""

from __future__ import annotations

import sys

from tests.e2e.test_catalogue import results, run_preflight
from tests.paths import TESTS

sys.path.insert(0, TESTS)
from sim import cloud_hw  # noqa: E402


def test_an_a3_mega_node_passes_and_its_mtu_1460_twin_fails_over_ssh(sim_cluster, tmp_path):
    cluster = sim_cluster(2)
    for node, mtus in zip(cluster.nodes, ([8244] * 8, [8244, 8244, 1460] + [8244] * 5)):
        cloud_hw.own_class_net(node)
        cloud_hw.install_google(node, "tcpxo", mtus)
    env_path = tmp_path / "a3mega.env"
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--only", "cloud_fabric", "--env-file", str(env_path))
    found = {r["node"]: r for r in results(doc, "cloud_fabric")}
    assert found["n001"]["status"] == "pass", found
    assert found["n001"]["message"].startswith("GPUDirect-TCPXO: 8 GPU NICs at MTU 8244, RxDM pid 4242"), found
    assert found["n002"]["status"] == "fail" and found["n002"]["action"] == "fix_config", found
    assert "eth3 MTU 1460 (expected MTU 8244 on every GPU NIC" in found["n002"]["message"], found
    assert rc == 1, err
    env = env_path.read_text()
    assert "/var/lib/tcpxo/lib64/nccl-env-profile.sh" in env and "NCCL_IB_HCA" not in env, env

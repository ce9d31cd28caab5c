"""The second catalogue end to end over SSH on simulated nodes: a fault on one node is named, the
others pass (ib_errors, nccl_env, storage)."""

from __future__ import annotations

import os

from tests.sim import gpu_hw, ib_hw
from tests.e2e.test_catalogue import results, run_preflight


def _by_node(doc, check):
    return {r["node"]: r for r in results(doc, check)}


def test_ib_errors_names_the_flapping_port_while_it_flaps(sim_cluster):
    cluster = sim_cluster(3)
    for node in cluster.nodes:
        ib_hw.install_hcas(node, [{}, {}])
    # n002's mlx5_1 goes down and counts symbol errors while the probe watches (a process in the node)
    cluster.count_up("n002", ["class/infiniband/mlx5_1/ports/1/counters/link_downed",
                              "class/infiniband/mlx5_1/ports/1/counters/symbol_error"], step=1, every=0.2)
    rc, doc, _ = run_preflight(cluster, cluster.inventory(), "--only", "ib_errors")
    assert rc == 1
    found = _by_node(doc, "ib_errors")
    assert found["n002"]["status"] == "fail" and found["n002"]["action"] == "isolate"
    assert "n002 mlx5_1 port 1: link went down" in found["n002"]["message"]
    assert "(link flap)" in found["n002"]["message"]
    assert "mlx5_0" not in found["n002"]["message"]
    assert found["n001"]["status"] == found["n003"]["status"] == "pass"
    cluster.heal("n002")
    assert cluster.leftover_processes() == {}


def test_ib_errors_names_a_port_that_flapped_before_the_run_from_the_kernel_log(sim_cluster):
    """The counters are quiet during the probe; the kernel log (the simulator's journalctl -k, the reader xid
    shares) shows n002's mlx5_1 going down three times an hour ago and its transceiver overheating."""
    from tests.e2e.test_hw_checks import hgx_pcie

    cluster = sim_cluster(3)
    hgx_pcie(cluster, None, None)
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    target = cluster.node("n002")
    base = max(20.0, uptime - 3600)
    gpu_hw.inject_kernel_log(target, "mlx5_core 0000:2b:00.0 mlx5_1: Port: 1 Link ACTIVE", 15.5)
    for i in range(3):
        gpu_hw.inject_kernel_log(target, "mlx5_core 0000:2b:00.0 mlx5_1: Port: 1 Link DOWN", base + i)
        gpu_hw.inject_kernel_log(target, "mlx5_core 0000:2b:00.0 mlx5_1: Port: 1 Link ACTIVE", base + i + 0.5)
    gpu_hw.inject_kernel_log(target, "mlx5_core 0000:2b:00.0: Port module event[error]: module 1, Error condition, "
                             "High Temperature", base + 3)
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=8), "--only", "ib_errors,xid")
    assert rc == 1, err
    found = _by_node(doc, "ib_errors")
    assert found["n002"]["status"] == "fail" and found["n002"]["action"] == "isolate", found["n002"]
    message = found["n002"]["message"]
    assert "n002 mlx5_1 port 1: link went down 3 times since boot in the kernel log" in message, message
    assert "n002 mlx5_1 port 1: transceiver module error since boot" in message and "High Temperature" in message
    assert "mlx5_0" not in message
    assert found["n002"]["data"]["flaps"] == {"mlx5_1:1": 3}
    for name in ("n001", "n003"):
        assert found[name]["status"] == "pass", found[name]
        assert "no link flap since boot in" in found[name]["message"] and "(journalctl)" in found[name]["message"]
    # xid read the same log in the same probe run: every node passes it
    assert {r["status"] for r in results(doc, "xid")} == {"pass"}, results(doc, "xid")
    print(message)


def test_ib_errors_against_the_previous_run(sim_cluster, tmp_path):
    cluster = sim_cluster(3)
    for node in cluster.nodes:
        ib_hw.install_hcas(node, [{}])
    history = str(tmp_path / "history")
    inv = cluster.inventory()
    rc, doc, _ = run_preflight(cluster, inv, "--only", "ib_errors", "--history", history)
    assert rc == 0, doc["results"]
    # between the runs n003's port counted 500 symbol errors: far above 120/hour
    cluster.node("n003").write_sys("class/infiniband/mlx5_0/ports/1/counters/symbol_error", "500\n")
    rc, doc, _ = run_preflight(cluster, inv, "--only", "ib_errors", "--history", history)
    assert rc == 1
    found = _by_node(doc, "ib_errors")
    assert found["n003"]["status"] == "fail"
    assert "n003 mlx5_0 port 1: symbol_error +500 since the last run" in found["n003"]["message"]
    assert "IBTA bit-error-rate bound" in found["n003"]["message"]
    assert found["n001"]["status"] == found["n002"]["status"] == "pass"
    assert "since the last run" in found["n001"]["message"]


def test_nccl_env_names_the_stale_line_in_one_nodes_etc_nccl_conf(sim_cluster):
    cluster = sim_cluster(3)
    for node in cluster.nodes:
        node.write_host_file("/etc/nccl.conf", "# site settings\nNCCL_DEBUG=WARN\n")
    cluster.node("n002").write_host_file("/etc/nccl.conf", "# site settings\nNCCL_DEBUG=WARN\nNCCL_SOCKET_IFNAME=eth0\n")
    rc, doc, _ = run_preflight(cluster, cluster.inventory(), "--only", "nccl_env")
    assert rc == 1
    failed = [r for r in results(doc, "nccl_env") if r["status"] == "fail"]
    assert [r["node"] for r in failed] == ["n002"], failed
    assert failed[0]["message"] == (
        "n002: NCCL_SOCKET_IFNAME=eth0 (/etc/nccl.conf:3) does not select the data interface eth1 (recommended =eth1)"
    )
    assert failed[0]["action"] == "fix_config"
    found = _by_node(doc, "nccl_env")
    assert found["n001"]["status"] == found["n003"]["status"] == "pass"
    assert "NCCL_DEBUG=WARN (/etc/nccl.conf:2)" in found["n001"]["message"]


def test_storage_names_the_node_whose_shared_path_is_a_local_directory(sim_cluster):
    cluster = sim_cluster(3)
    shared = os.path.join(cluster.root, "shared")
    os.makedirs(shared)
    cluster.mount_local("n003", shared)  # n003's "mount" is a local tmpfs: the others' files are not there
    inv = cluster.inventory(shared_paths=[shared])
    rc, doc, _ = run_preflight(cluster, inv, "--only", "storage")
    assert rc == 1
    found = _by_node(doc, "storage")
    assert found["n003"]["status"] == "fail"
    assert "%s is not the filesystem the head n001 sees: its token is not there (here: tmpfs pfsim-local on %s)" % (
        shared, shared) in found["n003"]["message"]
    assert found["n001"]["status"] == found["n002"]["status"] == "pass"
    assert sorted(os.listdir(shared)) == [".preflight-shared-token"]
    cluster.heal("n003")

"""The data network's wrong verdicts (issue 14) end to end: real sshd per simulated node, the real CLI.

A node whose data cable is pulled, or two nodes holding the same data address, must fail by name with
exit 1, and the env file must not export the management interface in the data network's place.
"""

from __future__ import annotations

import json
import sys

import pytest
from tests.paths import REPO



def run_preflight(cluster, inv, *args, timeout=240):
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--json", "-", "--no-progress", *args],
                       cwd=REPO, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def exports(path):
    """{KEY: value} of the env file's export lines (values are single-quoted by the writer)."""
    out = {}
    for line in open(path).read().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = value.strip("'")
    return out


def failed_nodes(doc, check):
    return sorted({r["node"] for r in doc["results"] if r["check"] == check and r["status"] == "fail"})


@pytest.mark.parametrize("n, down", [(2, (1, 2)), (4, (2, 3))])
def test_data_cable_pulled_fails_those_nodes_and_keeps_management_out_of_the_env(sim_cluster, tmp_path, n, down):
    cluster = sim_cluster(n)
    for i in down:
        cluster.data_link_down(i)
    env = str(tmp_path / "nccl.env")
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--only", "nic,mtu,ports", "--env-file", env)
    assert rc == 1, err
    names = ["n%03d" % i for i in down]
    assert failed_nodes(doc, "nic") == names
    for r in doc["results"]:
        if r["check"] == "nic" and r["node"] in names:
            assert "eth1" in r["message"] and "is down" in r["message"] and "198.19.0.0/16" in r["message"], r
    # The healthy nodes keep the data network; the management port (eth0) is never exported.
    assert exports(env).get("NCCL_SOCKET_IFNAME") == ("=eth1" if n > len(down) else None), open(env).read()
    assert cluster.leftover_processes() == {}


def test_data_address_conflict_is_a_named_failure(sim_cluster, tmp_path):
    cluster = sim_cluster(3)
    cluster.set_data_address(3, cluster.node(2).data_ip)
    env = str(tmp_path / "nccl.env")
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--only", "nic,mtu,ports", "--env-file", env)
    assert rc == 1, err
    assert failed_nodes(doc, "nic") == ["n002", "n003"]
    conflict = [r["message"] for r in doc["results"] if r["check"] == "nic" and r["node"] == "n003"]
    assert any("address conflict: %s on eth1 is also on n002" % cluster.node(2).data_ip in m for m in conflict), conflict
    assert exports(env).get("NCCL_SOCKET_IFNAME") == "=eth1", open(env).read()
    assert cluster.leftover_processes() == {}

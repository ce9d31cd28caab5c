"""The SSH fan-out end to end: real sshd nodes in network namespaces, the real CLI in the controller's."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from tests.paths import REPO



def preflight(cluster, *args, timeout=180):
    """Run the CLI in the controller namespace; (exit code, JSON report or None, stderr)."""
    proc = cluster.ctl([sys.executable, "-m", "preflight", *args], cwd=REPO, timeout=timeout)
    doc = None
    if "--json" in args and proc.stdout.strip():
        doc = json.loads(proc.stdout)
    return proc.returncode, doc, proc.stderr


def by_node(doc, check):
    return {r["node"]: r for r in doc["results"] if r["check"] == check}


def test_dead_and_hung_nodes_are_named_and_the_rest_reported(sim_cluster):
    cluster = sim_cluster(8)
    cluster.stop_sshd(7)
    cluster.hang_commands(8)
    inv = cluster.inventory(command_timeout=6, connect_timeout=3)
    started = time.monotonic()
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress")
    elapsed = time.monotonic() - started
    assert rc == 1, err
    ssh = by_node(doc, "ssh")
    assert [n for n, r in sorted(ssh.items()) if r["status"] == "pass"] == ["n%03d" % i for i in range(1, 7)]
    assert ssh["n007"]["status"] == "fail" and "connection refused" in ssh["n007"]["message"]
    assert ssh["n008"]["status"] == "fail" and "timed out" in ssh["n008"]["message"]
    assert "killed the remote process group" in ssh["n008"]["message"]
    assert doc["summary"]["fail"] == 2 and doc["exit_code"] == 1
    assert "Traceback" not in err
    print("8 nodes, 1 dead, 1 hung: %.2f s (command_timeout 6 s)" % elapsed)
    assert cluster.leftover_processes() == {}


def test_unknown_host_key_fails_until_accepted(sim_cluster, tmp_path):
    cluster = sim_cluster(2)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = cluster.inventory(known_hosts=str(empty))
    rc, doc, _ = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress")
    assert rc == 1
    for result in by_node(doc, "ssh").values():
        assert result["status"] == "fail"
        assert "not in %s" % empty in result["message"] and "ssh-keyscan" in result["message"]
    rc, doc, _ = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", "--accept-new-host-keys")
    assert rc == 0
    recorded = empty.read_text()
    assert all(n.mgmt_ip in recorded for n in cluster.nodes)
    rc, _, _ = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress")
    assert rc == 0  # now known: verified without the flag


def test_changed_host_key_is_refused_even_with_accept_new(sim_cluster):
    cluster = sim_cluster(2)
    cluster.change_host_key(2)
    inv = cluster.inventory()
    for extra in ([], ["--accept-new-host-keys"]):
        rc, doc, _ = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", *extra)
        assert rc == 1
        bad = by_node(doc, "ssh")["n002"]
        assert "CHANGED" in bad["message"] and "SHA256:" in bad["message"] and "ssh-keygen -R" in bad["message"]
        assert by_node(doc, "ssh")["n001"]["status"] == "pass"


def test_frozen_sshd_is_a_named_hang_within_connect_timeout(sim_cluster):
    cluster = sim_cluster(2)
    cluster.freeze_sshd(2)
    inv = cluster.inventory(connect_timeout=2)
    rc, doc, _ = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress")
    assert rc == 1
    assert "no SSH banner" in by_node(doc, "ssh")["n002"]["message"]


def test_ctrl_c_kills_remote_runs(sim_cluster):
    cluster = sim_cluster(2)
    cluster.hang_commands(2)
    inv = cluster.inventory(command_timeout=120)
    proc = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh", "--no-progress"], cwd=REPO,
                             stdout=open(os.devnull, "w"), stderr=__import__("subprocess").PIPE)
    deadline = time.monotonic() + 30
    while not cluster.processes(2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.processes(2), "the hung command never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1].decode()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert cluster.leftover_processes() == {}


def test_unreachable_node_checks_are_errors_not_passes(sim_cluster):
    cluster = sim_cluster(2)
    cluster.stop_sshd(2)
    inv = cluster.inventory()
    rc, doc, _ = preflight(cluster, "check", inv, "--only", "nic", "--json", "-", "--no-progress")
    assert rc == 1
    nic = by_node(doc, "nic")
    assert nic["n002"]["status"] == "error" and "not checked" in nic["n002"]["message"]
    assert [n for n in doc["nodes"] if n["name"] == "n002"][0]["status"] == "fail"  # ssh fail (its checks: not_run)


@pytest.mark.parametrize("transport", ["ssh"])
def test_in_process_session_deadline_kills_remote_group(sim_cluster, transport):
    """The transport API itself, driven in-process from the controller namespace."""
    from preflight import inventory
    from preflight.transport.contract import NodeFailure
    from preflight.transport.ssh import SSHSession

    cluster = sim_cluster(1)
    cluster.hang_commands(1)
    spec = inventory.load(cluster.inventory()).nodes[0]
    with cluster.in_ctl():
        session = SSHSession(spec)
        session.open()
        try:
            with pytest.raises(NodeFailure) as info:
                session.run_bundle({"mode": "probe", "checks": {"ssh": {}}}, deadline_s=2)
            assert info.value.kind == "timeout"
        finally:
            session.close()
    assert cluster.leftover_processes() == {}


def _probe_processes(cluster, node, timeout=5.0):
    """The node's python processes (the bundle), once they are gone or after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in cluster.processes(node) if "python" in p[1]]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_phases_share_one_node_process_and_nothing_is_left(sim_cluster):
    """then=True keeps each node's process for the next phase (no new channel, shell, Python or bundle:
    a new process always prints its clock line first, a kept one does not); a node the next phase does
    not name has its kept process ended; after the last phase nothing is left."""
    from preflight import inventory
    from preflight.transport.pool import SessionPool

    cluster = sim_cluster(2)
    specs = inventory.load(cluster.inventory()).nodes
    cfg = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 20}
    with cluster.in_ctl():
        fleet = SessionPool(specs)
        try:
            one = fleet.run({s.name: cfg for s in specs}, lambda s: 30, then=True)
            assert all(o.failure is None and o.run.clock is not None for o in one.values()), one
            assert all(_probe_processes(cluster, n, timeout=0) for n in ("n001", "n002"))  # waiting
            two = fleet.run({"n001": dict(cfg, checks={"ssh": {}, "nic": {}})}, lambda s: 30)
            assert two["n001"].failure is None and set(two["n001"].result["facts"]) == {"ssh", "nic"}
            assert two["n001"].run.clock is None  # the same process ran the second phase
            assert _probe_processes(cluster, "n001") == [] and _probe_processes(cluster, "n002") == []
            three = fleet.run({s.name: cfg for s in specs}, lambda s: 30)  # nothing kept: new processes
            assert all(o.failure is None and o.run.clock is not None for o in three.values()), three
        finally:
            fleet.close()
    assert cluster.leftover_processes() == {}


def test_a_kept_process_that_overruns_the_next_phase_is_killed(sim_cluster):
    """The kept process's pid (from its first phase) is what the deadline kills: its process group,
    pings included, does not outlive the run."""
    from preflight import inventory
    from preflight.transport.pool import SessionPool

    cluster = sim_cluster(1)
    specs = inventory.load(cluster.inventory()).nodes
    first = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 20}
    slow = {"mode": "probe", "probe_timeout_s": 100, "checks": {"mtu": {
        "iface": "lo", "source_ip": "127.0.0.1", "mtu": 1500, "size": 1472, "small_size": 56, "count": 1000,
        "targets": [{"peer": "self", "ip": "127.0.0.1"}]}}}  # 1,000 pings 50 ms apart: 50 s
    with cluster.in_ctl():
        fleet = SessionPool(specs)
        try:
            assert fleet.run({"n001": first}, lambda s: 30, then=True)["n001"].failure is None
            out = fleet.run({"n001": slow}, lambda s: 3)["n001"]
        finally:
            fleet.close()
    assert out.failure is not None and out.failure.kind == "timeout", out
    assert "killed the remote process group" in str(out.failure)  # at the 3 s deadline, not after 50 s
    assert cluster.leftover_processes() == {}

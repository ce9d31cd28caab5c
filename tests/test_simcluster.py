"""The simulated cluster does what the rest of the suite relies on: real sshd, real links, real faults."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import yaml

from tests.sim import DOCKER0_CIDR, cleanup_stale, in_netns
from tests.sim.netns import list_netns, netns_id
from tests.paths import REPO


def _connect(cluster, node, port=22, timeout=2.0):
    """A TCP socket to node:port opened from the controller namespace."""
    with cluster.in_ctl():
        return socket.create_connection((node.mgmt_ip, port), timeout=timeout)


def _thread_netns():
    st = os.stat("/proc/thread-self/ns/net")
    return (st.st_dev, st.st_ino)


def _ping(cluster, src, dst_ip, size):
    return cluster.node_exec(src, ["ping", "-n", "-q", "-c", "1", "-W", "1", "-M", "do", "-s", str(size), dst_ip])


def test_ssh_session_env_with_strict_host_keys(sim_cluster):
    c = sim_cluster(2)
    node = c.node("n002")
    node.install_executable("nvidia-smi", "#!/bin/sh\necho fake-smi\n")
    script = ('echo "$PATH"; echo "$PREFLIGHT_SYSFS_ROOT"; command -v python3; nvidia-smi;'
              ' ls "$PREFLIGHT_SYSFS_ROOT/class/net"')
    r = c.ssh(node, script)
    assert r.returncode == 0, r.stderr
    path, sysfs, python, smi, *ifaces = r.stdout.split()
    # SetEnv really replaces the session PATH (the host's ~/.bashrc is not sourced: SHLVL=1)
    assert path.split(":")[0] == node.bin_dir
    assert sysfs == node.sys_dir
    assert python == os.path.join(node.bin_dir, "python3")
    assert smi == "fake-smi"
    assert sorted(ifaces) == ["eth0", "eth1", "lo"]  # the node's own interfaces through sys/class/net
    r = c.ssh(node, "python3 -c 'import sys; print(sys.prefix)'")
    assert r.stdout.strip() == sys.prefix


def test_changed_host_key_is_rejected_then_healed(sim_cluster):
    c = sim_cluster(1)
    c.change_host_key("n001")
    r = c.ssh("n001", "true")
    assert r.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    c.heal("n001")
    assert c.ssh("n001", "true").returncode == 0


def test_paramiko_through_in_netns(sim_cluster):
    paramiko = pytest.importorskip("paramiko")
    c = sim_cluster(1)
    node = c.node(1)
    outside = _thread_netns()
    client = paramiko.SSHClient()
    client.load_host_keys(c.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with c.in_ctl():
        assert _thread_netns() == netns_id(c.ctl_ns)
        client.connect(node.mgmt_ip, username="root", key_filename=c.identity_file, timeout=5,
                       allow_agent=False, look_for_keys=False)
    assert _thread_netns() == outside  # restored; the socket keeps the ctl namespace
    try:
        _, stdout, _ = client.exec_command("echo $PREFLIGHT_SYSFS_ROOT")
        assert stdout.read().decode().strip() == node.sys_dir
    finally:
        client.close()


def test_in_netns_is_per_thread_and_restores_on_error(sim_cluster):
    c = sim_cluster(1)
    outside = _thread_netns()
    seen = {}

    def other():
        time.sleep(0.2)
        seen["other"] = _thread_netns()

    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(RuntimeError):
        with in_netns(c.node(1).ns):
            assert _thread_netns() == netns_id(c.node(1).ns)
            t.join()
            raise RuntimeError("boom")
    assert seen["other"] == outside
    assert _thread_netns() == outside


def test_jumbo_frames_and_mtu_blackhole(sim_cluster):
    c = sim_cluster(3)
    n1, n2, n3 = c.nodes
    assert _ping(c, n1, n2.data_ip, 8972).returncode == 0
    assert _ping(c, n3, n1.data_ip, 8972).returncode == 0
    r = c.ctl(["ping", "-n", "-q", "-c", "1", "-W", "1", "-M", "do", "-s", "8972", n2.data_ip])
    assert r.returncode == 0, r.stdout

    c.mtu_blackhole(n3)
    link = json.loads(c.node_exec(n3, ["ip", "-j", "link", "show", "eth1"]).stdout)[0]
    assert link["mtu"] == 9000  # the node still believes in jumbo frames
    assert _ping(c, n1, n2.data_ip, 8972).returncode == 0
    assert _ping(c, n1, n3.data_ip, 8972).returncode != 0
    assert _ping(c, n3, n1.data_ip, 8972).returncode != 0
    assert _ping(c, n1, n3.data_ip, 1000).returncode == 0
    assert _ping(c, n3, n1.data_ip, 1000).returncode == 0

    c.heal(n3)
    assert _ping(c, n1, n3.data_ip, 8972).returncode == 0


def _inet6(cluster, node, dev):
    out = cluster.node_exec(node, ["ip", "-j", "-6", "addr", "show", "dev", dev]).stdout
    return [a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])]


def test_link_local_off_sends_no_multicast_and_keeps_jumbo_paths(sim_cluster):
    """link_local=False (the benchmarks past 256 nodes): no IPv6 link-local address, so no start-up multicast
    for the one software bridge to copy to every port; IPv4 and jumbo frames work as before. The switch has no
    IPv6 of its own either way."""
    quiet = sim_cluster(2, sshd=False, link_local=False)
    assert _inet6(quiet, "n001", "eth1") == [] and _inet6(quiet, "n001", "eth0") == []
    assert _ping(quiet, "n001", quiet.node("n002").data_ip, 8972).returncode == 0
    stats = subprocess.run(["ip", "-n", quiet.switch_ns, "-j", "-s", "link", "show", "br-data"],
                           capture_output=True, text=True, check=True).stdout
    assert json.loads(stats)[0]["stats64"]["rx"]["multicast"] == 0, stats
    usual = sim_cluster(2, sshd=False)
    deadline = time.monotonic() + 10
    while not any(a.startswith("fe80:") for a in _inet6(usual, "n001", "eth1")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(a.startswith("fe80:") for a in _inet6(usual, "n001", "eth1")), _inet6(usual, "n001", "eth1")


def test_docker0_same_address_on_every_node(sim_cluster):
    c = sim_cluster(3, docker0=["n001", "n002"])
    addrs = []
    for node in c.nodes[:2]:
        deadline = time.monotonic() + 3  # the kernel's linkwatch reports carrier within about a second
        while True:
            info = json.loads(c.node_exec(node, ["ip", "-j", "addr", "show", "docker0"]).stdout)[0]
            if info["operstate"] == "UP" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert info["operstate"] == "UP"  # carrier, as on a host running containers
        addrs.append([(a["local"], a["prefixlen"]) for a in info["addr_info"] if a["family"] == "inet"])
    ip, plen = DOCKER0_CIDR.split("/")
    assert addrs[0] == addrs[1] == [(ip, int(plen))]
    assert c.node_exec("n003", ["ip", "link", "show", "docker0"]).returncode != 0


def test_hold_port_makes_port_busy(sim_cluster):
    c = sim_cluster(1)
    node = c.node(1)
    bind = [sys.executable, "-c", "import socket; socket.socket().bind(('0.0.0.0', 29500))"]
    assert c.node_exec(node, bind).returncode == 0
    pid = c.hold_port(node, 29500)
    r = c.node_exec(node, bind)
    assert r.returncode != 0 and "Address already in use" in r.stderr
    _connect(c, node, 29500).close()  # a real listener, reachable from the controller
    assert c.processes(node) == []    # a held port is test setup, not a leftover
    c.heal(node)
    assert not os.path.exists("/proc/%d" % pid)
    assert c.node_exec(node, bind).returncode == 0


def test_stop_sshd_refuses_connections(sim_cluster):
    c = sim_cluster(2)
    c.stop_sshd("n001")
    with pytest.raises(ConnectionRefusedError):
        _connect(c, c.node("n001"))
    _connect(c, c.node("n002")).close()
    c.heal("n001")
    assert c.ssh("n001", "true").returncode == 0


def test_frozen_sshd_accepts_tcp_but_sends_no_banner(sim_cluster):
    c = sim_cluster(1)
    node = c.node(1)
    c.freeze_sshd(node)
    sock = _connect(c, node)  # the kernel completes the handshake from the listen backlog
    try:
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(64)
        c.heal(node)  # SIGCONT: the queued connection is served
        sock.settimeout(5)
        assert sock.recv(64).startswith(b"SSH-2.0-")
    finally:
        sock.close()


def test_link_down_times_out(sim_cluster):
    c = sim_cluster(2)
    c.link_down("n001")
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        _connect(c, c.node("n001"), timeout=1.0)
    assert time.monotonic() - t0 >= 0.9
    c.heal("n001")
    _connect(c, c.node("n001")).close()


def _start_hung_command(c, node):
    """ssh `python3` on a node whose python3 hangs; returns once the remote sleep exists."""
    client = c.ctl_popen(c.ssh_argv(node) + ["python3", "-c", "'print(1)'"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not any("sleep 100000" in cmd for _, cmd in c.processes(node)):
        assert client.poll() is None and time.monotonic() < deadline, "no hung command appeared"
        time.sleep(0.05)
    return client


def test_hang_commands_piles_up_processes(sim_cluster):
    c = sim_cluster(1)
    node = c.node(1)
    c.hang_commands(node)
    client = _start_hung_command(c, node)
    client.kill()
    client.wait()
    # the client is gone, the remote command is not: exactly what the transport must clean up
    left = c.leftover_processes(timeout=0.3)
    assert any("sleep 100000" in cmd for _, cmd in left.get(node.name, [])), left
    c.heal(node)
    assert c.ssh(node, "python3 -c 'print(1)'").stdout.strip() == "1"


def test_processes_quiet_after_clean_session(sim_cluster):
    c = sim_cluster(2)
    assert c.ssh("n001", "sleep 0.1").returncode == 0
    assert c.leftover_processes() == {}


def test_inventory_file(sim_cluster):
    c = sim_cluster(3)
    path = c.inventory(node_overrides={"n002": {"port": 2222}}, gpus_per_node=8, expect={"driver": "550"})
    data = yaml.safe_load(open(path))
    assert data["defaults"]["identity_file"] == c.identity_file
    assert data["defaults"]["known_hosts"] == c.known_hosts
    assert data["defaults"]["gpus_per_node"] == 8
    assert data["cluster"] == {"master_port": 29500, "expect": {"driver": "550"}}
    assert [n["name"] for n in data["nodes"]] == ["n001", "n002", "n003"]
    assert data["nodes"][1] == {"host": c.node(2).mgmt_ip, "name": "n002", "port": 2222}
    with pytest.raises(KeyError):
        c.inventory(node_overrides={"n099": {}})


def test_teardown_leaves_nothing(sim_cluster):
    c = sim_cluster(3, docker0=True)
    c.hang_commands("n001")
    _start_hung_command(c, c.node("n001"))
    c.hold_port("n002", 8080)
    c.freeze_sshd("n003")
    ctl_proc = c.ctl_popen(["sleep", "1000"])
    names = [c.switch_ns, c.ctl_ns] + [n.ns for n in c.nodes]
    ids = [netns_id(n) for n in names]
    root = c.root
    c.stop()
    assert not set(names) & set(list_netns())
    assert ctl_proc.poll() is not None
    assert not os.path.exists(root)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = os.stat("/proc/%s/ns/net" % pid)
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        assert (st.st_dev, st.st_ino) not in ids, pid
        assert root.encode() not in cmd, cmd


def test_cleanup_stale_after_crash(sim_cluster):
    live = sim_cluster(1)  # a live cluster of this process must survive cleanup_stale()
    code = textwrap.dedent("""
        import sys, time
        from tests.sim import SimCluster
        c = SimCluster(2).start()
        c.hang_commands("n001")
        p = c.ssh_argv("n001") + ["python3"]
        c.ctl_popen(p)
        print(c.prefix, c.root, flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True,
                            cwd=REPO)
    try:
        prefix, root = proc.stdout.readline().split()
    finally:
        proc.kill()  # a crash: no teardown runs
        proc.wait()
        proc.stdout.close()
    assert any(n.startswith(prefix + "-") for n in list_netns())
    removed = cleanup_stale()
    assert prefix + "-n001" in removed
    assert not [n for n in list_netns() if n.startswith(prefix + "-")]
    assert live.ctl_ns in list_netns()
    assert live.ssh("n001", "true").returncode == 0
    assert not os.path.exists(root)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                assert root.encode() not in fh.read()
        except OSError:
            pass

"""ports: real sockets on 127.0.0.1 (listen, connect, busy port, /proc holder lookup), the plan and the rule."""

import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from preflight.checks import ports
from preflight.checks.ports import probe as ports_probe
from preflight.checks.ports import rule as ports_rule
from preflight.model import ParseError, Status, with_action
from preflight.probe import portclaim
from preflight.output import report
from preflight.probe.context import NodeContext
from tests.builders import data_node, names, view
from tests.fixture_cases import fixture_dir, read
from tests.probe.test_portclaim import nobody, squatter
from tests.netports import free_port  # a port of this worker's own block

# Recorded on Linux 6.x with a listener on 0.0.0.0:29500, one accepted connection to it, and a
# listener on [::1]:29501 (the cases tests/fixtures/ports/proc_net_tcp*_listener.json).
PROC_NET_TCP = read(os.path.join(fixture_dir("ports"), "proc_net_tcp_listener.txt"))
PROC_NET_TCP6 = read(os.path.join(fixture_dir("ports"), "proc_net_tcp6_listener.txt"))


# ---------------------------------------------------------------------------------------------- parser


def test_parse_proc_net_tcp():
    rows = ports_probe.parse_proc_net_tcp(PROC_NET_TCP)
    assert rows[0] == {"local_ip": "0.0.0.0", "local_port": 29500, "state": "0A", "uid": 0, "inode": 259424}
    assert rows[1]["local_ip"] == "127.0.0.1" and rows[1]["state"] == "01"
    assert rows[2]["local_port"] == 0xDAD0 and rows[2]["uid"] == 1001
    rows6 = ports_probe.parse_proc_net_tcp(PROC_NET_TCP6)
    assert rows6 == [{"local_ip": "::1", "local_port": 29501, "state": "0A", "uid": 0, "inode": 259425}]


@pytest.mark.parametrize("text", ["", "garbage", PROC_NET_TCP + "   9: nonsense\n", PROC_NET_TCP.split("\n", 1)[1]])
def test_parse_proc_net_tcp_rejects(text):
    with pytest.raises(ParseError):
        ports_probe.parse_proc_net_tcp(text)


def test_parse_real_proc_net_tcp():
    with open("/proc/net/tcp") as handle:
        ports_probe.parse_proc_net_tcp(handle.read())


# ---------------------------------------------------------------------------------------- real sockets


def run_listener(cfg):
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=ports_probe.listen(cfg)), daemon=True)
    thread.start()
    return thread, box


def test_listen_and_connect_handshake():
    port = free_port()
    thread, box = run_listener(
        {
            "port": port,
            "bind_ip": "127.0.0.1",
            "name": "n001",
            "expect_peers": ["127.0.0.1"],
            "expect_names": ["n002"],
            "window_s": 60,
        }
    )
    res = ports_probe.connect({"host": "127.0.0.1", "port": port, "name": "n002", "source_ip": "127.0.0.1", "retry_s": 5})
    thread.join(60)
    assert res["connected"] and res["handshake"] and res["error"] is None and res["reply"] == "preflight-ok n001"
    head = box["result"]
    assert head["listening"] and [p["name"] for p in head["peers"]] == ["n002"]
    assert head["elapsed_s"] < 60  # stopped once every expected peer came, not at the end of its window
    json.dumps(head), json.dumps(res)


def test_connector_retries_until_listener_comes_up():
    port = free_port()
    box = {}

    def late():
        time.sleep(0.8)
        box["result"] = ports_probe.listen({"port": port, "bind_ip": "127.0.0.1", "expect_names": ["n002"], "window_s": 10})

    thread = threading.Thread(target=late, daemon=True)
    thread.start()
    res = ports_probe.connect({"host": "127.0.0.1", "port": port, "name": "n002", "retry_s": 6})
    thread.join(10)
    assert res["handshake"] and res["attempts"] > 1


def test_connect_refused_reports_errno():
    res = ports_probe.connect({"host": "127.0.0.1", "port": free_port(), "retry_s": 0.6})
    assert not res["connected"] and res["errno"] == "ECONNREFUSED" and res["attempts"] >= 2


def test_connect_to_foreign_listener_is_not_a_handshake():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        res = ports_probe.connect({"host": "127.0.0.1", "port": port, "retry_s": 2})
    finally:
        srv.close()
    assert res["connected"] and not res["handshake"]
    assert res["error"] == "the listener did not answer as preflight" and res["reply"].startswith("SSH-2.0")


def test_a_hello_nobody_answered_is_sent_again_not_failed():
    """The healthy-but-unusual twin of a foreign listener: the head accepted the connection but did not
    answer in time (its accept queue overflowed while 999 peers connected at once, at 1,000 simulated
    nodes: 972 healthy nodes FAILed 'connected, then timed out'). The node connects again within its retry
    window, and the second hello is answered."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def serve():
        silent, _ = srv.accept()  # the first connection: accepted, never answered, closed late
        conn, _ = srv.accept()
        data = b""
        while not data.endswith(b"\n"):
            data += conn.recv(512)
        conn.sendall(ports_probe.REPLY + b"n001\n")
        conn.close()
        time.sleep(3.5)
        silent.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        res = ports_probe.connect({"host": "127.0.0.1", "port": port, "name": "n002", "retry_s": 8})
    finally:
        srv.close()
    assert res["handshake"] and res["attempts"] == 2 and res["error"] is None, res


def test_rule_silence_after_connecting_is_a_retest_a_foreign_reply_a_fail():
    silent = dict(connected(4), handshake=False, reply="", elapsed_s=10.2, error="connected, then timed out")
    foreign = dict(connected(1), handshake=False, reply="SSH-2.0-OpenSSH_9.6",
                   error="the listener did not answer as preflight")
    found = {f.node: f for f in ports_rule.rule(cluster(3, {"n002": silent, "n003": foreign}))}
    assert (found["n002"].status, found["n002"].action) == (Status.ERROR, "retest"), found["n002"]
    assert found["n002"].message == ("n002 → n001 198.19.0.1:29500: connected, but the head did not answer within "
                                     "10.2s (connected, then timed out): not tested; retest")
    assert found["n003"].status == Status.FAIL and "did not answer as preflight" in found["n003"].message


def test_most_nodes_unreached_is_the_heads_end_a_few_are_their_own():
    """Five of six nodes cannot reach the listening head: one FAIL on the head (a firewall there, or a listener
    too busy), the five not tested; its twin, one node of six failing, is that node's own path."""
    head = {"role": "listen", "port": 29500, "bind_ip": "0.0.0.0", "listening": True,
            "peers": [{"ip": "198.19.0.2", "name": "n002", "at_s": 0.1}]}
    lost = dict(connected(3), connected=False, handshake=False, reply="", errno="timeout", error="timed out")
    facts = {"n001": head, "n002": connected(1)}
    facts.update({n: dict(lost) for n in ("n003", "n004", "n005", "n006", "n007")})
    found = ports_rule.rule(cluster(7, facts))
    fails = [f for f in found if f.status == Status.FAIL]
    assert [f.node for f in fails] == ["n001"], fails
    assert fails[0].message.startswith("5 of 6 nodes could not reach or hear the head n001 on port 29500 (n[003-007])")
    assert {f.node for f in found if f.status == Status.SKIP} == {"n003", "n004", "n005", "n006", "n007"}
    few = {"n001": head, **{n: connected(1) for n in ("n002", "n003", "n004", "n005", "n006")}, "n007": dict(lost)}
    found = {f.node: f for f in ports_rule.rule(cluster(7, few))}
    assert found["n007"].status == Status.FAIL and found["n001"].status == Status.PASS


def test_most_nodes_unreached_by_a_head_whose_listener_could_not_keep_up_is_a_retest_not_a_firewall():
    """At 1,000 simulated nodes on 2 shared cores the head's listener, starved, answered 156 of 999 nodes and was
    FAILed as a firewall. A listener that could not keep up leaves traces a firewall cannot (connections its
    kernel completed and queued, handshakes dropped for a full queue, hellos answered after their node gave
    up): then it is the head overloaded, an error to retest; without them (the test above) a FAIL."""
    head = {"role": "listen", "port": 29500, "bind_ip": "0.0.0.0", "listening": True, "queued": 37, "overflows": 512,
            "peers": [{"ip": "198.19.0.2", "name": "n002", "at_s": 0.1}, {"ip": "198.19.0.4", "name": "n004", "at_s": 12.5}]}
    lost = dict(connected(3), connected=False, handshake=False, reply="", errno="timeout", error="timed out")
    facts = {"n001": head, "n002": connected(1), **{n: dict(lost) for n in ("n003", "n004", "n005", "n006", "n007")}}
    found = ports_rule.rule(cluster(7, facts))
    (verdict,) = [f for f in found if f.node == "n001"]
    assert (verdict.status, verdict.action) == (Status.ERROR, "retest"), verdict
    assert verdict.message == (
        "5 of 6 nodes could not reach or hear the head n001 on port 29500 (n[003-007]): its listener, preflight's "
        "own, could not keep up (37 connections still waiting to be accepted when its window closed, 512 handshakes "
        "dropped for a full accept queue, 1 node answered after giving up): the head overloaded, not a firewall; "
        "not tested, retest")
    assert not [f for f in found if f.status == Status.FAIL]
    assert {f.node for f in found if f.status == Status.SKIP} == {"n003", "n004", "n005", "n006", "n007"}


def test_an_overloaded_head_whose_somaxconn_is_below_the_nodes_names_it():
    """The kernel truncates the listener's backlog to net.core.somaxconn: an overloaded head whose somaxconn (the
    somaxconn check's facts) is below the connecting nodes says so, as the cause a retest meets again; its twin at
    4096 (and one whose value was not read) reads as before."""
    head = {"role": "listen", "port": 29500, "bind_ip": "0.0.0.0", "listening": True, "queued": 0, "overflows": 40,
            "peers": [{"ip": "198.19.0.2", "name": "n002", "at_s": 0.1}]}
    lost = dict(connected(3), connected=False, handshake=False, reply="", errno="timeout", error="timed out")
    facts = {"n001": head, "n002": connected(1), **{n: dict(lost) for n in ("n003", "n004", "n005", "n006", "n007")}}
    messages = {}
    for somax in (4, 4096, None):
        v = cluster(7, facts)
        if somax is not None:
            v.facts["n001"]["somaxconn"] = {"somaxconn": somax, "tcp_max_syn_backlog": 4096}
        (verdict,) = [f for f in ports_rule.rule(v) if f.node == "n001"]
        assert (verdict.status, verdict.action) == (Status.ERROR, "retest"), verdict
        messages[somax] = verdict.message
    assert ("40 handshakes dropped for a full accept queue; net.core.somaxconn 4 on the head truncated its backlog "
            "below the 6 connecting nodes: raise it as the somaxconn check says): the head overloaded") in messages[4], messages[4]
    assert messages[4096] == messages[None] and "somaxconn" not in messages[4096]


def test_a_refusal_before_the_head_listened_is_not_tested_and_one_after_is_a_fail():
    """At 1,000 simulated nodes 6 healthy nodes FAILed 'refused ... after 10s': the head's starved probe bound
    the port after their retry window had closed. The head says when it began listening and each node when it
    stopped trying; with the ssh check's clock offsets between them, a node refused before the head listened
    was not tested (retest); its twin, refused while the head listened (a REJECT rule), still FAILs."""
    head = dict(listening("n002"), from_t=1000.0)
    found = judged_n003(head, refused(until_t=995.0))
    assert (found.status, found.action) == (Status.ERROR, "retest"), found
    assert "the head began listening only 5.0s after this node's last try" in found.message
    found = judged_n003(head, refused(until_t=1009.0))
    assert found.status == Status.FAIL and "refused" in found.message, found
    # clocks: n003's runs 10 s behind the controller's, so its 995.0 is the controller's 1005.0: it tried while
    # the head listened (the ssh check measured the offset: the clock read in the middle of the window sent)
    found = judged_n003(head, refused(until_t=995.0), ssh={"time": 1490.0, "window": [1499.9, 1500.1]})
    assert found.status == Status.FAIL, found


def test_a_refusal_after_the_heads_window_closed_is_not_tested_one_while_it_listened_is_a_fail():
    """At 256 simulated Slurm nodes on 2 cores (load 300) healthy nodes FAILed 'refused ... after 10s' whose
    probes started after the head's listener had closed its window: such a node was not tested (retest); its
    twin, refused while the head still listened, FAILs; a head that began listening within the clocks'
    uncertainty of a node's last try is said so, not as a negative delay."""
    head = dict(listening("n002"), from_t=1000.0, elapsed_s=15.0)  # listened 1000.0 .. 1015.0
    found = judged_n003(head, refused(until_t=1027.0))  # tried 1017.0 .. 1027.0
    assert (found.status, found.action) == (Status.ERROR, "retest"), found
    assert "the head's listener had closed its window 2.0s before this node's first try" in found.message
    found = judged_n003(head, refused(until_t=1014.0))  # tried 1004.0 .. 1014.0, while the head listened
    assert found.status == Status.FAIL and "refused" in found.message, found
    # n003's clock 10 s ahead of the controller's (the ssh check's offset): its 1027.0 is the controller's 1017.0,
    # so it tried while the head listened: a FAIL
    found = judged_n003(head, refused(until_t=1027.0), ssh={"time": 1510.0, "window": [1499.9, 1500.1]})
    assert found.status == Status.FAIL, found
    # the head began listening 1 s before the node's last try, inside the clocks' uncertainty (2 s): retest, said so
    found = judged_n003(head, refused(until_t=1001.0), ssh={"time": 1500.0, "window": [1498.0, 1502.0]})
    assert found.status == Status.ERROR, found
    assert "about when this node stopped trying (within the clocks' uncertainty)" in found.message


def refused(until_t):
    """A connecting node's facts: refused for its whole 10 s window, its last try at until_t (its own clock)."""
    return dict(connected(40), connected=False, handshake=False, errno="ECONNREFUSED", error="Connection refused",
                elapsed_s=10.0, until_t=until_t)


def judged_n003(head, ports, ssh=None):
    """The ports finding on n003 (facts `ports`) beside the head n001 (`head`) and a connected n002; ssh: n003's
    ssh check facts (its clock's offset from the controller's)."""
    v = cluster(3, {"n001": head, "n002": connected(1), "n003": ports})
    if ssh is not None:
        v.facts["n003"]["ssh"] = ssh
    (found,) = [f for f in ports_rule.rule(v) if f.node == "n003"]
    return found


def test_the_kernel_traces_of_a_listener_that_does_not_keep_up():
    """A real listening socket that accepts nothing: its accept queue fills (TCP_INFO's tcpi_unacked) and the
    kernel counts the handshakes it drops (/proc/net/netstat ListenOverflows, this network namespace)."""
    from preflight.probe import listenq

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    before = listenq.listen_overflows()
    clients = []
    try:
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(srv.getsockname())
            clients.append(c)
        deadline = time.monotonic() + 10
        while (listenq.listen_overflows() or 0) <= (before or 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listenq.accept_queue(srv) == 3  # backlog 2: the kernel queues one more than asked
        assert before is not None and listenq.listen_overflows() > before
    finally:
        for c in clients:
            c.close()
        srv.close()
    assert listenq.parse_listen_overflows("TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 12 12\n") == 12
    assert listenq.parse_listen_overflows("Ip: Forwarding\nIp: 1\n") is None


def test_the_listener_backlog_holds_every_expected_peer():
    """listen(backlog) sized to the peers (ss shows a listener's backlog as its Send-Q)."""
    if not shutil.which("ss"):
        pytest.skip("no ss (iproute2) here")
    port = free_port()
    thread, box = run_listener({"port": port, "bind_ip": "127.0.0.1", "name": "n001",
                                "expect_names": ["n%04d" % i for i in range(2, 1001)], "window_s": 3})
    deadline = time.monotonic() + 5
    backlog = None
    while backlog is None and time.monotonic() < deadline:
        out = subprocess.run(["ss", "-ltnH", "sport = :%d" % port], capture_output=True, text=True).stdout.split()
        backlog = int(out[2]) if len(out) > 2 else None
        time.sleep(0.05)
    thread.join(10)
    assert backlog is not None and backlog >= 999, backlog


@pytest.mark.parametrize("wildcard", [False, True])
def test_busy_port_names_this_process_and_free_ports(wildcard):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        res = ports_probe.listen({"port": port, "bind_ip": "127.0.0.1", "wildcard": wildcard, "window_s": 1})
    finally:
        holder.close()
    assert not res["listening"] and res["errno"] == "EADDRINUSE"
    assert {"pid": os.getpid(), "ip": "127.0.0.1"}.items() <= res["holders"][0].items()
    assert res["holders"][0]["comm"]  # e.g. "python" or "pytest"
    assert res["free_ports"] and all(p > port for p in res["free_ports"])


def test_a_port_another_preflight_run_claimed_is_named_not_bound():
    port = free_port()
    other = portclaim.claim(port)  # another run's agent or listener, here this process
    try:
        res = ports_probe.listen({"port": port, "bind_ip": "127.0.0.1", "window_s": 1})
    finally:
        other.close()
    assert not res["listening"] and res["busy"] == {"pid": os.getpid(), "uid": os.getuid()}
    assert res["error"] == "another preflight run (pid %d, uid %d) holds port %d" % (os.getpid(), os.getuid(), port)
    assert "holders" not in res  # never bound over it


def test_a_port_held_by_another_uid_posing_as_a_preflight_run_fails_naming_its_pid_and_uid():
    """A process of uid nobody binds preflight's claim name and the port itself. Before: the head read "another
    preflight run, retest" and every node stayed in the hostfile; now the port is tested, and FAILs."""
    port = free_port()
    with squatter([portclaim.PREFIX + str(port)], tcp_port=port) as pid:
        res = ports_probe.listen({"port": port, "bind_ip": "127.0.0.1", "wildcard": True, "window_s": 1})
    assert "busy" not in res and res["squatter"] == {"pid": pid, "uid": nobody()}
    assert not res["listening"] and res["errno"] == "EADDRINUSE"
    assert {"pid": pid, "uid": nobody()}.items() <= res["holders"][0].items()
    (f,) = [x for x in ports_rule.rule(cluster(1, {"n001": res}, cluster={"master_port": port})) if x.node == "n001"]
    assert f.status is Status.FAIL and with_action(f, ports.CHECK.action).action == "fix_config"
    assert f.message.startswith("n001: port %d is held by pid %d (python3, uid %d); preflight's run claim on it is "
                                "held by pid %d of uid %d (not this run's user or root: not believed)" % (
                                    port, pid, nobody(), pid, nobody())), f.message


def test_a_claim_squatted_by_another_uid_on_a_free_port_does_not_stop_the_test():
    """The twin: the name squatted, the port free: the listener tests the port (a pass) and names the squatter."""
    port = free_port()
    with squatter([portclaim.PREFIX + str(port)]) as pid:
        thread, box = run_listener({"port": port, "bind_ip": "127.0.0.1", "name": "n001", "window_s": 10,
                                    "expect_names": ["n002"]})
        peer = ports_probe.connect({"host": "127.0.0.1", "port": port, "name": "n002", "retry_s": 5})
        thread.join(15)
    res = box["result"]
    assert res["listening"] and peer["handshake"] and res["squatter"] == {"pid": pid, "uid": nobody()}
    findings = {f.node: f for f in ports_rule.rule(cluster(2, {"n001": res, "n002": peer}, cluster={"master_port": port}))}
    assert {n: f.status for n, f in findings.items()} == {"n001": Status.PASS, "n002": Status.PASS}
    assert findings["n001"].message == ("listened on port %d; 1 peer connected (n002); preflight's run claim on it is "
                                        "held by pid %d of uid %d (not this run's user or root: not believed)" % (
                                            port, pid, nobody()))


def test_the_listener_claims_its_port_while_it_listens_and_releases_it():
    port = free_port()
    thread, box = run_listener({"port": port, "bind_ip": "127.0.0.1", "window_s": 2, "expect_peers": ["127.0.0.9"]})
    deadline = time.monotonic() + 5
    while portclaim.holder(port) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert portclaim.holder(port) == {"pid": os.getpid(), "uid": os.getuid()}
    thread.join(10)
    assert box["result"]["listening"] and portclaim.holder(port) is None


def test_find_holders_of_unused_port_is_empty():
    assert ports_probe.find_holders(free_port()) == []


def test_probe_dispatch():
    assert ports_probe.probe(NodeContext({"skip": "no data interface"})) == {"skipped": "no data interface"}
    with pytest.raises(ValueError):
        ports_probe.probe(NodeContext({}))


# ------------------------------------------------------------------------------------------ plan, rule


def cluster(n=3, port_facts=None, **kw):
    facts = {}
    for i, name in enumerate(names(n), 1):
        facts[name] = {"nic": data_node(i)}
        if port_facts and name in port_facts:
            facts[name]["ports"] = port_facts[name]
    return view(facts, **kw)


def test_plan():
    plan = ports_rule.plan(cluster(3, cluster={"master_port": 29600}))
    head = plan["n001"]
    assert head["role"] == "listen" and head["port"] == 29600 and head["bind_ip"] == "198.19.0.1"
    assert head["expect_peers"] == ["198.19.0.2", "198.19.0.3"] and head["expect_names"] == ["n002", "n003"]
    assert plan["n002"] == {
        "role": "connect",
        "name": "n002",
        "host": "198.19.0.1",
        "port": 29600,
        "source_ip": "198.19.0.2",
        "retry_s": ports_probe.RETRY_S,
    }
    assert plan["n003"]["role"] == "connect"
    json.dumps(plan)


def connected(n):
    return {
        "role": "connect",
        "host": "198.19.0.1",
        "port": 29500,
        "connected": True,
        "handshake": True,
        "reply": "preflight-ok n001",
        "attempts": n,
        "elapsed_s": 0.5 * n,
        "error": None,
    }


def listening(*names):
    return {
        "role": "listen",
        "port": 29500,
        "bind_ip": "0.0.0.0",
        "listening": True,
        "peers": [{"ip": "198.19.0.%d" % (i + 2), "name": n, "at_s": 0.1} for i, n in enumerate(names)],
    }


def test_rule_pass():
    view = cluster(3, {"n001": listening("n002", "n003"), "n002": connected(1), "n003": connected(3)})
    findings = {f.node: f for f in ports_rule.rule(view)}
    assert {n: f.status for n, f in findings.items()} == {"n001": Status.PASS, "n002": Status.PASS, "n003": Status.PASS}
    assert findings["n001"].message == "listened on port 29500; 2 peers connected (n[002-003])"


def test_rule_busy_port_message():
    busy = {
        "role": "listen",
        "port": 29500,
        "bind_ip": "0.0.0.0",
        "listening": False,
        "peers": [],
        "error": "EADDRINUSE: Address already in use",
        "errno": "EADDRINUSE",
        "holders": [{"pid": 4242, "comm": "python3", "uid": 1000, "ip": "0.0.0.0"}],
        "free_ports": [29501, 29502, 29503],
    }
    refused = {
        "role": "connect",
        "host": "198.19.0.1",
        "port": 29500,
        "connected": True,
        "handshake": False,
        "reply": "",
        "attempts": 1,
        "elapsed_s": 3.0,
        "error": "the listener did not answer as preflight",
    }
    findings = {f.node: f for f in ports_rule.rule(cluster(2, {"n001": busy, "n002": refused}))}
    assert findings["n001"].status == Status.FAIL
    assert findings["n001"].message == "n001: port 29500 is held by pid 4242 (python3, uid 1000); try --master-port 29501 (free)"
    # n002 is not at fault: not tested, its status its own (not 'fail'), so it stays in the hostfile
    assert findings["n002"].status == Status.SKIP
    assert findings["n002"].message == "not tested: the head n001 could not listen on port 29500 (its finding says why)"
    assert report.node_statuses(list(findings.values()), ["n001", "n002"]) == {"n001": "fail", "n002": "pass"}


def test_rule_port_held_by_another_preflight_run_is_a_retest_for_no_node():
    busy = {"role": "listen", "port": 29500, "bind_ip": "0.0.0.0", "listening": False, "peers": [],
            "busy": {"pid": 4242, "uid": 0}, "error": "another preflight run (pid 4242, uid 0) holds port 29500"}
    landed = dict(connected(1), handshake=False, reply="", error="the listener did not answer as preflight")
    (f,) = ports_rule.rule(cluster(3, {"n001": busy, "n002": landed, "n003": connected(1)}))
    assert (f.node, f.status, f.action) == (None, Status.ERROR, "retest")
    assert f.message == ("not tested: port 29500 on the head n001 is in use by another preflight run (pid 4242, "
                         "uid 0) (its all-reduce or its port test); retest when it has finished")


def test_rule_holder_not_visible():
    busy = {
        "role": "listen",
        "port": 29500,
        "listening": False,
        "errno": "EADDRINUSE",
        "error": "EADDRINUSE",
        "holders": [{"pid": None, "comm": None, "uid": 0, "ip": "0.0.0.0"}],
        "free_ports": [],
    }
    f = [x for x in ports_rule.rule(cluster(1, {"n001": busy}))][0]
    assert f.message == "n001: port 29500 is held by a process of uid 0 not visible to this user"


@pytest.mark.parametrize(
    "errno_name, hint",
    [("ECONNREFUSED", "refused"), ("ETIMEDOUT", "timed out: a firewall"), ("EHOSTUNREACH", "unreachable")],
)
def test_rule_connect_failure(errno_name, hint):
    failed = {
        "role": "connect",
        "host": "198.19.0.1",
        "port": 29500,
        "connected": False,
        "handshake": False,
        "attempts": 30,
        "elapsed_s": 10.0,
        "error": "Connection refused",
        "errno": errno_name,
    }
    findings = {
        f.node: f for f in ports_rule.rule(cluster(3, {"n001": listening("n002"), "n002": connected(1), "n003": failed}))
    }
    assert findings["n003"].status == Status.FAIL
    assert findings["n003"].message.startswith("n003 → n001 198.19.0.1:29500: " + hint)
    assert findings["n001"].status == Status.PASS and findings["n002"].status == Status.PASS


def test_rule_errors_never_pass():
    findings = {f.node: f.status for f in ports_rule.rule(cluster(2, {"n001": {"probe_error": "boom"}}))}
    assert findings == {"n001": Status.ERROR, "n002": Status.ERROR}

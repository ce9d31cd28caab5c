"""preflight.probe.portclaim: a run's claim on a rendezvous port (and the controller's on its nodes), seen by
another process as "another preflight run" with its pid; released by close or by the holder's death; believed
only from this run's user or root (a real second uid, `nobody` through setpriv, squats the names)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import uuid

import pytest

from preflight.probe import portclaim
from tests.paths import REPO


#: what a local user of another uid runs to squat preflight's names (and, given a port, the TCP port too)
SQUAT = """
import os, socket, sys, time
held = []
for name in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind("\\0" + name); s.listen(1); held.append(s)
    while os.environ.get("FILL"):  # its backlog full: nobody can connect to ask who holds it
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.setblocking(False)
        try:
            c.connect("\\0" + name)
        except BlockingIOError:
            break
        held.append(c)
if int(sys.argv[1]):
    t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", int(sys.argv[1]))); t.listen(1); held.append(t)
print("ready", flush=True)
time.sleep(300)
"""


def as_other_uid(argv, user="nobody"):
    """argv run as another local user (setpriv: real, effective and saved uid, its own group, no others)."""
    if os.geteuid() != 0:
        pytest.skip("a second uid needs root (setpriv)")
    entry = pwd.getpwnam(user)
    return ["setpriv", "--reuid=%d" % entry.pw_uid, "--regid=%d" % entry.pw_gid, "--clear-groups"] + list(argv)


@contextlib.contextmanager
def squatter(names, tcp_port=0, fill=False):
    """A process of uid `nobody` holding the abstract names (their backlogs full when `fill`; tcp_port on
    0.0.0.0 when given) until the block ends: yields its pid. Killed and reaped on the way out."""
    proc = subprocess.Popen(as_other_uid([sys.executable, "-c", SQUAT, str(tcp_port)] + list(names)),
                            stdout=subprocess.PIPE, cwd="/", env=dict(os.environ, FILL="1" if fill else ""))
    try:
        assert proc.stdout.readline().strip() == b"ready"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def nobody():
    return pwd.getpwnam("nobody").pw_uid


def unique_port():
    """A port number no other test in this network namespace claims (the claim is a name, not a bind)."""
    return 40000 + uuid.uuid4().int % 20000


def test_a_claimed_port_cannot_be_claimed_again_and_names_its_holder():
    port = unique_port()
    assert portclaim.holder(port) is None
    mine = portclaim.claim(port)
    try:
        again = portclaim.claim(port)
        assert mine.sock is not None and again.sock is None and again.squatter is None
        assert again.busy == {"pid": os.getpid(), "uid": os.getuid()}  # this run's user: believed
        assert portclaim.holder(port) == {"pid": os.getpid(), "uid": os.getuid()}
        assert portclaim.describe(portclaim.holder(port)) == "another preflight run (pid %d, uid %d)" % (
            os.getpid(), os.getuid())
    finally:
        mine.close()
    assert portclaim.holder(port) is None  # closed: free again
    again = portclaim.claim(port)
    assert again.sock is not None and again.busy is None
    again.close()


def test_the_claim_dies_with_its_holder():
    port = unique_port()
    code = "import sys, time; from preflight.probe import portclaim; c = portclaim.claim(%d); " \
           "print('ready', flush=True); time.sleep(60)" % port
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(
        os.environ, PYTHONPATH=REPO))
    try:
        assert holder.stdout.readline().strip() == b"ready"
        assert portclaim.holder(port)["pid"] == holder.pid and portclaim.claim(port).busy["pid"] == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert portclaim.holder(port) is None  # no stale lock after a SIGKILL
    again = portclaim.claim(port)
    assert again.sock is not None  # no stale claim to clean up
    again.close()


def test_the_controller_claims_all_its_nodes_or_none():
    hosts = ["h-%s" % uuid.uuid4().hex for _ in range(3)]
    claims, held = portclaim.claim_nodes(hosts[:2])
    try:
        assert len(claims) == 2 and held == {}
        again, busy = portclaim.claim_nodes(hosts[1:])  # overlaps on one host
        assert again == [] and busy == {hosts[1]: {"pid": os.getpid(), "uid": os.getuid()}}
        third, free = portclaim.claim_nodes(hosts[2:])  # nothing kept from the refused attempt
        assert len(third) == 1 and free == {}
        third[0].close()
    finally:
        for c in claims:
            c.close()


def test_a_port_claim_held_by_another_uid_is_not_believed_and_blocks_nothing():
    """Before: any user binding preflight-port-P made this run read "another preflight run" and stop."""
    port = unique_port()
    with squatter([portclaim.PREFIX + str(port)]) as pid:
        got = portclaim.claim(port)
        try:
            assert got.busy is None and got.sock is None  # not believed, and not ours to hold
            assert got.squatter == {"pid": pid, "uid": nobody()}
            assert portclaim.describe_squatter(got.squatter) == ("preflight's run claim on it is held by pid %d of "
                                                                 "uid %d (not this run's user or root: not believed)"
                                                                 % (pid, nobody()))
        finally:
            got.close()


def test_a_node_claim_squatted_by_another_uid_does_not_stop_the_all_reduce():
    """Before: binding one node's name on a shared login node refused every all-reduce on that node."""
    hosts = ["h-%s" % uuid.uuid4().hex for _ in range(2)]
    with squatter([portclaim.node_name(hosts[0])]):
        claims, held = portclaim.claim_nodes(hosts)
        try:
            assert held == {} and len(claims) == 2
            assert [c.sock is not None for c in claims] == [h != hosts[0] for h in sorted(hosts)]
        finally:
            for c in claims:
                c.close()


def test_a_claim_held_by_root_is_believed_by_a_run_of_another_user():
    """The twin: root's run (this test process) holds the port; a run of uid nobody sees it as busy."""
    port = unique_port()
    mine = portclaim.claim(port)
    code = "from preflight.probe import portclaim; c = portclaim.claim(%d); print(c.busy, c.squatter)" % port
    try:
        out = subprocess.run(as_other_uid([sys.executable, "-c", code]), stdout=subprocess.PIPE,
                             universal_newlines=True, env=dict(os.environ, PYTHONPATH=REPO), cwd="/", timeout=60)
    finally:
        mine.close()
    assert out.stdout.strip() == "{'pid': %d, 'uid': 0} None" % os.getpid()


def test_a_squatter_that_fills_its_backlog_is_not_believed_and_costs_no_wait():
    """A holder whose backlog is full cannot be asked who it is: that is no preflight run's claim either (before:
    a 1 s wait, then "another preflight run", busy)."""
    port = unique_port()
    with squatter([portclaim.PREFIX + str(port)], fill=True):
        got = portclaim.claim(port)
    assert got.busy is None and got.sock is None and got.squatter == {}
    assert portclaim.describe_squatter(got.squatter).startswith(
        "preflight's run claim on it is held by a process whose credentials could not be read")

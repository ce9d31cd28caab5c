"""preflight.probe.portclaim: a run's claim on a rendezvous port (and the controller's on its nodes), seen by
another process as "another preflight run" with its pid; released by close or by the holder's death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

from preflight.probe import portclaim


def unique_port():
    """A port number no other test in this network namespace claims (the claim is a name, not a bind)."""
    return 40000 + uuid.uuid4().int % 20000


def test_a_claimed_port_cannot_be_claimed_again_and_names_its_holder():
    port = unique_port()
    assert portclaim.holder(port) is None
    mine = portclaim.claim(port)
    try:
        assert mine is not None and portclaim.claim(port) is None
        assert portclaim.holder(port) == {"pid": os.getpid(), "uid": os.getuid()}
        assert portclaim.describe(portclaim.holder(port)) == "another preflight run (pid %d, uid %d)" % (
            os.getpid(), os.getuid())
    finally:
        mine.close()
    assert portclaim.holder(port) is None  # closed: free again
    again = portclaim.claim(port)
    assert again is not None
    again.close()


def test_the_claim_dies_with_its_holder():
    port = unique_port()
    code = "import sys, time; from preflight.probe import portclaim; c = portclaim.claim(%d); " \
           "print('ready', flush=True); time.sleep(60)" % port
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(
        os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        assert holder.stdout.readline().strip() == b"ready"
        assert portclaim.holder(port)["pid"] == holder.pid and portclaim.claim(port) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert portclaim.holder(port) is None  # no stale lock after a SIGKILL
    portclaim.claim(port).close()


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

"""A slow login shell is not a broken node (issue 40 item 12), on the simulated cluster's real sshd.

Each node's shell runs a real start-up file (bash sources $BASH_ENV before every command sshd runs, as it
sources ~/.bashrc on a real node) that takes a lock shared by every node and holds it, as `pyenv init`'s
rehash lock on an NFS home does: the shells start one after another. Nodes are few (2 cores shared);
what a larger run measured is in the report of the change.
"""

from __future__ import annotations

import fcntl
import json
import shlex
import sys
import time

import pytest

from preflight.model import FAILURE_KINDS, NodeInfo, Status
from preflight.transport.contract import NodeFailure
from preflight.transport.ssh import ShellStarts
from tests.paths import REPO
from tests import builders



def _slow_rc(cluster, lock: str, hold_s: float) -> None:
    """Every node's shell start-up file takes `lock` (shared: one file for all nodes) and holds it hold_s."""
    text = "exec 9>>%s; flock 9; sleep %g; exec 9>&-\n" % (shlex.quote(lock), hold_s)
    for node in cluster:
        with open(node.shell_rc, "w") as fh:
            fh.write(text)


def _wait_no_leftovers(cluster, bound_s: float = 30.0):
    """Processes the runs started on the nodes, once those still unwinding had time to end (polled)."""
    until = time.monotonic() + bound_s
    while cluster.leftover_processes() and time.monotonic() < until:
        time.sleep(0.2)
    return cluster.leftover_processes()


def test_healthy_nodes_whose_login_shells_start_one_after_another_pass(sim_cluster, tmp_path):
    """Three shells queue on one lock for 2 s each: the last starts its command after >= 6 s, past the
    4 s command deadline. Before, that node was `FAIL ssh timed out`, action isolate; the shell's start now
    has its own bound and the deadline counts from the command's start."""
    cluster = sim_cluster(3)
    _slow_rc(cluster, str(tmp_path / "rehash.lock"), 2)
    inv = cluster.inventory(command_timeout=4, connect_timeout=5)
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh", "--json", "-",
                        "--no-progress"], cwd=REPO, timeout=120)
    doc = json.loads(proc.stdout)
    ssh = {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}
    assert {n: r["status"] for n, r in ssh.items()} == {"n001": "pass", "n002": "pass", "n003": "pass"}, ssh
    assert proc.returncode == 0, proc.stderr
    assert _wait_no_leftovers(cluster) == {}


def test_a_login_shell_that_does_not_start_the_command_is_named_not_a_dead_node(sim_cluster, tmp_path):
    """The start-up file waits on a lock held elsewhere (a hung NFS home's lock): connected, authenticated,
    no `preflight-pid` line within the shell's bound. The failure names the login environment and how to
    quiet it; once the lock is free the shell goes on, finds its channel closed and ends."""
    from preflight import inventory
    from preflight.transport.ssh import SSHSession

    cluster = sim_cluster(1)
    lock = str(tmp_path / "rehash.lock")
    _slow_rc(cluster, lock, 0)
    spec = inventory.load(cluster.inventory(connect_timeout=5)).nodes[0]
    held = open(lock, "a")
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with cluster.in_ctl():
            session = SSHSession(spec)
            session.starts = ShellStarts()  # this test's own gate
            session.SHELL_START_S = 3.0
            session.open()
            try:
                with pytest.raises(NodeFailure) as failed:
                    session.run_bundle({"mode": "probe", "checks": {"ssh": {}}}, deadline_s=2)
            finally:
                session.close()
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
    assert failed.value.kind == "login_shell", failed.value
    message = str(failed.value)
    assert message.startswith("login shell slow: connected and authenticated, but the shell's start-up files had "
                              "not finished after 3 s"), message
    assert "[[ $- == *i* ]] || return" in message and "retest" in message
    assert session.starts.limit is None  # one slow shell under SLOW_S: the gate stays open
    assert _wait_no_leftovers(cluster) == {}


def test_the_ssh_check_makes_a_slow_login_shell_a_retest_never_an_isolate():
    why = "login shell slow: connected and authenticated, but the shell's start-up files had not finished after 60 s"
    from preflight.checks.ssh import rule as ssh_rule
    nodes = [NodeInfo("n001", "n001", 0), NodeInfo("n002", "n002", 0)]
    view = builders.view({},
                         nodes=nodes,
                         expect={},
                         cluster={FAILURE_KINDS: {"n001": "login_shell", "n002": "timeout"}},
                         unreachable={"n001": why, "n002": "timed out: no answer within 60 s"})
    by_node = {f.node: f for f in ssh_rule.rule(view)}
    assert (by_node["n001"].status, by_node["n001"].action) == (Status.ERROR, "retest"), by_node["n001"]
    assert by_node["n001"].message == why
    assert (by_node["n002"].status, by_node["n002"].action) == (Status.FAIL, "isolate")  # the twin: a hung node


def test_slow_shell_starts_narrow_the_gate_and_fast_ones_widen_it():
    gate = ShellStarts()
    assert all(gate.enter(lambda: False) for _ in range(20)) and gate.limit is None
    gate.leave(0.5)
    assert gate.limit is None  # fast starts never narrow it
    gate.leave(ShellStarts.SLOW_S + 1)
    assert gate.limit == 9  # half of the 18 still starting, rounded up
    gate.leave(ShellStarts.SLOW_S + 2)
    assert gate.limit == 9  # the same slow spell: one cut
    gate.leave(0.1)
    assert gate.limit == 10
    assert gate.enter(lambda: True) is False  # 16 starting >= 10: a cancelled wait takes no place
    for _ in range(16):
        gate.leave(None)
    assert gate.starting == 0 and gate.limit == 10

"""Ranks warmed during phase 1 (preflight.probe.bench_warm) with real torch.distributed (gloo on 127.0.0.1):
adopted by the bench agent, refused when they do not fit, and never outliving the node process that
started them (killed, or ended before any bench came).

The node process is this test process (the agent runs in it, as in the bundle's process on a node) or,
for the lifetime tests, a child python that plays it and is then killed or exits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from preflight.probe import bench_agent, bench_warm
from tests.probe.test_bench_agent import assert_no_leftovers, config, free_port, our_ranks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def no_warm_left():
    yield
    bench_warm.discard()
    assert not bench_warm.WARM and not bench_warm.RESERVES


def warm(local=2, **spec):
    return bench_agent.warm(dict({"backend": "gloo", "local_world_size": local, "python": sys.executable}, **spec))


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, bound_s=60.0):
    """The pids still alive after up to bound_s (generous: an exit under load, never a timing claim)."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end and [p for p in pids if alive(p)]:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_warm_ranks_are_adopted_by_the_bench_and_run_it():
    assert warm() == {"started": 2}
    pids = [w.proc.pid for w in bench_warm.WARM.values()]
    doc = bench_agent.run(config(free_port(), 2, local=2))  # the go may reach them still importing
    assert doc["error"] is None and doc["deadline"] is None, doc
    assert [(r["rank"], r["status"], r["warm"], r["pid"]) for r in doc["ranks"]] == [
        (0, "ok", True, pids[0]), (1, "ok", True, pids[1])]
    for r in doc["ranks"]:
        assert [s["bytes"] for s in r["sizes"]] == [1024, 2048, 4096, 65536] and all(s["ok"] for s in r["sizes"])
        assert r["import_s"] is not None and r["import_s"] > 0  # the rank's own import, measured in it
    assert not bench_warm.WARM
    assert_no_leftovers(doc)


def test_a_warm_rank_that_does_not_fit_is_stopped_and_a_cold_one_runs():
    """Twin of the adoption: the bench env sets a variable torch reads at import (OMP_NUM_THREADS), so the
    ranks warmed without it would measure with the wrong setting: they are killed, cold ranks run."""
    warm()
    pids = [w.proc.pid for w in bench_warm.WARM.values()]
    cfg = config(free_port(), 2, local=2)
    cfg["env"]["OMP_NUM_THREADS"] = "2"
    doc = bench_agent.run(cfg)
    assert [(r["status"], r["warm"]) for r in doc["ranks"]] == [("ok", False), ("ok", False)], doc
    assert not set(pids) & {r["pid"] for r in doc["ranks"]}
    assert wait_gone(pids) == []
    assert_no_leftovers(doc)


def test_more_warm_ranks_than_the_bench_wants_are_stopped_when_it_ends():
    warm(local=3)
    spare = bench_warm.WARM[2].proc.pid
    doc = bench_agent.run(config(free_port(), 2, local=2))
    assert [(r["status"], r["warm"]) for r in doc["ranks"]] == [("ok", True), ("ok", True)], doc
    assert not bench_warm.WARM and wait_gone([spare]) == []
    assert_no_leftovers(doc)


def test_a_warm_rank_still_importing_at_the_init_deadline_is_named_at_its_import(tmp_path):
    """The interpreter takes longer than the init deadline to start (a slow import): the rank is a timeout
    at step "import", its own delay, not the rendezvous's or the network's."""
    slow = tmp_path / "slowpython"
    # one process (a shell's `sleep` child would outlive the kill): it waits, then becomes the interpreter
    slow.write_text("#!%s\nimport os, sys, time\ntime.sleep(60)\nos.execv(%r, [%r] + sys.argv[1:])\n"
                    % (sys.executable, sys.executable, sys.executable))
    slow.chmod(0o755)
    warm(local=1, python=str(slow))
    cfg = dict(config(free_port(), 2, local=1, init_s=3), python=str(slow))
    doc = bench_agent.run(cfg)
    (r,) = doc["ranks"]
    assert (r["status"], r["stage"], r["step"], r["warm"]) == ("timeout", "init", "import", True), r
    assert doc["deadline"] == {"kind": "init", "limit_s": 3.0}
    assert_no_leftovers(doc)


NODE = r"""
import json, os, sys
sys.path.insert(0, %(repo)r)
from preflight.probe import bench_agent, bench_warm
print(json.dumps(bench_agent.warm({"backend": "gloo", "local_world_size": 2, "python": sys.executable})))
print(json.dumps([w.proc.pid for w in bench_warm.WARM.values()]), flush=True)
if sys.stdin.readline().strip() == "exit":
    os._exit(0)  # the bootstrap's end after its last phase: no bench came for this node
sys.stdin.read()
"""


@pytest.mark.parametrize("end", ["sigkill", "exit", "eof-killpg"])
def test_warm_ranks_never_outlive_the_node_process(end):
    """The node process is SIGKILLed (the controller gone, the bootstrap's watchdog), exits after its last
    phase without a bench (a node that failed phase 1), or its group is killed: no warm rank is left."""
    node_ends_and_takes_its_ranks([sys.executable, "-c", NODE % {"repo": REPO}], {"started": 2}, 2, end)


def node_ends_and_takes_its_ranks(argv, first_line, count, end):
    """Start the node process argv (it prints first_line, then its warm ranks' pids, then waits on stdin),
    end it the way `end` says, and assert that none of its ranks is left."""
    node = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert json.loads(node.stdout.readline()) == first_line
        pids = json.loads(node.stdout.readline())
        assert len(pids) == count and all(alive(p) for p in pids)
        if end == "sigkill":
            node.kill()
        elif end == "exit":
            node.stdin.write(b"exit\n")
            node.stdin.flush()
        else:
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(60)
        assert wait_gone(pids) == []
        assert our_ranks(node.pid) == []
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(10)

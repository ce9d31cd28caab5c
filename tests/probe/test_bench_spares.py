"""The next round's ranks started during this bench (preflight.probe.bench_spares), with real torch.distributed
(gloo on 127.0.0.1): the next bench adopts them; a bench without "next_warm" leaves none; a misfit is stopped
and a cold rank runs; a spare opens no socket before its go; one still importing at the next bench's init
deadline is named at its import; a bench that fails short of the trigger still starts them (the rounds
follow); and none outlives the node process that started them.

The node process is this test process (the agent runs in it, as in the bundle's kept process on a node) or,
for the lifetime tests, a child python that plays it and is then killed or exits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from preflight.probe import bench_agent, bench_warm
from tests.probe.test_bench_agent import assert_no_leftovers, config, free_port
from tests.probe.test_bench_warm import REPO, alive, node_ends_and_takes_its_ranks, wait_gone

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")


@pytest.fixture(autouse=True)
def no_warm_left():
    yield
    bench_warm.discard()
    assert not bench_warm.WARM


def with_next(cfg, after="done", **spec):
    return dict(cfg, next_warm=dict({"backend": "gloo", "local_world_size": cfg["local_world_size"],
                                     "python": sys.executable, "after": after}, **spec))


def spare_pids():
    return [w.proc.pid for _lr, w in sorted(bench_warm.WARM.items())]


def sockets(pid):
    """The socket file descriptors a process holds (a connection, a listener)."""
    out = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("socket:"):
                out.append(fd)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("after", ["done", "store", "init", "end"])
def test_a_bench_starts_the_next_rounds_ranks_and_the_next_bench_adopts_them(after):
    doc = bench_agent.run(with_next(config(free_port(), 2, local=2), after))
    assert doc["error"] is None and [(r["status"], r["warm"]) for r in doc["ranks"]] == [("ok", False)] * 2, doc
    spares = spare_pids()
    assert len(spares) == 2 and all(alive(p) for p in spares)
    assert not set(spares) & {r["pid"] for r in doc["ranks"]}  # new processes, not this bench's ranks
    again = bench_agent.run(config(free_port(), 2, local=2))
    assert [(r["status"], r["warm"], r["pid"]) for r in again["ranks"]] == [("ok", True, p) for p in spares], again
    assert all(r["store_s"] is not None and r["store_s"] <= r["init_s"] for r in again["ranks"])
    assert not bench_warm.WARM
    assert_no_leftovers(doc, again)


def test_a_bench_without_next_warm_leaves_no_spare():
    """Twin: the last round (or a transport that keeps no process) asks for none: nothing stays behind."""
    doc = bench_agent.run(config(free_port(), 2, local=2))
    assert [(r["status"], r["warm"]) for r in doc["ranks"]] == [("ok", False)] * 2
    assert not bench_warm.WARM
    assert_no_leftovers(doc)


def test_a_spare_opens_no_socket_before_its_go():
    """It only imports and waits: no store, no peer, no listener until the next bench hands it its go."""
    doc = bench_agent.run(with_next(config(free_port(), 1, local=1)))
    (spare,) = spare_pids()
    # its import done (the worker says so on its stdout, which the next bench reads): still no socket
    line = bench_warm.WARM[0].proc.stdout.readline()
    assert json.loads(line)["event"] == "imported", line
    assert sockets(spare) == []
    bench_warm.discard()
    assert_no_leftovers(doc)


def test_a_spare_that_does_not_fit_the_next_round_is_stopped_and_a_cold_rank_runs():
    """The next bench sets a variable torch reads at import (OMP_NUM_THREADS): the spares started without it
    are killed and cold ranks run; the verdict is the same."""
    bench_agent.run(with_next(config(free_port(), 2, local=2)))
    spares = spare_pids()
    cfg = config(free_port(), 2, local=2)
    cfg["env"]["OMP_NUM_THREADS"] = "2"
    doc = bench_agent.run(cfg)
    assert [(r["status"], r["warm"]) for r in doc["ranks"]] == [("ok", False)] * 2, doc
    assert wait_gone(spares) == []
    assert_no_leftovers(doc)


def test_fewer_ranks_next_round_the_extra_spare_is_stopped():
    bench_agent.run(with_next(config(free_port(), 2, local=2)))
    spares = spare_pids()
    doc = bench_agent.run(config(free_port(), 1, local=1))
    assert [(r["status"], r["warm"], r["pid"]) for r in doc["ranks"]] == [("ok", True, spares[0])], doc
    assert wait_gone(spares[1:]) == []
    assert_no_leftovers(doc)


def test_a_bench_that_fails_before_the_trigger_still_starts_the_spares():
    """A fault (here: the second rank never comes, the init deadline fires): rounds follow, so the spares
    start when the bench ends; an invalid config starts none (twin)."""
    doc = bench_agent.run(with_next(config(free_port(), 2, local=1, init_s=3)))
    assert doc["deadline"] == {"kind": "init", "limit_s": 3.0}, doc
    assert len(spare_pids()) == 1
    bench_warm.discard()
    bad = bench_agent.run(with_next(dict(config(free_port(), 2, local=1), sizes=[])))
    assert bad["error"].startswith("invalid config") and not bench_warm.WARM


def test_spares_asked_for_after_a_fault_start_only_after_one():
    """"failed" (gloo's sweep): a bench whose ranks all finish ok leaves no spare (a healthy cluster needs
    no round); its twin, a bench whose init deadline fires, starts them at its end."""
    doc = bench_agent.run(with_next(config(free_port(), 2, local=2), "failed"))
    assert [r["status"] for r in doc["ranks"]] == ["ok", "ok"] and not bench_warm.WARM, doc
    failed = bench_agent.run(with_next(config(free_port(), 2, local=1, init_s=3), "failed"))
    assert failed["deadline"] == {"kind": "init", "limit_s": 3.0}, failed
    assert len(spare_pids()) == 1
    bench_warm.discard()
    assert_no_leftovers(doc, failed)


def test_a_spare_still_importing_at_the_init_deadline_is_named_at_its_import(tmp_path):
    slow = tmp_path / "slowpython"
    slow.write_text("#!%s\nimport os, sys, time\ntime.sleep(60)\nos.execv(%r, [%r] + sys.argv[1:])\n"
                    % (sys.executable, sys.executable, sys.executable))
    slow.chmod(0o755)
    bench_agent.run(with_next(config(free_port(), 1, local=1), python=str(slow)))
    assert len(spare_pids()) == 1
    doc = bench_agent.run(dict(config(free_port(), 2, local=1, init_s=3), python=str(slow)))
    (r,) = doc["ranks"]
    assert (r["status"], r["stage"], r["step"], r["warm"]) == ("timeout", "init", "import", True), r
    assert_no_leftovers(doc)


NODE = r"""
import json, os, sys
sys.path.insert(0, %(repo)r)
from preflight.probe import bench_agent, bench_warm
cfg = json.loads(sys.argv[1])
doc = bench_agent.run(cfg)
print(json.dumps([r["status"] for r in doc["ranks"]]))
print(json.dumps([w.proc.pid for w in bench_warm.WARM.values()]), flush=True)
if sys.stdin.readline().strip() == "exit":
    os._exit(0)  # the bootstrap's end: the next round left this node out (or the stage ended it)
sys.stdin.read()
"""


@pytest.mark.parametrize("end", ["sigkill", "exit", "eof-killpg"])
def test_spares_never_outlive_the_node_process(end):
    """The kept process is killed (the controller gone, a deadline), exits (a round that leaves the node out,
    or the stage's end: the transport ends a process not named), or its group is killed: no spare is left."""
    cfg = with_next(config(free_port(), 1, local=1))
    node_ends_and_takes_its_ranks([sys.executable, "-c", NODE % {"repo": REPO}, json.dumps(cfg)], ["ok"], 1, end)

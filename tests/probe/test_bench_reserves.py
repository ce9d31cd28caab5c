"""The later launches' ranks started in phase 1 ("reserves", preflight.probe.bench_warm.RESERVES) with real
torch.distributed (gloo on 127.0.0.1 standing in for nccl): three benches in a row each adopt one set and ask
for no spares while a reserve for the next launch is held; once they are used up, spares start as before; a
misfit is stopped and a cold rank runs; a reserve opens no socket before its go; and none outlives the node
process that started it (killed, exited, its group killed), an unused set included. The node process is
this test process, or for the lifetime tests a child python that plays it (as in test_bench_warm.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from preflight.probe import bench_agent, bench_warm
from tests.probe.test_bench_agent import assert_no_leftovers, config, free_port
from tests.probe.test_bench_spares import sockets, with_next
from tests.probe.test_bench_warm import REPO, alive, node_ends_and_takes_its_ranks, wait_gone, warm
from tests.probe.test_bench_warm import no_warm_left  # noqa: F401  (autouse: no warm rank or reserve left)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")


def pids(ranks):
    return [w.proc.pid for _lr, w in sorted(ranks.items())]


def test_reserves_start_in_phase_1_and_three_benches_in_a_row_each_adopt_one_set():
    """The sweep, the NIC round and the screening each adopt the set phase 1 started for them, none starting
    spares while a reserve for the next launch is held; the last bench, reserves used up, starts spares (as
    before reserves) for the rounds that may follow."""
    assert warm(local=1, reserves=2) == {"started": 1, "reserves": 2}
    sets = [pids(bench_warm.WARM)] + [pids(s) for s in bench_warm.RESERVES]
    everyone = [p for s in sets for p in s]
    assert len(set(everyone)) == 3 and all(alive(p) for p in everyone)
    docs = []
    for i, want in enumerate(sets):
        doc = bench_agent.run(with_next(config(free_port(), 1, local=1), "store"))
        assert [(r["status"], r["warm"], r["pid"]) for r in doc["ranks"]] == [("ok", True, want[0])], doc
        if i + 1 < len(sets):  # no second import of the next launch: its reserve set is what waits now
            assert pids(bench_warm.WARM) == sets[i + 1] and len(bench_warm.RESERVES) == 1 - i
        docs.append(doc)
    spares = pids(bench_warm.WARM)
    assert len(spares) == 1 and spares[0] not in everyone and not bench_warm.RESERVES
    bench_warm.discard()
    assert wait_gone(everyone + spares) == []
    assert_no_leftovers(*docs)


def test_a_reserve_that_does_not_fit_its_launch_is_stopped_and_a_cold_rank_runs():
    """The second launch sets a variable torch reads at import (OMP_NUM_THREADS): its reserve, started
    without it, is killed and a cold rank runs with the same verdict."""
    warm(local=1, reserves=1)
    reserve = pids(bench_warm.RESERVES[0])
    first = bench_agent.run(config(free_port(), 1, local=1))
    assert [(r["status"], r["warm"]) for r in first["ranks"]] == [("ok", True)], first
    assert pids(bench_warm.WARM) == reserve
    cfg = config(free_port(), 1, local=1)
    cfg["env"]["OMP_NUM_THREADS"] = "2"
    second = bench_agent.run(cfg)
    assert [(r["status"], r["warm"]) for r in second["ranks"]] == [("ok", False)], second
    assert second["ranks"][0]["pid"] not in reserve and wait_gone(reserve) == []
    assert_no_leftovers(first, second)


def test_a_reserve_opens_no_socket_before_its_go():
    """Still waiting after the bench before it ran (and that bench's rank had its store and its peers): the
    reserve imported torch and connected nowhere."""
    warm(local=1, reserves=1)
    doc = bench_agent.run(config(free_port(), 1, local=1))
    (reserve,) = pids(bench_warm.WARM)
    line = bench_warm.WARM[0].proc.stdout.readline()  # its import done: the worker says so on its stdout
    assert json.loads(line)["event"] == "imported", line
    assert sockets(reserve) == []
    bench_warm.discard()
    assert_no_leftovers(doc)


NODE = r"""
import json, os, sys
sys.path.insert(0, %(repo)r)
from preflight.probe import bench_agent, bench_warm
bench_agent.warm({"backend": "gloo", "local_world_size": 1, "python": sys.executable, "reserves": 1})
doc = bench_agent.run(json.loads(sys.argv[1]))
print(json.dumps([(r["status"], r["warm"]) for r in doc["ranks"]]))
print(json.dumps([w.proc.pid for s in [bench_warm.WARM] + bench_warm.RESERVES for w in s.values()]), flush=True)
if sys.stdin.readline().strip() == "exit":
    os._exit(0)  # the transport ends a process the next run does not name (spares.end after the last round)
sys.stdin.read()
"""


@pytest.mark.parametrize("end", ["sigkill", "exit", "eof-killpg"])
def test_reserves_never_outlive_the_node_process(end):
    """The sweep adopted its set; the NIC round's set is still held (a round that never came) when the kept
    process is killed, exits (the stage's end), or its group is killed: it is gone too."""
    cfg = config(free_port(), 1, local=1)
    node_ends_and_takes_its_ranks([sys.executable, "-c", NODE % {"repo": REPO}, json.dumps(cfg)],
                                  [["ok", True]], 1, end)

"""A size of the sweep costs warmup + timed all-reduces (and its stop decision) and no more, its last timed
result is the check, and the budget agreement between sizes rides on the stop decision.

bench_worker._one_size against a real gloo process group of one rank in this process (torch.distributed
through a counting pass-through: every call reaches gloo). Each collective is a network round trip on
every rank of the world (90-130 ms each at 16 simulated nodes at load 23-27: docs/speed.md), so a
sweep of 13 sizes pays for every one it adds. A wrong result must still be caught: the correctness check
reads the last timed all-reduce (its buffer freshly filled like every iteration's) instead of a 14th run.
"""

from __future__ import annotations

import datetime
import json
import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")


class Counting:
    """torch.distributed with all_reduce counted: every attribute is the real one."""

    def __init__(self, dist):
        self._dist = dist
        self.all_reduces = 0

    def all_reduce(self, *args, **kwargs):
        self.all_reduces += 1
        return self._dist.all_reduce(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._dist, name)


@pytest.fixture()
def world_of_one():
    """(torch, Counting(torch.distributed)): a gloo group of one rank, destroyed after the test."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield torch, Counting(dist)
    finally:
        dist.destroy_process_group()


def one_size(world, nbytes, expected, **cfg):
    from preflight.probe import bench_worker

    torch, dist = world
    return bench_worker._one_size(torch, dist, torch.device("cpu"), False, 0, nbytes, cfg, expected,
                                  stop=bench_worker._stop_rule(cfg))


def test_a_size_runs_its_warmup_and_timed_iterations_and_no_extra_check_run(world_of_one):
    out = one_size(world_of_one, 4096, 1.0, warmup=2, iters=5)
    assert (out["iters"], out["stop"], out["ok"]) == (5, "cap", True), out
    assert world_of_one[1].all_reduces == 2 + 5


def test_with_the_stop_rule_the_count_is_warmup_timed_and_decisions(world_of_one):
    # a tolerance every run meets: stable at the first decision (after iters_min), one decision collective
    out = one_size(world_of_one, 4096, 1.0, warmup=2, iters=9, iters_min=3, stable_tol=100.0)
    assert (out["iters"], out["stop"], out["ok"]) == (3, "stable", True), out
    assert world_of_one[1].all_reduces == 2 + 3 + 1


@pytest.mark.parametrize("stop", [{}, {"iters_min": 2, "stable_tol": 100.0}], ids=["at the cap", "stopped stable"])
def test_a_wrong_result_is_still_caught_with_its_first_bad_element(world_of_one, stop):
    # one rank: every element reduces to rank + 1 = 1.0; a check expecting 3.0 (a world whose peers did not
    # add their part) must flag every element, whether the size ran to its cap or stopped at a decision
    out = one_size(world_of_one, 4096, 3.0, warmup=1, iters=4, **stop)
    assert (out["ok"], out["mismatches"], out["expected"], out["got"], out["index"]) == (False, 1024, 3.0, 1.0, 0), out


def sweep(world, sizes, **cfg):
    """bench_worker._sweep over sizes: ([(bytes, seconds, runs)], the protocol lines it wrote)."""
    import io

    from preflight.probe import bench_worker

    torch, dist = world
    lines = io.StringIO()
    saved, bench_worker._events = bench_worker._events, lines
    try:
        done = bench_worker._sweep(torch, dist, torch.device("cpu"), False, 0, 1, dict(cfg, sizes=sizes), {})
    finally:
        bench_worker._events = saved
    return done, [json.loads(line) for line in lines.getvalue().splitlines()]


def test_the_budget_agreement_rides_on_each_sizes_stop_decision(world_of_one):
    # stable_tol 0: no size is stable, each runs to its cap after its one decision; the budget is far above
    # what the next size can take, and the decision's bound says so: no separate agreement between sizes
    done, events = sweep(world_of_one, [1024, 2048, 4096], warmup=2, iters=5, iters_min=3, stable_tol=0.0,
                         size_budget_s=1e6)
    assert [d[0] for d in done] == [1024, 2048, 4096] and not [e for e in events if e["event"] == "cut"]
    assert world_of_one[1].all_reduces == 3 * (2 + 5 + 1)


def test_a_bound_over_the_budget_still_asks_every_rank_and_cuts(world_of_one):
    # a budget nothing fits: the size stops at its decision ("budget"), whose bound is over it, so the ranks
    # agree on the exact figure (one more collective) and the sweep ends before the second size, as before
    done, events = sweep(world_of_one, [1024, 2048, 4096], warmup=2, iters=5, iters_min=3, stable_tol=0.0,
                         size_budget_s=1e-12)
    assert [d[0] for d in done] == [1024] and [e["bytes"] for e in events if e["event"] == "cut"] == [2048]
    assert [e["stop"] for e in events if e["event"] == "size"] == ["budget"]
    assert world_of_one[1].all_reduces == (2 + 3 + 1) + 1


def test_without_the_stop_rule_the_agreement_runs_between_sizes(world_of_one):
    done, _events = sweep(world_of_one, [1024, 2048, 4096], warmup=2, iters=5, size_budget_s=1e6)
    assert len(done) == 3 and world_of_one[1].all_reduces == 3 * (2 + 5) + 2


@pytest.mark.parametrize("tol,key", [(100.0, "collectives"), (0.0, "collectives_cap")], ids=["stable", "at the cap"])
def test_the_time_plan_counts_the_collectives_a_sweep_runs(world_of_one, tol, key):
    # the CPU sweep with the defaults (13 sizes, 2 warm-up, 3-5 timed): every size stable at iters_min, or
    # none before the cap; the plan's count is what the real sweep ran, rank for rank
    from preflight.checks.allreduce import plan, timeplan
    from preflight.probe import bench_worker

    tp = timeplan.time_plan([0] * 4, {}, {})
    sweep_plan = tp["phases"][0]
    done, _events = sweep(world_of_one, plan.CPU_SIZES, warmup=tp["warmup"], iters=tp["iters"],
                          iters_min=tp["iters_min"], stable_tol=tol, size_budget_s=1e6)
    assert len(done) == len(plan.CPU_SIZES)
    assert world_of_one[1].all_reduces == sweep_plan[key] == (78 if key == "collectives" else 104), sweep_plan
    assert timeplan.DECIDE_EVERY == bench_worker.DECIDE_EVERY


@pytest.mark.parametrize("growth,stops", [(1e9, ["cap", "latency", "latency", "cap"]), (1e-9, ["cap"] * 4), (0, ["cap"] * 4)],
                         ids=["latency-bound", "each size slower than the last", "rule off"])
def test_a_latency_bound_size_below_the_last_stops_at_iters_min(world_of_one, growth, stops):
    # forced through the config, never through timing: a growth nothing exceeds stops every size but the
    # first (nothing to compare with) and the last (the verdict) at its decision; one nothing meets, none;
    # without latency_growth (the rounds, an older controller) the rule is off
    sizes = [1024, 2048, 4096, 8192]
    done, events = sweep(world_of_one, sizes, warmup=2, iters=5, iters_min=3, stable_tol=0.0, size_budget_s=1e6,
                         latency_growth=growth)
    got = [(e["bytes"], e["iters"], e["stop"]) for e in events if e["event"] == "size"]
    assert got == [(b, 3 if why == "latency" else 5, why) for b, why in zip(sizes, stops)], got
    assert world_of_one[1].all_reduces == sum(2 + (3 if why == "latency" else 5) + 1 for why in stops)
    assert [d[2] for d in done] == [2 + (3 if why == "latency" else 5) for why in stops]

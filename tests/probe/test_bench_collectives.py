"""A size of the sweep costs warmup + timed all-reduces and no more, and its last timed result is the check.

bench_worker._one_size against a real gloo process group of one rank in this process (torch.distributed
through a counting pass-through: every call reaches gloo). Each collective is a network round trip on
every rank of the world (90-130 ms each at 16 simulated nodes at load 23-27: docs/speed.md), so a
sweep of 13 sizes pays for every one it adds. A wrong result must still be caught: the correctness check
reads the last timed all-reduce (its buffer freshly filled like every iteration's) instead of a 14th run.
"""

from __future__ import annotations

import datetime
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

"""The sweep's stop rule (bench_worker._stop_rule / _agree_stop) through the real agent and gloo ranks on 127.0.0.1.

`iters` is the cap; with `iters_min` below it a size stops once every rank's last iters_min iterations are
within stable_tol of their best ("stable"), before the size's time would pass size_budget_s ("budget"), else
at the cap ("cap"). Every rank runs the same count (a collective). Outcomes are forced through the config
(a tolerance every run meets, one no run can meet, a budget no run fits), never through timing.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.probe.test_bench_agent import assert_no_leftovers, config, free_port, run_all

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")

SIZES = [1024, 4096, 65536]


def sweep(**extra):
    """One agent, two local ranks: {rank: [size entries]} and the agent's document."""
    cfg = dict(config(free_port(), 2, local=2, sizes=SIZES), warmup=1, **extra)
    (doc,) = run_all((cfg,))
    assert doc["error"] is None and doc["deadline"] is None, doc
    assert [r["status"] for r in doc["ranks"]] == ["ok", "ok"], doc["ranks"]
    assert_no_leftovers(doc)
    return {r["rank"]: r["sizes"] for r in doc["ranks"]}, doc


def counts(sizes):
    return [(s["bytes"], s["iters"], s["stop"]) for s in sizes]


def test_stable_sizes_stop_at_the_minimum_on_every_rank():
    # a tolerance of 100x: any run is "stable" at its first decision
    by_rank, _doc = sweep(iters=12, iters_min=2, stable_tol=100.0)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(b, 2, "stable") for b in SIZES]
    assert all(s["ok"] and s["time_s"] > 0 for s in by_rank[0] + by_rank[1])


def test_the_default_tolerance_stops_each_size_between_the_minimum_and_the_cap():
    # the inventory's defaults (iters 5, iters_min 3; no stable_tol): which sizes are stable depends on the
    # machine's load, so only the bounds and the agreement of the ranks are asserted
    by_rank, _doc = sweep(iters=5, iters_min=3)
    assert counts(by_rank[0]) == counts(by_rank[1])
    for b, n, why in counts(by_rank[0]):
        assert (why, n) in (("stable", 3), ("cap", 5), ("budget", 3)), (b, n, why)


def test_sizes_never_stable_run_to_the_cap():
    # a tolerance no pair of positive times meets (median above half the best): never stable, no budget hit
    by_rank, _doc = sweep(iters=7, iters_min=2, stable_tol=-0.5, size_budget_s=3600)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(b, 7, "cap") for b in SIZES]


def test_without_iters_min_every_size_runs_iters_as_before():
    by_rank, _doc = sweep(iters=4)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(b, 4, "cap") for b in SIZES]


def test_a_size_over_its_budget_stops_there_and_the_sweep_is_cut_after_it():
    # never stable, and a budget no iteration fits: the first size stops at its first decision ("budget"),
    # then the sweep's cut ends it before the next size (the agent reports the cut)
    by_rank, doc = sweep(iters=12, iters_min=2, stable_tol=-0.5, size_budget_s=1e-9)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(SIZES[0], 2, "budget")]
    assert all(r["cut"] and r["cut"]["bytes"] == SIZES[1] for r in doc["ranks"]), doc["ranks"]


def test_iters_min_above_iters_is_clamped_by_the_agent():
    # the inventory refuses it (exit 2); a hand-written agent config runs fixed iterations
    by_rank, _doc = sweep(iters=3, iters_min=9)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(b, 3, "cap") for b in SIZES]


def test_a_latency_bound_size_stops_at_the_minimum_through_the_agent():
    # latency_growth reaches the ranks (the agent forwards it); forced through the config, not timing: a growth
    # nothing exceeds stops the middle size (the first has nothing to compare with, the last is the verdict)
    by_rank, _doc = sweep(iters=6, iters_min=2, stable_tol=-0.5, size_budget_s=3600, latency_growth=1e9)
    assert counts(by_rank[0]) == counts(by_rank[1]) == [(1024, 6, "cap"), (4096, 2, "latency"), (65536, 6, "cap")]

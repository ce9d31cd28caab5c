"""The burn-in's all-reduce soak: real rounds in the ranks' compute phase (torch on CPU, gloo on 127.0.0.1,
through bench_agent as on a node) and the rule's verdicts on recorded per-round figures."""

from __future__ import annotations

import importlib.util

import pytest

from preflight.checks.allreduce import soak, tiers
from preflight.model import NodeInfo, Status

from tests import builders
from tests.probe.test_bench_agent import config, free_port, our_ranks, run_all

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")

#: the gloo burn-in spec, shortened: 3 rounds of about 0.1 s
SHORT = dict(tiers.SPECS[("burn-in", "gloo")], seconds=0.2, soak_rounds=3, soak_round_s=0.1, tier="burn-in")


def _view(docs, names, compute):
    infos = [NodeInfo(n, "127.0.0.1", 0, i == 0, {}) for i, n in enumerate(names)]
    meta = {"backend": docs[0].get("backend", "gloo"), "nodes": list(names), "compute": compute}
    return builders.view({n: {"allreduce": d} for n, d in zip(names, docs)}, nodes=infos, cluster={"allreduce": meta})


@needs_torch
def test_the_soak_runs_its_rounds_in_the_ranks_and_cpu_nodes_pass_on_completion():
    port = free_port()
    docs = run_all(*[(dict(config(port, 2, node_rank=i, sizes=[1024]), compute=SHORT),) for i in range(2)])
    soaks = [r["compute"]["soak"] for d in docs for r in d["ranks"]]
    assert all(s["ok"] and len(s["rounds"]) == 3 == len(s["iters"]) and s["world"] == 2 for s in soaks), soaks
    assert soaks[0]["rounds"] == soaks[1]["rounds"]  # every rank holds the slowest rank's figures
    found = soak.soak_findings(_view(docs, ["n0", "n1"], SHORT))
    assert [f.status for f in found] == [Status.PASS] and "CPU: judged on completion" in found[0].message
    assert not our_ranks()


def _recorded(rounds, ok=True, backend="nccl"):
    docs = [{"backend": backend, "ranks": [{"rank": 0, "status": "ok", "compute": {"soak": {
        "bytes": 256 << 20, "iters": [200] * len(rounds), "rounds": rounds, "ok": ok, "world": 16}}}]}]
    spec = dict(tiers.SPECS[("burn-in", backend)], tier="burn-in")
    return soak.soak_findings(_view(docs, ["g0"], spec))


def test_steady_rounds_pass_with_their_figures_and_one_slow_round_fails():
    steady = _recorded([0.0100, 0.0102, 0.0101, 0.0099, 0.0100])
    assert [f.status for f in steady] == [Status.PASS] and "steady (spread 3%)" in steady[0].message
    assert "GB/s bus" in steady[0].message
    flap = _recorded([0.0100, 0.0101, 0.0180, 0.0100, 0.0100])
    assert [(f.status, f.action) for f in flap] == [(Status.FAIL, "retest")] and "1.8x the median" in flap[0].message


def test_a_wide_spread_warns_and_wrong_sums_fail_and_a_cpu_spread_is_not_judged():
    wide = _recorded([0.0100, 0.0112, 0.0118, 0.0100, 0.0105])
    assert [f.status for f in wide] == [Status.WARN] and "spread 17%" in wide[0].message
    assert [f.status for f in _recorded([0.01] * 5, ok=False)] == [Status.FAIL]
    assert [f.status for f in _recorded([0.010, 0.030, 0.011], backend="gloo")] == [Status.PASS]


def test_no_soak_outside_burn_in_and_a_missing_one_is_an_error():
    docs = [{"backend": "nccl", "ranks": [{"rank": 0, "status": "ok", "compute": {}}]}]
    standard = dict(tiers.SPECS[("standard", "nccl")], tier="standard")
    assert soak.soak_findings(_view(docs, ["g0"], standard)) == []
    burn = dict(tiers.SPECS[("burn-in", "nccl")], tier="burn-in")
    assert [f.status for f in soak.soak_findings(_view(docs, ["g0"], burn))] == [Status.ERROR]

"""preflight.checks.allreduce.timeplan: the bench's phases and their durations, planned before any node is touched."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from preflight.checks.allreduce import localize, plan, timeplan
from preflight.common import GiB
from tests.paths import REPO



def test_one_size_is_latency_plus_bytes_over_busbw():
    # 16 ranks, 1 GiB at 100 GB/s busbw: 2*log2(16) hops + 2^30 * 2*15/16 / 1e11
    want = 8 * timeplan.HOP_LATENCY_S + GiB * 2 * 15 / 16 / 100e9
    assert timeplan.op_s(GiB, 16, 100.0) == pytest.approx(want)
    assert timeplan.op_s(GiB, 1, 100.0) == 0.0  # one rank moves nothing


def test_the_plan_follows_the_phases_run_py_runs_with_their_deadlines():
    tp = timeplan.time_plan([8] * 4, {"sizes": [GiB], "warmup": 1, "iters": 3}, {"busbw_gbps": 100})
    assert [p["phase"] for p in tp["phases"]] == ["sweep", "node tests", "node round: nic", "pair rounds"]
    assert tp["phases"][1]["runs"] == 0 and tp["phases"][2]["worst_runs"] == 2  # NVLink in the sweep's processes
    sweep = tp["phases"][0]
    assert sweep["expected_s"] == round(timeplan.launch_s(32) + 4 * timeplan.op_s(GiB, 32, 100.0), 1)
    assert sweep["budget_s"] == plan.outer_deadline({"deadlines": plan.default_deadlines("nccl")})
    pairs = tp["phases"][-1]
    # nccl: the screening pairs are a launch, then at most ceil(log2 4) + 2 = 4 rounds
    assert pairs["worst_runs"] == 1 + localize.max_rounds(4) == 5 and pairs["ranks"] == 16
    assert tp["rates"]["net_gbps"] == 100.0 and tp["rates"]["net_from"] == "expect.busbw_gbps"
    assert tp["expected_s"] == pytest.approx(sum(p["expected_s"] for p in tp["phases"]), abs=0.05)
    assert tp["rounds"] == {"planned_max": 4, "log2_bound": 2}
    assert "at most 4 rounds (ceil(log2 4) + 2" in pairs["what"]


def test_cpu_fleets_plan_no_node_round_and_two_nodes_no_pair_round():
    tp = timeplan.time_plan([0, 0], {}, {})
    assert tp["backend"] == "gloo" and [p["phase"] for p in tp["phases"]] == ["sweep", "node tests"]
    tp = timeplan.time_plan([0] * 5, {}, {})
    assert [p["phase"] for p in tp["phases"]] == ["sweep", "node tests", "pair rounds"]
    # the gloo loopback and pairs ride on the sweep's processes: no launch
    assert tp["phases"][1]["runs"] == 0 and tp["phases"][2]["runs"] == 0
    assert tp["phases"][2]["worst_runs"] == localize.max_rounds(5) == 5
    assert [p["phase"] for p in timeplan.time_plan([0] * 5, {"node_round": False}, {})["phases"]] == [
        "sweep", "pair rounds"]
    assert tp["rounds"]["log2_bound"] == math.ceil(math.log2(5))


def test_1024_gpus_at_ndr_400g_are_planned_within_ten_minutes_with_every_pair_round():
    tp = timeplan.time_plan([8] * 128, {}, {"ib_hcas": 8, "ib_rate_gbps": 400}, gpu_model="NVIDIA H100 80GB HBM3")
    assert tp["ranks"] == 1024 and tp["rates"]["nvlink_gbps"] == 450.0
    assert tp["rates"]["net_gbps"] == pytest.approx(8 * 50 * 0.7)
    assert tp["expected_with_localization_s"] > tp["expected_s"]
    assert tp["expected_with_localization_s"] <= 600, timeplan.render(tp)


def test_check_plan_prints_the_plan_and_touches_no_node(tmp_path):
    inv = tmp_path / "hosts.yaml"
    # hosts that do not resolve: any connection attempt would fail the run
    inv.write_text("defaults:\n  gpus_per_node: 8\ncluster:\n  expect:\n    ib_hcas: 4\n    ib_rate_gbps: 200\n"
                   "nodes:\n  - gpu-[01-03].invalid\n")
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv), "--plan"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("all-reduce time plan: 3 nodes, 24 nccl ranks, verdict at 4 GiB (nothing was run)")
    assert "pair rounds" in done.stdout and "70 GB/s (expect.ib_hcas x ib_rate_gbps" in done.stdout
    done = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv), "--plan", "--json", "-"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)["allreduce_plan"]
    assert doc["nodes"] == 3 and doc["phases"][0]["phase"] == "sweep"


def test_the_sweep_is_expected_at_iters_min_and_capped_at_iters():
    # each size stops once stable after iters_min (default 3) timed runs, at most iters: the expected time
    # counts the minimum, expected_cap_s the cap (bench_worker._stop_rule)
    tp = timeplan.time_plan([8] * 4, {"sizes": [GiB], "warmup": 1, "iters": 9}, {"busbw_gbps": 100})
    sweep = tp["phases"][0]
    op = timeplan.op_s(GiB, 32, 100.0)
    assert tp["iters_min"] == timeplan.ITERS_MIN == 3 and tp["iters"] == 9
    assert sweep["expected_s"] == round(timeplan.launch_s(32) + (1 + 3) * op, 1)
    assert sweep["expected_cap_s"] == round(timeplan.launch_s(32) + (1 + 9) * op, 1) > sweep["expected_s"]
    assert "1 warm-up + 3-9 (stops once stable or latency-bound) timed runs each" in sweep["what"]
    assert any("every size run to its cap of 9 iterations" in line for line in timeplan.render(tp))
    # iters_min at iters: fixed iterations, as before the stop rule; above iters: the cap wins
    for raw in ({"iters_min": 9}, {"iters_min": 20}):
        fixed = timeplan.time_plan([8] * 4, dict({"sizes": [GiB], "warmup": 1, "iters": 9}, **raw), {"busbw_gbps": 100})
        assert fixed["phases"][0]["expected_s"] == fixed["phases"][0]["expected_cap_s"] == sweep["expected_cap_s"]
        assert "1 warm-up + 9 timed runs each" in fixed["phases"][0]["what"]


def test_reserves_hide_each_certain_launchs_import_under_the_node_checks_and_the_phases_before_it():
    """nccl, warm: the NIC round's and the screening's ranks start in phase 1 (reserves), so each hides
    min(import, node checks + the phases before it) where warm rounds hid only the run before's tail."""
    kw = dict(gpu_model="NVIDIA H100 80GB HBM3", first_hidden_s=12.0)
    expect = {"ib_hcas": 8, "ib_rate_gbps": 400}
    reserved = timeplan.time_plan([8] * 128, {}, expect, **kw)
    rounds = timeplan.time_plan([8] * 128, {}, expect, reserves=False, **kw)
    assert reserved["assumptions"]["reserves"] is True and rounds["assumptions"]["reserves"] is False
    hidden = {p["phase"]: p.get("hidden_s") for p in reserved["phases"]}
    assert hidden == {"sweep": 12.0, "node tests": None, "node round: nic": 15.0, "pair rounds": 15.0}
    tails = {p["phase"]: p.get("hidden_s") for p in rounds["phases"]}
    assert tails["node round: nic"] < 15.0 and tails["pair rounds"] < tails["node round: nic"]
    assert reserved["phases"][0] == rounds["phases"][0]  # the sweep's own launch: the same
    assert reserved["expected_s"] < rounds["expected_s"]
    assert any("(reserves)" in line for line in timeplan.render(reserved))
    # `--plan` (no node checks given): the first launch hides nothing, a reserve still had the sweep (a launch
    # at least as long as its import) before its round: all of it
    plain = timeplan.time_plan([8] * 4, {"sizes": [GiB]}, {"busbw_gbps": 100})
    sweep, _nvlink, nic, pairs = plain["phases"]
    assert sweep["hidden_s"] == 0.0 and nic["hidden_s"] == pairs["hidden_s"] == timeplan.IMPORT_S


def test_no_reserves_for_gloo_or_with_warming_off():
    """Twins: gloo's healthy run launches once (nothing to reserve); warm false hides nothing at all."""
    gloo = timeplan.time_plan([0] * 5, {}, {}, first_hidden_s=12.0)
    assert gloo["assumptions"]["reserves"] is False
    cold = timeplan.time_plan([8] * 4, {"warm": False}, {"busbw_gbps": 100}, first_hidden_s=12.0)
    assert cold["assumptions"]["reserves"] is False and not any(p.get("hidden_s") for p in cold["phases"])


def test_the_plan_counts_the_iterations_each_phase_runs():
    # gloo, the defaults: the loopback at the sweep's cap, one pass (judged on completion only); the in-process
    # pairs at plan.ROUND_MIN_ITERS; the rounds' deadlines from warm-up + cap runs of the slowest size, the last
    # of them the check (no extra run)
    tp = timeplan.time_plan([0] * 16, {}, {})
    phases = {p["phase"]: p for p in tp["phases"]}
    node, pairs = phases["node tests"], phases["pair rounds"]
    assert (node["iters"], node["passes"]) == (tp["iters"], 1) and "suspects again" not in node["what"]
    assert node["expected_s"] == round((tp["warmup"] + tp["iters"]) * timeplan.op_s(plan.CPU_SIZES[-1], 2, 1.0), 1)
    assert (pairs["iters"], pairs["rotations"]) == (plan.ROUND_MIN_ITERS, plan.PAIR_ROTATIONS)
    assert pairs["expected_s"] == round(3 * (tp["warmup"] + 20) * timeplan.op_s(plan.CPU_SIZES[-1], 2, 1.0), 1)
    slowest = (tp["warmup"] + tp["iters"]) * timeplan.op_s(plan.CPU_SIZES[-1], 16, 1.0)
    assert tp["assumptions"]["round_deadlines"] == plan.round_budget(plan.default_deadlines("gloo"), None, slowest, 1)
    # the sweep: each size's decision is counted, with the budget agreement riding on it
    sweep = phases["sweep"]
    assert (sweep["collectives"], sweep["collectives_cap"]) == (13 * (2 + 3 + 1), 13 * (2 + 5 + 1))
    fixed = {p["phase"]: p for p in timeplan.time_plan([0] * 16, {"iters_min": 5}, {})["phases"]}["sweep"]
    assert fixed["collectives"] == fixed["collectives_cap"] == 13 * (2 + 5) + 12  # the agreement apart
    # nccl's NVLink test keeps its confirmation pass in the worst case
    gpu = {p["phase"]: p for p in timeplan.time_plan([8] * 4, {}, {"busbw_gbps": 100})["phases"]}["node tests"]
    assert gpu["passes"] == 1 and gpu["expected_worst_s"] >= gpu["expected_s"]

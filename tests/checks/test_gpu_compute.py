"""The compute tier: the compute phase in the all-reduce's own ranks (real torch on CPU, gloo), the
gpu_compute rule on recorded per-GPU figures, NVML samples under load in pynvml's layout, --tier in --plan.

The wrong answer comes through a real interface: one "node"'s ranks get a PYTHONPATH whose
sitecustomize.py wraps torch.matmul so that one element of every product is off by one part in 10^6, as a
bad math library or a GPU flipping a mantissa bit would. Nothing in preflight knows about it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading

import pytest

from preflight.checks.allreduce import tiers
from preflight.checks.gpu_compute import rule as gc
from preflight.model import NodeInfo, Status
from preflight.probe import bench_compute

from tests.builders import view
from tests.sim.gpu_hw import FakeNVML
from tests.probe.test_bench_agent import config, free_port, our_ranks, run_all
from tests.paths import REPO

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")

SMALL_COMPUTE = dict(tiers.SPECS[("standard", "gloo")], seconds=0.3, tier="standard")

#: a node's environment that corrupts matmul results (a bad BLAS, a flipping ALU): element 7 of every
#: product is scaled by (1 + 1e-6)
BAD_MATMUL = '''
import torch
_real = torch.matmul
def _bad(a, b, *args, **kwargs):
    out = _real(a, b, *args, **kwargs)
    if out.is_floating_point() and out.numel() > 7:
        out.view(-1)[7] *= 1.000001
    return out
torch.matmul = _bad
'''


def _view(docs, names, backend="gloo", compute=SMALL_COMPUTE):
    infos = [NodeInfo(n, "127.0.0.1", 0, i == 0, {}) for i, n in enumerate(names)]
    facts = {n: {"allreduce": d} for n, d in zip(names, docs)}
    meta = {"backend": backend, "nodes": list(names)}
    if compute:
        meta["compute"] = compute
    return view(facts, nodes=infos, expect={}, cluster={"allreduce": meta}, unreachable={})


def _run_cluster(tmp_path, bad_node=None, n=3):
    port = free_port()
    cfgs = [dict(config(port, n, node_rank=i, sizes=[1024, 4096]), compute=SMALL_COMPUTE) for i in range(n)]
    if bad_node is not None:
        site = tmp_path / "badlib"
        site.mkdir()
        (site / "sitecustomize.py").write_text(BAD_MATMUL)
        cfgs[bad_node]["env"] = dict(cfgs[bad_node]["env"], PYTHONPATH=str(site))
    return run_all(*[(c,) for c in cfgs])


@needs_torch
def test_the_compute_phase_runs_in_the_allreduce_ranks_and_a_wrong_matmul_is_named(tmp_path):
    docs = _run_cluster(tmp_path, bad_node=2)
    for doc in docs:
        for r in doc["ranks"]:
            assert r["status"] == "ok", r
            assert r["compute_error"] is None and r["compute"]["gemm"]["fp32"]["tflops"] > 0
            assert r["compute"]["copy"]["ok"] and r["compute"]["sdc"]["repeat_agree"]
    digests = [d["ranks"][0]["compute"]["sdc"]["digest"] for d in docs]
    assert digests[0] == digests[1] != digests[2]
    findings = gc.rule(_view(docs, ["n0", "n1", "n2"]))
    bad = [f for f in findings if f.status is Status.FAIL]
    assert [(f.node, f.action) for f in bad] == [("n2", "isolate")]
    assert "silent data corruption" in bad[0].message and "rank 2" in bad[0].message
    assert "chained" in bad[0].message and digests[2] in bad[0].message
    assert {f.node for f in findings if f.status is Status.PASS} == {"n0", "n1"}
    assert not our_ranks()


@needs_torch
def test_healthy_ranks_agree_and_pass_on_completion(tmp_path):
    docs = _run_cluster(tmp_path, n=2)
    findings = gc.rule(_view(docs, ["n0", "n1"]))
    assert [f.status for f in findings] == [Status.PASS, Status.PASS], findings
    assert "SDC digest agrees" in findings[0].message and "fp32 GEMM" in findings[0].message


# ------------------------------------------------------------------------------ rule, recorded figures

def _gpu(tflops, passes=None, gbps=3000.0, digest="d0", reasons=0x4, model="NVIDIA H100 80GB HBM3", driver="550.54.15"):
    samples = [{"t": 1.0 + i, "sm_mhz": 1980 if not reasons & gc.HW_FAULT else 1100, "mem_mhz": 2619,
                "power_w": 690.0, "temp_c": 61, "reasons": reasons} for i in range(3)]
    return {"device": model, "versions": {"torch": "2.4.0", "cuda": "12.4", "driver": driver},
            "gemm": {"bf16": {"tflops": tflops, "passes": passes or [tflops, tflops]}},
            "copy": {"gbps": gbps, "bytes": 1 << 30, "ok": True},
            "sdc": {"digest": digest, "repeat_agree": True, "what": "8 chained 1024x1024 fp32 GEMMs"},
            "nvml": samples, "nvml_error": None}


def _nodes(*per_node):
    """Agent documents for nodes of GPUs (one compute record per GPU)."""
    docs, rank = [], 0
    for gpus in per_node:
        ranks = []
        for i, comp in enumerate(gpus):
            ranks.append({"rank": rank, "local_rank": i, "status": "ok", "compute": comp, "compute_error": None})
            rank += 1
        docs.append({"backend": "nccl", "ranks": ranks})
    return docs


def _judge(*per_node):
    names = ["g%d" % i for i in range(len(per_node))]
    return gc.rule(_view(_nodes(*per_node), names, backend="nccl", compute=dict(tiers.SPECS[("standard", "nccl")])))


def test_a_gpu_slow_in_both_passes_warns_past_10_and_fails_past_20_percent_with_the_reasons():
    fleet = [_gpu(700.0)] * 4
    findings = _judge(fleet, fleet[:3] + [_gpu(600.0)], fleet[:3] + [_gpu(530.0, reasons=0x4 | 0x20)])
    warn = [f for f in findings if f.status is Status.WARN]
    fail = [f for f in findings if f.status is Status.FAIL]
    assert [(f.node, f.action) for f in warn] == [("g1", "retest")]
    assert "GPU 3 (rank 7)" in warn[0].message and "14% below" in warn[0].message
    assert [(f.node, f.action) for f in fail] == [("g2", "isolate")]
    assert "24% below" in fail[0].message and "SW thermal slowdown" in fail[0].message
    assert "SM clock 1980-1980 MHz" in fail[0].message


def test_healthy_twins_one_noisy_pass_the_power_cap_and_another_model_are_not_named():
    fleet = [_gpu(700.0)] * 4
    noisy = _gpu(700.0, passes=[520.0, 702.0])  # one pass low, the confirming pass at the median
    noisy["gemm"]["fp8"] = {"error": "TypeError: _scaled_mm() missing 1 required positional argument"}  # recorded
    l40s = [_gpu(300.0, model="NVIDIA L40S", gbps=800.0, digest="dL")] * 2  # another part: its own fleet (too few)
    findings = _judge(fleet, fleet[:3] + [noisy], l40s)
    assert not [f for f in findings if f.status.is_problem or f.status is Status.WARN], findings
    assert {f.node for f in findings if f.status is Status.PASS and f.node} == {"g0", "g1", "g2"}


def test_hw_slowdown_while_loaded_fails_even_at_the_median_rate():
    fleet = [_gpu(700.0)] * 4
    findings = _judge(fleet, fleet[:3] + [_gpu(700.0, reasons=0x8 | 0x4)])
    fail = [f for f in findings if f.status is Status.FAIL]
    assert [(f.node, f.action) for f in fail] == [("g1", "isolate")]
    assert "HW slowdown asserted while loaded" in fail[0].message and "SM clock 1100-1100 MHz" in fail[0].message


def test_sdc_is_judged_within_part_and_driver_and_a_tie_names_no_gpu():
    fleet = [_gpu(700.0)] * 4
    other_driver = [_gpu(700.0, digest="dX", driver="560.35.03")] * 4  # another cuBLAS: its own digest, healthy
    findings = _judge(fleet, other_driver)
    assert not [f for f in findings if f.status.is_problem], findings
    findings = _judge([_gpu(700.0, digest="dA")], [_gpu(700.0, digest="dB")])
    fail = [f for f in findings if f.status is Status.FAIL]
    assert [(f.node, f.action) for f in fail] == [(None, "retest")] and "no majority" in fail[0].message
    selfish = _gpu(700.0)
    selfish["sdc"] = dict(selfish["sdc"], repeat_agree=False)
    fail = [f for f in _judge([selfish]) if f.status is Status.FAIL]
    assert [(f.node, f.action) for f in fail] == [("g0", "isolate")] and "two different digests" in fail[0].message


def test_the_datasheet_peak_is_a_report_line():
    findings = _judge([_gpu(702.0)] * 8)
    notes = [f for f in findings if f.node is None]
    assert [f.message for f in notes] == [
        "H100 SXM bf16 dense 702 TFLOPS = 71% of 989 peak (datasheet; fleet median of 8 GPUs)"]


def test_quick_tier_skips_and_a_rank_without_its_compute_phase_is_named():
    findings = gc.rule(_view([{"backend": "gloo", "ranks": []}], ["n0"], compute=None))
    assert [(f.status, f.node) for f in findings] == [(Status.SKIP, None)] and "--tier quick" in findings[0].message
    docs = _nodes([_gpu(700.0)])
    docs[0]["ranks"][0].update(compute=None, compute_error="RuntimeError: CUDA error: an illegal memory access")
    findings = gc.rule(_view(docs, ["g0"], backend="nccl"))
    assert [(f.status, f.node) for f in findings] == [(Status.FAIL, "g0")]
    assert "illegal memory access" in findings[0].message and findings[0].action == "check_app"
    docs[0]["ranks"][0].update(status="timeout", compute_error=None)  # the all-reduce's verdict, not ours
    findings = gc.rule(_view(docs, ["g0"], backend="nccl"))
    assert [(f.status, f.node, f.action) for f in findings] == [(Status.ERROR, "g0", "retest")]
    assert "see allreduce" in findings[0].message


# ------------------------------------------------------------------------------ NVML under load

class LoadNVML(FakeNVML):
    """FakeNVML with the readings a loaded GPU gives, answered in pynvml's names and constants."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._get(h, "sm_mhz" if clock == self.NVML_CLOCK_SM else "mem_mhz")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(h, "power_mw")

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._get(h, "temp_c")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get(h, "reasons")


def test_nvml_samples_under_load_carry_the_clock_event_reasons_and_the_rule_reads_them():
    import pynvml

    assert (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_TEMPERATURE_GPU) == (1, 2, 0)
    nvml = LoadNVML({"devices": [{"sm_mhz": {"sequence": [1980, 1980, 1410]}, "mem_mhz": 2619,
                                  "power_mw": {"sequence": [350000, 699000, 700000]}, "temp_c": 84,
                                  "reasons": {"sequence": [0x4, 0x4, 0x80 | 0x4]}}]})
    stop = threading.Event()
    samples = bench_compute.sample_nvml(nvml, 0, stop, 0.0, limit=3)
    assert [s["sm_mhz"] for s in samples] == [1980, 1980, 1410] and samples[2]["power_w"] == 700.0
    comp = dict(_gpu(700.0), nvml=samples)
    fail = [f for f in _judge([_gpu(700.0)] * 3 + [comp]) if f.status is Status.FAIL]
    assert len(fail) == 1 and "HW power brake asserted while loaded" in fail[0].message
    assert "SM clock 1410-1980 MHz, up to 700.0 W, 84 C" in fail[0].message


# ------------------------------------------------------------------------------ tiers and --plan

def test_the_standard_tier_adds_under_a_minute_and_widens_the_deadlines():
    assert tiers.compute_s("quick", "nccl") == 0.0
    assert 0 < tiers.compute_s("standard", "nccl") <= 60 and tiers.compute_s("burn-in", "nccl") > 60
    cfgs = {"a": {"backend": "nccl", "deadlines": {"op_s": 30.0, "total_s": 300.0}}}
    tiers.with_compute(cfgs, tiers.compute_spec("burn-in", "nccl"))
    assert cfgs["a"]["compute"]["seconds"] == 60.0 and cfgs["a"]["deadlines"]["op_s"] > 60.0
    assert cfgs["a"]["deadlines"]["total_s"] > 300.0 + tiers.compute_s("burn-in", "nccl")


def test_the_burn_in_plan_uses_the_node_checks_own_budgets():
    from preflight.checks.dcgm import probe as dcgm_probe
    from preflight.checks.nvbandwidth import probe as nvb_probe

    assert (tiers.DCGM_LEVEL3_S, tiers.NVBANDWIDTH_S) == (dcgm_probe.LEVEL_BUDGET_S[3], nvb_probe.BUDGET_S)
    assert tiers.node_checks_s("burn-in", "gloo") == {} and tiers.node_checks_s("standard", "nccl") == {}


def test_check_plan_prints_each_tier_before_anything_runs(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("defaults:\n  gpus_per_node: 8\nnodes:\n  - gpu-[01-04].invalid\n")
    env = dict(os.environ, PYTHONPATH=REPO)
    out = {}
    for tier in tiers.TIERS:
        done = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv), "--plan", "--tier", tier,
                               "--json", "-"], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        out[tier] = json.loads(done.stdout)["allreduce_plan"]["tier"]
    assert out["quick"]["added_s"] == 0 and out["standard"]["added_s"] == tiers.compute_s("standard", "nccl")
    assert out["burn-in"]["expected_s"] > out["standard"]["expected_s"] > out["quick"]["expected_s"]
    burn = " / ".join(out["burn-in"]["runs"])
    assert "all-reduce soak: 20 rounds" in burn and "dcgmi diag -r 3" in burn and "nvbandwidth" in burn
    assert "clock and thermal trend" in burn and out["burn-in"]["expected_with_tools_s"] > out["burn-in"]["expected_s"]
    done = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv), "--plan", "--tier", "standard"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert "tier standard: expected" in done.stdout and "bf16/fp8 GEMM 4s each" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv), "--plan", "--tier", "soak"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# ------------------------------------------------------------------------------ end to end, over SSH

#: the same corruption, installed the way a site library hooks a package: applied when torch is imported
#: (not at interpreter start, so the node's probes do not import torch)
LAZY_BAD_MATMUL = '''
import importlib.abc, importlib.util, sys

def _patch(torch):
    real = torch.matmul
    def bad(a, b, *args, **kwargs):
        out = real(a, b, *args, **kwargs)
        if out.is_floating_point() and out.numel() > 7:
            out.view(-1)[7] *= 1.000001
        return out
    torch.matmul = bad

class _OnTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _OnTorch())
'''


@needs_torch
def test_standard_tier_end_to_end_names_the_node_whose_library_corrupts_matmul(sim_cluster):
    from tests.e2e.allreduce_sim import inventory, run_preflight

    cluster = sim_cluster(3)
    site = os.path.join(cluster.node("n003").dir, "badlib")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(LAZY_BAD_MATMUL)
    python = os.path.join(site, "python3")
    with open(python, "w") as fh:  # n003's interpreter: the real one, with the bad library on its path
        fh.write("#!/bin/sh\nPYTHONPATH=%s exec %s \"$@\"\n" % (site, sys.executable))
    os.chmod(python, 0o755)
    inv = inventory(cluster, {"init_timeout": 180, "op_timeout": 30}, expect={"busbw_gbps": 0.001},
                    node_overrides={"n003": {"python": python}})
    rc, doc, _wall = run_preflight(cluster, inv, "--only", "gpu_compute", "--tier", "standard")
    found = [r for r in doc["results"] if r["check"] == "gpu_compute"]
    bad = [r for r in found if r["status"] == "fail"]
    assert rc == 1 and [(r["node"], r.get("action")) for r in bad] == [("n003", "isolate")], found
    assert "silent data corruption" in bad[0]["message"] and "rank 2" in bad[0]["message"]
    assert sorted(r["node"] for r in found if r["status"] == "pass") == ["n001", "n002"], found
    assert cluster.leftover_processes() == {}

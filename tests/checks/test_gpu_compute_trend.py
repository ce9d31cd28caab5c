"""The burn-in's clock and thermal trend (preflight.checks.gpu_compute.trend): NVML samples taken through
bench_compute's own sampler from an NVML double in pynvml's layout (tests/sim/gpu_hw.FakeNVML: the same
function names, constants and argument order), judged by the gpu_compute rule at --tier burn-in."""

from __future__ import annotations

import threading

from preflight.checks.allreduce import tiers
from preflight.checks.gpu_compute import rule as gc
from preflight.checks.gpu_compute import trend
from preflight.model import Status
from preflight.probe import bench_compute

from tests.checks.test_gpu_compute import LoadNVML, _gpu, _nodes, _view

N = 40  # samples in a soak window (a 60 s soak at 0.5 s gives ~120)


class SoakNVML(LoadNVML):
    """LoadNVML plus the GPU's temperature thresholds, answered as pynvml's nvmlDeviceGetTemperatureThreshold."""

    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return self._get(h, "slowdown_c" if kind == self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else "shutdown_c")


def _ramp(a, b, n=N):
    return [round(a + (b - a) * i / (n - 1)) for i in range(n)]


def _soak(sm, temp, slowdown=87, shutdown=92):
    """A compute record whose bf16 soak window holds the samples the sampler read from the double."""
    dev = {"sm_mhz": {"sequence": list(sm)}, "mem_mhz": 2619, "power_mw": 690000,
           "temp_c": {"sequence": list(temp)}, "reasons": 0x4}
    dev.update(slowdown_c=slowdown if slowdown is not None else {"error": "NVML_ERROR_NOT_SUPPORTED"},
               shutdown_c=shutdown if shutdown is not None else {"error": "NVML_ERROR_NOT_SUPPORTED"})
    nvml = SoakNVML({"devices": [dev]})
    limits = bench_compute.temperature_limits(nvml, 0)
    samples = bench_compute.sample_nvml(nvml, 0, threading.Event(), 0.0, limit=len(sm))
    rec = dict(_gpu(700.0), nvml=samples, nvml_limits=limits)
    rec["windows"] = {"bf16": [samples[0]["t"] - 1.0, samples[-1]["t"] + 1.0]}
    return rec


def _burn_in(*soaks):
    fleet = [_gpu(700.0)] * 3
    docs = _nodes(*([list(fleet) + [s] for s in soaks]))
    names = ["g%d" % i for i in range(len(soaks))]
    spec = dict(tiers.SPECS[("burn-in", "nccl")], tier="burn-in")
    return gc.rule(_view(docs, names, backend="nccl", compute=spec))


def _named(findings):
    return [f for f in findings if f.status in (Status.WARN, Status.FAIL)]


def test_the_sampler_reads_the_thresholds_and_a_part_without_them_says_none():
    assert _soak([1980] * 3, [60] * 3)["nvml_limits"] == {"slowdown_c": 87, "shutdown_c": 92}
    assert _soak([1980] * 3, [60] * 3, slowdown=None, shutdown=None)["nvml_limits"] == {
        "slowdown_c": None, "shutdown_c": None}


def test_a_gpu_climbing_to_its_slowdown_threshold_fails_isolate_with_the_evidence():
    findings = _named(_burn_in(_soak([1980] * N, _ramp(70, 88))))
    assert [(f.node, f.status, f.action) for f in findings] == [("g0", Status.FAIL, "isolate")]
    assert "GPU 3" in findings[0].message and "reached its slowdown threshold under the soak" in findings[0].message
    assert "slowdown threshold 87 C" in findings[0].message and findings[0].data["trend"]["temp_max"] == 88


def test_falling_clocks_warn_past_10_and_fail_past_20_percent():
    warn, fail = _burn_in(_soak(_ramp(1980, 1620), [75] * N)), _burn_in(_soak(_ramp(1980, 1250), [75] * N))
    assert [f.status for f in _named(warn)] == [Status.WARN] and "SM clock fell over the soak" in _named(warn)[0].message
    assert [f.status for f in _named(fail)] == [Status.FAIL] and _named(fail)[0].action == "isolate"


def test_still_rising_near_the_threshold_warns():
    found = _named(_burn_in(_soak([1980] * N, _ramp(76, 84))))
    assert [f.status for f in found] == [Status.WARN] and "still rising toward" in found[0].message


def test_healthy_twins_hot_but_flat_a_warm_up_dip_one_noisy_sample_no_threshold_are_not_named():
    hot_flat = _soak([1755] * N, [85] * N)
    warm_up = _soak([1980, 1980, 1900] + [1755] * (N - 3), _ramp(45, 70))
    noisy = _soak([1980] * (N - 5) + [1100] + [1980] * 4, [72] * (N - 5) + [95] + [72] * 4)
    no_limits = _soak([1980] * N, _ramp(70, 95), slowdown=None, shutdown=None)
    assert _named(_burn_in(hot_flat, warm_up, noisy, no_limits)) == []
    assert trend.judge(no_limits) is None  # no threshold: the climb is not judged against one


def test_too_few_samples_is_no_trend_and_the_standard_tier_judges_none():
    assert trend.judge(_soak(_ramp(1980, 1000, 8), _ramp(70, 95, 8))) is None
    falling = _soak(_ramp(1980, 1400), _ramp(70, 90))
    fleet = [_gpu(700.0)] * 3
    spec = dict(tiers.SPECS[("standard", "nccl")], tier="standard")
    findings = gc.rule(_view(_nodes(list(fleet) + [falling]), ["g0"], backend="nccl", compute=spec))
    assert not [f for f in findings if (f.data or {}).get("trend")]


def test_each_dtype_is_its_own_window():
    """fp8 runs at lower clocks than bf16: the step between two windows is not a fall within one."""
    rec = _soak([1980] * 20 + [1500] * 20, [75] * N)
    ts = [s["t"] for s in rec["nvml"]]
    rec["windows"] = {"bf16": [ts[0], ts[19]], "fp8": [ts[20], ts[-1]]}
    # the sampler runs back to back here: the windows split the samples by index as their times allow
    if ts[19] < ts[20]:
        assert trend.judge(dict(rec, gpu=True)) is None
    whole = dict(rec, windows={})
    assert trend.judge(whole)[0] is Status.FAIL

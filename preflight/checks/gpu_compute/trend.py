"""The burn-in's clock and thermal trend: per GPU, whether its SM clock falls or its temperature climbs
toward the GPU's own slowdown threshold over the soak, from the NVML samples taken under load.

Pure, controller side; judged with --tier burn-in only (a standard run's 4 s GEMM is no trend). Each GEMM
dtype's soak is its own window (bench_compute's "windows": fp8 runs at other clocks and power than bf16),
its first WARMUP share left out (boost clocks settle to the power limit in the first seconds on a healthy
part). Within a window, the median of its first third against the median of its last third:

- the GPU reached its slowdown threshold (nvmlDeviceGetTemperatureThreshold SLOWDOWN) in HOT_SAMPLES
  samples of the window: FAIL
  isolate (it will throttle under any long job: cooling, fans, airflow, thermal paste);
- SM clock fell more than FAIL_DROP: FAIL isolate; more than WARN_DROP: WARN retest;
- temperature rose by RISING_C or more and ended within NEAR_C of the threshold: WARN retest (still
  climbing toward it: a longer job will reach it).

Healthy twins, not named: a GPU hot but flat (high and steady, not rising), clocks that dip only in the
warm-up, a single low or hot sample (medians), a part whose NVML reports no threshold (the temperature
rule is not judged: said in the pass line's data), fewer than MIN_SAMPLES samples in a window (too short to
call a trend: reported, not judged).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.checks.gpu_compute import NAME
from preflight.model import Finding, Status

WARN_DROP = 0.10
FAIL_DROP = 0.20
RISING_C = 3.0
NEAR_C = 5.0
WARMUP = 0.10
MIN_SAMPLES = 12
#: samples at or above the slowdown threshold that make "reached" (one hot reading is a noisy sample)
HOT_SAMPLES = 2


def window_trend(samples: Sequence[Dict[str, Any]]) -> Optional[Dict[str, float]]:
    """{"n", "sm_first", "sm_last", "drop", "temp_first", "temp_last", "rise", "temp_max", "temps"} over one
    window's samples (time order, the warm-up left out), or None with fewer than MIN_SAMPLES usable ones."""
    usable = [s for s in samples if s.get("sm_mhz") and s.get("temp_c") is not None]
    usable = usable[int(len(usable) * WARMUP):]
    if len(usable) < MIN_SAMPLES:
        return None
    third = len(usable) // 3
    first, last = usable[:third], usable[-third:]
    sm_first = statistics.median(s["sm_mhz"] for s in first)
    sm_last = statistics.median(s["sm_mhz"] for s in last)
    t_first = statistics.median(s["temp_c"] for s in first)
    t_last = statistics.median(s["temp_c"] for s in last)
    return {"n": len(usable), "sm_first": sm_first, "sm_last": sm_last, "drop": round(1.0 - sm_last / sm_first, 4),
            "temp_first": t_first, "temp_last": t_last, "rise": t_last - t_first,
            "temp_max": max(s["temp_c"] for s in usable), "temps": [s["temp_c"] for s in usable]}


def _windows(r: Dict[str, Any]) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """(dtype, its samples) per GEMM soak window; the whole record as one window when it has none."""
    samples = r.get("nvml") or []
    wins = r.get("windows") or {}
    if not wins:
        return [("load", list(samples))]
    return [(d, [s for s in samples if lo <= s.get("t", 0) <= hi]) for d, (lo, hi) in sorted(wins.items())]


def judge(r: Dict[str, Any]) -> Optional[Tuple[Status, str, Dict[str, Any]]]:
    """(status, why, evidence) for one GPU's worst window, or None when no window shows a trend."""
    slowdown = (r.get("nvml_limits") or {}).get("slowdown_c")
    worst: Optional[Tuple[Status, str, Dict[str, Any]]] = None
    for dtype, samples in _windows(r):
        tr = window_trend(samples)
        if tr is None:
            continue
        said = "%s soak: SM clock %d -> %d MHz (%.0f%% %s), temperature %g -> %g C (max %g%s)" % (
            dtype, tr["sm_first"], tr["sm_last"], abs(100 * tr["drop"]), "down" if tr["drop"] >= 0 else "up",
            tr["temp_first"], tr["temp_last"], tr["temp_max"],
            ", slowdown threshold %d C" % slowdown if slowdown else ", no slowdown threshold reported")
        temps = tr.pop("temps")
        verdict = None
        if slowdown and sum(1 for t in temps if t >= slowdown) >= HOT_SAMPLES:
            verdict = (Status.FAIL, "reached its slowdown threshold under the soak: " + said)
        elif tr["drop"] > FAIL_DROP:
            verdict = (Status.FAIL, "SM clock fell over the soak: " + said)
        elif tr["drop"] > WARN_DROP:
            verdict = (Status.WARN, "SM clock fell over the soak: " + said)
        elif slowdown and tr["rise"] >= RISING_C and tr["temp_last"] >= slowdown - NEAR_C:
            verdict = (Status.WARN, "temperature still rising toward its slowdown threshold: " + said)
        if verdict and (worst is None or verdict[0].rank > worst[0].rank):
            worst = (verdict[0], verdict[1], dict(tr, dtype=dtype, slowdown_c=slowdown))
    return worst


def trend_findings(records: Sequence[Dict[str, Any]]) -> List[Finding]:
    """One finding per GPU whose soak shows a falling clock or a climb to its slowdown threshold."""
    out: List[Finding] = []
    for r in records:
        if not r.get("gpu"):
            continue  # CPU nodes: completion only
        got = judge(r)
        if got is None:
            continue
        status, why, evidence = got
        where = "%s GPU %s (rank %s, %s)" % (r["node"], r.get("local_rank"), r.get("rank"), r.get("device"))
        out.append(Finding(NAME, r["node"], status, "%s: %s" % (where, why),
                           expected="steady clocks below the slowdown threshold over the soak",
                           actual="%.0f%% clock drop, max %g C" % (100 * evidence["drop"], evidence["temp_max"]),
                           data={"trend": evidence}, action="isolate" if status is Status.FAIL else "retest"))
    return out

"""gpu_compute: every GPU computes at its model's pace and gets the same answer as every other GPU of its kind.

Rule only, judged after the all-reduce: with `--tier standard` (or burn-in) the all-reduce's own rank
processes run the compute phase after their sweep (preflight.probe.bench_worker._compute_phase, no second
torch import): a dense GEMM per fast dtype (bf16, fp8 from compute capability 8.9; fp32 on a CPU) for a few
seconds of steady clocks, a device-memory copy, and the silent-data-corruption computation (seeded
inputs, chained fp32 GEMMs, TF32 off, deterministic algorithms: a sha256 digest). The rule reads

    view.facts[node]["allreduce"]["ranks"][i]["compute"]   what each rank measured (bench_agent's document)
    view.cluster["allreduce"]["compute"]                    the tier's spec the stage sent (absent: quick tier)

Verdicts (preflight.checks.gpu_compute.rule): a digest that differs from the majority of the ranks of the
same part, driver, CUDA and torch, or from the rank's own repeat: FAIL isolate naming node, GPU and the
computation. A GPU's steady GEMM (its better pass of two) or copy figure more than WARN_FRACTION below the
median of its model across the fleet: WARN; more than FAIL_FRACTION: FAIL isolate, with the clock-event
reasons NVML reported during the load. A hardware slowdown, thermal slowdown or power brake asserted while
loaded: FAIL isolate; the software power cap alone is what a saturating GEMM does on a healthy part (pass).
CPU nodes (gloo) are judged on completion and SDC agreement only. The datasheet peak is a report line.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpu_compute"

CHECK = Check(
    name=NAME,
    claim="Every GPU reaches its model's fleet-median GEMM and copy rates under load, with no hardware "
    "slowdown, and computes the same digest as every other GPU of its model and driver",
    why="A capped or slow GPU passes every idle check, then every step of a synchronous job waits for it; "
    "a GPU that returns wrong numbers corrupts training silently (Meta and ByteDance report silent data "
    "corruption as a rising failure class).",
    fix="A GPU that computes a different digest: drain it and run the vendor's diagnostics (dcgmi diag -r 3 "
    "or 4), then RMA; a slow GPU: read the clock-event reasons named (HW slowdown / power brake: check the "
    "node's power supplies and cooling; thermal: airflow, fans), reset it and retest.",
    needs=("allreduce",),
    action="isolate",
    reads="the all-reduce ranks' compute phase (--tier standard): torch GEMM, copy, SDC digest; NVML samples",
    takes="about 10 s per rank with --tier standard (none with --tier quick)",
    order=95,
)

"""The run's tiers: what `--tier quick|standard|burn-in` adds to the all-reduce launch, and how long it takes.

Controller only, pure. quick is the all-reduce as it was; standard adds the compute phase
(preflight.probe.bench_compute, judged by the gpu_compute check) to the same rank processes, after the
sweep and the pairs: no second launch, no second torch import; burn-in runs that phase as a soak (a
minute per GEMM dtype, the NVML samples giving the clock and thermal trend). The all-reduce soak, DCGM
level 3 and nvbandwidth that issue 36 puts in burn-in are not run by it yet: its plan says so.

The time model (printed with the plan): every rank runs the phase at once, so it adds one rank's time to
the run: per dtype its GEMM seconds plus SETUP_S (inputs, library init), then the copy and the SDC
computation (COPY_SDC_S). A GPU part is assumed to run bf16 and fp8 (Hopper and later; Ampere runs bf16
only, so its plan is an over-estimate), a CPU node fp32.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

TIERS = ("quick", "standard", "burn-in")

#: The compute phase's settings per tier and backend (bench_compute.compute_phase reads them).
SPECS = {
    ("standard", "nccl"): {"seconds": 4.0, "gemm_n": 8192, "copy_bytes": 1 << 30, "sdc_n": 1024, "sdc_steps": 8},
    ("standard", "gloo"): {"seconds": 1.0, "gemm_n": 256, "copy_bytes": 16 << 20, "sdc_n": 128, "sdc_steps": 4},
    ("burn-in", "nccl"): {"seconds": 60.0, "gemm_n": 8192, "copy_bytes": 1 << 30, "sdc_n": 1024, "sdc_steps": 8,
                          "sample_s": 0.5},
    ("burn-in", "gloo"): {"seconds": 5.0, "gemm_n": 256, "copy_bytes": 16 << 20, "sdc_n": 128, "sdc_steps": 4},
}
#: Per GEMM dtype: input creation and the library's first call (cuBLAS handle, kernel choice).
SETUP_S = {"nccl": 1.5, "gloo": 0.5}
#: The copy and the SDC computation, with the phase's two barriers; on a GPU also torch.use_deterministic_algorithms's
#: first call (seconds of imports: 3-5 s measured on a loaded 2-core CPU box; unmeasured on a GPU node).
COPY_SDC_S = {"nccl": 4.0, "gloo": 0.5}
DTYPES = {"nccl": ("bf16", "fp8"), "gloo": ("fp32",)}
NOT_YET = "all-reduce soak, DCGM level 3 and nvbandwidth: not run by this version"


def compute_spec(tier: str, backend: str) -> Optional[Dict[str, Any]]:
    """The "compute" entry of every agent config for this tier (None: quick, nothing added)."""
    spec = SPECS.get((tier, backend))
    return dict(spec, tier=tier) if spec else None


def compute_s(tier: str, backend: str) -> float:
    """Seconds the compute phase adds to one run (every rank at once), by the model above."""
    spec = SPECS.get((tier, backend))
    if not spec:
        return 0.0
    return len(DTYPES[backend]) * (spec["seconds"] + SETUP_S[backend]) + COPY_SDC_S[backend]


def with_compute(configs: Mapping[str, Dict[str, Any]], spec: Optional[Dict[str, Any]]) -> None:
    """Add the compute phase to the agents' configs, and its time to their op and total deadlines (a
    burn-in GEMM runs longer than the sweep's op deadline between two progress lines)."""
    if not spec:
        return
    for cfg in configs.values():
        backend = cfg["backend"]
        dl = dict(cfg["deadlines"])
        added = compute_s(spec["tier"], backend)
        dl["op_s"] = max(float(dl["op_s"]), 2.0 * (spec["seconds"] + SETUP_S[backend]))
        dl["total_s"] = float(dl["total_s"]) + 2.0 * added
        cfg["deadlines"], cfg["compute"] = dl, dict(spec)


def plan(tier: str, backend: str, base_expected_s: float) -> Dict[str, Any]:
    """{"tier", "runs", "added_s", "expected_s"}: the tier's parts and its expected time over the quick run's."""
    added = round(compute_s(tier, backend), 1)
    spec = SPECS.get((tier, backend))
    runs = ["the all-reduce sweep, node tests and pair rounds (as planned above)"]
    if spec:
        runs.append("compute phase in the same ranks: %s GEMM %gs each (n=%d), copy %s MiB, SDC digest (%d chained "
                    "%dx%d fp32 GEMMs)" % ("/".join(DTYPES[backend]), spec["seconds"], spec["gemm_n"],
                                           spec["copy_bytes"] >> 20, spec["sdc_steps"], spec["sdc_n"], spec["sdc_n"]))
    if tier == "burn-in":
        runs.append(NOT_YET)
    return {"tier": tier, "runs": runs, "added_s": added, "expected_s": round(base_expected_s + added, 1)}


def render(tp: Mapping[str, Any]) -> List[str]:
    lines = ["tier %s: expected %.1fs (+%.1fs over quick)" % (tp["tier"], tp["expected_s"], tp["added_s"])]
    lines += ["  - " + r for r in tp["runs"]]
    return lines

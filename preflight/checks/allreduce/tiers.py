"""The run's tiers: what `--tier quick|standard|burn-in` adds to the all-reduce launch, and how long it takes.

Controller only, pure. quick is the all-reduce as it was; standard adds the compute phase
(preflight.probe.bench_compute, judged by the gpu_compute check) to the same rank processes, after the
sweep and the pairs: no second launch, no second torch import; burn-in runs that phase as a soak (a
minute per GEMM dtype, NVML sampled every 0.5 s for the clock and thermal trend: gpu_compute/trend.py),
then the all-reduce soak (20 rounds of about 3 s, judged by the spread between rounds: allreduce/soak.py);
in the node checks, DCGM level 3 where dcgmi is installed (the dcgm check) and nvbandwidth where installed
(the nvbandwidth check). CPU nodes run the same phases (shorter) and are judged on completion.

The time model (printed with the plan): every rank runs the phase at once, so it adds one rank's time to
the run: per dtype its GEMM seconds plus SETUP_S (inputs, library init), then the copy and the SDC
computation (COPY_SDC_S), then the soak's rounds plus SOAK_SETUP_S. A GPU part is assumed to run bf16 and
fp8 (Hopper and later; Ampere runs bf16 only, so its plan is an over-estimate), a CPU node fp32. DCGM
level 3 and nvbandwidth run in the node checks on every GPU node at once: their budgets are the most
they add, only where installed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

TIERS = ("quick", "standard", "burn-in")

#: The compute phase's settings per tier and backend (bench_compute.compute_phase reads them).
SPECS = {
    ("standard", "nccl"): {"seconds": 4.0, "gemm_n": 8192, "copy_bytes": 1 << 30, "sdc_n": 1024, "sdc_steps": 8},
    ("standard", "gloo"): {"seconds": 1.0, "gemm_n": 256, "copy_bytes": 16 << 20, "sdc_n": 128, "sdc_steps": 4},
    ("burn-in", "nccl"): {"seconds": 60.0, "gemm_n": 8192, "copy_bytes": 1 << 30, "sdc_n": 1024, "sdc_steps": 8,
                          "sample_s": 0.5, "soak_rounds": 20, "soak_round_s": 3.0, "soak_bytes": 256 << 20},
    ("burn-in", "gloo"): {"seconds": 5.0, "gemm_n": 256, "copy_bytes": 16 << 20, "sdc_n": 128, "sdc_steps": 4,
                          "soak_rounds": 5, "soak_round_s": 0.5, "soak_bytes": 4 << 20},
}
#: Per GEMM dtype: input creation and the library's first call (cuBLAS handle, kernel choice).
SETUP_S = {"nccl": 1.5, "gloo": 0.5}
#: The copy and the SDC computation, with the phase's two barriers; on a GPU also torch.use_deterministic_algorithms's
#: first call (seconds of imports: 3-5 s measured on a loaded 2-core CPU box; unmeasured on a GPU node).
COPY_SDC_S = {"nccl": 4.0, "gloo": 0.5}
DTYPES = {"nccl": ("bf16", "fp8"), "gloo": ("fp32",)}
#: The node checks' budgets burn-in adds where their tools exist: dcgm's LEVEL_BUDGET_S[3] and nvbandwidth's
#: BUDGET_S (a check imports no other check's code; tests/checks/test_gpu_compute.py holds them equal).
DCGM_LEVEL3_S = 2700.0
NVBANDWIDTH_S = 240.0
#: Added to the op deadline between two compute progress lines (see with_compute).
OP_SLACK_S = 30.0
#: The all-reduce soak's calibration (one timed all-reduce, agreed on by every rank) and first reduction.
SOAK_SETUP_S = {"nccl": 2.0, "gloo": 0.5}


def compute_spec(tier: str, backend: str) -> Optional[Dict[str, Any]]:
    """The "compute" entry of every agent config for this tier (None: quick, nothing added)."""
    spec = SPECS.get((tier, backend))
    return dict(spec, tier=tier) if spec else None


def soak_s(tier: str, backend: str) -> float:
    """Seconds the all-reduce soak adds (burn-in only)."""
    spec = SPECS.get((tier, backend)) or {}
    if not spec.get("soak_rounds"):
        return 0.0
    return spec["soak_rounds"] * spec["soak_round_s"] + SOAK_SETUP_S[backend]


def compute_s(tier: str, backend: str) -> float:
    """Seconds the compute phase (and, burn-in, the all-reduce soak in it) adds to one run, by the model above."""
    spec = SPECS.get((tier, backend))
    if not spec:
        return 0.0
    return len(DTYPES[backend]) * (spec["seconds"] + SETUP_S[backend]) + COPY_SDC_S[backend] + soak_s(tier, backend)


def node_checks_s(tier: str, backend: str) -> Dict[str, float]:
    """{what: at most seconds} the tier adds to the node checks where their tool is installed (GPU nodes)."""
    if tier != "burn-in" or backend != "nccl":
        return {}
    return {"DCGM level 3 (dcgmi diag -r 3)": DCGM_LEVEL3_S, "nvbandwidth (3 copy testcases)": NVBANDWIDTH_S}


def with_compute(configs: Mapping[str, Dict[str, Any]], spec: Optional[Dict[str, Any]]) -> None:
    """Add the compute phase to the agents' configs, and its time to their op and total deadlines (a
    burn-in GEMM runs longer than the sweep's op deadline between two progress lines)."""
    if not spec:
        return
    for cfg in configs.values():
        backend = cfg["backend"]
        dl = dict(cfg["deadlines"])
        added = compute_s(spec["tier"], backend)
        # + OP_SLACK_S: a GEMM pass on a starved CPU box (2 cores, load 30) ran past twice its seconds
        dl["op_s"] = max(float(dl["op_s"]), 2.0 * (spec["seconds"] + SETUP_S[backend]) + OP_SLACK_S)
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
    if spec and spec.get("soak_rounds"):
        runs.append("all-reduce soak: %d rounds of about %gs of %d MiB all-reduces%s (%gs)" % (
            spec["soak_rounds"], spec["soak_round_s"], spec["soak_bytes"] >> 20,
            ", judged by the spread between rounds" if backend == "nccl" else "", soak_s(tier, backend)))
    if spec and tier == "burn-in":
        runs.append("clock and thermal trend over each GEMM soak (NVML every %gs)" % spec.get("sample_s", 0.2)
                    if backend == "nccl" else "CPU nodes: judged on completion only (no trend, no soak spread)")
    where = node_checks_s(tier, backend)
    runs += ["%s in the node checks, where installed: up to %.0fs, every GPU node at once" % kv for kv in where.items()]
    upto = round(base_expected_s + added + sum(where.values()), 1)
    return {"tier": tier, "runs": runs, "added_s": added, "expected_s": round(base_expected_s + added, 1),
            "expected_with_tools_s": upto}


def render(tp: Mapping[str, Any]) -> List[str]:
    lines = ["tier %s: expected %.1fs (+%.1fs over quick)%s" % (
        tp["tier"], tp["expected_s"], tp["added_s"], "; up to %.1fs where DCGM and nvbandwidth are installed" %
        tp["expected_with_tools_s"] if tp.get("expected_with_tools_s", tp["expected_s"]) > tp["expected_s"] else "")]
    lines += ["  - " + r for r in tp["runs"]]
    return lines

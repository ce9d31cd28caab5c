"""gpu_compute's verdicts from what the all-reduce ranks measured in their compute phase (see __init__.py).

Pure, controller side. Three steps: gather every rank's compute record (or why there is none), the SDC
agreement per kind of part, then each GPU's rates against the fleet median of its model.
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.checks.gpu_compute import NAME, trend
from preflight.model import ClusterView, Finding, Status

#: A GPU this share below its model's fleet median WARNs, FAIL_FRACTION below FAILs (isolate).
WARN_FRACTION = 0.10
FAIL_FRACTION = 0.20
#: The fewest GPUs of one model for a fleet median (fewer: the rates are reported, not judged).
MIN_PEERS = 3

#: NVML clock-event (throttle) reasons, nvml.h nvmlClocksEventReason*; the first three are faults when
#: asserted under load, SW thermal is a warning, SW power cap is what a saturating GEMM does on a healthy GPU.
REASONS = ((0x8, "HW slowdown"), (0x40, "HW thermal slowdown"), (0x80, "HW power brake"),
           (0x20, "SW thermal slowdown"), (0x4, "SW power cap"), (0x2, "applications clocks setting"),
           (0x10, "sync boost"), (0x1, "GPU idle"), (0x100, "display clock setting"))
HW_FAULT = 0x8 | 0x40 | 0x80
SW_THERMAL = 0x20

#: Dense (no sparsity) datasheet peaks, TFLOPS, from NVIDIA's product pages / data sheets (H100: "H100
#: Tensor Core GPU" datasheet; H200: the H200 product brief; A100: the A100 datasheet; B200: the DGX B200
#: datasheet per GPU; L40S: the L40S datasheet), halved where the sheet quotes "with sparsity".
PEAKS = (
    (re.compile(r"H100(?!.*(PCIe|NVL\b))", re.I), "H100 SXM", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    (re.compile(r"H100.*PCIe", re.I), "H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}),
    (re.compile(r"H100.*NVL", re.I), "H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp8": 1670.0}),
    (re.compile(r"H200|GH200", re.I), "H200", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}),
    (re.compile(r"A100", re.I), "A100", {"bf16": 312.0, "fp16": 312.0}),
    (re.compile(r"\bB200\b", re.I), "B200", {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}),
    (re.compile(r"L40S", re.I), "L40S", {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0}),
)


def reason_names(mask: int) -> List[str]:
    return [name for bit, name in REASONS if mask & bit]


def rule(view: ClusterView) -> List[Finding]:
    meta = view.cluster.get("allreduce")
    if not meta:
        return [Finding(NAME, None, Status.SKIP, "not run: the all-reduce did not run (skipped, or no node passed "
                        "the node checks)")]
    if meta.get("skip"):
        return [Finding(NAME, None, Status.SKIP, "not run: the all-reduce did not run (%s)" % meta["skip"])]
    if not meta.get("compute"):
        return [Finding(NAME, None, Status.SKIP, "not run: --tier quick (the compute phase runs with --tier "
                        "standard or burn-in)")]
    records, missing = gather(view, meta)
    findings = [Finding(NAME, node, Status.FAIL if own else Status.ERROR, "compute phase %s: %s" % (
        "failed" if own else "not run", why), action="check_app" if own else "retest")
        for node, (own, why) in sorted(missing.items())]
    findings += sdc_findings(records)
    findings += rate_findings(records)
    if meta["compute"].get("tier") == "burn-in":  # a soak long enough for a clock and thermal trend
        findings += trend.trend_findings(records)
    bad = {f.node for f in findings if f.status.is_problem or f.status is Status.WARN}
    for node in sorted({r["node"] for r in records} - bad):
        mine = [r for r in records if r["node"] == node]
        findings.append(Finding(NAME, node, Status.PASS, "%d rank%s completed, SDC digest agrees: %s" % (
            len(mine), "" if len(mine) == 1 else "s", _figures(mine))))
    findings += peak_notes(records)
    return findings


def gather(view: ClusterView, meta: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Dict[str, Tuple[bool, str]]]:
    """Every rank's compute record with its node and rank, and {node: (own, why)} for nodes without one:
    own when the compute phase itself failed, not when the all-reduce stopped first (that is the
    allreduce check's verdict, not repeated here as a fault)."""
    records: List[Dict[str, Any]] = []
    missing: Dict[str, Tuple[bool, str]] = {}
    for node in meta.get("nodes") or []:
        doc = (view.facts.get(node) or {}).get("allreduce")
        if not isinstance(doc, dict) or not doc.get("ranks"):
            missing[node] = (False, "no all-reduce result from this node (see allreduce)")
            continue
        for rank in doc["ranks"]:
            comp = rank.get("compute")
            if not isinstance(comp, dict) or not isinstance(comp.get("sdc"), dict):
                own = rank.get("status") == "ok" and bool(rank.get("compute_error"))
                why = rank.get("compute_error") if own else "the all-reduce stopped first on rank %s (%s; see " \
                    "allreduce)" % (rank.get("rank"), rank.get("status"))
                missing[node] = (own, "rank %s: %s" % (rank.get("rank"), why) if own else why)
                continue
            records.append(dict(comp, node=node, rank=rank.get("rank"), local_rank=rank.get("local_rank"),
                                gpu=doc.get("backend") == "nccl"))
    return records, missing


def _where(r: Dict[str, Any]) -> str:
    return "GPU %s (rank %s)" % (r["local_rank"], r["rank"]) if r["gpu"] else "rank %s" % r["rank"]


def _kind(r: Dict[str, Any]) -> Tuple[str, ...]:
    """Ranks whose digests must agree: the same part, the same libraries that pick its kernels (and on a
    CPU the same BLAS thread count)."""
    v = r.get("versions") or {}
    return (str(r.get("device")), str(v.get("driver")), str(v.get("cuda")), str(v.get("torch")), str(v.get("threads")))


def sdc_findings(records: Sequence[Dict[str, Any]]) -> List[Finding]:
    """FAIL isolate for every rank whose digest differs from its kind's majority or from its own repeat."""
    out: List[Finding] = []
    groups: Dict[Tuple[str, ...], List[Dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_kind(r), []).append(r)
    for kind, members in sorted(groups.items()):
        counts: Dict[str, int] = {}
        for r in members:
            counts[r["sdc"]["digest"]] = counts.get(r["sdc"]["digest"], 0) + 1
        top, n = max(counts.items(), key=lambda kv: kv[1])
        majority = top if n * 2 > len(members) else None
        what = members[0]["sdc"].get("what", "the SDC computation")
        if len(counts) > 1 and majority is None:
            out.append(Finding(NAME, None, Status.FAIL, "%s: the %d ranks of %s disagree on the digest of %s with "
                               "no majority (%s); cannot tell which is wrong" % (
                                   ", ".join(sorted({r["node"] for r in members})), len(members), kind[0], what,
                                   ", ".join("%s x%d" % kv for kv in sorted(counts.items()))),
                               expected="one digest", actual="%d digests" % len(counts), action="retest"))
        for r in members:
            wrong = majority is not None and r["sdc"]["digest"] != majority
            if wrong or not r["sdc"].get("repeat_agree", True):
                why = ("computed digest %s where %d of %d ranks of %s computed %s" % (
                    r["sdc"]["digest"], n, len(members), kind[0], majority)) if wrong else \
                    "computed two different digests for the same inputs"
                out.append(Finding(NAME, r["node"], Status.FAIL, "%s %s: silent data corruption: %s (%s)" % (
                    r["node"], _where(r), why, what), expected=majority, actual=r["sdc"]["digest"],
                    data={"sdc": dict(r["sdc"], rank=r["rank"])}, action="isolate"))
    return out


def _best_gemm(r: Dict[str, Any], dtype: str) -> Optional[float]:
    """The GPU's better of its two steady passes (a slow GPU is slow in both: one noisy pass names none)."""
    g = (r.get("gemm") or {}).get(dtype) or {}
    passes = [p for p in g.get("passes") or [g.get("tflops")] if p]
    return max(passes) if passes else None


def rate_findings(records: Sequence[Dict[str, Any]]) -> List[Finding]:
    """Per GPU: its GEMM and copy rates against its model's fleet median, and NVML's reasons under load."""
    out: List[Finding] = []
    gpus = [r for r in records if r["gpu"]]
    by_model: Dict[str, List[Dict[str, Any]]] = {}
    for r in gpus:
        by_model.setdefault(str(r.get("device")), []).append(r)
    for model, members in sorted(by_model.items()):
        medians = _medians(members) if len(members) >= MIN_PEERS else {}
        for r in members:
            low = []
            for metric, median in medians.items():
                mine = _best_gemm(r, metric[5:]) if metric.startswith("gemm ") else (r.get("copy") or {}).get("gbps")
                if mine is not None and median > 0 and mine < (1.0 - WARN_FRACTION) * median:
                    low.append((metric, mine, median, 1.0 - mine / median))
            out.extend(_judge_gpu(r, model, low))
    return out


def _medians(members: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    dtypes = sorted({d for r in members for d in (r.get("gemm") or {})})
    for d in dtypes:
        vals = [v for v in (_best_gemm(r, d) for r in members) if v is not None]
        if len(vals) >= MIN_PEERS:
            out["gemm " + d] = statistics.median(vals)
    copies = [(r.get("copy") or {}).get("gbps") for r in members]
    copies = [c for c in copies if c]
    if len(copies) >= MIN_PEERS:
        out["copy"] = statistics.median(copies)
    return out


def _judge_gpu(r: Dict[str, Any], model: str, low: List[Tuple[str, float, float, float]]) -> List[Finding]:
    """One GPU's finding from its low rates and the NVML samples taken while it was loaded."""
    samples = r.get("nvml") or []
    mask = 0
    for s in samples:
        mask |= int(s.get("reasons") or 0)
    clocks = [s["sm_mhz"] for s in samples if s.get("sm_mhz")]
    under = ("; under load NVML reported %s, SM clock %d-%d MHz, up to %s W, %s C" % (
        ", ".join(reason_names(mask)) or "no clock-event reason", min(clocks), max(clocks),
        max(s.get("power_w") or 0 for s in samples), max(s.get("temp_c") or 0 for s in samples))) if clocks else \
        ("; no NVML samples (%s)" % (r.get("nvml_error") or "none taken"))
    where = "%s %s (%s)" % (r["node"], _where(r), model)
    data = {"nvml": samples[-20:], "reasons": reason_names(mask), "low": [list(x) for x in low]}
    if mask & HW_FAULT:
        return [Finding(NAME, r["node"], Status.FAIL, "%s: %s asserted while loaded%s" % (
            where, " and ".join(reason_names(mask & HW_FAULT)), under), expected="no HW slowdown under load",
            actual=", ".join(reason_names(mask)), data=data, action="isolate")]
    if not low:
        if mask & SW_THERMAL:
            return [Finding(NAME, r["node"], Status.WARN, "%s: SW thermal slowdown while loaded, rates at the fleet "
                            "median%s" % (where, under), data=data, action="retest")]
        return []
    worst = max(low, key=lambda x: x[3])
    said = "; ".join("%s %.4g (fleet median %.4g, %.0f%% below)" % (m, v, med, 100 * f) for m, v, med, f in low)
    status = Status.FAIL if worst[3] > FAIL_FRACTION else Status.WARN
    return [Finding(NAME, r["node"], status, "%s: slow in both passes: %s%s" % (where, said, under),
                    expected=">= %.0f%% of the fleet median" % (100 * (1 - WARN_FRACTION)),
                    actual="%.0f%% below" % (100 * worst[3]), data=data,
                    action="isolate" if status is Status.FAIL else "retest")]


def _figures(mine: Sequence[Dict[str, Any]]) -> str:
    parts = []
    for d in sorted({d for r in mine for d in (r.get("gemm") or {})}):
        vals = [v for v in (_best_gemm(r, d) for r in mine) if v is not None]
        if vals:
            parts.append("%s GEMM %s TFLOPS" % (d, _span(vals)))
    copies = [(r.get("copy") or {}).get("gbps") for r in mine if (r.get("copy") or {}).get("gbps")]
    if copies:
        parts.append("copy %s GB/s" % _span(copies))
    return ", ".join(parts) or "no figures"


def _span(vals: Sequence[float]) -> str:
    lo, hi = min(vals), max(vals)
    return "%.4g" % lo if abs(hi - lo) < 1e-9 else "%.4g-%.4g" % (lo, hi)


def peak_notes(records: Sequence[Dict[str, Any]]) -> List[Finding]:
    """One PASS line per GPU model and dtype: the fleet median against the datasheet's dense peak."""
    out = []
    by_model: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        if r["gpu"]:
            by_model.setdefault(str(r.get("device")), []).append(r)
    for model, members in sorted(by_model.items()):
        label, peaks = next(((lab, p) for pat, lab, p in PEAKS if pat.search(model)), (None, {}))
        for d in sorted({d for r in members for d in (r.get("gemm") or {})}):
            vals = [v for v in (_best_gemm(r, d) for r in members) if v is not None]
            if not vals:
                continue
            med = statistics.median(vals)
            if d in peaks:
                text = "%s %s dense %.0f TFLOPS = %.0f%% of %.0f peak (datasheet; fleet median of %d GPU%s)" % (
                    label, d, med, 100 * med / peaks[d], peaks[d], len(vals), "" if len(vals) == 1 else "s")
            else:
                text = "%s %s dense %.0f TFLOPS (fleet median of %d; no datasheet peak known for this part)" % (
                    model, d, med, len(vals))
            out.append(Finding(NAME, None, Status.PASS, text, data={"peak": {"model": model, "dtype": d,
                               "median_tflops": med, "peak_tflops": peaks.get(d)}}))
    return out

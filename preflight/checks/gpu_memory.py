"""gpu_memory: no GPU's memory is running out of spare rows, out of retirable pages, or correcting errors now.

Rule only: the gpu probe reads the facts in its one NVML session (preflight.probe.gpu_health: the row-remap
counts and the bank remap-availability histogram on Ampere and later, retired pages on earlier parts, the
corrected ECC counter twice WINDOW_S apart) or from the nvidia-smi XML it already ran. The gpu check keeps
the verdicts it had (uncorrectable ECC, remap failure: isolate; remap pending: reset when idle; page
retirement pending: reset): one verdict per fault.

Which condition isolates and which resets follows NVIDIA's "GPU Memory Error Management" (docs.nvidia.com/
deploy/a100-gpu-mem-error-mgmt: "Row Remapping", "RMA Policy"): a pending remap takes effect at the next
reset and does not affect running work (reset when idle, the gpu check); the RMA criterion is the
row-remap failure flag, set when an uncorrectable error hits a bank that already has eight rows remapped
for uncorrectable errors, a row already remapped, or after 512 such remaps; legacy page retirement allows
at most 64 retired pages, after which no page can be retired. The histogram (nvmlRowRemapperHistogramValues_t:
banks with max / high / partial / low / none of their reserved rows available) says how close a GPU is
to that flag. Correctable HBM errors are outside NVIDIA's note: the thresholds below are ours and named.

Per GPU:

- banks with no spare row left (histogram "none" > 0): WARN, plan the replacement: the next uncorrectable
  error in such a bank sets the row-remap failure flag (RMA). Banks at "low": named in the PASS message.
- pre-Ampere: retired pages (single-bit + double-bit causes) at or above RETIRED_PAGES_MAX: FAIL isolate
  (no page can be retired any more: the next bad page stays in use). Fewer: named in the PASS message.
- corrected ECC errors arriving during the window (NVML, two reads): at CE_STORM_PER_S or more per second,
  FAIL isolate (a memory part failing now: error handling costs bandwidth and the uncorrectable error
  follows); fewer but some: WARN (retest; isolate if it keeps rising). A large count since the last reset
  with none arriving now is an old burst: named in the PASS message, never a verdict. On the nvidia-smi
  path (one sample) the rate is not judged: said in the PASS message.
"""

from __future__ import annotations

from typing import Any, List

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, Status

NAME = "gpu_memory"
#: NVIDIA GPU Memory Error Management, "Row Remapping": legacy page retirement supports at most 64 pages.
RETIRED_PAGES_MAX = 64
#: Corrected errors per second during the window that make a GPU's memory failing now (ours: a GPU with
#: billions of corrected errors since its last reset averages thousands a second; a healthy one, zero).
CE_STORM_PER_S = 100.0
#: Corrected errors since the last reset worth naming in the PASS message.
CE_NOTEWORTHY = 1000


def _gpu(gpu: Any, window_s: Any) -> List[Any]:
    """(status, message, expected, actual, action|None) for one GPU, and PASS notes as (None, note)."""
    h = gpu.health or {}
    out: List[Any] = []
    remap = h.get("remap") or {}
    hist = remap.get("histogram") or {}
    if hist.get("none"):
        banks = sum(hist.values())
        out.append((Status.WARN, "%s: %s of %d with no spare row left (remaps: %d uncorrectable, %d correctable): the "
                    "next uncorrectable error there is a row-remap failure (NVIDIA RMA criterion); plan to replace "
                    "the GPU" % (gpu.label, plural(hist["none"], "memory bank"), banks, remap.get("unc", 0),
                                 remap.get("corr", 0)), "0 banks without spare rows", "%d" % hist["none"], None))
    elif hist.get("low"):
        out.append((None, "%s: %s with few spare rows" % (gpu.label, plural(hist["low"], "bank"))))
    pages = h.get("retired_pages")
    if pages:
        total = pages["sbe"] + pages["dbe"]
        if total >= RETIRED_PAGES_MAX:
            out.append((Status.FAIL, "%s: %d pages retired (%d single-bit, %d double-bit; the limit is %d): no "
                        "further page can be retired, the next bad page stays in use: replace the GPU"
                        % (gpu.label, total, pages["sbe"], pages["dbe"], RETIRED_PAGES_MAX),
                        "< %d retired pages" % RETIRED_PAGES_MAX, str(total), "isolate"))
        elif total:
            out.append((None, "%s: %s retired" % (gpu.label, plural(total, "page"))))
    first, after = h.get("ce_volatile"), h.get("ce_volatile_after")
    if first is not None and after is not None and window_s:
        new = after - first
        rate = new / float(window_s)
        if rate >= CE_STORM_PER_S:
            out.append((Status.FAIL, "%s: %d corrected ECC errors in %.1f s (%.0f/s, %d since the last reset): its "
                        "memory is failing now; replace the GPU" % (gpu.label, new, window_s, rate, after),
                        "< %g/s" % CE_STORM_PER_S, "%.0f/s" % rate, "isolate"))
        elif new > 0:
            out.append((Status.WARN, "%s: %d corrected ECC errors in %.1f s (%d since the last reset): retest, and "
                        "replace the GPU if they keep arriving" % (gpu.label, new, window_s, after),
                        "0 new", str(new), None))
        elif after >= CE_NOTEWORTHY:
            out.append((None, "%s: %d corrected ECC errors since the last reset, none during the %.1f s window"
                        % (gpu.label, after, window_s)))
    elif first is not None and first >= CE_NOTEWORTHY:
        out.append((None, "%s: %d corrected ECC errors since the last reset (rate not measured: one nvidia-smi "
                    "sample)" % (gpu.label, first)))
    for problem in h.get("query_errors") or []:
        out.append((Status.WARN, "%s: %s: memory health unknown" % (gpu.label, problem), "an answer", problem, None))
    return out


def _summary(record: Any, read: List[Any]) -> str:
    how = ("corrected-error rate over %.1f s" % record.health_window_s if record.health_window_s
           else "no corrected-error rate (%s)" % ("nvidia-smi: one sample" if record.health_source == "nvidia-smi"
                                                  else "ECC counters not readable"))
    return "%s: spare rows and retired pages within limits, %s" % (plural(len(read), "GPU"), how)


def rule(view: ClusterView) -> List[Finding]:
    from preflight.gpus import per_health_node

    return per_health_node(NAME, view, lambda gpu, record: _gpu(gpu, record.health_window_s), _summary)


CHECK = Check(
    name=NAME,
    claim="No GPU has a memory bank without spare rows, its retired-page limit reached, or corrected ECC errors "
    "arriving during the run",
    why="An uncorrectable error in a bank with no spare row is a row-remap failure (NVIDIA's RMA criterion); a GPU "
    "whose memory corrects errors by the thousand each second is failing now and slows every collective; past "
    "64 retired pages a pre-Ampere GPU keeps using bad pages. A count of old corrected errors with none arriving "
    "now is not failed.",
    fix="Banks without spare rows: plan the GPU's replacement (nvidia-smi -q -d ROW_REMAPPER). Corrected errors "
    "arriving: drain the node, run dcgmi diag -r 3, replace the GPU if they continue. Retired-page limit: "
    "replace the GPU (nvidia-smi -q -d PAGE_RETIREMENT).",
    probe=None,
    rule=rule,
    needs=("gpu",),
    action="isolate",
    order=21,
    reads="the gpu probe's NVML session (row remapper histogram, retired pages, corrected ECC twice) or its "
    "nvidia-smi -q -x",
    takes="a 1 s window inside the gpu probe (NVML only), concurrent with pcie and ib_errors",
)

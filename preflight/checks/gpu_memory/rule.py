"""The gpu_memory check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, List

from preflight.checks.gpu_memory import NAME
from preflight.common import plural
from preflight.derived.gpus import per_health_node
from preflight.model import ClusterView, Finding, Status

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

    return per_health_node(NAME, view, lambda gpu, record: _gpu(gpu, record.health_window_s), _summary)

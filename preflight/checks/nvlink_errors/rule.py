"""The nvlink_errors check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, List

from preflight.checks.nvlink_errors import NAME
from preflight.common import plural
from preflight.derived.gpus import node_gpus, per_health_node
from preflight.model import ClusterView, Finding, Status

#: DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: CRC errors per second that matter (DCGM, from the driver team).
CRC_PER_S = 100.0
#: Totals since boot worth naming in the PASS message.
NOTEWORTHY = 1000


def _gpu(gpu: Any, window_s: Any) -> List[Any]:
    h = gpu.health or {}
    before, after = h.get("nvlink_errors"), h.get("nvlink_errors_after")
    if not before or not after or not window_s:
        return []
    delta = {k: after[k] - before[k] for k in before if k in after}
    out: List[Any] = []
    hard = ["%d %s" % (delta[k], k) for k in ("recovery", "replay") if delta.get(k, 0) > 0]
    if hard:
        out.append((Status.FAIL, "%s: NVLink %s errors in %.1f s (expected none: the link is retraining or resending; "
                    "reseat or replace the GPU baseboard / cable)" % (gpu.label, ", ".join(hard), window_s),
                    "0", ", ".join(hard), "isolate"))
    crc = delta.get("crc_flit", 0) + delta.get("crc_data", 0)
    rate = crc / float(window_s)
    if rate >= CRC_PER_S:
        out.append((Status.FAIL, "%s: %d NVLink CRC errors in %.1f s (%.0f/s, expected < %g/s)" % (
            gpu.label, crc, window_s, rate, CRC_PER_S), "< %g/s" % CRC_PER_S, "%.0f/s" % rate, "isolate"))
    elif crc > 0:
        out.append((Status.WARN, "%s: %d NVLink CRC errors in %.1f s (%.1f/s, under DCGM's %g/s limit): retest"
                    % (gpu.label, crc, window_s, rate, CRC_PER_S), "0", str(crc), None))
    old = sum(after.values())
    if not out and old >= NOTEWORTHY:
        out.append((None, "%s: %d NVLink errors since boot, none during the window" % (gpu.label, old)))
    return out


def _summary(record: Any, read: List[Any]) -> str:
    linked = [g for g in read if (g.health or {}).get("nvlink_errors_after")]
    return "%s: no NVLink replay, recovery or CRC errors during the %.1f s window" % (
        plural(len(linked), "GPU"), record.health_window_s or 0)


def rule(view: ClusterView) -> List[Finding]:

    out = []
    for finding in per_health_node(NAME, view, lambda gpu, record: _gpu(gpu, record.health_window_s), _summary,
                                   report_stopped=False):
        record = node_gpus(view, finding.node) if finding.node else None
        if finding.status is Status.PASS and record is not None and not any(
                (g.health or {}).get("nvlink_errors_after") for g in record.gpus):
            why = ("read from nvidia-smi (one sample): no window" if record.health_source == "nvidia-smi"
                   else "no GPU reports NVLink error counters (PCIe GPUs, or a VM without NVLink)")
            finding = Finding(NAME, finding.node, Status.SKIP, "not judged: %s" % why)
        out.append(finding)
    return out

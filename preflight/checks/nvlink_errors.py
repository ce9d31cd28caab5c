"""nvlink_errors: no GPU's NVLinks are replaying, recovering, or taking CRC errors at a damaging rate during the run.

Rule only: the gpu probe reads the NVLink error counters (NVML field values, totals over all links:
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL 38, _CRC_DATA_ 45, _REPLAY_ 52, _RECOVERY_ 59) with its other
health facts and again after its window (preflight.probe.gpu_health, WINDOW_S, concurrent with the pcie and
ib_errors windows). Totals since boot are not judged: a link that took errors last month and none now is
healthy; what counts is the rate now. Blackwell's FEC counters are not read (forward error correction is
the link working as designed).

Thresholds are DCGM's NVLink health watch (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp and
dcgm_gpu_hardware_limits.h: DCGM_LIMIT_MAX_NVLINK_ERROR 1, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100 per second,
"RM has informed us that CRC errors only matter at rates of 100+ per second"):

- a recovery or replay error during the window: FAIL isolate (DCGM_FR_NVLINK_ERROR_CRITICAL: the link is
  retraining or resending; the all-reduce stalls on it).
- CRC (flit + data) errors at 100/s or more: FAIL isolate (DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD); fewer but
  some: WARN (DCGM_FR_NVLINK_ERROR_THRESHOLD).
- large totals since boot with nothing arriving: named in the PASS message.
- no GPU of the node has NVLink counters (PCIe parts, a VM without NVLink, the nvidia-smi path which reads
  one sample): SKIP with that reason, never a PASS that judged nothing.
"""

from __future__ import annotations

from typing import Any, List

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, Status

NAME = "nvlink_errors"
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
    from preflight.gpus import node_gpus, per_health_node

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


CHECK = Check(
    name=NAME,
    claim="No GPU's NVLinks take replay or recovery errors, or CRC errors at 100/s or more, during the run",
    why="A link that replays or recovers stalls every collective crossing it; CRC errors at a high rate mean a "
    "failing lane. Errors counted since boot with none arriving now are history, not a fault; PCIe GPUs and VMs "
    "without NVLink are not judged.",
    fix="Drain the node; nvidia-smi nvlink -e -i N names the link; reseat or replace the GPU baseboard or NVLink "
    "cable, then run dcgmi diag -r 2 before returning it to service.",
    probe=None,
    rule=rule,
    needs=("gpu",),
    action="isolate",
    order=23,
    reads="the gpu probe's NVML session: NVLink CRC flit/data, replay and recovery counters (field values), twice",
    takes="the gpu probe's 1 s health window (NVML only)",
)

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

from preflight.model import Check

NAME = "nvlink_errors"

CHECK = Check(
    name=NAME,
    claim="No GPU's NVLinks take replay or recovery errors, or CRC errors at 100/s or more, during the run",
    why="A link that replays or recovers stalls every collective crossing it; CRC errors at a high rate mean a "
    "failing lane. Errors counted since boot with none arriving now are history, not a fault; PCIe GPUs and VMs "
    "without NVLink are not judged.",
    fix="Drain the node; nvidia-smi nvlink -e -i N names the link; reseat or replace the GPU baseboard or NVLink "
    "cable, then run dcgmi diag -r 2 before returning it to service.",
    needs=("gpu",),
    action="isolate",
    order=23,
    reads="the gpu probe's NVML session: NVLink CRC flit/data, replay and recovery counters (field values), twice",
    takes="the gpu probe's 1 s health window (NVML only)",
)

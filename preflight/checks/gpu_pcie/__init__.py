"""gpu_pcie: no GPU's PCIe link replays during the run, or runs below its generation while the GPU is busy.

Rule only, the NVML half of PCIe health (the pcie check reads the kernel's AER counters from sysfs; the
topology check owns the link *width* against the slot and the fleet). The gpu probe reads the NVML replay
counter (field value NVML_FI_DEV_PCIE_REPLAY_COUNTER 94; nvidia-smi's <pci><replay_counter>) with its other
health facts and again after its window (preflight.probe.gpu_health), and the GPU's utilization.

- replays during the window: at least WINDOW_MIN replays (far above DCGM's budget of 8 per minute,
  dcgm_gpu_hardware_limits.h DCGM_LIMIT_MAX_PCIREPLAY_RATE): FAIL isolate (the link is failing now);
  fewer: WARN, retest (one noisy sample is no verdict). Replays since boot with none arriving now: named
  in the PASS message. The nvidia-smi path (one sample) does not judge the rate.
- link generation below the maximum NVML reports for the device in this system
  (nvmlDeviceGetMaxPcieLinkGeneration: the lower of the GPU's and the platform's): judged only while the
  GPU is busy (utilization >= BUSY_PCT): an idle GPU downshifts its link to save power, which is not a
  fault; then WARN (reseat, check the riser; pcie/topology judge the link's errors and width). Idle: the
  PASS message says the generation was not judged at idle.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpu_pcie"

CHECK = Check(
    name=NAME,
    claim="No GPU's PCIe link replays during the run, or runs below its maximum generation while the GPU is busy",
    why="A link that replays resends packets: the GPU's host transfers and GPUDirect traffic slow down and the "
    "link may drop (Xid 79). A link trained at a lower generation halves the bandwidth under load; at idle the GPU "
    "lowers it on purpose, so idle links are not judged.",
    fix="Drain the node, reseat the GPU or replace its riser/cable; check the pcie check's AER counters and "
    "lspci -vv LnkSta against LnkCap under load.",
    needs=("gpu",),
    action="isolate",
    order=24,
    reads="the gpu probe's NVML session: PCIe replay counter (field value 94) twice, utilization, link generation",
    takes="the gpu probe's 1 s health window (NVML only)",
)

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

from typing import Any, List

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, Status

NAME = "gpu_pcie"
#: Replays inside the window that make the link failing now (fewer are one noisy sample).
WINDOW_MIN = 3
#: Utilization (percent) from which the link must run at its maximum generation.
BUSY_PCT = 50
#: Replays since boot worth naming in the PASS message.
NOTEWORTHY = 100


def _gpu(gpu: Any, window_s: Any) -> List[Any]:
    h = gpu.health or {}
    out: List[Any] = []
    before, after = h.get("pcie_replay"), h.get("pcie_replay_after")
    if before is not None and after is not None and window_s:
        new = after - before
        if new >= WINDOW_MIN:
            out.append((Status.FAIL, "%s: %d PCIe replays in %.1f s (%d since boot; DCGM's budget is 8 per minute): the "
                        "link is failing now; reseat the GPU or replace the riser" % (gpu.label, new, window_s, after),
                        "< 8/min", "%d in %.1f s" % (new, window_s), "isolate"))
        elif new > 0:
            out.append((Status.WARN, "%s: %d PCIe replays in %.1f s: retest" % (gpu.label, new, window_s),
                        "0", str(new), None))
        elif after >= NOTEWORTHY:
            out.append((None, "%s: %d PCIe replays since boot, none during the window" % (gpu.label, after)))
    pcie = gpu.facts.get("pcie") or {}
    gen, top, util = pcie.get("gen"), pcie.get("max_gen"), h.get("util_gpu")
    if gen is not None and top is not None and gen < top:
        if util is not None and util >= BUSY_PCT:
            out.append((Status.WARN, "%s: PCIe Gen%d while %d%% busy (expected Gen%d): the link trained low; reseat "
                        "the GPU, check the riser" % (gpu.label, gen, util, top), "Gen%d" % top, "Gen%d" % gen, None))
        else:
            out.append((None, "PCIe generation not judged at idle (an idle GPU downshifts its link)"))
    return out


def _summary(record: Any, read: List[Any]) -> str:
    how = ("no PCIe replays during the %.1f s window" % record.health_window_s if record.health_window_s
           else "PCIe replay rate not measured (%s)" % ("nvidia-smi: one sample" if record.health_source == "nvidia-smi"
                                                        else "no replay counter"))
    return "%s: %s" % (plural(len(read), "GPU"), how)


def rule(view: ClusterView) -> List[Finding]:
    from preflight.gpus import per_health_node

    return per_health_node(NAME, view, lambda gpu, record: _gpu(gpu, record.health_window_s), _summary,
                           report_stopped=False)


CHECK = Check(
    name=NAME,
    claim="No GPU's PCIe link replays during the run, or runs below its maximum generation while the GPU is busy",
    why="A link that replays resends packets: the GPU's host transfers and GPUDirect traffic slow down and the "
    "link may drop (Xid 79). A link trained at a lower generation halves the bandwidth under load; at idle the GPU "
    "lowers it on purpose, so idle links are not judged.",
    fix="Drain the node, reseat the GPU or replace its riser/cable; check the pcie check's AER counters and "
    "lspci -vv LnkSta against LnkCap under load.",
    probe=None,
    rule=rule,
    needs=("gpu",),
    action="isolate",
    order=24,
    reads="the gpu probe's NVML session: PCIe replay counter (field value 94) twice, utilization, link generation",
    takes="the gpu probe's 1 s health window (NVML only)",
)

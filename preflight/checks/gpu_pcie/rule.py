"""The gpu_pcie check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, List

from preflight.checks.gpu_pcie import NAME
from preflight.common import plural
from preflight.derived.gpus import per_health_node
from preflight.model import ClusterView, Finding, Status

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

    return per_health_node(NAME, view, lambda gpu, record: _gpu(gpu, record.health_window_s), _summary,
                           report_stopped=False)

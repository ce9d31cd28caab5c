"""The pcie check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.pcie import NAME
from preflight.checks.pcie.probe import KINDS
from preflight.common import plural
from preflight.model import ClusterView, Finding, Status, probe_error

TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
#: DCGM's per-lane replay budget: a 1e-12 bit error rate at the link rate, per minute (GT/s x 1e9 x 1e-12 x 60).
BER_PER_GTS_LANE_MIN = 0.06
#: Correctable errors inside the window below this count are one noisy sample, never a verdict.
WINDOW_MIN_EVENTS = 3
#: A since-boot average above the budget is judged only over at least this many errors.
BOOT_MIN_EVENTS = 100


def budget_per_min(rate: Optional[List[float]]) -> Optional[int]:
    """DCGM's replay budget for a link: ceil(GT/s x 0.06 x lanes) correctable errors per minute."""
    if not rate:
        return None
    return int(math.ceil(rate[0] * BER_PER_GTS_LANE_MIN * rate[1]))


def _label(dev: Dict[str, Any]) -> str:
    return "%s %s" % ("GPU" if dev["kind"] == "gpu" else "NIC", dev["bdf"])


def _evidence(dev: Dict[str, Any]) -> str:
    top = sorted(dev.get("counts", {}).items(), key=lambda kv: -kv[1])[:3]
    return (" (%s)" % ", ".join("%s %d" % kv for kv in top)) if top else ""


def _judge_device(name: str, dev: Dict[str, Any], uptime: Optional[float], window: float) -> Tuple[List[Finding], Optional[str]]:
    total, delta = dev["total"], dev.get("delta") or {k: 0 for k in KINDS}
    label = _label(dev)
    budget = budget_per_min(dev.get("rate"))
    if delta["fatal"] or delta["nonfatal"]:
        what = "%d fatal, %d non-fatal" % (delta["fatal"], delta["nonfatal"])
        return [Finding(NAME, name, Status.FAIL, "%s %s: %s uncorrectable PCIe errors during the %gs check%s" % (
            name, label, what, window, _evidence(dev)), expected="0", actual=what, data={"device": dev}, action="isolate")], None
    if total["fatal"]:
        return [Finding(NAME, name, Status.FAIL, "%s %s: %s since boot%s: the link was reset; reboot, and isolate if it "
                        "returns" % (name, label, plural(total["fatal"], "fatal PCIe error"), _evidence(dev)),
                        expected="0", actual=str(total["fatal"]), data={"device": dev}, action="reboot")], None
    out: List[Finding] = []
    corr = delta["correctable"]
    if budget is not None and window > 0 and corr >= WINDOW_MIN_EVENTS and corr * 60.0 / window > budget:
        out.append(Finding(NAME, name, Status.FAIL, "%s %s: %d correctable PCIe errors in %gs (%.0f/min; budget %d/min "
                           "for %g GT/s x%d at a 1e-12 bit error rate)%s" % (
                               name, label, corr, window, corr * 60.0 / window, budget, dev["rate"][0], dev["rate"][1],
                               _evidence(dev)), expected="<= %d/min" % budget, actual="%.0f/min" % (corr * 60.0 / window),
                           data={"device": dev}, action="isolate"))
        return out, None
    old = total["correctable"]
    avg = old / (uptime / 60.0) if uptime else None
    if budget is not None and avg is not None and old >= BOOT_MIN_EVENTS and avg > budget:
        out.append(Finding(NAME, name, Status.FAIL, "%s %s: %d correctable PCIe errors since boot, %.0f/min on average "
                           "(budget %d/min for %g GT/s x%d)%s" % (name, label, old, avg, budget, dev["rate"][0],
                                                                  dev["rate"][1], _evidence(dev)),
                           expected="<= %d/min" % budget, actual="%.0f/min" % avg, data={"device": dev}, action="isolate"))
        return out, None
    if total["nonfatal"]:
        out.append(Finding(NAME, name, Status.WARN, "%s %s: %s since boot, none during the check%s" % (
            name, label, plural(total["nonfatal"], "non-fatal uncorrectable PCIe error"), _evidence(dev)),
            expected="0", actual=str(total["nonfatal"]), data={"device": dev}))
    note = None
    if old:
        note = "%s %d old correctable (%s)" % (label, old, "%.2f/min since boot" % avg if avg is not None else "uptime unknown")
    return out, note


def _judge(name: str, facts: Dict[str, Any]) -> List[Finding]:
    devices = facts["devices"]
    judged = [d for d in devices if d.get("total") is not None]
    if not devices:
        return [Finding(NAME, name, Status.SKIP, "no GPU or network controller in sysfs")]
    if not judged:
        return [Finding(NAME, name, Status.SKIP, "no AER statistics in sysfs for its %s (a VM, a kernel before 4.19, or "
                        "pci=noaer): not judged" % plural(len(devices), "GPU/NIC", "GPUs/NICs"))]
    out: List[Finding] = []
    notes: List[str] = []
    for dev in judged:
        found, note = _judge_device(name, dev, facts.get("uptime_s"), float(facts.get("window_s") or 0))
        out.extend(found)
        if note:
            notes.append(note)
    if not out:
        gpus = sum(1 for d in judged if d["kind"] == "gpu")
        msg = "%s: no uncorrectable PCIe errors on %s and %s over a %gs window%s" % (
            name, plural(gpus, "GPU"), plural(len(judged) - gpus, "NIC"), float(facts.get("window_s") or 0),
            "; below budget: " + "; ".join(notes[:4]) + (" and %d more" % (len(notes) - 4) if len(notes) > 4 else "") if notes else "")
        unjudged = len(devices) - len(judged)
        if unjudged:
            msg += " (%d without AER statistics)" % unjudged
        out.append(Finding(NAME, name, Status.PASS, msg))
    return out


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("devices", "device list"))
        out.extend([err] if err else _judge(name, facts))
    return out

"""pcie: no GPU or NIC PCIe link reports uncorrectable AER errors, or correctable ones above the link's error budget.

The probe reads the kernel's AER statistics (``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``
under ``bus/pci/devices/<bdf>``, kernel 4.19+; Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats,
Documentation/PCI/pcieaer-howto.rst) of every NVIDIA GPU (class 0x0300/0x0302) and network controller
(class 0x02xxxx), and of the port directly above each (the other end of the same link: errors the port
receives are counted there; a port above several functions, a dual-port NIC's, counts toward the first). It reads them twice, ``window_s`` apart (default 1 s, shortened to fit the
probe deadline), so errors happening now are told from old ones, and reads /proc/uptime for the rate
since boot. Each file is one ``<name> <count>`` line per error bit then ``TOTAL_ERR_COR|NONFATAL|FATAL <n>``;
kernels before 5.x print long names with spaces ("Receiver Error 2", "RELAY_NUM Rollover 0"), later
ones short names ("RxErr 2"); only the TOTAL line is summed (the kernel's own total).

Facts schema::

    uptime_s float | None     window_s float
    devices [{kind "gpu"|"nic", bdf, port bdf|None, rate [GT/s, lanes] | None,
              total {"correctable", "nonfatal", "fatal": int} | None     (device + port, after the window;
                                                                          None: the kernel keeps no AER stats)
              delta {same keys} | None                                    (during the window)
              counts {"<name>": n}                                        (non-zero bits, for evidence)}]

Rule (every node; CPU-only nodes are judged for their NICs):

- fatal or non-fatal errors during the window: FAIL, isolate (the link is failing now).
- fatal errors since boot: FAIL, reboot (a fatal error resets the link; the device is usually lost until
  a reboot; if it recurs, isolate).
- non-fatal errors since boot only: WARN (recovered, but a healthy link has none).
- correctable errors are judged against DCGM's PCIe replay budget (modules/health/DcgmHealthWatch.cpp
  GetExpectedPcieReplayRate: a 1e-12 bit error rate, ceil(GT/s x 0.06 x lanes) per minute: 31/min at
  Gen5 x16): FAIL isolate when at least 3 arrive during the window at a rate above it (DCGM's
  DCGM_FR_PCI_REPLAY_RATE is ISOLATE severity), or when the average since boot is above it over at least
  100 errors (a link failing for its whole uptime). A handful of old correctable errors is not a fault:
  the PASS names them with their rate.
- no device with AER statistics (a VM, a kernel without AER stats, pci=noaer): SKIP with that reason.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, probe_error
from preflight.probe import pci

NAME = "pcie"
KINDS = ("correctable", "nonfatal", "fatal")
FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
GPU_CLASSES = ("0x0300", "0x0302")
WINDOW_S = 1.0  # as long as ib_errors' window: the two run concurrently, so no added wall time on IB nodes
#: DCGM's per-lane replay budget: a 1e-12 bit error rate at the link rate, per minute (GT/s x 1e9 x 1e-12 x 60).
BER_PER_GTS_LANE_MIN = 0.06
#: Correctable errors inside the window below this count are one noisy sample, never a verdict.
WINDOW_MIN_EVENTS = 3
#: A since-boot average above the budget is judged only over at least this many errors.
BOOT_MIN_EVENTS = 100
_LINE = re.compile(r"^(.+?)\s+(\d+)$")


# --------------------------------------------------------------------------------------------- probe


def _read_aer(ctx: Any, bdf: Optional[str]) -> Optional[Dict[str, Dict[str, Any]]]:
    if bdf is None:
        return None
    base = ctx.sys_path("bus", "pci", "devices", bdf)
    out = {}
    for kind, fname in FILES.items():
        text = ctx.read(os.path.join(base, fname))
        if text is None:
            return None
        out[kind] = parse_aer_stats(text, "%s %s" % (bdf, fname))
    return out


def _sum(*reads: Optional[Dict[str, Dict[str, Any]]]) -> Optional[Dict[str, int]]:
    present = [r for r in reads if r is not None]
    if not present:
        return None
    return {k: sum(r[k]["total"] for r in present) for k in KINDS}


def probe(ctx: Any) -> Dict[str, Any]:
    """AER totals of every GPU and NIC (and the port above it), read twice window_s apart."""
    targets = []
    for fn in pci.functions(ctx):
        if fn["vendor"] == "0x10de" and fn["class"][:6] in GPU_CLASSES:
            targets.append(("gpu", fn["bdf"]))
        elif fn["class"].startswith("0x02"):
            targets.append(("nic", fn["bdf"]))
    ports: Dict[str, Optional[str]] = {}
    for _kind, bdf in targets:  # a port counts toward the first function below it only (dual-port NICs share one)
        port = pci.upstream(ctx, bdf)
        ports[bdf] = port if port not in ports.values() else None
    first = {bdf: _sum(_read_aer(ctx, bdf), _read_aer(ctx, ports[bdf])) for _kind, bdf in targets}
    window = float(ctx.config.get("window_s", WINDOW_S))
    left = ctx.remaining()
    if left is not None:
        window = max(0.0, min(window, left / 4.0))
    if any(v is not None for v in first.values()) and window > 0:
        time.sleep(window)
    devices = []
    for kind, bdf in targets:
        dev, port = _read_aer(ctx, bdf), _read_aer(ctx, ports[bdf])
        total = _sum(dev, port)
        before = first[bdf]
        delta = {k: total[k] - before[k] for k in KINDS} if total is not None and before is not None else None
        counts: Dict[str, int] = {}
        for side in (dev, port):
            for kind_read in (side or {}).values():
                for name, n in kind_read["counts"].items():
                    counts[name] = counts.get(name, 0) + n
        rate = pci.link_rate(ctx, bdf)
        devices.append({"kind": kind, "bdf": bdf, "port": ports[bdf], "rate": list(rate) if rate else None,
                        "total": total, "delta": delta, "counts": counts})
    return {"uptime_s": parse_uptime(ctx.read("/proc/uptime")), "window_s": window, "devices": devices}


# --------------------------------------------------------------------------------------------- parse


def parse_aer_stats(text: str, what: str = "aer_dev_*") -> Dict[str, Any]:
    """An aer_dev_{correctable,nonfatal,fatal} file -> {"total": TOTAL_ERR_* value, "counts": {bit name: n
    for the non-zero bits}}. Bit names may hold spaces (kernels before 5.x: "Receiver Error 2")."""
    total = None
    counts: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line.strip())
        if not m:
            raise ParseError("%s line %d: expected '<error name> <count>', got %.60r" % (what, number, line))
        name, value = m.group(1), int(m.group(2))
        if name.startswith("TOTAL_ERR_"):
            total = value
        elif value:
            counts[name] = value
    if total is None:
        raise ParseError("%s: no TOTAL_ERR_COR/NONFATAL/FATAL line (not an AER statistics file)" % what)
    return {"total": total, "counts": counts}


def parse_uptime(text: Optional[str]) -> Optional[float]:
    """/proc/uptime ("350735.47 234388.90") -> seconds since boot; unreadable -> None."""
    if text is None:
        return None
    parts = text.split()
    try:
        return float(parts[0])
    except (IndexError, ValueError):
        raise ParseError("/proc/uptime: expected '<seconds> <idle seconds>', got %.40r" % text)


# ---------------------------------------------------------------------------------------------- rule


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


CHECK = Check(
    name=NAME,
    claim="No GPU or NIC PCIe link logs uncorrectable AER errors, or correctable ones above its 1e-12 bit-error "
    "budget (now, or on average since boot)",
    why="A PCIe link that counts errors retransmits (replays) traffic and slows every transfer through it; "
    "uncorrectable errors drop the GPU or NIC off the bus (Xid 79) mid-job. The kernel counts them silently.",
    fix="Reseat the GPU/NIC and its riser, check the slot and cable (lspci -vvv: LnkSta, CESta/UESta), update "
    "the platform firmware; after fatal errors reboot; drain the node if the count keeps rising.",
    probe=probe,
    rule=rule,
    action="isolate",
    reads="sysfs bus/pci/devices/*/{vendor,class,max_link_*,aer_dev_*} of GPUs, NICs and their ports, twice; /proc/uptime",
    takes="1 s window (none without AER statistics)",
    order=69,
)

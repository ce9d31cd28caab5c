"""The pcie check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import time

from preflight.node_model import ParseError
from preflight.probe import pci
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional

KINDS = ("correctable", "nonfatal", "fatal")
FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
GPU_CLASSES = ("0x0300", "0x0302")
WINDOW_S = 1.0  # as long as ib_errors' window: the two run concurrently, so no added wall time on IB nodes
_LINE = lazy(r"^(.+?)\s+(\d+)$")


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

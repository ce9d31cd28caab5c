"""What a finding is about, as the unit that recurs: a GPU by serial, an HCA port, or else the node.

A fault that comes back is counted on the part that carries it: an Xid on the GPU at PCI 0000:17:00
is the GPU whose serial the same report lists at that bus (``hardware``), so a board moved to another
slot or node keeps its count; a port's counters belong to ``node:port``. The fault key names the
check and, where the finding says it, the code (``xid:xid79``), so an Xid 79 and an Xid 48 on one GPU
are two faults.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Tuple

_BUS = re.compile(r"([0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-7])?$")


def bus_key(pci: Any) -> Optional[str]:
    """'0000:17:00' and '00000000:17:00.0' as the same key ('17:00'); None for text that is no bus id."""
    if not isinstance(pci, str):
        return None
    m = _BUS.search(pci.strip().lower())
    return m.group(1) if m else None


def gpu_index(hardware: Mapping[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{node: {bus key: gpu record}} from a report's ``hardware`` section."""
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for node, entry in (hardware or {}).items():
        gpus = (entry or {}).get("gpus") or []
        out[node] = {k: g for g in gpus if isinstance(g, dict) for k in [bus_key(g.get("pci_bus_id"))] if k}
    return out


def subject_of(result: Mapping[str, Any], gpus: Mapping[str, Mapping[str, Dict[str, Any]]]) -> Tuple[str, str]:
    """(subject, fault) of one report result. subject: ``gpu:<serial>`` (or ``gpu:<uuid>`` when the
    serial is not reported), ``port:<node>:<port>``, or ``node:<node>``; fault: ``<check>`` or
    ``<check>:<kind><code>``."""
    node = result.get("node") or ""
    data = result.get("data") if isinstance(result.get("data"), dict) else {}
    fault = result["check"]
    if data.get("code") is not None:
        fault = "%s:%s%s" % (fault, data.get("kind") or "", data["code"])
    gpu = None
    key = bus_key(data.get("pci"))
    if key is not None:
        gpu = (gpus.get(node) or {}).get(key)
    elif result["check"] == "gpu":
        failed = [g for g in (gpus.get(node) or {}).values() if g.get("failed")]
        gpu = failed[0] if len(failed) == 1 else None
    if gpu is not None and (gpu.get("serial") or gpu.get("uuid")):
        return "gpu:%s" % (gpu.get("serial") or gpu.get("uuid")), fault
    if isinstance(data.get("port"), str) and data["port"]:
        return "port:%s:%s" % (node, data["port"]), fault
    return "node:%s" % node, fault

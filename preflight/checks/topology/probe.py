"""The topology check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import re

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy
from preflight.probe.pci import bridges, nvidia_gpus, rdma_hcas

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional

LINK_FILES = ("current_link_width", "max_link_width", "current_link_speed", "max_link_speed")
_SPEED = lazy(r"^(\d+(?:\.\d+)?) GT/s(?: PCIe)?$")


def _link_attrs(ctx: Any, bdf: str) -> Dict[str, Optional[str]]:
    base = ctx.sys_path("bus", "pci", "devices", bdf)
    return {name: ctx.read(os.path.join(base, name)) for name in LINK_FILES}


def read_device(ctx: Any, kind: str, bdf: str, name: Optional[str]) -> Dict[str, Any]:
    chain = bridges(ctx, bdf)
    slot = None
    if chain:
        attrs = _link_attrs(ctx, chain[-1])
        if attrs["max_link_width"] is not None:
            link = link_facts(attrs, "%s slot" % chain[-1])
            slot = {"max_width": link["max_width"], "max_speed": link["max_speed"]}
    numa = ctx.read(ctx.sys_path("bus", "pci", "devices", bdf, "numa_node"))
    return {
        "kind": kind,
        "bdf": bdf,
        "name": name,
        "numa_node": parse_numa_node(numa),
        "bridges": chain,
        "link": link_facts(_link_attrs(ctx, bdf), "%s %s" % (kind, bdf)),
        "slot": slot,
    }


def probe(ctx: Any) -> Dict[str, Any]:
    """Link state, NUMA node and bridge chain of every NVIDIA GPU and RDMA HCA."""
    devices = [read_device(ctx, "gpu", bdf, None) for bdf in nvidia_gpus(ctx)]
    for hca, bdf in rdma_hcas(ctx):
        if bdf is not None:
            devices.append(read_device(ctx, "hca", bdf, hca))
    return {"devices": devices}


def parse_numa_node(text: Optional[str]) -> Optional[int]:
    """'1' -> 1; '-1' (no NUMA information) or unreadable -> None."""
    if text is None or text.strip() == "-1":
        return None
    if not re.match(r"^\d+$", text.strip()):
        raise ParseError("numa_node: expected an integer or -1, got %.40r" % text)
    return int(text.strip())


def parse_link_speed(text: Optional[str], what: str = "link speed") -> Optional[float]:
    """'32.0 GT/s PCIe' (kernel 4.19+), '8 GT/s' (older) -> GT/s; 'Unknown' (no link) or unreadable -> None."""
    if text is None or text.strip() in ("Unknown", "Unknown speed", ""):
        return None
    m = _SPEED.match(text.strip())
    if not m:
        raise ParseError("%s: expected a speed like '16.0 GT/s PCIe', got %.40r" % (what, text))
    return float(m.group(1))


def parse_link_width(text: Optional[str], what: str = "link width") -> Optional[int]:
    """'16' -> 16; '0' (no link trained) or unreadable -> None."""
    if text is None or text.strip() == "0":
        return None
    if not text.strip().isdigit():
        raise ParseError("%s: expected a lane count like 16, got %.40r" % (what, text))
    return int(text.strip())


def link_facts(attrs: Dict[str, Optional[str]], where: str = "device") -> Dict[str, Any]:
    """{current,max}_link_{width,speed} sysfs texts -> {cur_width, max_width, cur_speed, max_speed}."""
    return {
        "cur_width": parse_link_width(attrs.get("current_link_width"), where + " current_link_width"),
        "max_width": parse_link_width(attrs.get("max_link_width"), where + " max_link_width"),
        "cur_speed": parse_link_speed(attrs.get("current_link_speed"), where + " current_link_speed"),
        "max_speed": parse_link_speed(attrs.get("max_link_speed"), where + " max_link_speed"),
    }

"""The ib_hca check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import ipaddress
import os

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy
from preflight.probe.rdma import is_efa, natural_key  # noqa: F401  (this module's API too)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {0: "NOP", 1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "Phy Test"}
LINK_LAYERS = {"InfiniBand": "ib", "Ethernet": "roce"}
_NUMBERED = lazy(r"^(\d+): (\S.*)$")
_RATE = lazy(r"^(\d+(?:\.\d+)?) Gb/sec(?: \((\d+X)(?: ?([A-Za-z0-9]+))?\))?$")


def parse_numbered(text: Optional[str], table: Dict[int, str], what: str) -> str:
    """'4: ACTIVE' → 'ACTIVE', '5: LinkUp' → 'LinkUp'. The number and the name must agree."""
    if text is None:
        raise ParseError("%s: missing or unreadable" % what)
    m = _NUMBERED.match(text.strip())
    if not m:
        raise ParseError("%s: expected 'N: NAME', got %.60r" % (what, text))
    number, name = int(m.group(1)), m.group(2).strip()
    known = table.get(number)
    if known is None or known.replace(" ", "").lower() != name.replace(" ", "").lower():
        raise ParseError("%s: unknown value %.60r" % (what, text))
    return known


def parse_rate(text: Optional[str], what: str) -> Tuple[float, Optional[str]]:
    """'400 Gb/sec (4X NDR)' → (400.0, '4X NDR'); '2.5 Gb/sec (1X SDR)' → (2.5, '1X SDR')."""
    if text is None:
        raise ParseError("%s: missing or unreadable" % what)
    m = _RATE.match(text.strip())
    if not m:
        raise ParseError("%s: expected 'N Gb/sec (WX SPEED)', got %.60r" % (what, text))
    width = " ".join(p for p in (m.group(2), m.group(3)) if p) or None
    return float(m.group(1)), width


def parse_link_layer(text: Optional[str], what: str) -> str:
    """'InfiniBand' → 'ib', 'Ethernet' → 'roce'."""
    if text is None or text.strip() not in LINK_LAYERS:
        raise ParseError("%s: expected InfiniBand or Ethernet, got %.60r" % (what, text))
    return LINK_LAYERS[text.strip()]


def parse_roce_gid(gid_type: Optional[str], gid: Optional[str]) -> Optional[str]:
    """The IPv4 address of a RoCE v2 GID entry ('RoCE v2', '0000:...:ffff:c613:0003' → '198.19.0.3'), else None."""
    if gid_type is None or gid_type.strip() != "RoCE v2" or not gid:
        return None
    try:
        addr = ipaddress.IPv6Address(gid.strip())
    except ValueError:
        raise ParseError("GID %.60r is not an IPv6-format address" % gid) from None
    mapped = addr.ipv4_mapped
    return str(mapped) if mapped is not None else None


def _number(value: float) -> Any:
    return int(value) if value == int(value) else value


def _port_netdev(ctx: Any, hca_dir: str, port: int) -> Optional[str]:
    """The netdev of an HCA port: device/net/*; with several, the one whose dev_port is port-1."""
    net_dir = os.path.join(hca_dir, "device", "net")
    names = ctx.listdir(net_dir)
    if len(names) == 1:
        return names[0]
    for name in names:
        dev_port = ctx.read(os.path.join(net_dir, name, "dev_port"))
        if dev_port is not None and dev_port.strip().isdigit() and int(dev_port) == port - 1:
            return name
    return None


def _roce_v2_gids(ctx: Any, port_dir: str) -> List[Dict[str, Any]]:
    """Every GID entry of type RoCE v2 holding an IPv4-mapped address, lowest index first:
    [{"index", "ip", "ndev"}], ndev from gid_attrs/ndevs/<index> (a VLAN netdev such as ens1f0np0.100
    where the address sits on a VLAN; None when unreadable)."""
    types_dir = os.path.join(port_dir, "gid_attrs", "types")
    out = []
    for entry in sorted((e for e in ctx.listdir(types_dir) if e.isdigit()), key=int):
        ip = parse_roce_gid(ctx.read(os.path.join(types_dir, entry)), ctx.read(os.path.join(port_dir, "gids", entry)))
        if ip is not None:
            ndev = ctx.read(os.path.join(port_dir, "gid_attrs", "ndevs", entry))
            out.append({"index": int(entry), "ip": ip, "ndev": ndev.strip() if ndev and ndev.strip() else None})
    return out


def _link(ctx: Any, port_dir: str, where: str) -> Dict[str, Any]:
    """A port's state, phys_state, rate and width (ports/<n>/{state,phys_state,rate})."""
    rate, width = parse_rate(ctx.read(os.path.join(port_dir, "rate")), where + " rate")
    return {"state": parse_numbered(ctx.read(os.path.join(port_dir, "state")), STATES, where + " state"),
            "phys_state": parse_numbered(ctx.read(os.path.join(port_dir, "phys_state")), PHYS_STATES,
                                         where + " phys_state"),
            "rate_gbps": _number(rate), "width": width}


def read_port(ctx: Any, hca: str, port: int) -> Dict[str, Any]:
    """One port's facts from class/infiniband/<hca>/ports/<port>/."""
    hca_dir = ctx.sys_path("class", "infiniband", hca)
    port_dir = os.path.join(hca_dir, "ports", str(port))
    where = "%s port %d" % (hca, port)
    link = _link(ctx, port_dir, where)
    link_layer = parse_link_layer(ctx.read(os.path.join(port_dir, "link_layer")), where + " link_layer")
    gids = _roce_v2_gids(ctx, port_dir) if link_layer == "roce" else []
    return {"hca": hca, "port": port, **link, "link_layer": link_layer, "netdev": _port_netdev(ctx, hca_dir, port),
            "roce_v2_gid_index": gids[0]["index"] if gids else None,
            "roce_v2_ip": gids[0]["ip"] if gids else None, "roce_v2_gids": gids}


def read_efa_port(ctx: Any, device: str, port: int) -> Dict[str, Any]:
    """One EFA device port: state, phys_state and rate as the efa driver publishes them (its link_layer
    'Unknown' is not read: the device is no InfiniBand/RoCE port)."""
    port_dir = ctx.sys_path("class", "infiniband", device, "ports", str(port))
    return {"device": device, "kind": "efa", "port": port, **_link(ctx, port_dir, "%s port %d" % (device, port))}


def probe(ctx: Any) -> Dict[str, Any]:
    """Every HCA with its GUID and firmware, and every port's state, rate, link layer and RoCE GID; EFA
    devices apart, under "efa" (present only when the node has some)."""
    root = ctx.sys_path("class", "infiniband")
    hcas: Dict[str, Dict[str, Any]] = {}
    ports: List[Dict[str, Any]] = []
    efa: List[Dict[str, Any]] = []
    for hca in sorted(ctx.listdir(root), key=natural_key):
        hca_dir = os.path.join(root, hca)
        port_names = ctx.listdir(os.path.join(hca_dir, "ports"))
        if not port_names:
            raise ParseError("%s: no ports/ directory under %s" % (hca, hca_dir))
        if any(not entry.isdigit() for entry in port_names):
            raise ParseError("%s: unexpected port entry %r" % (hca, next(e for e in port_names if not e.isdigit())))
        numbers = sorted(int(entry) for entry in port_names)
        if is_efa(ctx, hca_dir):
            efa.extend(read_efa_port(ctx, hca, n) for n in numbers)
            continue
        hcas[hca] = {
            "node_guid": ctx.read(os.path.join(hca_dir, "node_guid")),
            "fw_ver": ctx.read(os.path.join(hca_dir, "fw_ver")),
            "board_id": ctx.read(os.path.join(hca_dir, "board_id")),
            "hca_type": ctx.read(os.path.join(hca_dir, "hca_type")),
        }
        ports.extend(read_port(ctx, hca, n) for n in numbers)
    facts: Dict[str, Any] = {"hcas": hcas, "ports": ports}
    if efa:
        facts["efa"] = efa
    return facts

"""ib_hca: every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, alike on every node.

The probe reads the sysfs tree the RDMA core publishes (`class/infiniband/<hca>/ports/<n>/...`); no
rdma-core tools (ibstat, ibv_devinfo) are needed on the node. `usable_hcas(view)` is the helper the
NCCL env-file writer uses for NCCL_IB_HCA / NCCL_IB_GID_INDEX.

Ports are judged by their role. The rails (the ports NCCL uses) are the ACTIVE ports of the link layer
most ports have, less those run at another rate by design; the others are frontend/storage ports or spares.
"The same port" is a port's name (mlx5_3:1), link layer and card model (hca_type, else board_id) on the
other nodes: a port ACTIVE on two nodes or more is expected at the rate most of them run it at.
- no HCA anywhere: SKIP ("no InfiniBand/RoCE HCA"), unless the inventory expects some (`expect.ib_hcas`
  or `expect.ib_rate_gbps`): then FAIL. A node without HCAs while other nodes have them: FAIL.
- a port not ACTIVE/LinkUp: FAIL, except when `expect.ib_hcas` is set and the node still has that many
  usable ports (an uncabled spare port): WARN. A port administratively Disabled that is not a rail (another
  layer than the rails, or Disabled on every node) is named as a spare in the PASS.
- a rail whose rate differs from `expect.ib_rate_gbps`, else from the rails' rate (the most common rate of
  the layer's ACTIVE ports); any other port whose rate differs from the same port on the other nodes:
  FAIL (a degraded width/speed paces every collective). A port of the rails' layer run at another rate on
  most nodes, or (no other node has it) on another card model than the rails, is a frontend port; with
  neither to tell, it is judged as a rail. No majority rate for a rail: FAIL naming the split.
- usable ports (ACTIVE at the expected rate) fewer than `expect.ib_hcas`, or fewer than the cluster
  majority: FAIL.
- locked-memory limit (ssh facts, memlock_soft; None = unlimited) on nodes with an active port or EFA
  device: below 1 GiB FAIL (RDMA memory registration fails or NCCL falls back to sockets), limited but
  >= 1 GiB WARN (set it unlimited), unlimited PASS.
- AWS EFA devices (the efa driver in device/uevent, else PCI vendor 0x1d0f; link_layer 'Unknown') are
  their own fabric, under "efa" in the facts with kind "efa": never an HCA for NCCL's InfiniBand transport
  nor in NCCL_IB_HCA (NCCL drives EFA through the aws-ofi-nccl plugin). PASS naming them; WARN
  (fix_config) for fewer devices than most EFA nodes have, or a device not ACTIVE. Real layout: link_layer
  'Unknown' in linux-rdma/rdma-core#884, ibstat of efa_0 in amzn/amzn-drivers#114, rdmap<bus>s0 names in
  aws/eks-charts#1110, the driver binding as NVIDIA/NVSentinel docs/nic-health-monitor.md reads it.
Real mixed nodes behind the role rules: kvcache-ai/Mooncake#2039 (ConnectX-7 InfiniBand rails at 400, CX-6
Dx Ethernet ports Down/Disabled), #1999 (CX-7 RoCE rails beside CX-6 Dx ports), imbue-ai/cluster-health#4.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import fold, human_bytes, majority, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Setting, Status, probe_error

NAME = "ib_hca"
#: Below this locked-memory limit RDMA registration of NCCL's buffers fails: FAIL.
MEMLOCK_MIN_BYTES = 1 << 30

STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {0: "NOP", 1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "Phy Test"}
LINK_LAYERS = {"InfiniBand": "ib", "Ethernet": "roce"}
#: The PCI vendor id of Amazon's EFA functions (device/vendor), where device/uevent names no driver.
EFA_VENDOR = "0x1d0f"
_NUMBERED = re.compile(r"^(\d+): (\S.*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec(?: \((\d+X)(?: ?([A-Za-z0-9]+))?\))?$")


# ----------------------------------------------------------------------------------------------- parse


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


def natural_key(name: str) -> Tuple[Any, ...]:
    """mlx5_2 sorts before mlx5_10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# ----------------------------------------------------------------------------------------------- probe


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


def _driver(ctx: Any, hca_dir: str) -> Optional[str]:
    """The kernel driver bound to the HCA's PCI function ('efa', 'mlx5_core'), from device/uevent's DRIVER=
    line; None when unreadable."""
    for line in (ctx.read(os.path.join(hca_dir, "device", "uevent")) or "").splitlines():
        if line.startswith("DRIVER="):
            return line[len("DRIVER="):].strip() or None
    return None


def is_efa(ctx: Any, hca_dir: str) -> bool:
    """An AWS Elastic Fabric Adapter: bound to the efa driver, or (no uevent) on a PCI function of Amazon's
    vendor id 0x1d0f."""
    driver = _driver(ctx, hca_dir)
    if driver is not None:
        return driver == "efa"
    return (ctx.read(os.path.join(hca_dir, "device", "vendor")) or "").strip().lower() == EFA_VENDOR


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


# ------------------------------------------------------------------------------------------------ rule


def port_label(p: Dict[str, Any]) -> str:
    """'mlx5_0:1', the form NCCL_IB_HCA takes."""
    return "%s:%d" % (p["hca"], p["port"])


def is_active(p: Dict[str, Any]) -> bool:
    return p.get("state") == "ACTIVE" and p.get("phys_state") == "LinkUp"


def _rate_text(rate: Any) -> str:
    return "%g Gb/s" % rate


PORT_LIST = ("ports", "port list")  # a node's facts are judged only with a port list
LAYER_NAMES = {"ib": "InfiniBand", "roce": "RoCE"}
_layer = lambda layer: LAYER_NAMES.get(layer, str(layer))  # noqa: E731


def _valid(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: facts} for nodes whose ib_hca probe produced a port list."""
    out = {}
    for name, facts in view.of(NAME).items():
        if probe_error(NAME, name, facts, listed=PORT_LIST) is None:
            out[name] = facts
    return out


def _position(facts: Dict[str, Any], p: Dict[str, Any]) -> Tuple[str, str, Optional[str]]:
    """What makes two nodes' ports "the same port": its name and port (mlx5_3:1), link layer, and card
    model (the HCA's hca_type, MT4129 on a ConnectX-7 and MT4125 on a ConnectX-6 Dx, as ibstat's "CA
    type" shows it; else its board_id; None when neither was read)."""
    hca = (facts.get("hcas") or {}).get(p["hca"])
    model = (hca.get("hca_type") or hca.get("board_id")) if isinstance(hca, dict) else None
    return port_label(p), p["link_layer"], model or None


def _active_rates(valid: Dict[str, Dict[str, Any]]) -> Dict[str, List[Any]]:
    """{link layer: [rate of every ACTIVE port]}."""
    rates: Dict[str, List[Any]] = {}
    for facts in valid.values():
        for p in facts["ports"]:
            if is_active(p):
                rates.setdefault(p["link_layer"], []).append(p["rate_gbps"])
    return rates


def rail_layer(valid: Dict[str, Dict[str, Any]]) -> Optional[str]:
    """The link layer most ACTIVE ports have across the nodes: the rails'. None on a tie or without any."""
    return majority([p["link_layer"] for f in valid.values() for p in f["ports"] if is_active(p)])[0]


def expected_rates(view: ClusterView, valid: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, Any]:
    """{link layer: Gb/s}: expect.ib_rate_gbps for the rails' layer (every layer when no layer has the
    majority), else the most common rate of the layer's ACTIVE ports.

    A tie (two rates equally common, none more) has no reference value: the layer maps to None, and the
    rule judges each port by the same port on the other nodes or, lacking that, FAILs it naming the split.
    """
    valid = _valid(view) if valid is None else valid
    want = view.expect.get("ib_rate_gbps")
    rails = rail_layer(valid)
    out: Dict[str, Any] = {}
    for layer, rates in _active_rates(valid).items():
        out[layer] = want if want is not None and rails in (None, layer) else majority(rates)[0]
    if want is not None and rails is None:
        out.setdefault("ib", want)
        out.setdefault("roce", want)
    return out


def _plan(view: ClusterView, valid: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The fleet reference: the rails' layer and rate, and every port position's ACTIVE rates across nodes."""
    rates, layer = expected_rates(view, valid), rail_layer(valid)
    rate = rates.get(layer)
    active: Dict[Any, List[float]] = {}
    nodes_with: Dict[Any, int] = {}
    for facts in valid.values():
        for p in facts["ports"]:
            pos = _position(facts, p)
            nodes_with[pos] = nodes_with.get(pos, 0) + 1
            if is_active(p):
                active.setdefault(pos, []).append(float(p["rate_gbps"]))
    at_rate = [pos for pos, r in active.items() if pos[1] == layer and rate is not None and float(rate) in r]
    return {"layer": layer, "rate": rate, "rates": rates, "active": active, "nodes_with": nodes_with,
            "rail_models": {pos[2] for pos in at_rate if pos[2] is not None}, "rate_met": bool(at_rate),
            "want": view.expect.get("ib_rate_gbps")}


def _peer_rate(plan: Dict[str, Any], pos: Any, p: Dict[str, Any]) -> Optional[float]:
    """The rate this port runs at on most nodes (itself included; needs two nodes that agree), or, for a
    port that is not ACTIVE, on the one other node that has it ACTIVE; None without such evidence."""
    rates = plan["active"].get(pos) or []
    if len(rates) >= 2:
        return majority(rates)[0]
    return rates[0] if rates and not is_active(p) else None


def _is_rail(plan: Dict[str, Any], pos: Any, peer: Optional[float]) -> bool:
    """Whether the port is a rail (NCCL uses it). Only ports of the rails' layer can be; among them, the
    same port on the other nodes decides (a rail there is a rail here; one run at another rate on most
    nodes is a frontend/storage port by design), then the card model; with neither, a rail."""
    layer, model = pos[1], pos[2]
    if plan["layer"] is None:
        return True  # the layers tie: no pick (usable_hcas says so); every port is judged as a rail
    if layer != plan["layer"]:
        return False
    if plan["rate"] is None or not plan["rate_met"]:
        return True  # no rails' rate to tell ports apart by (a tie, or expect.ib_rate_gbps met nowhere)
    if peer is not None:
        return peer == float(plan["rate"])
    seen = plan["active"].get(pos, [])
    if len(seen) >= 2 and float(plan["rate"]) not in seen:
        return False  # ACTIVE on several nodes (at rates that tie), at the rails' rate on none
    if plan["nodes_with"].get(pos, 0) >= 2 and not plan["active"].get(pos):
        return False  # this port is ACTIVE on no node: a spare everywhere
    if model is not None and plan["rail_models"]:
        return model in plan["rail_models"]
    return True


def _expected(plan: Dict[str, Any], pos: Any, peer: Optional[float], rail: bool) -> Tuple[Optional[float], str]:
    """(the rate this port should run at, why); None when nothing sets one."""
    if rail and plan["rate"] is not None:
        if plan["want"] is not None:
            return plan["rate"], ""
        return plan["rate"], ", the rails' rate" if peer is None else ", as this port on the other nodes"
    if peer is not None:
        return peer, ", as this port on the other nodes"
    other = plan["rates"].get(pos[1]) if not rail and pos[1] != plan["layer"] else None
    return other, ", the %s ports' majority" % _layer(pos[1]) if other is not None else ""


def judged_ports(plan: Dict[str, Any], facts: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each port of a node with its role and reference: [{"port", "rail", "expected", "basis", "usable"}]."""
    out = []
    for p in facts["ports"]:
        pos = _position(facts, p)
        peer = _peer_rate(plan, pos, p)
        rail = _is_rail(plan, pos, peer)
        expected, basis = _expected(plan, pos, peer, rail)
        usable = is_active(p) and (expected is None or float(p["rate_gbps"]) == float(expected))
        tie = plan["active"].get(pos, []) if peer is None and len(plan["active"].get(pos, [])) >= 2 else []
        out.append({"port": p, "rail": rail, "expected": expected, "basis": basis, "usable": usable, "tie": tie})
    return out


def rate_split(valid: Dict[str, Dict[str, Any]], layer: str) -> str:
    """'400 Gb/s on 4 ports · 200 Gb/s on 4 ports': the ACTIVE ports' rates of one link layer."""
    return _split(_active_rates(valid).get(layer) or [], "port")


def _split(rates: List[Any], what: str) -> str:
    return " · ".join("%s on %s" % (_rate_text(r), plural(rates.count(r), what)) for r in sorted(set(rates), reverse=True))


def usable_hcas(view: ClusterView) -> Dict[str, Any]:
    """The ports NCCL should use, per node, for the env-file writer. Pure.

    The rails (the module docstring says how ports get their role): an H100 node's 8 InfiniBand rails, not
    its BlueField-3 Ethernet port; an all-RoCE node's 400 Gb/s rails, not its 100 Gb/s frontend ports. Never
    an EFA device. When the layers tie (as many InfiniBand as RoCE ports) no layer is picked.

    Returns {"nodes": {node: ["mlx5_0:1", ...]},   the rails (nodes whose probe failed are left out)
             "uniform": bool,                        the same list on every node listed
             "link_layer": "ib" | "roce" | None,     the rails' layer; None when no port is ACTIVE or the
                                                      layers tie
             "layer_counts": {layer: usable ports},  across the nodes, before the pick
             "left_out": {node: [(port, why)]},      usable ports that are not rails
             "gid_index": int | None,                RoCE v2 GID index when RoCE and identical on every
                                                      rail, else None
             "rate_gbps": {link layer: Gb/s}}        the expected rates used
    """
    valid = _valid(view)
    plan = _plan(view, valid)
    layer, rate = plan["layer"], plan["rate"]
    nodes: Dict[str, List[str]] = {}
    left_out: Dict[str, List[Tuple[str, str]]] = {}
    gids = set()
    all_layers: List[str] = []
    for name in (n.name for n in view.live if n.name in valid):
        judged = [j for j in judged_ports(plan, valid[name]) if j["usable"]]
        all_layers.extend(j["port"]["link_layer"] for j in judged)
        rails = [j["port"] for j in judged if j["rail"]]
        nodes[name] = [port_label(p) for p in rails]
        gids.update(p.get("roce_v2_gid_index") for p in rails)
        rails_text = "%s at %s" % (_layer(layer), _rate_text(rate) if rate is not None else "mixed rates")
        others = [j["port"] for j in judged if not j["rail"]]
        if others:
            left_out[name] = [(port_label(p), "%s at %s; the rails are %s" % (
                _layer(p["link_layer"]), _rate_text(p["rate_gbps"]), rails_text)) for p in others]
    lists = {tuple(v) for v in nodes.values()}
    return {
        "nodes": nodes,
        "uniform": len(lists) <= 1,
        "link_layer": layer,
        "layer_counts": {lay: all_layers.count(lay) for lay in sorted(set(all_layers))},
        "left_out": left_out,
        "gid_index": gids.pop() if layer == "roce" and len(gids) == 1 else None,
        "rate_gbps": plan["rates"],
    }


def _left_out_text(left_out: Optional[List[Tuple[str, str]]]) -> str:
    """'; not for NCCL: mlx5_bond_0:1 (RoCE at 200 Gb/s; the rails are ...)', or ''."""
    if not left_out:
        return ""
    return "; not for NCCL: " + ", ".join("%s (%s)" % pair for pair in left_out)


def _memlock_finding(view: ClusterView, name: str) -> Optional[Finding]:
    ssh = view.facts.get(name, {}).get("ssh")
    if not isinstance(ssh, dict) or "probe_error" in ssh or "memlock_soft" not in ssh:
        return Finding(NAME, name, Status.ERROR, "%s: locked-memory limit unknown (no ssh facts)" % name)
    soft = ssh["memlock_soft"]
    if soft is None:
        return None
    shown = human_bytes(soft)
    if soft < MEMLOCK_MIN_BYTES:
        status, consequence = Status.FAIL, ": RDMA memory registration will fail"
    else:
        status, consequence = Status.WARN, "; set it unlimited for RDMA"
    return Finding(NAME, name, status, "%s: locked-memory limit (ulimit -l) is %s%s" % (name, shown, consequence),
                   expected="unlimited", actual=shown)


def _no_hca(name: str, with_hcas: List[str], want_count: Any, want_rate: Any) -> Finding:
    """FAIL for a node without InfiniBand/RoCE ports where some were expected or other nodes have them."""
    if want_count is not None or want_rate is not None:
        exp = "%s HCA ports" % want_count if want_count is not None else "HCAs at %s" % _rate_text(want_rate)
        return Finding(NAME, name, Status.FAIL, "no InfiniBand/RoCE HCA (expected %s)" % exp, expected=exp,
                       actual="none")
    others = sorted(set(with_hcas) - {name})
    return Finding(NAME, name, Status.FAIL, "no InfiniBand/RoCE HCA (%s have them)" % fold(others),
                   expected="HCAs like the other nodes", actual="none")


def _port_findings(name: str, judged: List[Dict[str, Any]], enough: bool, valid: Dict[str, Any]) -> List[Finding]:
    """A node's port verdicts: a port not ACTIVE (a Disabled non-rail only noted), a rate off its reference."""
    out = []
    usable = sum(1 for j in judged if j["usable"])
    for j in judged:
        p, exp_rate = j["port"], j["expected"]
        expected = "ACTIVE at %s" % _rate_text(exp_rate) if exp_rate is not None else "ACTIVE"
        where = "%s %s port %d" % (name, p["hca"], p["port"])
        data = {"port": port_label(p), "role": "rail" if j["rail"] else "other"}
        if not is_active(p):
            if p["phys_state"] == "Disabled" and not j["rail"]:
                continue  # administratively off and no rail: a spare, named in the PASS
            out.append(Finding(NAME, name, Status.WARN if enough else Status.FAIL, "%s: state %s, %s (expected %s)%s" % (
                where, p["state"], p["phys_state"], expected,
                "; not needed: %d usable ports as expected" % usable if enough else ""),
                expected=expected, actual="%s/%s" % (p["state"], p["phys_state"]), data=data))
        elif exp_rate is not None and float(p["rate_gbps"]) != float(exp_rate):
            out.append(Finding(NAME, name, Status.FAIL, "%s: rate %s%s (expected %s%s)" % (
                where, _rate_text(p["rate_gbps"]), ", %s" % p["width"] if p.get("width") else "",
                _rate_text(exp_rate), j["basis"]), expected=_rate_text(exp_rate),
                actual=_rate_text(p["rate_gbps"]), data=data))
        elif exp_rate is None and (j["rail"] or j["tie"]):
            split = "no majority: %s; set expect.ib_rate_gbps" % rate_split(valid, p["link_layer"]) if j["rail"] else (
                "this port differs across nodes, no majority: %s" % _split(j["tie"], "node"))
            out.append(Finding(NAME, name, Status.FAIL, "%s: rate %s (%s)" % (where, _rate_text(p["rate_gbps"]), split),
                expected="one rate on every port", actual=_rate_text(p["rate_gbps"]), data=data))
    return out


def _pass(name: str, judged: List[Dict[str, Any]], left_out: Optional[List[Tuple[str, str]]]) -> Finding:
    aside = {label for label, _ in left_out or []}
    shown = [j["port"] for j in judged if j["usable"] and port_label(j["port"]) not in aside]
    spares = [port_label(j["port"]) for j in judged if not is_active(j["port"])]
    return Finding(NAME, name, Status.PASS, "%s ACTIVE at %s (%s): %s%s%s" % (
        plural(len(shown), "port"), "/".join(_rate_text(r) for r in sorted({p["rate_gbps"] for p in shown})),
        "/".join(sorted({p["link_layer"] for p in shown})), ", ".join(port_label(p) for p in shown),
        _left_out_text(left_out), "; spare, Disabled: %s" % ", ".join(spares) if spares else ""),
        actual=str(sum(1 for j in judged if j["usable"])))


def _count_findings(name: str, usable: int, counts: Dict[str, int], want_count: Any) -> List[Finding]:
    """Usable ports per node against expect.ib_hcas, else the majority; a tie has no reference value."""
    target = want_count if want_count is not None else majority(list(counts.values()))[0]
    if want_count is None and target is None and len(set(counts.values())) > 1:
        split = " · ".join("%d on %s" % (c, fold(n for n, v in counts.items() if v == c))
                           for c in sorted(set(counts.values()), reverse=True))
        return [Finding(NAME, name, Status.FAIL, "%s: %d usable HCA ports (no majority: %s; set expect.ib_hcas)" % (
            name, usable, split), expected="the same count on every node", actual=str(usable))]
    if target is None or usable >= target:
        return []
    basis = "expected %d" % target if want_count is not None else "%s have %d" % (
        fold(sorted(n for n, c in counts.items() if c == target)), target)
    return [Finding(NAME, name, Status.FAIL, "%s: %d usable HCA ports (%s)" % (name, usable, basis),
                    expected=str(target), actual=str(usable))]


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    valid = _valid(view)
    for name, facts in view.of(NAME).items():
        if name not in valid:
            out.append(probe_error(NAME, name, facts, listed=PORT_LIST))
    want_count, want_rate = view.expect.get("ib_hcas"), view.expect.get("ib_rate_gbps")
    expected_some = want_count is not None or want_rate is not None
    with_hcas = [n for n, f in valid.items() if f["ports"]]
    efa = efa_findings(view, valid)
    if not with_hcas and not (expected_some and (want_count is None or want_count > 0)):
        with_efa = {f.node for f in efa}
        return out + efa + [Finding(NAME, n, Status.SKIP, "no InfiniBand/RoCE HCA") for n in valid if n not in with_efa]
    plan = _plan(view, valid)
    judged = {n: judged_ports(plan, f) for n, f in valid.items()}
    counts = {n: sum(1 for j in js if j["usable"]) for n, js in judged.items()}
    not_for_nccl = usable_hcas(view)["left_out"]
    for name in (node.name for node in view.live if node.name in valid):
        if not valid[name]["ports"]:
            out.append(_no_hca(name, with_hcas, want_count, want_rate))
            continue
        enough = want_count is not None and counts[name] >= want_count
        node_out = _port_findings(name, judged[name], enough, valid)
        node_out += _count_findings(name, counts[name], counts, want_count)
        if any(is_active(p) for p in valid[name]["ports"]):
            mem = _memlock_finding(view, name)
            node_out += [mem] if mem is not None else []
        out.extend(node_out or [_pass(name, judged[name], not_for_nccl.get(name))])
    return out + efa


# ------------------------------------------------------------------------------------------------- EFA


def efa_findings(view: ClusterView, valid: Dict[str, Dict[str, Any]]) -> List[Finding]:
    """One finding per node with EFA devices: PASS naming them, WARN for fewer than most EFA nodes have or
    a device whose port is not ACTIVE (the efa driver reports ACTIVE/LinkUp while the device works)."""
    devices = {n: f["efa"] for n, f in valid.items() if f.get("efa")}
    common = majority([len(d) for d in devices.values()])[0] if len(devices) > 1 else None
    out = []
    for name, ports in devices.items():
        down = ["%s (%s/%s)" % (p["device"], p["state"], p["phys_state"]) for p in ports if not is_active(p)]
        rates = "/".join(_rate_text(r) for r in sorted({p["rate_gbps"] for p in ports}))
        problems = []
        if common is not None and len(ports) < common:
            problems.append("%d EFA devices where most EFA nodes have %d: launch the instance with every EFA "
                            "interface its type has" % (len(ports), common))
        if down:
            problems.append("not ACTIVE: %s" % ", ".join(down))
        if problems:
            out.append(Finding(NAME, name, Status.WARN, "%s: %s" % (name, "; ".join(problems)), action="fix_config",
                               expected="%s EFA devices ACTIVE" % (common or len(ports)), actual=str(len(ports) - len(down))))
        else:
            shown = ", ".join(p["device"] for p in ports[:4]) + (", ... (%d)" % len(ports) if len(ports) > 4 else "")
            out.append(Finding(NAME, name, Status.PASS, "%s ACTIVE at %s: %s (AWS EFA: used by NCCL through the aws-ofi-nccl "
                               "plugin, not its InfiniBand transport)" % (plural(len(ports), "EFA device"), rates, shown),
                               actual=str(len(ports))))
        if not valid[name]["ports"]:
            mem = _memlock_finding(view, name)
            out += [mem] if mem is not None else []
    return out


CHECK = Check(
    name=NAME,
    claim="Every InfiniBand/RoCE rail is ACTIVE at the rails' rate, every other port as on the other nodes; EFA devices ACTIVE",
    why="NCCL spreads traffic over every HCA it is told to use; one DOWN or slow port stalls or slows every "
    "collective, and a small locked-memory limit makes RDMA registration fail at startup.",
    fix="Check cables and the switch port (ibstat, mlxlink -d DEV), the subnet manager (sminfo), and firmware; "
    "set `* - memlock unlimited` in /etc/security/limits.conf (and LimitMEMLOCK=infinity for services).",
    probe=probe,
    rule=rule,
    needs=("ssh",),
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}, device ids, device/uevent",
    takes="< 0.1 s",
    order=60,
    settings=(
        Setting("expect.ib_hcas", "int", "ACTIVE HCA ports every node has (else the cluster majority)", low=0, high=65536),
        Setting("expect.ib_rate_gbps", "number", "the rate every rail (a port NCCL uses) runs at", low=0.001, high=100000, unit="Gb/s"),
    ),
)

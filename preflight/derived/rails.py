"""The RDMA rails NCCL uses on each node (NCCL_IB_HCA), derived once per cluster view: what topology reads
to judge GPU↔NIC affinity on the compute NICs only, not on storage or management ports.

Controller side. The choice is usable_hcas (ACTIVE ports at the rails' rate, of the link layer most usable
ports have: an H100 node's 8 InfiniBand rails, not its BlueField-3 Ethernet port), the same the env file writes
as NCCL_IB_HCA and the ib_hca check judges each port's role by (port_plan); it is carried on the view
(ClusterView.derive, `of`), so readers neither recompute it nor dig in ib_hca's facts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

from preflight.checks.ib_hca import NAME
from preflight.common import majority
from preflight.model import ClusterView, probe_error

DERIVED = "rails"


#: Its reading of the ib_hca facts, on the view (ports_of)
PORTS = "rail_ports"


def of(view: Any) -> Dict[str, Any]:
    """usable_hcas(view), computed once per view."""
    return view.derive(DERIVED, usable_hcas)


def ports_of(view: Any) -> Dict[str, Any]:
    """read_ports(view), computed once per view: what usable_hcas and the ib_hca rule both judge ports by."""
    return view.derive(PORTS, read_ports)


def compute_hcas(view: Any, node: str) -> Optional[Set[str]]:
    """The HCA devices (mlx5_0) carrying the node's NCCL rails; None when the node has no ib_hca facts
    (its rails unknown)."""
    ports = of(view)["nodes"].get(node)
    if ports is None:
        return None
    return {label.rsplit(":", 1)[0] for label in ports}


def port_label(p: Dict[str, Any]) -> str:
    """'mlx5_0:1', the form NCCL_IB_HCA takes."""
    return "%s:%d" % (p["hca"], p["port"])


def is_active(p: Dict[str, Any]) -> bool:
    return p.get("state") == "ACTIVE" and p.get("phys_state") == "LinkUp"


def rate_text(rate: Any) -> str:
    return "%g Gb/s" % rate


PORT_LIST = ("ports", "port list")  # a node's facts are judged only with a port list


LAYER_NAMES = {"ib": "InfiniBand", "roce": "RoCE"}


_layer = lambda layer: LAYER_NAMES.get(layer, str(layer))  # noqa: E731


def valid_ports(view: ClusterView) -> Dict[str, Dict[str, Any]]:
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


def active_rates(valid: Dict[str, Dict[str, Any]]) -> Dict[str, List[Any]]:
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
    valid = valid_ports(view) if valid is None else valid
    want = view.expect.get("ib_rate_gbps")
    rails = rail_layer(valid)
    out: Dict[str, Any] = {}
    for layer, rates in active_rates(valid).items():
        out[layer] = want if want is not None and rails in (None, layer) else majority(rates)[0]
    if want is not None and rails is None:
        out.setdefault("ib", want)
        out.setdefault("roce", want)
    return out


def port_plan(view: ClusterView, valid: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
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


def read_ports(view: ClusterView) -> Dict[str, Any]:
    """The ib_hca facts read once: {"valid": {node: facts with a port list} (valid_ports), "plan": the fleet
    reference (port_plan), "judged": {node: each port with its role and reference} (judged_ports)}."""
    valid = valid_ports(view)
    plan = port_plan(view, valid)
    return {"valid": valid, "plan": plan, "judged": {name: judged_ports(plan, facts) for name, facts in valid.items()}}


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
    ports = ports_of(view)
    valid, plan = ports["valid"], ports["plan"]
    layer, rate = plan["layer"], plan["rate"]
    nodes: Dict[str, List[str]] = {}
    left_out: Dict[str, List[Tuple[str, str]]] = {}
    gids = set()
    all_layers: List[str] = []
    for name in (n.name for n in view.live if n.name in valid):
        judged = [j for j in ports["judged"][name] if j["usable"]]
        all_layers.extend(j["port"]["link_layer"] for j in judged)
        rails = [j["port"] for j in judged if j["rail"]]
        nodes[name] = [port_label(p) for p in rails]
        gids.update(p.get("roce_v2_gid_index") for p in rails)
        rails_text = "%s at %s" % (_layer(layer), rate_text(rate) if rate is not None else "mixed rates")
        others = [j["port"] for j in judged if not j["rail"]]
        if others:
            left_out[name] = [(port_label(p), "%s at %s; the rails are %s" % (
                _layer(p["link_layer"]), rate_text(p["rate_gbps"]), rails_text)) for p in others]
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

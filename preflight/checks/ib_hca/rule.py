"""The ib_hca check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.common import fold, human_bytes, majority, plural
from preflight.model import ClusterView, Finding, Status, probe_error
from preflight.checks.ib_hca import NAME

#: Below this locked-memory limit RDMA registration of NCCL's buffers fails: FAIL.
MEMLOCK_MIN_BYTES = 1 << 30


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

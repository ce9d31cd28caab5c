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


def _valid(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: facts} for nodes whose ib_hca probe produced a port list."""
    out = {}
    for name, facts in view.of(NAME).items():
        if probe_error(NAME, name, facts, listed=PORT_LIST) is None:
            out[name] = facts
    return out


def _active_rates(valid: Dict[str, Dict[str, Any]]) -> Dict[str, List[Any]]:
    """{link layer: [rate of every ACTIVE port]}."""
    rates: Dict[str, List[Any]] = {}
    for facts in valid.values():
        for p in facts["ports"]:
            if is_active(p):
                rates.setdefault(p["link_layer"], []).append(p["rate_gbps"])
    return rates


def expected_rates(view: ClusterView, valid: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, Any]:
    """{link layer: expected Gb/s}: expect.ib_rate_gbps, else the most common rate of ACTIVE ports.

    A tie (two rates equally common, none more) has no reference value: the layer maps to None, every
    ACTIVE port of it counts as usable, and the rule FAILs each port naming the split (rate_split()).
    """
    valid = _valid(view) if valid is None else valid
    want = view.expect.get("ib_rate_gbps")
    out: Dict[str, Any] = {}
    for layer, rates in _active_rates(valid).items():
        out[layer] = want if want is not None else majority(rates)[0]
    if want is not None:
        out.setdefault("ib", want)
        out.setdefault("roce", want)
    return out


def _usable(ports: List[Dict[str, Any]], rates: Dict[str, Any]) -> List[Dict[str, Any]]:
    """ACTIVE ports at their layer's expected rate (any rate where the layer has no reference: a tie)."""
    out = []
    for p in ports:
        want = rates.get(p["link_layer"])
        if is_active(p) and (want is None or float(p["rate_gbps"]) == float(want)):
            out.append(p)
    return out


def rate_split(valid: Dict[str, Dict[str, Any]], layer: str) -> str:
    """'400 Gb/s on 4 ports · 200 Gb/s on 4 ports': the ACTIVE ports' rates of one link layer."""
    rates = _active_rates(valid).get(layer) or []
    return " · ".join(
        "%s on %s" % (_rate_text(r), plural(rates.count(r), "port")) for r in sorted(set(rates), reverse=True)
    )


LAYER_NAMES = {"ib": "InfiniBand", "roce": "RoCE"}


def _layer_text(layer: Any) -> str:
    return LAYER_NAMES.get(layer, str(layer))


def usable_hcas(view: ClusterView) -> Dict[str, Any]:
    """The ports NCCL should use, per node, for the env-file writer. Pure.

    The rails are the usable ports (ACTIVE at the expected rate for their link layer) of the link layer
    most usable ports across the nodes have: an H100 node's 8 InfiniBand rails, not its BlueField-3
    Ethernet port. Usable ports of another layer are left out, with the reason. When the layers tie
    (as many InfiniBand as RoCE ports) there is no majority and no layer is picked.

    Returns {"nodes": {node: ["mlx5_0:1", ...]},   the rails (nodes whose probe failed are left out)
             "uniform": bool,                        the same list on every node listed
             "link_layer": "ib" | "roce" | None,     the rails' layer; None when no port is usable or the
                                                      layers tie
             "layer_counts": {layer: usable ports},  across the nodes, before the pick
             "left_out": {node: [(port, why)]},      usable ports not on the rails' layer
             "gid_index": int | None,                RoCE v2 GID index when RoCE and identical on every
                                                      rail, else None
             "rate_gbps": {link layer: Gb/s}}        the expected rates used
    """
    valid = _valid(view)
    rates = expected_rates(view, valid)
    names = [n.name for n in view.live if n.name in valid]
    usable_by_node = {name: _usable(valid[name]["ports"], rates) for name in names}
    all_layers = [p["link_layer"] for usable in usable_by_node.values() for p in usable]
    link_layer, _, _ = majority(all_layers)
    nodes: Dict[str, List[str]] = {}
    left_out: Dict[str, List[Tuple[str, str]]] = {}
    gids = set()
    for name in names:
        usable = usable_by_node[name]
        rails = [p for p in usable if link_layer is None or p["link_layer"] == link_layer]
        nodes[name] = [port_label(p) for p in rails]
        gids.update(p.get("roce_v2_gid_index") for p in rails)
        others = [p for p in usable if p not in rails]
        if others:
            left_out[name] = [
                (
                    port_label(p),
                    "%s at %s; the rails are %s at %s"
                    % (
                        _layer_text(p["link_layer"]),
                        _rate_text(p["rate_gbps"]),
                        _layer_text(link_layer),
                        _rate_text(rates[link_layer]) if rates.get(link_layer) is not None else "mixed rates",
                    ),
                )
                for p in others
            ]
    lists = {tuple(v) for v in nodes.values()}
    gid_index = None
    if link_layer == "roce" and len(gids) == 1:
        gid_index = gids.pop()
    return {
        "nodes": nodes,
        "uniform": len(lists) <= 1,
        "link_layer": link_layer,
        "layer_counts": {layer: all_layers.count(layer) for layer in sorted(set(all_layers))},
        "left_out": left_out,
        "gid_index": gid_index,
        "rate_gbps": rates,
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
    return Finding(
        NAME,
        name,
        status,
        "%s: locked-memory limit (ulimit -l) is %s%s" % (name, shown, consequence),
        expected="unlimited",
        actual=shown,
    )


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    valid = _valid(view)
    for name, facts in view.of(NAME).items():
        if name not in valid:
            out.append(probe_error(NAME, name, facts, listed=PORT_LIST))
    want_count = view.expect.get("ib_hcas")
    want_rate = view.expect.get("ib_rate_gbps")
    expected_some = want_count is not None or want_rate is not None
    with_hcas = [n for n, f in valid.items() if f["ports"]]
    if not with_hcas and not (expected_some and (want_count is None or want_count > 0)):
        return out + [Finding(NAME, n, Status.SKIP, "no InfiniBand/RoCE HCA") for n in valid]

    rates = expected_rates(view, valid)
    usable_counts = {n: len(_usable(f["ports"], rates)) for n, f in valid.items()}
    # Usable ports per node against expect.ib_hcas, else the majority; a tie has no reference value.
    majority_count = majority(list(usable_counts.values()))[0] if want_count is None and usable_counts else None
    majority_nodes = sorted(n for n, c in usable_counts.items() if c == majority_count)
    not_for_nccl = usable_hcas(view)["left_out"]
    count_tie = want_count is None and majority_count is None and len(set(usable_counts.values())) > 1
    count_split = " · ".join(
        "%d on %s" % (c, fold(n for n, v in usable_counts.items() if v == c))
        for c in sorted(set(usable_counts.values()), reverse=True)
    )

    for node in view.live:
        name = node.name
        if name not in valid:
            continue
        ports = valid[name]["ports"]
        node_out: List[Finding] = []
        usable = _usable(ports, rates)
        if not ports:
            if expected_some:
                exp = "%s HCA ports" % want_count if want_count is not None else "HCAs at %s" % _rate_text(want_rate)
                node_out.append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "no InfiniBand/RoCE HCA (expected %s)" % exp,
                        expected=exp,
                        actual="none",
                    )
                )
            else:
                others = sorted(set(with_hcas) - {name})
                node_out.append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "no InfiniBand/RoCE HCA (%s have them)" % fold(others),
                        expected="HCAs like the other nodes",
                        actual="none",
                    )
                )
            out.extend(node_out)
            continue
        enough = want_count is not None and len(usable) >= want_count
        for p in ports:
            exp_rate = rates.get(p["link_layer"])
            expected = "ACTIVE at %s" % _rate_text(exp_rate) if exp_rate is not None else "ACTIVE"
            where = "%s %s port %d" % (name, p["hca"], p["port"])
            if not is_active(p):
                node_out.append(
                    Finding(
                        NAME,
                        name,
                        Status.WARN if enough else Status.FAIL,
                        "%s: state %s, %s (expected %s)%s"
                        % (
                            where,
                            p["state"],
                            p["phys_state"],
                            expected,
                            "; not needed: %d usable ports as expected" % len(usable) if enough else "",
                        ),
                        expected=expected,
                        actual="%s/%s" % (p["state"], p["phys_state"]),
                        data={"port": port_label(p)},
                    )
                )
            elif exp_rate is not None and float(p["rate_gbps"]) != float(exp_rate):
                node_out.append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "%s: rate %s%s (expected %s%s)"
                        % (
                            where,
                            _rate_text(p["rate_gbps"]),
                            ", %s" % p["width"] if p.get("width") else "",
                            _rate_text(exp_rate),
                            "" if want_rate is not None else ", the cluster majority",
                        ),
                        expected=_rate_text(exp_rate),
                        actual=_rate_text(p["rate_gbps"]),
                        data={"port": port_label(p)},
                    )
                )
            elif exp_rate is None and want_rate is None:
                node_out.append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "%s: rate %s (no majority: %s; set expect.ib_rate_gbps)"
                        % (where, _rate_text(p["rate_gbps"]), rate_split(valid, p["link_layer"])),
                        expected="one rate on every port",
                        actual=_rate_text(p["rate_gbps"]),
                        data={"port": port_label(p)},
                    )
                )
        if count_tie:
            node_out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "%s: %d usable HCA ports (no majority: %s; set expect.ib_hcas)" % (name, len(usable), count_split),
                    expected="the same count on every node",
                    actual=str(len(usable)),
                )
            )
        target = want_count if want_count is not None else majority_count
        if target is not None and len(usable) < target:
            basis = (
                "expected %d" % target
                if want_count is not None
                else "%s have %d" % (fold(majority_nodes), target)
            )
            node_out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "%s: %d usable HCA ports (%s)" % (name, len(usable), basis),
                    expected=str(target),
                    actual=str(len(usable)),
                )
            )
        if usable or any(is_active(p) for p in ports):
            mem = _memlock_finding(view, name)
            if mem is not None:
                node_out.append(mem)
        if not node_out:
            aside = {label for label, _ in not_for_nccl.get(name) or []}
            shown = [p for p in usable if port_label(p) not in aside]
            node_out.append(
                Finding(
                    NAME,
                    name,
                    Status.PASS,
                    "%s ACTIVE at %s (%s): %s%s"
                    % (
                        plural(len(shown), "port"),
                        "/".join(_rate_text(r) for r in sorted({p["rate_gbps"] for p in shown})),
                        "/".join(sorted({p["link_layer"] for p in shown})),
                        ", ".join(port_label(p) for p in shown),
                        _left_out_text(not_for_nccl.get(name)),
                    ),
                    actual=str(len(usable)),
                )
            )
        out.extend(node_out)
    return out

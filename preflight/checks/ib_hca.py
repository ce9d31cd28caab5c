"""ib_hca: every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, alike on every node.

The probe reads the sysfs tree the RDMA core publishes (`class/infiniband/<hca>/ports/<n>/...`); no
rdma-core tools (ibstat, ibv_devinfo) are needed on the node. `usable_hcas(view)` is the helper the
NCCL env-file writer uses for NCCL_IB_HCA / NCCL_IB_GID_INDEX.

Rule decisions:
- no HCA anywhere: SKIP ("no InfiniBand/RoCE HCA"), unless the inventory expects some (`expect.ib_hcas`
  or `expect.ib_rate_gbps`): then FAIL. A node without HCAs while other nodes have them: FAIL.
- a port not ACTIVE/LinkUp: FAIL, except when `expect.ib_hcas` is set and the node still has that many
  usable ports (an uncabled spare port): WARN.
- an ACTIVE port whose rate differs from `expect.ib_rate_gbps`, or else from the cluster majority for its
  link layer: FAIL (a degraded width/speed paces every collective).
- usable ports (ACTIVE at the expected rate) fewer than `expect.ib_hcas`, or fewer than the cluster
  majority: FAIL.
- locked-memory limit (ssh facts, memlock_soft; None = unlimited) on nodes with an active port:
  below 1 GiB FAIL (RDMA memory registration fails or NCCL falls back to sockets), limited but >= 1 GiB
  WARN (set it unlimited), unlimited PASS.
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
PHYS_STATES = {
    0: "NOP",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
LINK_LAYERS = {"InfiniBand": "ib", "Ethernet": "roce"}
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


def read_port(ctx: Any, hca: str, port: int) -> Dict[str, Any]:
    """One port's facts from class/infiniband/<hca>/ports/<port>/."""
    hca_dir = ctx.sys_path("class", "infiniband", hca)
    port_dir = os.path.join(hca_dir, "ports", str(port))
    where = "%s port %d" % (hca, port)
    rate, width = parse_rate(ctx.read(os.path.join(port_dir, "rate")), where + " rate")
    link_layer = parse_link_layer(ctx.read(os.path.join(port_dir, "link_layer")), where + " link_layer")
    gids = _roce_v2_gids(ctx, port_dir) if link_layer == "roce" else []
    return {
        "hca": hca,
        "port": port,
        "state": parse_numbered(ctx.read(os.path.join(port_dir, "state")), STATES, where + " state"),
        "phys_state": parse_numbered(
            ctx.read(os.path.join(port_dir, "phys_state")), PHYS_STATES, where + " phys_state"
        ),
        "rate_gbps": _number(rate),
        "width": width,
        "link_layer": link_layer,
        "netdev": _port_netdev(ctx, hca_dir, port),
        "roce_v2_gid_index": gids[0]["index"] if gids else None,
        "roce_v2_ip": gids[0]["ip"] if gids else None,
        "roce_v2_gids": gids,
    }


def probe(ctx: Any) -> Dict[str, Any]:
    """Every HCA with its GUID and firmware, and every port's state, rate, link layer and RoCE GID."""
    root = ctx.sys_path("class", "infiniband")
    hcas: Dict[str, Dict[str, Any]] = {}
    ports: List[Dict[str, Any]] = []
    for hca in sorted(ctx.listdir(root), key=natural_key):
        hca_dir = os.path.join(root, hca)
        hcas[hca] = {
            "node_guid": ctx.read(os.path.join(hca_dir, "node_guid")),
            "fw_ver": ctx.read(os.path.join(hca_dir, "fw_ver")),
            "board_id": ctx.read(os.path.join(hca_dir, "board_id")),
        }
        port_names = ctx.listdir(os.path.join(hca_dir, "ports"))
        if not port_names:
            raise ParseError("%s: no ports/ directory under %s" % (hca, hca_dir))
        for entry in sorted(port_names, key=natural_key):
            if not entry.isdigit():
                raise ParseError("%s: unexpected port entry %r" % (hca, entry))
            ports.append(read_port(ctx, hca, int(entry)))
    return {"hcas": hcas, "ports": ports}


# ------------------------------------------------------------------------------------------------ rule


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


CHECK = Check(
    name=NAME,
    claim="Every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, with the same ports on every node",
    why="NCCL spreads traffic over every HCA it is told to use; one DOWN or slow port stalls or slows every "
    "collective, and a small locked-memory limit makes RDMA registration fail at startup.",
    fix="Check cables and the switch port (ibstat, mlxlink -d DEV), the subnet manager (sminfo), and firmware; "
    "set `* - memlock unlimited` in /etc/security/limits.conf (and LimitMEMLOCK=infinity for services).",
    probe=probe,
    rule=rule,
    needs=("ssh",),
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}, device ids",
    takes="< 0.1 s",
    order=60,
    settings=(
        Setting("expect.ib_hcas", "int", "ACTIVE HCA ports every node has (else the cluster majority)", low=0, high=65536),
        Setting("expect.ib_rate_gbps", "number", "the rate every active port runs at", low=0.001, high=100000, unit="Gb/s"),
    ),
)

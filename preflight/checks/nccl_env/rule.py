"""The nccl_env check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from preflight.checks.nccl_env import NAME
from preflight.common import fold, majority, nccl_list, nccl_selects
from preflight.derived import datanet, envfabric, envvars, ncclenv
from preflight.model import ClusterView, Finding, Status, probe_error
from preflight.probe.ncclconf import effective

#: Variables whose value must agree across ranks: NCCL picks its transport, protocol, algorithm and
#: buffer sizes per rank, and ranks that disagree hang at the first collective or fall back to a slow path.
MUST_MATCH = frozenset(
    (
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_BUFFSIZE",
        "NCCL_NET",
        "NCCL_NET_PLUGIN",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        # the traffic class / service level of NCCL's RDMA traffic: a node on another class puts its
        # traffic in the lossy queue (no PFC), and the whole ring runs at its retransmission pace
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "NCCL_IB_FIFO_TC",
        "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_FAMILY",
        "NCCL_COLLNET_ENABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_CROSS_NIC",
        "NCCL_NET_GDR_LEVEL",
        "GLOO_SOCKET_IFNAME",
    )
)
UNSET = "(unset)"


def selects(spec: str, name: str, port: Optional[int] = None) -> bool:
    """Whether an NCCL list spec selects the interface `name` (or HCA `name` port `port`)."""
    return nccl_selects(spec, name, port)


def _recommended_names(value: str) -> List[str]:
    return nccl_list(value)[2]


def _contradiction(key: str, value: str, rec: Dict[str, str], node_iface: Optional[str], addressed: Dict[str, str]) -> Optional[str]:
    """Why a node's setting contradicts the recommended env (None when it does not).

    addressed: {interface: address} of the node's interfaces that hold an address (what NCCL's socket
    code can match)."""
    if key == "NCCL_SOCKET_IFNAME" and node_iface:
        recommended = rec.get(key) or "=" + node_iface
        if not selects(value, node_iface):
            return "does not select the data interface %s (recommended %s)" % (node_iface, recommended)
        others = sorted(name for name in addressed if name != node_iface and selects(value, name))
        if others:
            return (
                "also selects %s, not the data interface %s: NCCL's bootstrap takes the first match in interface order and its "
                "socket transport spreads over every match (recommended %s)"
                % (", ".join("%s (%s)" % (name, addressed[name]) for name in others), node_iface, recommended)
            )
    elif key == "GLOO_SOCKET_IFNAME" and node_iface:
        if value != node_iface:
            return "is not the data interface %s" % node_iface
    elif key == "NCCL_IB_HCA" and "NCCL_IB_HCA" in rec:
        left = []
        for label in _recommended_names(rec[key]):
            dev, _, port = label.partition(":")
            if not selects(value, dev, int(port) if port.isdigit() else None):
                left.append(label)
        if left:
            return "leaves out the usable HCA port%s %s (recommended %s)" % (
                "" if len(left) == 1 else "s",
                ", ".join(left),
                rec[key],
            )
    elif key == "NCCL_IB_GID_INDEX" and key in rec and value.strip() != rec[key]:
        return "is not the RoCE v2 GID index %s" % rec[key]
    elif key == "NCCL_IB_DISABLE" and "NCCL_IB_HCA" in rec and value.strip() not in ("", "0"):
        return "turns InfiniBand/RoCE off although %s are usable: NCCL falls back to sockets" % rec["NCCL_IB_HCA"].lstrip("=")
    return None


def _addressed(view: ClusterView, node: str) -> Dict[str, str]:
    """{name: first address} of the node's interfaces holding an IPv4 or a global IPv6 address (nic facts):
    the ones NCCL's interface matching can select (it skips link-local IPv6 and address-less interfaces)."""
    nic = (view.facts.get(node) or {}).get("nic")
    out: Dict[str, str] = {}
    for iface in (nic.get("interfaces") if isinstance(nic, dict) else None) or []:
        if not isinstance(iface, dict) or not isinstance(iface.get("name"), str):
            continue
        for addr in iface.get("addresses") or []:
            ip = str((addr or {}).get("ip") or "")
            if ip and not ip.lower().startswith("fe80") and iface["name"] not in out:
                out[iface["name"]] = ip
    return out


def _node_ifaces(view: ClusterView) -> Dict[str, str]:

    choice = datanet.of(view)
    out = {}
    for node in view.live:
        entry = choice.get(node.name)
        if entry and entry.get("iface"):
            out[node.name] = entry["iface"]
    return out


def _nccl_versions(view: ClusterView) -> Dict[str, Optional[Tuple[int, int, int]]]:
    """{node: its NCCL version as a tuple}, from the driver check's facts (the env writer's reading)."""
    names = [n.name for n in view.live]
    return {n: envvars.version_key(v) for n, v in envfabric.nccl_versions(view, names).items()}


def _recommended(view: ClusterView, nodes: List[str]) -> Tuple[Dict[str, str], Dict[str, Dict[str, str]]]:
    """(the env file's variables, {node: its per-node values}) derived over the same facts."""
    if not nodes:
        return {}, {}
    derived = ncclenv.derive(view, nodes)
    return derived.as_dict(), derived.per_node


def rule(view: ClusterView) -> List[Finding]:
    """Each node's effective NCCL settings against the env file's recommendation (a contradiction FAILs) and
    against the other nodes (drift FAILs for a MUST_MATCH variable, else WARNs), malformed conf lines WARN;
    a node with none of these PASSes."""

    out, settings, malformed = _read_settings(view)
    if not settings:
        return out
    nodes = [n.name for n in view.live if n.name in settings]
    common, per_node = _recommended(view, nodes)
    problems: Dict[str, List[Finding]] = {n: [] for n in nodes}
    contradicted = _contradictions(view, nodes, settings, common, per_node, problems)
    for key in sorted({k for s in settings.values() for k in s}):
        _drift(key, nodes, settings, per_node, contradicted, problems)
    for name in nodes:
        node_out = problems[name]
        for text in malformed[name]:
            node_out.append(Finding(NAME, name, Status.WARN, "%s: conf line %s" % (name, text)))
        out.extend(node_out or [_pass(name, settings[name])])
    return out


#: {node: {variable: (value, where it is set)}}
_Settings = Dict[str, Dict[str, Tuple[str, str]]]


def _read_settings(view: ClusterView) -> Tuple[List[Finding], _Settings, Dict[str, List[str]]]:
    """(probe errors, {node: {variable: (value, where it is set)}} as the node's NCCL reads them, {node: its
    malformed conf lines, as text})."""
    out: List[Finding] = []
    versions = _nccl_versions(view)
    settings: _Settings = {}
    malformed: Dict[str, List[str]] = {}
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("files", "conf-file list"))
        if err:
            out.append(err)
            continue
        settings[name] = effective(facts, versions.get(name))
        malformed[name] = [
            "%s:%d %r (NCCL reads the key %r, not a variable name: write KEY=VALUE)"
            % (f["path"], m["line"], m["text"], m["text"].split("=", 1)[0])
            for f in facts["files"]
            for m in f.get("malformed") or []
        ]
    return out, settings, malformed


def _contradictions(view: ClusterView, nodes: List[str], settings: _Settings,
                    common: Dict[str, str], per_node: Dict[str, Dict[str, str]],
                    problems: Dict[str, List[Finding]]) -> set:
    """A FAIL in `problems` for every setting that contradicts the recommended env; returns the (node,
    variable) pairs that did, which the drift step does not judge again."""
    ifaces = _node_ifaces(view)
    contradicted = set()
    for name in nodes:
        rec = dict(common, **per_node.get(name, {}))
        for key, (value, where) in sorted(settings[name].items()):
            why = _contradiction(key, value, rec, ifaces.get(name), _addressed(view, name))
            if why:
                contradicted.add((name, key))
                problems[name].append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "%s: %s=%s (%s) %s" % (name, key, value, where, why),
                        expected=rec.get(key) or ("unset or 0" if key == "NCCL_IB_DISABLE" else
                                                  "=" + ifaces[name] if key == "NCCL_SOCKET_IFNAME" and name in ifaces else None),
                        actual=value,
                        data={"key": key, "value": value, "source": where},
                    )
                )
    return contradicted


def _drift(key: str, nodes: List[str], settings: _Settings,
           per_node: Dict[str, Dict[str, str]], contradicted: set, problems: Dict[str, List[Finding]]) -> None:
    """A finding in `problems` for every node whose `key` differs from the other nodes' (the majority; a tie
    names the split), unless the env file asks for that value on that node or it was already contradicted."""
    values = [settings[n][key][0] if key in settings[n] else UNSET for n in nodes]
    ref, count, _ = majority(values)
    if ref is not None and count == len(nodes):
        return
    holders: Dict[str, List[str]] = {}
    for n, v in zip(nodes, values):
        holders.setdefault(v, []).append(n)
    for name, value in zip(nodes, values):
        if value == ref or (name, key) in contradicted or per_node.get(name, {}).get(key) == value:
            continue  # (a per-node value the env file asks for is no drift)
        where = settings[name][key][1] if key in settings[name] else "not set"
        if ref is not None:
            basis = "%s: %s" % (fold(holders[ref]), "unset" if ref == UNSET else "%s=%s" % (key, ref))
        else:
            basis = "no majority: " + " · ".join(
                "%s %s" % (fold(ns), "unset" if v == UNSET else "=" + v) for v, ns in sorted(holders.items())
            )
        shown = "%s unset" % key if value == UNSET else "%s=%s (%s)" % (key, value, where)
        problems[name].append(
            Finding(
                NAME,
                name,
                Status.FAIL if key in MUST_MATCH else Status.WARN,
                "%s: %s differs from the other nodes (%s)" % (name, shown, basis),
                expected=None if ref is None else ("unset" if ref == UNSET else ref),
                actual="unset" if value == UNSET else value,
                data={"key": key, "value": None if value == UNSET else value, "source": where},
            )
        )


def _pass(name: str, mine: Dict[str, Tuple[str, str]]) -> Finding:
    """'3 NCCL variables, as on every node: ...', or that none is set."""
    listed = ", ".join("%s=%s (%s)" % (k, v, w) for k, (v, w) in sorted(mine.items()))
    return Finding(
        NAME,
        name,
        Status.PASS,
        ("%d NCCL variable%s, as on every node: %s" % (len(mine), "" if len(mine) == 1 else "s", listed))
        if mine
        else "no NCCL variables set (NCCL defaults), as on every node",
        actual=str(len(mine)),
    )

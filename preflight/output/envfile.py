"""The recommended NCCL env file: derived only from verified facts, explained line by line, safe to source.

Every value comes from a check's facts, is validated against the characters NCCL, gloo and torch accept
for that variable, and is written single-quoted. A fact that fails validation (an interface may legally
be named `x$(id)`) is refused with a named finding and never written; a node whose own fact was refused
is left out of the env (and, through that FAIL finding, out of the hostfile), so the file stays right for
the nodes it names. The all-reduce test runs with exactly these variables (preflight.allreduce.run), so the file
the user sources is the one that was proven.

    derive(view, healthy) -> Derived(variables, refused, notes, nodes, left_out, per_node, versions)   pure
    render(report)        -> the file's text: header, then per variable the why and `export K='v'`

Which value wins (issue 25, read against NCCL's env parsing, src/misc/param.cc and utils.cc, and torch's
ProcessGroupNCCL.hpp): most variables are authoritative, `export K='v'`, because the environment beats
~/.nccl.conf and /etc/nccl.conf and a leftover value in the launch environment is exactly what hangs jobs.
NCCL_DEBUG, MASTER_ADDR and MASTER_PORT are the user's to choose (a launcher sets MASTER_* per job, and
the proof ran with NCCL_DEBUG=INFO anyway): they are written `K=${K:-'v'}`, so a value already set wins.
A value that is right on some nodes only (an interface named differently across nodes, a RoCE GID
index that differs) is never written globally: the file lists the per-node values in comments.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from preflight import __version__, datanet
from preflight.common import fold
from preflight.model import ClusterView, Finding, Status

#: Interface names NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME can carry. Linux allows almost anything in a
#: name (`x$(id)`, `a,b`); ',' splits the lists, a leading '^' or '=' changes NCCL's matching, so only
#: plain names pass. 15 characters is the kernel's limit (IFNAMSIZ - 1).
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")
#: An NCCL_IB_HCA entry as ib_hca.port_label writes it: device name, ':', port number.
HCA_PORT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}:[0-9]{1,3}$")
#: torch renamed NCCL_ASYNC_ERROR_HANDLING to TORCH_NCCL_ASYNC_ERROR_HANDLING in 2.2, and its default is
#: 3 (SkipCleanUp: kill the process without ncclCommAbort, which can itself hang) since then; 1 (TearDown)
#: calls ncclCommAbort first (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, ErrorHandlingMode).
TORCH_ASYNC_RENAMED = (2, 2)
TORCH_ASYNC_SAFE = "3"
#: NCCL 2.21 picks the RoCE GID per port (ncclIbGetGidIndex: the first RoCE v2 entry of NCCL_IB_ADDR_FAMILY
#: within NCCL_IB_ADDR_RANGE); before, NCCL_IB_GID_INDEX defaulted to 0 (RoCE v1 on mlx5).
NCCL_GID_AUTO = (2, 21, 0)
#: NCCL_NET_PLUGIN=NAME makes NCCL load libnccl-net-NAME.so (src/plugin/net.cc; "none": no plugin).
PLUGIN_FILE_RE = re.compile(r"(?:^|/)libnccl-net-([A-Za-z0-9_.-]{1,64})\.so(?:\.[0-9.]+)?$")
PLUGIN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DEFAULT_PORT = 29500


@dataclass
class EnvVar:
    """One variable; default=True: the user's value wins (`K=${K:-'v'}`), else the file's (`export K='v'`)."""

    key: str
    value: str
    why: List[str] = field(default_factory=list)
    default: bool = False


@dataclass
class Derived:
    """The variables the facts justify, the findings for refused facts, notes on what was not written.

    nodes     the nodes the variables were derived for (healthy nodes minus those left out)
    left_out  {node: why} for healthy nodes dropped because one of their facts was refused
    per_node  {node: {key: value}}: values with no single right value across the nodes (not exported)
    versions  {"nccl": [...], "torch": [...]}: the versions the driver check found on the nodes
    """

    variables: List[EnvVar] = field(default_factory=list)
    refused: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    nodes: List[str] = field(default_factory=list)
    left_out: Dict[str, str] = field(default_factory=dict)
    per_node: Dict[str, Dict[str, str]] = field(default_factory=dict)
    versions: Dict[str, List[str]] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, str]:
        return {v.key: v.value for v in self.variables}


def _fold(names: Sequence[str]) -> str:
    return fold(names) or "(none)"


def _is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4 and text == str(ipaddress.ip_address(text))
    except ValueError:
        return False


def _refuse(derived: Derived, check: str, node: Optional[str], key: str, value: Any, what: str, expected: str) -> None:
    where = "%s: " % node if node else ""
    derived.refused.append(
        Finding(
            check,
            node,
            Status.FAIL,
            "%s%s %s is not a safe value for %s; refused, not written to the env file" % (where, what, _shown(value), key),
            expected=expected,
            actual=_shown(value),
        )
    )


def _shown(value: Any) -> str:
    """repr() keeps control characters and quotes visible (and on one line) in the report."""
    return repr(value if isinstance(value, str) else str(value))


def _valid(pattern: "re.Pattern[str]") -> Callable[[Any], bool]:
    return lambda value: isinstance(value, str) and bool(pattern.match(value))


_IFNAME_OK = _valid(IFNAME_RE)
_HCA_OK = _valid(HCA_PORT_RE)
_IFNAME_EXPECTED = "1-15 letters, digits, '.', '_', '-', '@'"


def version_key(text: Any) -> Optional[Tuple[int, int, int]]:
    """(2, 21, 5) from '2.21.5' or '2.21.5+cuda12.2'; the oldest of 'A + B' (several system libraries); None if none."""
    keys = []
    for part in str(text or "").split("+ "):
        match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", part)
        if match:
            keys.append((int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)))
    return min(keys) if keys else None


def nccl_versions(view: ClusterView, nodes: Sequence[str]) -> Dict[str, Optional[str]]:
    """{node: the NCCL version a torch job there loads, from the driver check's facts, or None}."""
    from preflight.checks import driver

    out: Dict[str, Optional[str]] = {}
    for node in nodes:
        facts = (view.facts.get(node) or {}).get("driver")
        ok = isinstance(facts, dict) and "probe_error" not in facts
        out[node] = driver.nccl_version(facts) if ok else None
    return out


def derive(view: ClusterView, healthy: Optional[Sequence[str]] = None) -> Derived:
    """The env for the given nodes (default: every live node), from the nic, ib_hca, ports and driver facts.

    Pure. A node whose data-interface name or address is refused is left out (with a FAIL finding
    naming it), and the variables are derived for the remaining nodes.
    """
    derived = Derived()
    wanted = list(healthy) if healthy is not None else [n.name for n in view.live]
    choice = datanet.choose(view)

    # Per-node facts first: a node whose own fact cannot be written is left out as a whole.
    for node in wanted:
        entry = choice.get(node)
        if entry is None:
            continue
        if not _IFNAME_OK(entry.get("iface")):
            _refuse(derived, "nic", node, "NCCL_SOCKET_IFNAME", entry.get("iface"), "data interface name", _IFNAME_EXPECTED)
            derived.left_out[node] = "its data interface name was refused (nic)"
        elif not _is_ipv4(str(entry.get("ip"))):
            _refuse(derived, "nic", node, "MASTER_ADDR", entry.get("ip"), "data address", "an IPv4 address")
            derived.left_out[node] = "its data address was refused (nic)"
    nodes = [n for n in wanted if n not in derived.left_out]
    derived.nodes = nodes
    if derived.left_out:
        derived.notes.append("left out %s: a fact read there is not a safe value (see the nic findings)" % _fold(list(derived.left_out)))
    if not nodes:
        derived.notes.append("no node %s: nothing could be verified" % ("left whose facts can be written" if derived.left_out else "passed its checks"))
        return derived

    nccl = nccl_versions(view, nodes)
    derived.versions = {
        "nccl": sorted({v for v in nccl.values() if v}),
        "torch": sorted({v for v in (_torch_text(view, n) for n in nodes) if v}),
    }
    chosen = {n: choice.get(n) for n in nodes}
    _socket(view, choice, chosen, derived)
    _ib(view, nodes, choice, nccl, derived)
    _rendezvous(view, nodes, chosen, derived)
    _async_error_handling(view, nodes, derived)
    derived.variables.append(
        EnvVar(
            "NCCL_DEBUG",
            "WARN",
            ["NCCL prints warnings and errors (a hang then leaves a trace), not the INFO flood",
             "a value already set wins: the all-reduce test runs NCCL with NCCL_DEBUG=INFO (to read what NCCL chose), so this value is not part of the proof"],
            default=True,
        )
    )
    return derived


def _interfaces(view: ClusterView, node: str) -> List[str]:
    """Every interface name the nic check saw on the node, up or down, with or without an address."""
    nic = (view.facts.get(node) or {}).get("nic")
    listed = nic.get("interfaces") if isinstance(nic, dict) else None
    return [i["name"] for i in listed or [] if isinstance(i, dict) and isinstance(i.get("name"), str)]


def _socket(view: ClusterView, choice: Any, chosen: Dict[str, Optional[Dict[str, Any]]], derived: Derived) -> None:
    missing = [n for n, e in chosen.items() if e is None]
    if missing:
        derived.notes.append("NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME not written: no data interface on %s (see the nic check)" % _fold(missing))
        return
    names = sorted({e["iface"] for e in chosen.values()})
    per_name = "; ".join(
        "%s: %s in %s, mtu %s" % (_fold([n for n, e in chosen.items() if e["iface"] == name]), name, _entry(chosen, name, "subnet"), _entry(chosen, name, "mtu"))
        for name in names
    )
    if any(e.get("management") for e in chosen.values()):
        network = "the management network: no other subnet is shared by the nodes"
    else:
        network = "not loopback, a container bridge or the management network"
    why = [
        "nic check: the data interface chosen on every node (up, in the shared subnet %s; %s)" % (choice.subnet or "?", network),
        per_name,
    ]
    if len(names) == 1:
        derived.variables.append(EnvVar("NCCL_SOCKET_IFNAME", "=" + names[0], why + ["'=' asks NCCL for this exact name (a bare prefix would also match %s0)" % names[0]]))
        derived.variables.append(EnvVar("GLOO_SOCKET_IFNAME", names[0], ["the same interface for gloo (torch.distributed CPU collectives)"]))
        return
    # A list '=a,b' selects every listed name that exists on a node: NCCL's bootstrap and IB setup take
    # the first match in interface order and the socket transport spreads over all of them (before NCCL
    # 2.28.3 even over an interface without link). It is safe only where each node has exactly one of them.
    clashes: Dict[str, List[str]] = {}
    for node, entry in chosen.items():
        for other in sorted(set(names) & set(_interfaces(view, node)) - {entry["iface"]}):
            clashes.setdefault(other, []).append(node)
    for node, entry in chosen.items():
        derived.per_node.setdefault(node, {})["GLOO_SOCKET_IFNAME"] = entry["iface"]
    if not clashes:
        derived.variables.append(
            EnvVar(
                "NCCL_SOCKET_IFNAME",
                "=" + ",".join(names),
                why + ["the names differ across nodes; on every node exactly one of them exists, and it is that node's data interface, so the list selects it and nothing else"],
            )
        )
    else:
        for node, entry in chosen.items():
            derived.per_node[node]["NCCL_SOCKET_IFNAME"] = "=" + entry["iface"]
        derived.notes.append(
            "NCCL_SOCKET_IFNAME not written: the data interface is named differently across nodes (%s), and the list '=%s' would also select %s, "
            "which is not the data interface there: NCCL's bootstrap takes the first match in interface order and its socket traffic spreads over "
            "every match (traffic on the wrong network, or a hang where it is not routed); set it per node (see the per-node values) or give the "
            "data NICs one name" % (per_name, ",".join(names), "; ".join("%s on %s" % (name, _fold(on)) for name, on in sorted(clashes.items())))
        )
    derived.notes.append(
        "GLOO_SOCKET_IFNAME not written: the data interface is named differently across nodes (%s) and gloo needs the same name on every rank; "
        "set it per node (see the per-node values)" % ", ".join(names)
    )


def _entry(chosen: Dict[str, Any], name: str, key: str) -> str:
    values = sorted({str(e[key]) for e in chosen.values() if e and e["iface"] == name and e.get(key) is not None})
    return values[0] if len(values) == 1 else "{%s}" % ",".join(values)


def _ib(view: ClusterView, nodes: Sequence[str], choice: Any, nccl: Dict[str, Optional[str]], derived: Derived) -> None:
    from preflight.checks import ib_hca

    usable = ib_hca.usable_hcas(view)
    unknown = [n for n in nodes if n not in usable["nodes"]]
    if unknown:
        derived.notes.append("NCCL_IB_HCA/NCCL_IB_DISABLE not written: no HCA facts from %s (see the ib_hca check)" % _fold(unknown))
        return
    ports = {n: list(usable["nodes"][n]) for n in nodes}
    if not any(ports.values()):
        derived.variables.append(
            EnvVar(
                "NCCL_IB_DISABLE",
                "1",
                ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s: NCCL's own InfiniBand transport is turned off (it has nothing to use); "
                 "traffic goes over NCCL's sockets, or over a net plugin where one is loaded (it is not turned off by this)" % _fold(list(nodes))],
            )
        )
        return
    lists = {tuple(p) for p in ports.values()}
    if len(lists) != 1:
        by_list = "; ".join(
            "%s: %s" % (_fold([n for n, p in ports.items() if tuple(p) == lst]), ",".join(lst) or "none") for lst in sorted(lists)
        )
        derived.notes.append(
            "NCCL_IB_HCA not written: the ACTIVE ports at the expected rate differ across nodes (%s); fix the DOWN or slow ports, or leave those nodes out" % by_list
        )
        return
    hcas = list(next(iter(lists)))
    bad = [h for h in hcas if not _HCA_OK(h)]
    if bad:
        for h in bad:
            _refuse(derived, "ib_hca", None, "NCCL_IB_HCA", h, "HCA port", "an HCA name of letters, digits, '.', '_', '-' and ':PORT'")
        derived.notes.append("NCCL_IB_HCA not written: an HCA name was refused (see the ib_hca findings)")
        return
    layer = usable.get("link_layer")
    if layer not in ("ib", "roce"):
        counts = usable.get("layer_counts") or {}
        derived.notes.append(
            "NCCL_IB_HCA not written: the usable ports are as many InfiniBand as RoCE (%d each across the nodes), "
            "so there is no majority link layer to take as the rails; set NCCL_IB_HCA to the rails by hand"
            % counts.get("ib", 0)
        )
        return
    rate = (usable.get("rate_gbps") or {}).get(layer)
    why = [
        "ib_hca check: the %d ACTIVE %s port(s)%s, identical on %s"
        % (len(hcas), "RoCE" if layer == "roce" else "InfiniBand", " at %g Gb/s" % rate if rate else "", _fold(list(nodes))),
        "'=' asks NCCL for exactly these devices and ports",
    ]
    why.extend(_left_out_ports(usable.get("left_out") or {}, nodes))
    derived.variables.append(EnvVar("NCCL_IB_HCA", "=" + ",".join(hcas), why))
    derived.variables.append(
        EnvVar(
            "NCCL_IB_DISABLE",
            "0",
            ["the rails above carry the traffic: 0 keeps NCCL's InfiniBand/RoCE transport on where the launch environment, "
             "~/.nccl.conf or /etc/nccl.conf still says NCCL_IB_DISABLE=1 (the environment beats both files)"],
        )
    )
    if layer == "roce":
        _gid(view, nodes, hcas, choice, nccl, derived)


def _port_gids(port: Any) -> List[Dict[str, Any]]:
    """The port's RoCE v2 IPv4 GIDs [{index, ip, ndev}], valid indexes only (facts before roce_v2_gids: the lowest)."""
    if not isinstance(port, dict):
        return []
    gids = port.get("roce_v2_gids")
    if not isinstance(gids, list):
        gids = [{"index": port.get("roce_v2_gid_index"), "ip": port.get("roce_v2_ip"), "ndev": None}]
    out = []
    for g in gids:
        index = g.get("index") if isinstance(g, dict) else None
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 1024:
            out.append(g)
    return out


def _in_subnet(ip: Any, subnet: Optional[str]) -> bool:
    try:
        return subnet is not None and ipaddress.ip_address(str(ip)) in ipaddress.ip_network(subnet)
    except ValueError:
        return False


def _gid(view: ClusterView, nodes: Sequence[str], rails: Sequence[str], choice: Any, nccl: Dict[str, Optional[str]], derived: Derived) -> None:
    """The RoCE GID: the RoCE v2 IPv4 entry in the data subnet (a VLAN's, not the untagged lowest one), pinned
    with NCCL_IB_GID_INDEX where NCCL < 2.21 needs it, NCCL_IB_ADDR_RANGE where 2.21+ would pick another."""
    from preflight.checks import ib_hca

    subnet = choice.subnet
    picked: Dict[str, Dict[str, Dict[str, Any]]] = {}
    lowest: Dict[str, Dict[str, int]] = {}
    unclear: Dict[str, List[str]] = {}
    for node in nodes:
        hca = (view.facts.get(node) or {}).get("ib_hca") or {}
        by_label = {ib_hca.port_label(p): p for p in hca.get("ports") or [] if isinstance(p, dict)}
        for label in rails:
            gids = _port_gids(by_label.get(label))
            inside = [g for g in gids if _in_subnet(g.get("ip"), subnet)]
            pick = inside[0] if inside else (gids[0] if len(gids) == 1 else None)
            if pick is None:
                why = "no RoCE v2 GID with an IPv4 address" if not gids else "%d RoCE v2 IPv4 GIDs, none in the data subnet %s" % (len(gids), subnet or "?")
                unclear.setdefault(why, []).append("%s %s" % (node, label))
                continue
            picked.setdefault(node, {})[label] = pick
            lowest.setdefault(node, {})[label] = gids[0]["index"]
    if unclear:
        derived.notes.append(
            "NCCL_IB_GID_INDEX not written: %s; set NCCL_IB_GID_INDEX (NCCL_IB_ADDR_RANGE from NCCL 2.21) to the RoCE v2 entry of the data network by hand"
            % "; ".join("%s: %s" % (", ".join(where), why) for why, where in unclear.items())
        )
        return
    entries = [(n, label, g) for n in nodes for label, g in picked[n].items()]
    versions = {n: version_key(nccl.get(n)) for n in nodes}
    shown = ", ".join(derived.versions.get("nccl") or []) or "not found"
    by_subnet = " (the entry in the data subnet %s)" % subnet if any(_in_subnet(g.get("ip"), subnet) for _, _, g in entries) else ""
    if all(v is not None and v >= NCCL_GID_AUTO for v in versions.values()):
        moved = [(n, label, g) for n, label, g in entries if g["index"] != lowest[n][label]]
        if not moved:
            indexes = sorted({g["index"] for _, _, g in entries})
            derived.notes.append(
                "NCCL_IB_GID_INDEX not written: NCCL %s (2.21 and later) picks the first RoCE v2 IPv4 GID per port itself, here GID %s%s; "
                "a pinned index would freeze a GID table that can change" % (shown, ",".join(map(str, indexes)), by_subnet)
            )
            return
        n, label, g = moved[0]
        derived.variables.append(
            EnvVar(
                "NCCL_IB_ADDR_RANGE",
                str(ipaddress.ip_network(subnet, strict=False)),
                ["ib_hca check: on %s the first RoCE v2 IPv4 GID is GID %d, outside the data subnet; GID %d (%s%s) is in it"
                 % ("%s %s" % (n, label), lowest[n][label], g["index"], g.get("ip"), " on %s" % g["ndev"] if g.get("ndev") else ""),
                 "NCCL %s (2.21 and later) picks the first RoCE v2 GID within NCCL_IB_ADDR_RANGE: RoCE stays on the interface/VLAN "
                 "that carries the data subnet, whatever the GID table's order" % shown],
            )
        )
        return
    if any(v is None for v in versions.values()):
        gate = "NCCL's version was not found on %s; pinned, as NCCL before 2.21 needs" % _fold([n for n, v in versions.items() if v is None])
    else:
        gate = "NCCL %s: before 2.21 NCCL uses GID index 0 (RoCE v1) unless told" % shown
    indexes = {g["index"] for _, _, g in entries}
    if len(indexes) == 1:
        index = indexes.pop()
        derived.variables.append(
            EnvVar("NCCL_IB_GID_INDEX", str(index), ["ib_hca check: GID index %d is RoCE v2 with an IPv4 address%s on every port" % (index, by_subnet), gate])
        )
        return
    mixed = [n for n in nodes if len({g["index"] for g in picked[n].values()}) > 1]
    if mixed:
        derived.notes.append(
            "NCCL_IB_GID_INDEX not written: the RoCE v2 GID index differs across the ports of %s and NCCL takes one index per process; "
            "give every port its RoCE address in the same GID slot (%s)" % (_fold(mixed), gate)
        )
        return
    for n in nodes:
        derived.per_node.setdefault(n, {})["NCCL_IB_GID_INDEX"] = str(next(iter(picked[n].values()))["index"])
    derived.notes.append(
        "NCCL_IB_GID_INDEX not written: the RoCE v2 GID index differs across nodes (%s) and %s; set it per node (see the per-node values)"
        % ("; ".join("%s: %s" % (_fold([n for n in nodes if derived.per_node[n]["NCCL_IB_GID_INDEX"] == i]), i)
                     for i in sorted({derived.per_node[n]["NCCL_IB_GID_INDEX"] for n in nodes})), gate)
    )


def _left_out_ports(left_out: Dict[str, List[Tuple[str, str]]], nodes: Sequence[str]) -> List[str]:
    """'left out mlx5_bond_0:1 on n[001-002]: RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s'."""
    where: Dict[Tuple[str, str], List[str]] = {}
    for node in nodes:
        for label, why in left_out.get(node) or []:
            where.setdefault((label, why), []).append(node)
    return ["left out %s on %s: %s" % (label, _fold(on), why) for (label, why), on in where.items()]


def _rendezvous(view: ClusterView, nodes: Sequence[str], chosen: Dict[str, Any], derived: Derived) -> None:
    head = view.head.name
    port = view.cluster.get("master_port", DEFAULT_PORT)
    entry = chosen.get(head)
    if head not in nodes or entry is None:
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the head node %s did not pass its checks" % head)
        return
    facts = {n: (view.facts.get(n) or {}).get("ports") for n in nodes}
    listened = facts[head]
    if not isinstance(listened, dict) or not listened.get("listening") or listened.get("port") != port:
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the ports check did not verify that %s can listen on port %s" % (head, port))
        return
    peers = [n for n in nodes if n != head]
    silent = [n for n in peers if not (isinstance(facts[n], dict) and facts[n].get("handshake") and facts[n].get("port") == port)]
    if silent:
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the ports check did not verify that %s reach %s:%s" % (_fold(silent), head, port))
        return
    yours = "a value already set (your launcher's) wins"
    derived.variables.append(
        EnvVar("MASTER_ADDR", entry["ip"], ["nic check: %s's address on its data interface %s (the head: rank 0 hosts the store)" % (head, entry["iface"]), yours], default=True)
    )
    reached = "%s connected to it" % _fold(peers) if peers else "no other node"
    derived.variables.append(EnvVar("MASTER_PORT", str(int(port)), ["ports check: %s listened on %d and %s" % (head, int(port), reached), yours], default=True))


def _torch_text(view: ClusterView, node: str) -> Optional[str]:
    driver = (view.facts.get(node) or {}).get("driver")
    torch = driver.get("torch") if isinstance(driver, dict) else None
    version = torch.get("version") if isinstance(torch, dict) else None
    return version if isinstance(version, str) else None


def _torch_version(view: ClusterView, node: str) -> Optional[Tuple[int, int]]:
    match = re.match(r"^(\d+)\.(\d+)", _torch_text(view, node) or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _async_error_handling(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    """torch >= 2.2: 3, its own default, written so that a leftover 1 does not replace it. Never 1."""
    versions = {n: _torch_version(view, n) for n in nodes}
    known = sorted({v for v in versions.values() if v})
    shown = ", ".join("%d.%d" % v for v in known)
    old = [n for n, v in versions.items() if v and v < TORCH_ASYNC_RENAMED]
    if any(v >= TORCH_ASYNC_RENAMED for v in known):
        derived.variables.append(
            EnvVar(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                TORCH_ASYNC_SAFE,
                ["driver check: torch %s on the nodes; 3 is torch's own default since 2.2: a failed or timed-out collective kills the "
                 "process without calling ncclCommAbort, which can itself hang" % shown,
                 "written so that a leftover 1 (abort first, the hang-prone mode), here or under the old name NCCL_ASYNC_ERROR_HANDLING, "
                 "does not replace it"],
            )
        )
    if old:
        derived.notes.append(
            "NCCL_ASYNC_ERROR_HANDLING not written: torch %s on %s reads that name, and its safe mode differs by version; "
            "preflight never writes 1 (ncclCommAbort can itself hang): upgrade to torch 2.2 or later" % (shown, _fold(old))
        )
    if not known:
        derived.notes.append("TORCH_NCCL_ASYNC_ERROR_HANDLING not written: torch's version was not found on the nodes (torch 2.2 and later default to 3 by themselves)")
    unknown = [n for n, v in versions.items() if v is None]
    if known and unknown:
        derived.notes.append("torch not found on %s" % _fold(unknown))


# ------------------------------------------------------------------------------------------------ render


def render(report: Any) -> str:
    """The env file text for a finished run (a preflight.engine.RunReport)."""
    view: ClusterView = report.view
    unreachable = set(view.unreachable)
    real = [f for f in report.findings if f.status.is_problem and not _echo(f, unreachable)]
    problems = {f.node for f in real if f.node} | unreachable
    healthy = [n.name for n in view.live if n.name not in problems]
    derived = report.env if getattr(report, "env", None) is not None else derive(view, healthy)
    real += [f for f in derived.refused if f not in real]  # (the engine adds them to the findings already)
    problems |= {f.node for f in derived.refused if f.node}
    healthy = [n for n in healthy if n not in problems]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    inv = report.inventory
    total = len(view.nodes)
    lines = [
        "# NCCL environment recommended by preflight %s; source it in your launch script (bash or sh)." % __version__,
        "# generated %s from %s (sha256 %s)" % (stamp, inv.path, (inv.sha256 or "-")[:16]),
        "# nodes: %s (%d of %d)" % (_fold(healthy), len(healthy), total),
    ]
    for reason, names in _left_out(view, real, problems):
        lines.append("# left out: %s (%s)" % (_fold(names), reason))
    failed = _failed_checks(real)
    if failed:
        lines.append("# checks that failed or errored: %s" % failed)
    proof = _proof(report, unreachable)
    logs = proof_logs(report) if proof.startswith("proven") else {}
    lines.append("# %s" % proof)
    lines.append("# %s" % _versions_line(derived, logs))
    variables, notes = with_proof(derived, logs)
    lines.append("# authoritative (the file's value replaces one already set): %s" % (", ".join(v.key for v in variables if not v.default) or "none"))
    lines.append("# yours win (kept when already set, else the file's): %s" % (", ".join(v.key for v in variables if v.default) or "none"))
    for note in derived.notes + notes:
        lines.append("# note: %s" % note)
    lines.extend(_per_node_lines(derived.per_node))
    for var in variables:
        lines.append("")
        lines.extend("# %s" % why for why in var.why)
        lines.append(assignment(var))
    return "".join(_comment(line) + "\n" if line.startswith("#") else line + "\n" for line in lines)


def assignment(var: EnvVar) -> str:
    """`export K='v'`, or for a variable whose already-set value wins `K=${K:-'v'}; export K` (a plain
    assignment: no field splitting or globbing in sh or bash, whatever IFS the environment holds)."""
    if var.default:
        return "%s=${%s:-%s}; export %s" % (var.key, var.key, quote(var.value), var.key)
    return "export %s=%s" % (var.key, quote(var.value))


def _per_node_lines(per_node: Dict[str, Dict[str, str]]) -> List[str]:
    """'#   n[001-002]: NCCL_SOCKET_IFNAME='=eth1' GLOO_SOCKET_IFNAME='eth1'', nodes with the same values together."""
    if not per_node:
        return []
    groups: Dict[Tuple[Tuple[str, str], ...], List[str]] = {}
    for node, values in per_node.items():
        groups.setdefault(tuple(sorted(values.items())), []).append(node)
    lines = ["# per-node values (no single value is right on every node, so none is exported): "
             "export these in each node's launch, e.g. from a per-host env file"]
    for values, on in groups.items():
        lines.append("#   %s: %s" % (_fold(on), " ".join("%s=%s" % (k, quote(v)) for k, v in values)))
    return lines


def proof_logs(report: Any) -> Dict[str, Dict[str, Any]]:
    """{node: what NCCL chose there in the proof (the allreduce findings' data["nccl"], from its NCCL log)}."""
    out = {}
    for f in report.findings:
        nccl = f.data.get("nccl") if f.check == "allreduce" and f.node and isinstance(f.data, dict) else None
        if isinstance(nccl, dict):
            out[f.node] = nccl
    return out


def _seen(logs: Dict[str, Dict[str, Any]], key: str) -> List[str]:
    return sorted({str(v) for log in logs.values() for v in log.get(key) or [] if v})


def _versions_line(derived: Derived, logs: Dict[str, Dict[str, Any]]) -> str:
    torch = ", ".join(derived.versions.get("torch") or []) or "not found"
    proven = _seen(logs, "version")
    if proven:
        return "proven with NCCL %s (the all-reduce's NCCL log) and torch %s (driver check)" % (", ".join(proven), torch)
    nccl = ", ".join(derived.versions.get("nccl") or []) or "not found"
    return "on the nodes: NCCL %s, torch %s (driver check)" % (nccl, torch)


def with_proof(derived: Derived, logs: Dict[str, Dict[str, Any]]) -> Tuple[List[EnvVar], List[str]]:
    """The variables and extra notes once the proof's NCCL log is known: NCCL_NET_PLUGIN pinned to what the
    proven run used, and the NCCL_IB_DISABLE=1 comment saying which net plugin carries the traffic.

    The log lines (NCCL src/plugin/net.cc; real lines in /work/shared/realworld/nccl_info): "NET/Plugin: Loaded
    net plugin NCCL RDMA Plugin (v5)" or "Plugin Path : <lib>" (loaded), "NET/Plugin : No plugin found
    (libnccl-net.so), using internal implementation" or "NET/Plugin: Could not find: libnccl-net.so"
    (internal), and "Using network IB | Socket | AWS Libfabric | IBext_v8 | GPUDirectTCPX | FasTrak": the
    network that carried the traffic. A plugin's network (EFA, TCPX/TCPXO, SHARP) is never turned off with
    'none'; an internal IB/Socket run beside a loaded plugin is pinned with 'none'.
    """
    variables = list(derived.variables)
    networks = sorted({t.split("/", 1)[1] for log in logs.values() for t in log.get("transport") or [] if str(t).startswith("NET/")})
    if not networks:
        return variables, []
    loaded = [p for p in _seen(logs, "plugin") if p != "internal"]
    external = [n for n in networks if n not in ("IB", "Socket")]
    on = _fold(list(logs))
    if external:
        carried = "the proven run's traffic on %s went over the net plugin %s (%s)" % (
            on, "/".join(external), ", ".join(loaded) or "loaded by its default name libnccl-net.so")
        for i, var in enumerate(variables):
            if var.key == "NCCL_IB_DISABLE" and var.value == "1":
                variables[i] = EnvVar(var.key, var.value, ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s: NCCL's own InfiniBand "
                                                           "transport is off; %s, which this does not turn off" % (_fold(derived.nodes), carried)])
        names = sorted({m.group(1) for m in (PLUGIN_FILE_RE.search(p) for p in loaded) if m})
        if len(names) == 1 and PLUGIN_NAME_RE.match(names[0]):
            variables.append(EnvVar("NCCL_NET_PLUGIN", names[0], [
                "all-reduce NCCL log: %s" % carried,
                "pinned by name: NCCL loads libnccl-net-%s.so, not another libnccl-net*.so found first on the library path; "
                "never 'none' here, which would turn %s off" % (names[0], "/".join(external))]))
            return variables, []
        return variables, ["NCCL_NET_PLUGIN not written: %s, which NCCL finds by its default name; never set it to none "
                           "here (that turns %s off)" % (carried, "/".join(external))]
    if loaded:
        variables.append(EnvVar("NCCL_NET_PLUGIN", "none", [
            "all-reduce NCCL log on %s: the net plugin %s was loaded, but the traffic went over NCCL's internal %s" % (on, ", ".join(loaded), "/".join(networks)),
            "'none' keeps it so: NCCL then loads no libnccl-net*.so (HPC-X's SHARP plugin on the library path, say) and runs "
            "the transport that was proven"]))
        return variables, []
    return variables, ["NCCL_NET_PLUGIN not written: the proven run on %s loaded no net plugin and used NCCL's internal %s"
                       % (on, "/".join(networks))]


def _left_out(view: ClusterView, real: Sequence[Finding], problems: set) -> List[Tuple[str, List[str]]]:
    """[(reason, nodes)] for the left-out nodes, nodes with the same reason together, inventory order."""
    reasons: Dict[str, List[str]] = {}
    for node in [n.name for n in view.nodes if n.name in problems]:
        if node in view.unreachable:
            reason = "unreachable: ssh"
        else:
            checks = sorted({f.check for f in real if f.node == node}, key=_check_order)
            reason = "failed: %s" % ", ".join(checks)
        reasons.setdefault(reason, []).append(node)
    return list(reasons.items())


def _failed_checks(real: Sequence[Finding]) -> str:
    by_check: Dict[str, set] = {}
    for f in real:
        by_check.setdefault(f.check, set()).add(f.node)
    parts = []
    for check in sorted(by_check, key=_check_order):
        nodes = sorted(n for n in by_check[check] if n)
        where = [_fold(nodes)] if nodes else []
        if None in by_check[check]:
            where.append("cluster-wide")
        parts.append("%s (%s)" % (check, ", ".join(where)))
    return ", ".join(parts)


def _echo(f: Finding, unreachable: set) -> bool:
    """A check's "not checked: node unreachable" finding, which only repeats the ssh failure."""
    return f.node in unreachable and f.check != "ssh"


def _proof(report: Any, unreachable: set) -> str:
    allreduce = getattr(report, "allreduce", None)
    if not allreduce:
        return "not yet proven by the all-reduce test (run `preflight check` with the allreduce check)"
    if allreduce.get("verdict") == "skip":
        return "not proven: the all-reduce test was skipped (%s)" % (allreduce.get("reason") or "no reason given")
    own = [f for f in report.findings if f.check == "allreduce" and not _echo(f, unreachable)]
    worst = max((f.status for f in own), key=lambda s: s.rank, default=None)
    summary = allreduce.get("summary") or ""
    on = _fold(allreduce.get("nodes") or [])
    if worst is not None and not worst.is_problem and allreduce.get("summary"):
        return "proven: the all-reduce test ran with exactly these variables on %s: %s" % (on, summary)
    return "NOT proven: the all-reduce test with these variables on %s did not pass (%s); see the report" % (on, summary or (worst.value if worst else "no verdict"))


def quote(value: str) -> str:
    """Single-quoted for sh and bash whatever the value holds (values are validated before, too)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _comment(text: str) -> str:
    """One comment line whatever the facts hold: whitespace runs become one space, control characters '?'."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split()))


def _check_order(name: str) -> int:
    from preflight.checks import CHECK_NAMES

    return CHECK_NAMES.index(name) if name in CHECK_NAMES else 99

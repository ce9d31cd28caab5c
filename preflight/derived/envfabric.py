"""The fabric half of the env file: NCCL_IB_HCA / NCCL_IB_DISABLE, the RoCE GID, NCCL_NVLS_ENABLE, NCCL_NET_PLUGIN.

    ib(view, nodes, choice, nccl, derived)   the rails from the ib_hca facts, NCCL_IB_DISABLE=0 beside them
                                             (the environment beats nccl.conf), the RoCE GID per NCCL version
    nvls(view, nodes, derived)               NCCL_NVLS_ENABLE=0 where NVLS cannot work on a node (preflight.derived.nvls)
    cloud(view, nodes, derived)              FI_PROVIDER / FI_EFA_USE_DEVICE_RDMA on EFA, the vendor's script on Google's fabrics
    with_proof(derived, logs)                after the all-reduce: NCCL_NET_PLUGIN from what its NCCL log says

The NCCL behaviour these follow (NCCL source, tags 2.18-2.28: src/transport/net_ib.cc ncclIbGetGidIndex,
src/plugin/net.cc, src/misc/param.cc): the environment beats ~/.nccl.conf and /etc/nccl.conf; before 2.21
NCCL_IB_GID_INDEX defaults to 0 (RoCE v1 on mlx5), from 2.21 NCCL takes the first RoCE v2 GID of the
address family within NCCL_IB_ADDR_RANGE; NCCL_NET_PLUGIN=NAME loads libnccl-net-NAME.so, "none" loads
no plugin.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.derived import cloud as cloud_fabric, rails, versions
from preflight.derived.envvars import Derived, EnvVar, HCA_OK, fold_names, refuse, version_key
from preflight.derived.nvls import assess
from preflight.derived.rails import port_label
from preflight.model import ClusterView

#: NCCL 2.21 picks the RoCE GID per port (ncclIbGetGidIndex: the first RoCE v2 entry of NCCL_IB_ADDR_FAMILY
#: within NCCL_IB_ADDR_RANGE); before, NCCL_IB_GID_INDEX defaulted to 0 (RoCE v1 on mlx5).
NCCL_GID_AUTO = (2, 21, 0)

#: NCCL_NET_PLUGIN=NAME makes NCCL load libnccl-net-NAME.so (src/plugin/net.cc; "none": no plugin).
PLUGIN_FILE_RE = re.compile(r"(?:^|/)libnccl-net-([A-Za-z0-9_.-]{1,64})\.so(?:\.[0-9.]+)?$")
PLUGIN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: A network's name as NCCL_NET takes it ("AWS Libfabric", "GPUDirectTCPX_v7", "FasTrak", "gIB").
NET_NAME_RE = re.compile(r"^[A-Za-z0-9_.-][A-Za-z0-9 _.-]{0,63}$")
#: NCCL_NET exists from NCCL 2.10 (NCCL's environment-variable documentation).
NCCL_NET_SINCE = (2, 10, 0)


def nccl_versions(view: ClusterView, nodes: Sequence[str]) -> Dict[str, Optional[str]]:
    """{node: the NCCL version a torch job there loads, from the driver check's facts, or None}."""
    out: Dict[str, Optional[str]] = {}
    for node in nodes:
        facts = (view.facts.get(node) or {}).get("driver")
        ok = isinstance(facts, dict) and "probe_error" not in facts
        out[node] = versions.nccl_version(facts) if ok else None
    return out


def ib(view: ClusterView, nodes: Sequence[str], choice: Any, nccl: Dict[str, Optional[str]], derived: Derived) -> None:
    """NCCL_IB_HCA (the rails, identical on every node), NCCL_IB_DISABLE (0 beside them, 1 without any), the
    RoCE GID; or a note saying why not. nccl: {node: NCCL version} (nccl_versions)."""
    usable = rails.of(view)
    unknown = [n for n in nodes if n not in usable["nodes"]]
    if unknown:
        derived.notes.append("NCCL_IB_HCA/NCCL_IB_DISABLE not written: no HCA facts from %s (see the ib_hca check)" % fold_names(unknown))
        return
    ports = {n: list(usable["nodes"][n]) for n in nodes}
    if not any(ports.values()):
        why = ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s: NCCL's own InfiniBand transport is turned off (it has nothing to use); "
               "traffic goes over NCCL's sockets, or over a net plugin where one is loaded (it is not turned off by this)" % fold_names(list(nodes))]
        efa = [n for n in nodes if ((view.facts.get(n) or {}).get("ib_hca") or {}).get("efa")]
        if efa:  # EFA devices sit under class/infiniband but NCCL's IB transport does not drive them
            why.append("AWS EFA devices on %s: NCCL reaches them only through the aws-ofi-nccl plugin, never as NCCL_IB_HCA entries" % fold_names(efa))
        derived.variables.append(EnvVar("NCCL_IB_DISABLE", "1", why))
        return
    lists = {tuple(p) for p in ports.values()}
    if len(lists) != 1:
        by_list = "; ".join(
            "%s: %s" % (fold_names([n for n, p in ports.items() if tuple(p) == lst]), ",".join(lst) or "none") for lst in sorted(lists)
        )
        derived.notes.append(
            "NCCL_IB_HCA not written: the ACTIVE ports at the expected rate differ across nodes (%s); fix the DOWN or slow ports, or leave those nodes out" % by_list
        )
        return
    hcas = list(next(iter(lists)))
    bad = [h for h in hcas if not HCA_OK(h)]
    if bad:
        for h in bad:
            refuse(derived, "ib_hca", None, "NCCL_IB_HCA", h, "HCA port", "an HCA name of letters, digits, '.', '_', '-' and ':PORT'")
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
        % (len(hcas), "RoCE" if layer == "roce" else "InfiniBand", " at %g Gb/s" % rate if rate else "", fold_names(list(nodes))),
        "'=' asks NCCL for exactly these devices and ports",
    ]
    why.extend(left_out_ports(usable.get("left_out") or {}, nodes))
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
        gid(view, nodes, hcas, choice, nccl, derived)


def nvls(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    """NCCL_NVLS_ENABLE=0 when NVLS (NVLink SHARP) cannot work on one of the nodes (preflight.derived.nvls.assess:
    NVLS-capable NVSwitch hardware whose fabric is not programmed); otherwise nothing (NCCL's own default
    2 uses NVLS where CUDA reports multicast, and that is what the proof measures).

    0 costs nothing where NVLS cannot work, and it must be the same on every rank (NCCL_NVLS_ENABLE is one
    of the settings nccl_env requires to match): with NCCL 2.29 and later a failed multicast bind fails the
    job's init instead of falling back (src/transport/nvls.cc; 2.29.2 release notes)."""

    by_name = {n.name: n for n in view.live}
    states = {n: assess(view, by_name[n]) for n in nodes if n in by_name}
    broken = [n for n, s in states.items() if s.kind == "unusable"]
    if not broken:
        return
    reasons: Dict[str, List[str]] = {}
    for n in broken:
        reasons.setdefault("; ".join(states[n].unmet), []).append(n)
    nccl = sorted({s.nccl for n, s in states.items() if n in broken and s.nccl})
    why = ["nvls check: NVLS (NVLink SHARP) cannot work on %s" % "; ".join(
        "%s: %s" % (fold_names(on), what) for what, on in reasons.items()),
        "NCCL %s: from 2.29 a failed NVLS multicast bind fails the job's init instead of falling back; 0 turns NVLS off "
        "(ring/tree over NVLink run as before) and must be the same on every rank" % (", ".join(nccl) or "(version unknown)")]
    ready = [n for n, s in states.items() if s.kind == "ready"]
    if ready:
        why.append("this also turns NVLS off on %s, where it works: fix the fabric on %s (fabric_manager) to get it back"
                   % (fold_names(ready), fold_names(broken)))
    derived.variables.append(EnvVar("NCCL_NVLS_ENABLE", "0", why))


def port_gids(port: Any) -> List[Dict[str, Any]]:
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


def in_subnet(ip: Any, subnet: Optional[str]) -> bool:
    try:
        return subnet is not None and ipaddress.ip_address(str(ip)) in ipaddress.ip_network(subnet)
    except ValueError:
        return False


def gid(view: ClusterView, nodes: Sequence[str], rails: Sequence[str], choice: Any, nccl: Dict[str, Optional[str]], derived: Derived) -> None:
    """The RoCE GID: the RoCE v2 IPv4 entry in the data subnet (a VLAN's, not the untagged lowest one), pinned
    with NCCL_IB_GID_INDEX where NCCL < 2.21 needs it, NCCL_IB_ADDR_RANGE where 2.21+ would pick another."""
    subnet = choice.subnet
    picked, lowest, unclear = _gid_picks(view, nodes, rails, subnet)
    if unclear:
        derived.notes.append(
            "NCCL_IB_GID_INDEX not written: %s; set NCCL_IB_GID_INDEX (NCCL_IB_ADDR_RANGE from NCCL 2.21) to the RoCE v2 entry of the data network by hand"
            % "; ".join("%s: %s" % (", ".join(where), why) for why, where in unclear.items())
        )
        return
    entries = [(n, label, g) for n in nodes for label, g in picked[n].items()]
    versions = {n: version_key(nccl.get(n)) for n in nodes}
    shown = ", ".join(derived.versions.get("nccl") or []) or "not found"
    by_subnet = " (the entry in the data subnet %s)" % subnet if any(in_subnet(g.get("ip"), subnet) for _, _, g in entries) else ""
    if all(v is not None and v >= NCCL_GID_AUTO for v in versions.values()):
        gate = _gid_auto(entries, lowest, subnet, shown, by_subnet, derived)
        if gate is None:
            return
    elif any(v is None for v in versions.values()):
        gate = "NCCL's version was not found on %s; pinned, as NCCL before 2.21 needs" % fold_names([n for n, v in versions.items() if v is None])
    else:
        gate = "NCCL %s: before 2.21 NCCL uses GID index 0 (RoCE v1) unless told" % shown
    _gid_index(nodes, picked, entries, by_subnet, gate, derived)


def _gid_picks(view: ClusterView, nodes: Sequence[str], rails: Sequence[str], subnet: Optional[str]) -> Tuple[
        Dict[str, Dict[str, Dict[str, Any]]], Dict[str, Dict[str, int]], Dict[str, List[str]]]:
    """({node: {rail: the GID picked}}, {node: {rail: its lowest RoCE v2 IPv4 GID index}}, {why no GID: the
    node rails without one}): the GID in the data subnet, else a port's only one."""
    picked: Dict[str, Dict[str, Dict[str, Any]]] = {}
    lowest: Dict[str, Dict[str, int]] = {}
    unclear: Dict[str, List[str]] = {}
    for node in nodes:
        hca = (view.facts.get(node) or {}).get("ib_hca") or {}
        by_label = {port_label(p): p for p in hca.get("ports") or [] if isinstance(p, dict)}
        for label in rails:
            gids = port_gids(by_label.get(label))
            inside = [g for g in gids if in_subnet(g.get("ip"), subnet)]
            pick = inside[0] if inside else (gids[0] if len(gids) == 1 else None)
            if pick is None:
                why = "no RoCE v2 GID with an IPv4 address" if not gids else "%d RoCE v2 IPv4 GIDs, none in the data subnet %s" % (len(gids), subnet or "?")
                unclear.setdefault(why, []).append("%s %s" % (node, label))
                continue
            picked.setdefault(node, {})[label] = pick
            lowest.setdefault(node, {})[label] = gids[0]["index"]
    return picked, lowest, unclear


def _gid_auto(entries: List[Tuple[str, str, Dict[str, Any]]], lowest: Dict[str, Dict[str, int]], subnet: Optional[str],
              shown: str, by_subnet: str, derived: Derived) -> Optional[str]:
    """NCCL 2.21 and later on every node: a note when its own pick is the GID wanted, NCCL_IB_ADDR_RANGE when
    the data subnet's range steers it there (None: done); else why the index must be pinned instead."""
    moved = [(n, label, g) for n, label, g in entries if g["index"] != lowest[n][label]]
    if not moved:
        indexes = sorted({g["index"] for _, _, g in entries})
        derived.notes.append(
            "NCCL_IB_GID_INDEX not written: NCCL %s (2.21 and later) picks the first RoCE v2 IPv4 GID per port itself, here GID %s%s; "
            "a pinned index would freeze a GID table that can change" % (shown, ",".join(map(str, indexes)), by_subnet)
        )
        return None
    n, label, g = moved[0]
    found = "on %s the first RoCE v2 IPv4 GID is GID %d, outside the data subnet; GID %d (%s%s) is in it" % (
        "%s %s" % (n, label), lowest[n][label], g["index"], g.get("ip"), " on %s" % g["ndev"] if g.get("ndev") else "")
    outside = ["%s %s" % (n, label) for n, label, g in entries if not in_subnet(g.get("ip"), subnet)]
    if not outside:
        derived.variables.append(
            EnvVar(
                "NCCL_IB_ADDR_RANGE",
                str(ipaddress.ip_network(subnet, strict=False)),
                ["ib_hca check: %s" % found,
                 "NCCL %s (2.21 and later) picks the first RoCE v2 GID within NCCL_IB_ADDR_RANGE: RoCE stays on the interface/VLAN "
                 "that carries the data subnet, whatever the GID table's order" % shown],
            )
        )
        return None
    # a range would leave the ports addressed outside the data subnet without a GID: pin the index instead
    return "NCCL %s would pick another GID itself (%s), and NCCL_IB_ADDR_RANGE cannot serve %s, addressed outside it" % (
        shown, found, ", ".join(outside))


def _gid_index(nodes: Sequence[str], picked: Dict[str, Dict[str, Dict[str, Any]]],
               entries: List[Tuple[str, str, Dict[str, Any]]], by_subnet: str, gate: str, derived: Derived) -> None:
    """NCCL_IB_GID_INDEX when every port's pick has one index; per-node values when each node's ports agree
    but the nodes differ; a note when a node's ports differ (NCCL takes one index per process)."""
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
            "give every port its RoCE address in the same GID slot (%s)" % (fold_names(mixed), gate)
        )
        return
    for n in nodes:
        derived.per_node.setdefault(n, {})["NCCL_IB_GID_INDEX"] = str(next(iter(picked[n].values()))["index"])
    derived.notes.append(
        "NCCL_IB_GID_INDEX not written: the RoCE v2 GID index differs across nodes (%s) and %s; set it per node (see the per-node values)"
        % ("; ".join("%s: %s" % (fold_names([n for n in nodes if derived.per_node[n]["NCCL_IB_GID_INDEX"] == i]), i)
                     for i in sorted({derived.per_node[n]["NCCL_IB_GID_INDEX"] for n in nodes})), gate)
    )


def left_out_ports(left_out: Dict[str, List[Tuple[str, str]]], nodes: Sequence[str]) -> List[str]:
    """'left out mlx5_bond_0:1 on n[001-002]: RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s'."""
    where: Dict[Tuple[str, str], List[str]] = {}
    for node in nodes:
        for label, why in left_out.get(node) or []:
            where.setdefault((label, why), []).append(node)
    return ["left out %s on %s: %s" % (label, fold_names(on), why) for (label, why), on in where.items()]


def proof_logs(report: Any) -> Dict[str, Dict[str, Any]]:
    """{node: what NCCL chose there in the proof (the allreduce findings' data["nccl"], from its NCCL log)}."""
    out = {}
    for f in report.findings:
        nccl = f.data.get("nccl") if f.check == "allreduce" and f.node and isinstance(f.data, dict) else None
        if isinstance(nccl, dict):
            out[f.node] = nccl
    return out


def seen(logs: Dict[str, Dict[str, Any]], key: str) -> List[str]:
    return sorted({str(v) for log in logs.values() for v in log.get(key) or [] if v})


def _pin_network(external: List[str], versions: List[str], carried: str) -> List[EnvVar]:
    """NCCL_NET=<the plugin's network> where one plugin network carried the proven run on NCCL 2.10 or later:
    NCCL then fails at init instead of falling back to its internal IB or Socket transport when the plugin
    does not load (NCCL's documentation of NCCL_NET: 'to make sure NCCL uses an external plugin and doesn't
    automatically fall back on the internal IB or Socket implementation')."""
    keys = [version_key(v) for v in versions]
    if len(external) != 1 or not NET_NAME_RE.match(external[0]) or not keys or any(k is None or k < NCCL_NET_SINCE for k in keys):
        return []
    return [EnvVar("NCCL_NET", external[0], [
        "all-reduce NCCL log: %s" % carried,
        "NCCL %s: with the network named, a node where the plugin does not load fails at init instead of "
        "falling back to sockets at a fraction of the bandwidth (NCCL_NET, NCCL 2.10 and later)" % ", ".join(versions)])]


def _fabric_not_proven(derived: Derived, logs: Dict[str, Dict[str, Any]]) -> Optional[str]:
    """The note when the nodes' cloud fabric (derived.fabric) is not the one the proof's NCCL log says carried
    the traffic (an EFA run over Socket: aws-ofi-nccl did not load); None when it is, or nothing says."""
    proven = seen(logs, "fabric")
    if derived.fabric is None or not proven or proven == [derived.fabric]:
        return None
    return ("not proven for %s: the nodes are on %s (cloud_fabric), but the all-reduce's NCCL traffic went over %s "
            "(%s); the fabric's plugin did not carry it, so nothing is pinned to that run"
            % (derived.fabric, derived.fabric, "/".join(seen(logs, "transport")) or "?", ", ".join(proven)))


def with_proof(derived: Derived, logs: Dict[str, Dict[str, Any]]) -> Tuple[List[EnvVar], List[str]]:
    """The variables and extra notes once the proof's NCCL log is known: NCCL_NET_PLUGIN pinned to what the
    proven run used, and the NCCL_IB_DISABLE=1 comment saying which net plugin carries the traffic.

    The log lines (NCCL src/plugin/net.cc; real logs: NVIDIA/nccl#892 "NET/Plugin: Loaded net plugin NCCL
    RDMA Plugin (v5)" on 2.18, NVIDIA/nccl#1737 "Plugin Path : .../libnccl-net.so" (HPC-X SHARP), a DGX Spark
    NCCL 2.28.9 log "NET/Plugin: Could not find: libnccl-net.so" (internal), aws-samples/aws-efa-eks's
    README "Using network AWS Libfabric" (EFA)): "Using network IB | Socket | AWS Libfabric | IBext_v8 |
    GPUDirectTCPX | FasTrak" names the network that carried the traffic. A plugin's network (EFA, TCPX/TCPXO, SHARP) is never turned off with
    'none'; an internal IB/Socket run beside a loaded plugin is pinned with 'none'.
    """
    variables = list(derived.variables)
    unproven = _fabric_not_proven(derived, logs)
    if unproven:
        return variables, [unproven]
    networks = sorted({t.split("/", 1)[1] for log in logs.values() for t in log.get("transport") or [] if str(t).startswith("NET/")})
    if not networks:
        return variables, []
    loaded = [p for p in seen(logs, "plugin") if p != "internal"]
    external = [n for n in networks if n not in ("IB", "Socket")]
    on = fold_names(list(logs))
    if external:
        carried = "the proven run's traffic on %s went over the net plugin %s (%s)" % (
            on, "/".join(external), ", ".join(loaded) or "loaded by its default name libnccl-net.so")
        for i, var in enumerate(variables):
            if var.key == "NCCL_IB_DISABLE" and var.value == "1":
                variables[i] = EnvVar(var.key, var.value, ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s: NCCL's own InfiniBand "
                                                           "transport is off; %s, which this does not turn off" % (fold_names(derived.nodes), carried)])
        variables.extend(_pin_network(external, seen(logs, "version"), carried))
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


#: libfabric's EFA provider reads device RDMA (read) where the hardware has it; AWS's EFA/NCCL guide ("Get
#: started with EFA and NCCL", EC2 User Guide) exports FI_EFA_USE_DEVICE_RDMA=1 for p4d and later.
EFA_RDMA_TYPES = ("p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-")


def cloud(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    """The cloud fabric's variables (preflight.derived.cloud): FI_PROVIDER=efa and FI_EFA_USE_DEVICE_RDMA=1 where
    every node is on EFA with aws-ofi-nccl; for Google's fabrics a note naming the vendor's env script found on
    the nodes. Never NCCL_IB_HCA over EFA (ib() leaves EFA devices out)."""
    fabrics = cloud_fabric.of(view)
    on = {fabrics[n].fabric for n in nodes if n in fabrics}
    if not on & set(cloud_fabric.CLOUD):
        return
    if len(on) > 1 or any(n not in fabrics for n in nodes):
        derived.notes.append("no cloud fabric variables written: the nodes are not all on one fabric (%s; see cloud_fabric)"
                             % ", ".join(sorted(str(f) for f in on)))
        return
    fabric, all_facts = on.pop(), [fabrics[n].facts for n in nodes]
    derived.fabric = fabric
    if fabric == "efa":
        _efa_env(nodes, [bool(cloud_fabric.plugins_of(f, "efa")) for f in all_facts], all_facts, derived)
        return
    scripts = sorted({cloud_fabric.profile_of(f, fabric) for f in all_facts} - {None})
    then = "NCCL_NET is pinned once the all-reduce's NCCL log shows the plugin carried the traffic"
    if scripts:
        derived.notes.append("%s: source %s (the vendor's NCCL settings for this fabric) before this file; %s"
                             % (fabric, " or ".join(scripts), then))
    else:
        derived.notes.append("%s: no vendor NCCL env script found beside the plugin (the TCPX plugin ships none): set the "
                             "plugin's variables as Google Cloud's GPUDirect guide lists them; %s" % (fabric, then))


def _efa_env(nodes: Sequence[str], plugged: Sequence[bool], facts: Sequence[Dict[str, Any]], derived: Derived) -> None:
    missing = [n for n, ok in zip(nodes, plugged) if not ok]
    if missing:
        derived.notes.append("FI_PROVIDER not written: aws-ofi-nccl not found on %s, NCCL would not use EFA there "
                             "(see cloud_fabric)" % fold_names(missing))
        return
    where = fold_names(list(nodes))
    derived.variables.append(EnvVar("FI_PROVIDER", "efa", [
        "cloud_fabric check: EFA devices and aws-ofi-nccl on %s" % where,
        "libfabric opens only the efa provider (AWS EC2 User Guide, 'Get started with EFA and NCCL'; aws-ofi-nccl "
        "README): no silent fall-back to another provider such as tcp"]))
    types = sorted({str(f.get("product_name")) for f in facts})
    if all(t.startswith(EFA_RDMA_TYPES) for t in types):
        derived.variables.append(EnvVar("FI_EFA_USE_DEVICE_RDMA", "1", [
            "cloud_fabric check: instance type %s, whose EFA devices support RDMA read" % ", ".join(types),
            "AWS EC2 User Guide, 'Get started with EFA and NCCL': set for p4d and later instance types"]))

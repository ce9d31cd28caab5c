"""The NCCL environment derived from every node's facts: what the env file recommends, the all-reduce launches with,
and the nccl_env check compares a node's own settings against; computed once per run (engine) from the data network,
the rails, the driver facts and the ports check's rendezvous port.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.derived import datanet, envfabric, envvendor, rendezvous
from preflight.derived.envvars import IFNAME_EXPECTED, IFNAME_OK, Derived, EnvVar, fold_names, is_ipv4, refuse
from preflight.model import ClusterView

#: torch renamed NCCL_ASYNC_ERROR_HANDLING to TORCH_NCCL_ASYNC_ERROR_HANDLING in 2.2, and its default is
#: 3 (SkipCleanUp: kill the process without ncclCommAbort, which can itself hang) since then; 1 (TearDown)
#: calls ncclCommAbort first (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, ErrorHandlingMode).
TORCH_ASYNC_RENAMED = (2, 2)


TORCH_ASYNC_SAFE = "3"


DEFAULT_PORT = 29500


def derive(view: ClusterView, healthy: Optional[Sequence[str]] = None) -> Derived:
    """The env for the given nodes (default: every live node), from the nic, ib_hca, ports and driver facts.

    Pure. A node whose data-interface name or address is refused is left out (with a FAIL finding
    naming it), and the variables are derived for the remaining nodes.
    """
    derived = Derived()
    wanted = list(healthy) if healthy is not None else [n.name for n in view.live]
    choice = datanet.of(view)

    # Per-node facts first: a node whose own fact cannot be written is left out as a whole.
    for node in wanted:
        entry = choice.get(node)
        if entry is None:
            continue
        if not IFNAME_OK(entry.get("iface")):
            refuse(derived, "nic", node, "NCCL_SOCKET_IFNAME", entry.get("iface"), "data interface name", IFNAME_EXPECTED)
            derived.left_out[node] = "its data interface name was refused (nic)"
        elif not is_ipv4(str(entry.get("ip"))):
            refuse(derived, "nic", node, "MASTER_ADDR", entry.get("ip"), "data address", "an IPv4 address")
            derived.left_out[node] = "its data address was refused (nic)"
    nodes = [n for n in wanted if n not in derived.left_out]
    derived.nodes = nodes
    if derived.left_out:
        derived.notes.append("left out %s: a fact read there is not a safe value (see the nic findings)" % fold_names(list(derived.left_out)))
    if not nodes:
        derived.notes.append("no node %s: nothing could be verified" % ("left whose facts can be written" if derived.left_out else "passed its checks"))
        return derived

    nccl = envfabric.nccl_versions(view, nodes)
    derived.versions = {
        "nccl": sorted({v for v in nccl.values() if v}),
        "torch": sorted({v for v in (_torch_text(view, n) for n in nodes) if v}),
    }
    chosen = {n: choice.get(n) for n in nodes}
    _socket(view, choice, chosen, derived)
    envfabric.ib(view, nodes, choice, nccl, derived)
    envfabric.nvls(view, nodes, derived)
    envfabric.cloud(view, nodes, derived)
    envvendor.tuning(view, nodes, derived)
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
        derived.notes.append("NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME not written: no data interface on %s (see the nic check)" % fold_names(missing))
        return
    names = sorted({e["iface"] for e in chosen.values()})
    per_name = "; ".join(
        "%s: %s in %s, mtu %s" % (fold_names([n for n, e in chosen.items() if e["iface"] == name]), name, _entry(chosen, name, "subnet"), _entry(chosen, name, "mtu"))
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
            "data NICs one name" % (per_name, ",".join(names), "; ".join("%s on %s" % (name, fold_names(on)) for name, on in sorted(clashes.items())))
        )
    derived.notes.append(
        "GLOO_SOCKET_IFNAME not written: the data interface is named differently across nodes (%s) and gloo needs the same name on every rank; "
        "set it per node (see the per-node values)" % ", ".join(names)
    )


def _entry(chosen: Dict[str, Any], name: str, key: str) -> str:
    values = sorted({str(e[key]) for e in chosen.values() if e and e["iface"] == name and e.get(key) is not None})
    return values[0] if len(values) == 1 else "{%s}" % ",".join(values)


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
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the ports check did not verify that %s reach %s:%s" % (fold_names(silent), head, port))
        return
    yours = "a value already set (your launcher's) wins"
    derived.variables.append(
        EnvVar("MASTER_ADDR", entry["ip"], ["nic check: %s's address on its data interface %s (the head: rank 0 hosts the store)" % (head, entry["iface"]), yours], default=True)
    )
    reached = "%s connected to it" % fold_names(peers) if peers else "no other node"
    derived.variables.append(EnvVar("MASTER_PORT", str(int(port)), ["ports check: %s listened on %d and %s" % (head, int(port), reached), yours], default=True))
    short = rendezvous.short_backlog(view)
    if short:  # the job's ranks overflow the head's accept queue: say what it costs before the job meets it
        derived.notes.append("somaxconn check: %s's net.core.somaxconn is %d, below the %s ranks that connect to "
                             "MASTER_ADDR at once: expect the rendezvous to take about 1 s longer, 3 s for a rank "
                             "whose SYN is dropped twice (%s); fix on %s: %s" % (
                                 head, short["somaxconn"], format(short["ranks"], ","), rendezvous.MEASURED, head,
                                 rendezvous.fix_command(short["ranks"], short["tcp_max_syn_backlog"])))


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
            "preflight never writes 1 (ncclCommAbort can itself hang): upgrade to torch 2.2 or later" % (shown, fold_names(old))
        )
    if not known:
        derived.notes.append("TORCH_NCCL_ASYNC_ERROR_HANDLING not written: torch's version was not found on the nodes (torch 2.2 and later default to 3 by themselves)")
    unknown = [n for n, v in versions.items() if v is None]
    if known and unknown:
        derived.notes.append("torch not found on %s" % fold_names(unknown))

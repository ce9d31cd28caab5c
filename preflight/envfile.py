"""The recommended NCCL env file: derived only from verified facts, explained line by line, safe to source.

Every value comes from a check's facts (never from a default that nothing verified), is validated
against the characters NCCL/gloo/torch accept for that variable, and is written shell-quoted. A fact
that fails validation (an interface may legally be named `x$(id)`) is refused with a named finding and
never written. The all-reduce test runs with exactly these variables (see preflight.bench), so the
file the user sources is the one that was proven.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight import __version__
from preflight.model import ClusterView, Finding, Status

#: What a value may contain before it is written: interface, HCA and host names, numbers, lists.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,=@/+-]{1,256}$")
#: torch renamed NCCL_ASYNC_ERROR_HANDLING to TORCH_NCCL_ASYNC_ERROR_HANDLING in 2.2.
TORCH_ASYNC_RENAMED = (2, 2)


@dataclass
class EnvVar:
    key: str
    value: str
    why: List[str] = field(default_factory=list)


@dataclass
class Derived:
    """The variables the facts justify, the findings for facts that were refused, and notes on gaps."""

    variables: List[EnvVar] = field(default_factory=list)
    refused: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, str]:
        return {v.key: v.value for v in self.variables}


def _fold(names: Sequence[str]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names))) if names else "(none)"


def _safe(derived: Derived, check: str, node: Optional[str], key: str, value: Any, what: str) -> Optional[str]:
    """value as text when it is safe to write; otherwise a refusal finding and None."""
    text = "" if value is None else str(value)
    if SAFE_VALUE.match(text):
        return text
    derived.refused.append(
        Finding(
            check,
            node,
            Status.FAIL,
            "%s %r is not a safe value for %s; refused, not written to the env file" % (what, text, key),
            expected="letters, digits and . _ - : @ / + = ,",
            actual=repr(text),
        )
    )
    return None


def derive(view: ClusterView, healthy: Optional[Sequence[str]] = None) -> Derived:
    """The env for the given nodes (default: every live node), from the nic, ib_hca, ports and driver facts."""
    from preflight.checks import nic

    nodes = list(healthy) if healthy is not None else [n.name for n in view.live]
    derived = Derived()
    if not nodes:
        derived.notes.append("no node passed its checks: nothing could be verified")
        return derived

    # --- socket interface ----------------------------------------------------------------------
    choice = nic.choose(view)
    chosen = {n: choice.get(n) for n in nodes}
    names: List[str] = []
    for node, entry in chosen.items():
        if entry is None:
            continue
        name = _safe(derived, "nic", node, "NCCL_SOCKET_IFNAME", entry["iface"], "interface name")
        if name is not None and name not in names:
            names.append(name)
    missing = [n for n, e in chosen.items() if e is None]
    if names and not derived.refused and not missing:
        per_node = "; ".join(
            "%s: %s in %s, mtu %s" % (_fold([n for n, e in chosen.items() if e and e["iface"] == name]), name, _entry(chosen, name, "subnet"), _entry(chosen, name, "mtu"))
            for name in sorted(names)
        )
        why = ["nic check: the data interface chosen on every node (up, shared subnet %s, not loopback, docker or management)" % (choice.subnet or "?"), per_node]
        derived.variables.append(EnvVar("NCCL_SOCKET_IFNAME", "=" + ",".join(sorted(names)), why + ["'=' asks NCCL for exact names (a bare prefix would also match eth10)"]))
        if len(names) == 1:
            derived.variables.append(EnvVar("GLOO_SOCKET_IFNAME", names[0], ["same interface for gloo (torch.distributed CPU collectives and the c10d store)"]))
        else:
            derived.notes.append("GLOO_SOCKET_IFNAME not written: the data interface is named differently across nodes (%s) and gloo needs one name" % ", ".join(sorted(names)))
    elif missing:
        derived.notes.append("NCCL_SOCKET_IFNAME not written: no data interface on %s" % _fold(missing))
    elif derived.refused:
        derived.notes.append("NCCL_SOCKET_IFNAME not written: an interface name was refused (see the nic findings)")

    # --- InfiniBand / RoCE -----------------------------------------------------------------------
    _ib(view, nodes, derived)

    # --- rendezvous --------------------------------------------------------------------------------
    _rendezvous(view, nodes, chosen, derived)

    # --- error handling and logging ---------------------------------------------------------------
    key, why = _async_error_key(view, nodes)
    derived.variables.append(EnvVar(key, "1", why))
    derived.variables.append(EnvVar("NCCL_DEBUG", "WARN", ["NCCL prints warnings and errors (a hang then leaves a trace), not the INFO flood"]))
    return derived


def _entry(chosen: Dict[str, Any], name: str, key: str) -> str:
    values = sorted({str(e[key]) for e in chosen.values() if e and e["iface"] == name and e.get(key) is not None})
    return values[0] if len(values) == 1 else "{%s}" % ",".join(values)


def _ib(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    from preflight.checks import ib_hca

    usable = ib_hca.usable_hcas(view)
    ports = {n: list(usable["nodes"].get(n) or []) for n in nodes}
    if not any(ports.values()):
        derived.variables.append(EnvVar("NCCL_IB_DISABLE", "1", ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s; NCCL uses sockets" % _fold(list(nodes))]))
        return
    lists = {tuple(p) for p in ports.values()}
    if len(lists) != 1:
        by_list = "; ".join("%s: %s" % (_fold([n for n, p in ports.items() if tuple(p) == lst]), ",".join(lst) or "none") for lst in sorted(lists))
        derived.notes.append("NCCL_IB_HCA not written: the ACTIVE ports differ across nodes (%s); fix the DOWN ports first" % by_list)
        return
    hcas = list(next(iter(lists)))
    for hca in hcas:
        if _safe(derived, "ib_hca", None, "NCCL_IB_HCA", hca, "HCA port") is None:
            return
    layer = usable.get("link_layer")
    rate = (usable.get("rate_gbps") or {}).get(layer)
    derived.variables.append(
        EnvVar(
            "NCCL_IB_HCA",
            "=" + ",".join(hcas),
            ["ib_hca check: the %d ACTIVE %s port(s)%s identical on %s" % (len(hcas), "RoCE" if layer == "roce" else "InfiniBand", " at %g Gb/s" % rate if rate else "", _fold(list(nodes)))],
        )
    )
    if layer == "roce":
        gid = usable.get("gid_index")
        if gid is None:
            derived.notes.append("NCCL_IB_GID_INDEX not written: the RoCE v2 GID index differs across nodes or was not found")
        else:
            derived.variables.append(EnvVar("NCCL_IB_GID_INDEX", str(int(gid)), ["ib_hca check: GID index %d is RoCE v2 with an IPv4 address on every node" % int(gid)]))


def _rendezvous(view: ClusterView, nodes: Sequence[str], chosen: Dict[str, Any], derived: Derived) -> None:
    head = view.head.name
    port = view.cluster.get("master_port", 29500)
    entry = chosen.get(head)
    if head not in nodes or entry is None:
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the head node %s did not pass its checks" % head)
        return
    ports = (view.facts.get(head) or {}).get("ports")
    if not isinstance(ports, dict) or "probe_error" in ports or not ports.get("listening"):
        derived.notes.append("MASTER_ADDR/MASTER_PORT not written: the ports check did not verify port %s on %s" % (port, head))
        return
    addr = _safe(derived, "nic", head, "MASTER_ADDR", entry["ip"], "address")
    if addr is None:
        return
    derived.variables.append(EnvVar("MASTER_ADDR", addr, ["nic check: %s's address on its data interface %s" % (head, entry["iface"])]))
    derived.variables.append(EnvVar("MASTER_PORT", str(int(port)), ["ports check: %s could listen on %d and every node connected to it" % (head, int(port))]))


def _torch_version(view: ClusterView, node: str) -> Optional[Tuple[int, int]]:
    driver = (view.facts.get(node) or {}).get("driver")
    torch = driver.get("torch") if isinstance(driver, dict) else None
    version = torch.get("version") if isinstance(torch, dict) else None
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _async_error_key(view: ClusterView, nodes: Sequence[str]) -> Tuple[str, List[str]]:
    versions = {n: _torch_version(view, n) for n in nodes}
    known = {v for v in versions.values() if v}
    if known and all(v < TORCH_ASYNC_RENAMED for v in known):
        shown = ", ".join(sorted("%d.%d" % v for v in known))
        return "NCCL_ASYNC_ERROR_HANDLING", ["driver check: torch %s on the nodes reads the pre-2.2 name; a failed collective aborts instead of hanging" % shown]
    if known:
        shown = ", ".join(sorted("%d.%d" % v for v in known))
        return "TORCH_NCCL_ASYNC_ERROR_HANDLING", ["driver check: torch %s on the nodes; a failed collective aborts instead of hanging" % shown]
    return "TORCH_NCCL_ASYNC_ERROR_HANDLING", ["torch's version was not verified on the nodes; this is the name torch >= 2.2 reads"]


def render(report: Any) -> str:
    """The env file text for a finished run (a preflight.engine.RunReport)."""
    view: ClusterView = report.view
    problems = sorted({f.node for f in report.findings if f.status.is_problem and f.node})
    healthy = [n.name for n in view.live if n.name not in problems]
    derived = report.env if getattr(report, "env", None) is not None else derive(view, healthy)
    failed_checks = sorted({f.check for f in report.findings if f.status.is_problem}, key=_check_order)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        "# NCCL environment recommended by preflight %s; source it in your launch script." % __version__,
        "# generated %s from %s (sha256 %s)" % (stamp, _comment(report.inventory.path), (report.inventory.sha256 or "-")[:16]),
        "# verified nodes: %s (%d)" % (_fold(healthy), len(healthy)),
    ]
    if problems:
        lines.append("# left out (failed or errored checks): %s" % _fold(problems))
    if failed_checks:
        lines.append("# checks with failures: %s" % ", ".join(failed_checks))
    allreduce = getattr(report, "allreduce", None)
    if allreduce and allreduce.get("verdict"):
        lines.append("# proven: the all-reduce test ran with exactly these variables: %s" % _comment(allreduce.get("summary") or allreduce["verdict"]))
    else:
        lines.append("# not yet proven by the all-reduce test (run `preflight check` with the allreduce check)")
    for note in derived.notes:
        lines.append("# note: %s" % _comment(note))
    for var in derived.variables:
        lines.append("")
        lines.extend("# %s" % _comment(why) for why in var.why)
        lines.append("export %s=%s" % (var.key, quote(var.value)))
    return "\n".join(lines) + "\n"


def quote(value: str) -> str:
    """Single-quoted for sh and bash whatever the value holds (values are validated before, too)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _comment(text: str) -> str:
    """Comment text on one line: newlines from facts must not end the comment."""
    return " ".join(str(text).split())


def _check_order(name: str) -> int:
    from preflight.checks import CHECK_NAMES

    return CHECK_NAMES.index(name) if name in CHECK_NAMES else 99

"""The recommended NCCL env file: derived only from verified facts, explained line by line, safe to source.

Every value comes from a check's facts, is validated against the characters NCCL, gloo and torch accept
for that variable, and is written single-quoted. A fact that fails validation (an interface may legally
be named `x$(id)`) is refused with a named finding and never written; a node whose own fact was refused
is left out of the env (and, through that FAIL finding, out of the hostfile), so the file stays right for
the nodes it names. The all-reduce test runs with exactly these variables (preflight.allreduce.run), so the file
the user sources is the one that was proven.

    derive(view, healthy) -> Derived(variables, refused, notes, nodes, left_out)     pure
    render(report)        -> the file's text: header, then per variable the why and `export K='v'`
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
#: torch renamed NCCL_ASYNC_ERROR_HANDLING to TORCH_NCCL_ASYNC_ERROR_HANDLING in 2.2.
TORCH_ASYNC_RENAMED = (2, 2)
DEFAULT_PORT = 29500


@dataclass
class EnvVar:
    key: str
    value: str
    why: List[str] = field(default_factory=list)


@dataclass
class Derived:
    """The variables the facts justify, the findings for refused facts, notes on what was not written.

    nodes     the nodes the variables were derived for (healthy nodes minus those left out)
    left_out  {node: why} for healthy nodes dropped because one of their facts was refused
    """

    variables: List[EnvVar] = field(default_factory=list)
    refused: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    nodes: List[str] = field(default_factory=list)
    left_out: Dict[str, str] = field(default_factory=dict)

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

    chosen = {n: choice.get(n) for n in nodes}
    _socket(choice, chosen, derived)
    _ib(view, nodes, derived)
    _rendezvous(view, nodes, chosen, derived)
    _async_error_handling(view, nodes, derived)
    derived.variables.append(EnvVar("NCCL_DEBUG", "WARN", ["NCCL prints warnings and errors (a hang then leaves a trace), not the INFO flood"]))
    return derived


def _socket(choice: Any, chosen: Dict[str, Optional[Dict[str, Any]]], derived: Derived) -> None:
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
    else:
        derived.variables.append(
            EnvVar("NCCL_SOCKET_IFNAME", "=" + ",".join(names), why + ["the names differ across nodes: NCCL takes the one of these exact names each node has"])
        )
        derived.notes.append(
            "GLOO_SOCKET_IFNAME not written: the data interface is named differently across nodes (%s) and gloo needs the same name on every rank" % ", ".join(names)
        )


def _entry(chosen: Dict[str, Any], name: str, key: str) -> str:
    values = sorted({str(e[key]) for e in chosen.values() if e and e["iface"] == name and e.get(key) is not None})
    return values[0] if len(values) == 1 else "{%s}" % ",".join(values)


def _ib(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    from preflight.checks import ib_hca

    usable = ib_hca.usable_hcas(view)
    unknown = [n for n in nodes if n not in usable["nodes"]]
    if unknown:
        derived.notes.append("NCCL_IB_HCA/NCCL_IB_DISABLE not written: no HCA facts from %s (see the ib_hca check)" % _fold(unknown))
        return
    ports = {n: list(usable["nodes"][n]) for n in nodes}
    if not any(ports.values()):
        derived.variables.append(EnvVar("NCCL_IB_DISABLE", "1", ["ib_hca check: no ACTIVE InfiniBand/RoCE port on %s; NCCL uses sockets" % _fold(list(nodes))]))
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
    if layer == "roce":
        gid = usable.get("gid_index")
        if isinstance(gid, int) and not isinstance(gid, bool) and 0 <= gid < 1024:
            derived.variables.append(EnvVar("NCCL_IB_GID_INDEX", str(gid), ["ib_hca check: GID index %d is RoCE v2 with an IPv4 address on every port" % gid]))
        else:
            derived.notes.append("NCCL_IB_GID_INDEX not written: the RoCE v2 GID index differs across ports or was not found")


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
    derived.variables.append(EnvVar("MASTER_ADDR", entry["ip"], ["nic check: %s's address on its data interface %s (the head: rank 0 hosts the store)" % (head, entry["iface"])]))
    reached = "%s connected to it" % _fold(peers) if peers else "no other node"
    derived.variables.append(EnvVar("MASTER_PORT", str(int(port)), ["ports check: %s listened on %d and %s" % (head, int(port), reached)]))


def _torch_version(view: ClusterView, node: str) -> Optional[Tuple[int, int]]:
    driver = (view.facts.get(node) or {}).get("driver")
    torch = driver.get("torch") if isinstance(driver, dict) else None
    version = torch.get("version") if isinstance(torch, dict) else None
    match = re.match(r"^(\d+)\.(\d+)", version if isinstance(version, str) else "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _async_error_handling(view: ClusterView, nodes: Sequence[str], derived: Derived) -> None:
    versions = {n: _torch_version(view, n) for n in nodes}
    known = sorted({v for v in versions.values() if v})
    shown = ", ".join("%d.%d" % v for v in known)
    old = [v for v in known if v < TORCH_ASYNC_RENAMED]
    new = [v for v in known if v >= TORCH_ASYNC_RENAMED]
    what = "a failed or timed-out collective aborts the process instead of hanging"
    if new:
        derived.variables.append(EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", ["driver check: torch %s on the nodes; %s" % (shown, what)]))
    if old:
        derived.variables.append(
            EnvVar("NCCL_ASYNC_ERROR_HANDLING", "1", ["driver check: torch %s on the nodes; torch before 2.2 reads this name; %s" % (shown, what)])
        )
    if not known:
        derived.variables.append(
            EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", ["torch's version was not found on the nodes; this is the name torch 2.2 and later read; %s" % what])
        )
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
    lines.append("# %s" % _proof(report, unreachable))
    for note in derived.notes:
        lines.append("# note: %s" % note)
    for var in derived.variables:
        lines.append("")
        lines.extend("# %s" % why for why in var.why)
        lines.append("export %s=%s" % (var.key, quote(var.value)))
    return "".join(_comment(line) + "\n" if line.startswith("#") else line + "\n" for line in lines)


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

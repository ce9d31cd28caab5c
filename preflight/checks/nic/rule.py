"""The nic check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.nic import NAME
from preflight.common import fold, majority
from preflight.derived import datanet
from preflight.derived.datanet import excluded_reason, speed_text
from preflight.model import ClusterView, Finding, Status, probe_error


def describe(entry: Dict[str, Any]) -> str:
    """'eth1 198.19.0.3/16 mtu 9000 (100 Gb/s)'."""
    return "%s %s/%s mtu %s (%s)" % (
        entry["iface"],
        entry["ip"],
        entry["prefixlen"],
        entry["mtu"],
        speed_text(entry.get("speed_mbps")),
    )


def rule(view: ClusterView) -> List[Finding]:

    out: List[Finding] = []
    errors = set()
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("interfaces", "interface list"))
        if err:
            out.append(err)
            errors.add(name)
    choice = datanet.of(view)
    for node in view.live:
        name = node.name
        if name in errors:
            continue
        entry = choice.nodes.get(name)
        skipped = choice.skipped.get(name) or []
        if entry is None:
            # The reason already discusses some interfaces; list only the others.
            said = choice.missing.get(name, "")
            skipped = [p for p in skipped if not re.search(r"(?<![\w.-])%s(?![\w.-])" % re.escape(p[0]), said)]
        skip_text = "; skipped " + ", ".join("%s (%s)" % p for p in skipped) if skipped else ""
        if entry is None:
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    choice.missing.get(name, "no data interface") + skip_text,
                    expected="an up interface with an IPv4 address in a subnet shared by the nodes",
                    actual="none",
                )
            )
            continue
        fault = None if entry["pinned"] else _fell_back(view, entry, view.facts[name][NAME]["interfaces"])
        if fault is not None:
            others = [p for p in skipped if not fault[2].startswith(p[0] + " ")]  # the message names the down one
            skip_text = "; skipped " + ", ".join("%s (%s)" % p for p in others) if others else ""
            out.append(Finding(NAME, name, Status.FAIL, fault[0] + skip_text, expected=fault[1],
                               actual=fault[2], data=dict(entry)))
            continue
        message = describe(entry) + (" (pinned by data_interface)" if entry["pinned"] else "") + skip_text
        out.append(Finding(NAME, name, Status.PASS, message, actual=entry["iface"], data=dict(entry)))
    if not choice.uniform:
        groups: Dict[str, List[str]] = {}
        for name, entry in choice.nodes.items():
            groups.setdefault(entry["iface"], []).append(name)
        shown = " · ".join("%s on %s" % (iface, fold(ns)) for iface, ns in sorted(groups.items()))
        out.append(
            Finding(
                NAME,
                None,
                Status.WARN,
                "data interface names differ: %s; NCCL_SOCKET_IFNAME must list them all (%s)"
                % (shown, choice.socket_ifname()),
                expected="one interface name on every node",
                actual=", ".join(sorted(groups)),
            )
        )
    out.extend(_speed_drift(choice))
    return out


#: the Ethernet standard frame's MTU: a data network for NCCL/RDMA runs jumbo frames above it
STANDARD_MTU = 1500


def _fell_back(view: ClusterView, entry: Dict[str, Any], interfaces: List[Dict[str, Any]]) -> Optional[Tuple[str, str, str]]:
    """(message, expected, actual) when the chosen interface is a fallback from a data NIC that is down.

    With no partner node (`preflight node`, as slurmd runs it: no inventory or no data_interface, and no
    SSH_CONNECTION to say which port is management) datanet's cross-node evidence is missing, and a down
    link reads no speed, so a management port would win. So, on the node alone, a down interface with an
    IPv4 address that is not a bridge or tunnel, holding expect.mtu (or, without one, jumbo frames while the
    chosen one runs the standard 1500), is the data NIC, down. In a cluster only the expect.mtu case applies
    (the cross-node choice already fails a node whose data NIC is down in the shared subnet), and the mtu
    check judges a chosen interface at another MTU; on a node alone nothing else does, so nic does.
    """

    want = view.expect.get("mtu")
    alone = len(view.nodes) == 1
    have = entry.get("mtu") or 0
    chosen = "%s %s/%s mtu %s" % (entry["iface"], entry["ip"], entry["prefixlen"], entry["mtu"])
    basis = "expect.mtu %s" % want if want is not None else "no jumbo-frame interface is up"
    for iface in interfaces:
        mtu = iface.get("mtu") or 0
        if iface.get("up") or iface["name"] == entry["iface"] or excluded_reason(iface):
            continue
        if want is not None:
            holds = mtu == want and have != want
        else:
            holds = alone and mtu > STANDARD_MTU >= have
        address = next((a for a in iface.get("addresses") or [] if _global_ipv4(a.get("ip"))), None)
        if holds and address is not None:
            return (
                "data NIC down: %s %s/%s mtu %s is down (operstate %s), leaving only %s (%s)" % (
                    iface["name"], address["ip"], address["prefixlen"], mtu, iface.get("state") or "DOWN", chosen,
                    basis),
                "%s up (mtu %s)" % (iface["name"], mtu),
                "%s down" % iface["name"],
            )
    if want is not None and alone and have != want:
        return ("%s (expected %s (expect.mtu)): no interface at mtu %s is up; the data NIC is missing or set to "
                "another MTU" % (chosen, want, want), "an up data interface at mtu %s" % want, "mtu %s" % have)
    return None


def _global_ipv4(ip: Any) -> bool:
    try:
        addr = ipaddress.ip_address(str(ip))
    except ValueError:
        return False
    return addr.version == 4 and not (addr.is_loopback or addr.is_link_local or addr.is_unspecified)


def _speed_drift(choice: Any) -> List[Finding]:
    """WARN the nodes whose chosen interface is slower than the cluster majority's.

    A tie (as many nodes at one speed as at another, none more common) has no reference speed
    (preflight.common.majority): one cluster-wide WARN names the split instead of taking a side.
    """

    speeds: Dict[Optional[int], List[str]] = {}
    for name, entry in choice.nodes.items():
        speeds.setdefault(entry.get("speed_mbps"), []).append(name)
    known = {s: ns for s, ns in speeds.items() if s}
    if len(known) < 2:
        return []
    reference, _count, _strict = majority([s for s, ns in known.items() for _n in ns])
    if reference is None:
        split = " · ".join("%s on %s" % (speed_text(s), fold(known[s])) for s in sorted(known, reverse=True))
        return [
            Finding(
                NAME,
                None,
                Status.WARN,
                "data interface speeds split evenly with no majority: %s; the slowest link paces every collective"
                % split,
                expected="one speed on every node",
                actual=", ".join(speed_text(s) for s in sorted(known, reverse=True)),
            )
        ]
    out = []
    for speed, names in sorted(known.items(), key=lambda kv: kv[0] or 0):
        if speed >= reference:
            continue
        for name in sorted(names):
            entry = choice.nodes[name]
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.WARN,
                    "%s %s runs at %s (%s: %s); the slowest link paces every collective"
                    % (name, entry["iface"], speed_text(speed), fold(known[reference]), speed_text(reference)),
                    expected=speed_text(reference),
                    actual=speed_text(speed),
                )
            )
    return out

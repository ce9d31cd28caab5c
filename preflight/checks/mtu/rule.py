"""The mtu check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.mtu import NAME
from preflight.checks.mtu.probe import COUNT
from preflight.common import fold, majority
from preflight.derived import datanet
from preflight.model import ClusterView, Finding, Status, probe_error

IP_ICMP_HEADERS = 28
SMALL_PAYLOAD = 1000


def plan(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: probe config}: ring (or full-mesh) targets over each node's chosen data interface."""
    choice = datanet.of(view)
    ordered = [n.name for n in view.live if n.name in choice.nodes]
    mesh = bool(view.cluster.get("mtu_full_mesh"))
    out: Dict[str, Dict[str, Any]] = {}
    for node in view.live:
        if node.name not in choice.nodes:
            out[node.name] = {"skip": "no data interface (see the nic check)"}
    for i, name in enumerate(ordered):
        entry = choice.nodes[name]
        if mesh:
            peers = [p for p in ordered if p != name]
        else:
            peers = [ordered[(i + 1) % len(ordered)]] if len(ordered) > 1 else []
        mtu = int(entry["mtu"])
        out[name] = {
            "iface": entry["iface"],
            "source_ip": entry["ip"],
            "mtu": mtu,
            "size": mtu - IP_ICMP_HEADERS,
            "small_size": min(SMALL_PAYLOAD, mtu - IP_ICMP_HEADERS),
            "count": COUNT,
            "targets": [{"peer": p, "ip": choice.nodes[p]["ip"], "peer_mtu": choice.nodes[p]["mtu"]} for p in peers],
        }
    return out


def _path_problem(src: str, t: Dict[str, Any], peer_mtu: Optional[int]) -> Optional[Tuple[Status, str]]:
    """(status, 'n003 → n004: ...') for a path that did not carry full-size frames cleanly, else None."""
    pair = "%s → %s" % (src, t["peer"])
    size, small = t["size"], t["small_size"]
    peer_note = (
        " (%s mtu %s)" % (t["peer"], peer_mtu) if peer_mtu is not None and peer_mtu < size + IP_ICMP_HEADERS else ""
    )
    if t.get("jumbo_ok"):
        if t.get("loss_pct"):
            return Status.WARN, "%s: %g%% loss on %d-byte DF pings" % (pair, t["loss_pct"], size)
        return None
    if t.get("unfinished") or (not t.get("small_ok") and t.get("small_unfinished")):
        # ping ends on its own schedule whatever the network does: one that outran it says the node was
        # too busy to run it, nothing about the path
        return Status.ERROR, "%s: not tested: ping did not finish (%s): the node was too busy to run it; retest" % (
            pair, t.get("error") if t.get("unfinished") else t.get("small_error"))
    if t.get("too_long") or t.get("path_mtu") is not None:
        also = (
            ""
            if t.get("small_ok")
            else "; no reply to %d-byte pings either (%s)" % (small, t.get("small_error") or "lost")
        )
        return (
            Status.FAIL,
            "%s: %d-byte DF ping refused as too big (%s): the path MTU is below the interface MTU%s%s"
            % (pair, size, t.get("error"), peer_note, also),
        )
    again = " on two tries" if t.get("first_try") else ""
    if t.get("small_ok"):
        return Status.FAIL, "%s: %d-byte DF ping lost%s (%d-byte ping ok): jumbo frames black-holed%s" % (
            pair,
            size,
            again,
            small,
            peer_note,
        )
    why = t.get("small_error") or t.get("error") or "no reply"
    return Status.FAIL, "%s: no reply to %d-byte pings either%s: no route, host down or firewall (%s)" % (
        pair,
        small,
        again,
        why,
    )


def common_end(pairs: List[Tuple[str, str]]) -> Optional[str]:
    """The one node that is an end of every failing pair (needs two or more pairs), else None."""
    if len(pairs) < 2:
        return None
    common = set(pairs[0])
    for pair in pairs[1:]:
        common &= set(pair)
    return common.pop() if len(common) == 1 else None


def rule(view: ClusterView) -> List[Finding]:

    out: List[Finding] = []
    choice = datanet.of(view)
    mtus = {name: entry["mtu"] for name, entry in choice.nodes.items()}

    # 1. One MTU everywhere: against expect.mtu, else the majority; a tie has no reference value.
    want = view.expect.get("mtu")
    if mtus:
        reference = want if want is not None else majority(list(mtus.values()))[0]
        holders = sorted(n for n, m in mtus.items() if m == reference)
        split = " · ".join(
            "%s on %s" % (m, fold(n for n, v in mtus.items() if v == m)) for m in sorted(set(mtus.values()), reverse=True)
        )
        for name in [n.name for n in view.live if n.name in mtus]:
            if reference is None or mtus[name] != reference:
                if want is not None:
                    basis = "expected %s" % reference
                elif reference is not None:
                    basis = "%s: %s" % (fold(holders), reference)
                else:
                    basis = "no majority: %s; set expect.mtu" % split
                out.append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "%s %s: mtu %s (%s)" % (name, choice.nodes[name]["iface"], mtus[name], basis),
                        expected=str(reference) if reference is not None else "one MTU on every node",
                        actual=str(mtus[name]),
                    )
                )

    # 2. Paths.
    problems: List[Tuple[str, str, Status, str]] = []
    tested: Dict[str, List[str]] = {}
    retried: Dict[str, List[str]] = {}  # paths whose first ping got no reply and whose second did
    # nodes at an end of a path that carried full-size DF frames: both ways, the echo reply being as big as the
    # request (RFC 792), so such a node's interface and switch port pass them; not the broken end of another path
    carried: set = set()
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("targets", "ping results"))
        if err:
            out.append(err)
            continue
        tested[name] = []
        for t in facts["targets"]:
            tested[name].append(t["peer"])
            if t.get("first_try") or t.get("small_first_try"):
                retried.setdefault(name, []).append(t["peer"])
            if t.get("jumbo_ok"):
                carried.update((name, t["peer"]))
            found = _path_problem(name, t, mtus.get(t["peer"]))
            if found:
                problems.append((name, t["peer"], found[0], found[1]))

    failing = [(src, dst) for src, dst, status, _ in problems if status == Status.FAIL]
    culprit = common_end(failing)
    blamed_on: Dict[str, str] = {}
    if culprit:
        out.append(
            Finding(
                NAME,
                culprit,
                Status.FAIL,
                "%s is the common end of %d failing paths" % (culprit, len(failing)),
                data={"paths": ["%s → %s" % p for p in failing]},
            )
        )
    for src, dst, status, message in problems:
        owner = src
        cleared = [end for end in (src, dst) if end in carried]
        if culprit and status == Status.FAIL:
            owner = culprit
            if src != culprit:
                blamed_on[src] = "%s (the common end)" % culprit
        elif status == Status.FAIL and len(cleared) == 1:
            # one end carries full-size frames on another path (when the black-holed node's own ping went
            # untested, the one failing path would otherwise be blamed on the healthy pinger)
            owner = dst if cleared[0] == src else src
            message += " (%s carries full-size frames on another path: the fault is at %s's end)" % (cleared[0], owner)
            if owner != src:
                blamed_on[src] = "%s (this node carries full-size frames on another path)" % owner
        elif status == Status.FAIL and len(failing) == 1:
            message += " (one failing path: the fault may be at either end)"
        out.append(Finding(NAME, owner, status, message, data={"path": [src, dst]},
                           action="retest" if status == Status.ERROR else None))

    # 3. PASS for every tested node with nothing against it.
    against = {f.node for f in out if f.status in (Status.FAIL, Status.WARN, Status.ERROR)}
    for name in [n.name for n in view.live if n.name in tested]:
        if name in against:
            continue
        entry = choice.nodes.get(name)
        head = "%s mtu %s" % (entry["iface"], entry["mtu"]) if entry else "mtu"
        peers = tested[name]
        if not peers:
            out.append(Finding(NAME, name, Status.SKIP, "%s: no other node with a data interface to ping" % head))
            continue
        size = entry["mtu"] - IP_ICMP_HEADERS if entry else None
        shown = peers[0] if len(peers) == 1 else "%d peers" % len(peers)
        message = "%s: %s-byte DF pings reach %s" % (head, size, shown)
        if name in blamed_on:
            message = "%s: path to %s failed, blamed on %s" % (head, ", ".join(peers), blamed_on[name])
        elif name in retried:
            message += " (%s answered the second, slower try only)" % fold(retried[name])
        out.append(Finding(NAME, name, Status.PASS, message, actual=str(entry["mtu"]) if entry else None))
    return out

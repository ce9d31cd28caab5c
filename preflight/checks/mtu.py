"""mtu: the data interfaces agree on their MTU, and full-size frames cross the network between the nodes.

Phase 2. The plan (built on the controller from the nic facts, via preflight.datanet.of) has each node ping its
ring neighbour (the next node in inventory order among nodes with a data interface; every other node
when `cluster.mtu_full_mesh` is true) over its data interface with the don't-fragment bit set and a
payload of MTU − 28 (20-byte IPv4 header + 8-byte ICMP header), plus a small ping that tells "no route
at all" from "jumbo frames black-holed" (a switch port left at 1500 silently drops 9000-byte frames:
small messages work, NCCL hangs on the first large one).

Rule decisions: an MTU that differs from `expect.mtu` (or, without it, from the majority) FAILs the
minority (a tie has no majority: every node FAILs naming the split, and the fix is to set expect.mtu); each failing path FAILs as the pair `n003 → n004: ...`; when two or more paths fail and one node
is an end of all of them, that node is named as the fault and the failures are attributed to it.
Partial loss of full-size pings WARNs. Nodes without a data interface are not tested (ERROR "not tested", nic FAILs).

A ping that got no reply at all is sent again (3 packets 0.2 s apart, waiting 2 s for the last) before the
path is judged, and the second try decides: a burst of loss on a busy moment must not drain a node, and a
black hole loses both. A ping that has not ended 15 s past its own schedule (count × interval + -W: iputils
ends then whatever the network does) is an ERROR "not tested ... retest": a starved node, not a fact about
the path (seen on 1,000 simulated nodes sharing 2 cores, benchmarks/README.md).
"""

from __future__ import annotations

import concurrent.futures
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import fold, majority
from preflight.model import Check, ClusterView, Finding, ParseError, Setting, Status, probe_error

NAME = "mtu"
IP_ICMP_HEADERS = 28
SMALL_PAYLOAD = 1000
COUNT = 3
#: seconds between a target's pings: 50 ms keeps three pings to 0.1 s. iputils before 20210202 refuses
#: intervals under 200 ms to users ("cannot flood; minimal interval allowed for user is 200ms"): the
#: probe then pings again at SLOW_INTERVAL.
INTERVAL = 0.05
SLOW_INTERVAL = 0.2
_MIN_INTERVAL = re.compile(r"minimal interval allowed for user is", re.I)
MAX_PARALLEL = 32
#: seconds ping waits for the last reply (-W): the first try's, then the confirmation's
WAIT_S = 1
CONFIRM_WAIT_S = 2
#: seconds past ping's own schedule (count × interval + -W) before the probe stops waiting for it. ping ends on
#: that schedule whatever the network does, so one still running is a starved node (measured: 1,000 simulated
#: nodes on 2 cores, load above 1,000, missed a 6.6 s limit), not evidence about the path: "not tested".
PING_SLACK_S = 15.0

_STATS = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received(?P<rest>[^\n]*)")
_LOSS = re.compile(r"(\d+(?:\.\d+)?)% packet loss")
_ERRORS = re.compile(r"\+(\d+) errors")
_RTT = re.compile(r"(?:rtt|round-trip) min/avg/max(?:/mdev)? = ([\d.]+)/([\d.]+)/([\d.]+)")
#: iputils <= s20180629 prints "local error: Message too long, mtu=1500" (capitalised); s20190324 and later
#: "message too long, mtu=1500" (IPv4) and "message too long, mtu: 1500" (IPv6, ping6_common.c).
_LOCAL_MTU = re.compile(r"local error: message too long, mtu(?:=|: )(\d+)", re.I)
_TOO_LONG = re.compile(r"message too long", re.I)
_FRAG = re.compile(r"Frag(?:mentation)? needed and DF set \(mtu = (\d+)\)")
_PROG_ERROR = re.compile(r"^\S*ping\S*: (.+)$", re.M)


# ----------------------------------------------------------------------------------------------- parse


def _ping_error(text: str, stdout: str, stderr: str) -> Tuple[Optional[str], bool, Optional[int]]:
    """(first error ping reported, refused for its size?, reported path MTU) from ping's output."""
    m = _LOCAL_MTU.search(text)
    if m:
        return "message too long, mtu=%s" % m.group(1), True, int(m.group(1))
    m = _FRAG.search(text)
    if m:
        return "fragmentation needed (mtu = %s)" % m.group(1), True, int(m.group(1))
    if _TOO_LONG.search(text):
        return "message too long", True, None
    if "Destination Host Unreachable" in text:
        return "destination host unreachable", False, None
    if "Destination Net Unreachable" in text:
        return "destination net unreachable", False, None
    m = _PROG_ERROR.search(stderr) or _PROG_ERROR.search(stdout)
    return (m.group(1).strip() if m else None), False, None


def no_reply(error: str, too_long: bool = False, path_mtu: Optional[int] = None) -> Dict[str, Any]:
    """The facts of a ping that got no statistics line: nothing sent or received, and why."""
    return {
        "transmitted": 0,
        "received": 0,
        "loss_pct": 100.0,
        "rtt_ms": None,
        "errors": 0,
        "error": error,
        "too_long": too_long,
        "path_mtu": path_mtu,
    }


def parse_ping(stdout: str, stderr: str = "", rc: Optional[int] = None) -> Dict[str, Any]:
    """iputils ping output → {transmitted, received, loss_pct, rtt_ms, errors, error, too_long, path_mtu}.

    error is the first problem ping reported (None when every packet came back); too_long is True when
    the packet was refused for its size rather than lost (EMSGSIZE locally, or a router's
    fragmentation-needed); path_mtu is the MTU the sender's kernel or a router reported for the path
    ('local error: message too long, mtu=1500', 'Frag needed and DF set (mtu = 1500)'), else None.
    """
    text = (stdout or "") + "\n" + (stderr or "")
    stats = _STATS.search(text)
    rtt = _RTT.search(text)
    error, too_long, path_mtu = _ping_error(text, stdout or "", stderr or "")
    if stats is None:
        if error is None:
            raise ParseError("ping output has no statistics line and no error: %.120r" % text.strip())
        return no_reply(error, too_long, path_mtu)
    transmitted, received = int(stats.group(1)), int(stats.group(2))
    loss = _LOSS.search(stats.group("rest"))
    if loss is None:
        raise ParseError("ping statistics line without packet loss: %.120r" % stats.group(0))
    errors = _ERRORS.search(stats.group("rest"))
    if error is None and received < transmitted:
        error = "%d of %d replies lost" % (transmitted - received, transmitted)
    return {
        "transmitted": transmitted,
        "received": received,
        "loss_pct": float(loss.group(1)),
        "rtt_ms": float(rtt.group(2)) if rtt else None,
        "errors": int(errors.group(1)) if errors else 0,
        "error": error,
        "too_long": too_long,
        "path_mtu": path_mtu,
    }


# ------------------------------------------------------------------------------------------------ plan


def plan(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: probe config}: ring (or full-mesh) targets over each node's chosen data interface."""
    from preflight import datanet

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


# ----------------------------------------------------------------------------------------------- probe


def ping_argv(iface: str, size: int, target: str, count: int = COUNT, interval: float = INTERVAL,
              wait: int = WAIT_S) -> List[str]:
    """The ping command: DF set, fixed payload, bound to the interface. An argv list, never a shell line."""
    return [
        "ping",
        "-M",
        "do",
        "-s",
        str(int(size)),
        "-c",
        str(int(count)),
        "-i",
        "%g" % interval,
        "-W",
        str(int(wait)),
        "-I",
        iface,
        target,
    ]


def _ping(ctx: Any, cfg: Dict[str, Any], size: int, target: str, interval: float = INTERVAL,
          wait: int = WAIT_S) -> Dict[str, Any]:
    count = int(cfg.get("count", COUNT))
    timeout = count * max(interval, SLOW_INTERVAL) + wait + PING_SLACK_S
    res = ctx.run(ping_argv(cfg["iface"], size, target, count, interval, wait), timeout=timeout)
    if res.rc == 127:
        raise RuntimeError("ping is not installed (install iputils-ping)")
    if res.rc != 0 and interval < SLOW_INTERVAL and _MIN_INTERVAL.search(res.stderr):  # an older iputils, run by a user
        interval = SLOW_INTERVAL
        res = ctx.run(ping_argv(cfg["iface"], size, target, count, interval, wait), timeout=timeout)
    bound = cfg["iface"]
    if "SO_BINDTODEVICE" in res.stderr and "not permitted" in res.stderr and cfg.get("source_ip"):
        # Old kernels refuse SO_BINDTODEVICE to unprivileged users: bind the source address instead.
        bound = cfg["source_ip"]
        res = ctx.run(ping_argv(bound, size, target, count, interval, wait), timeout=timeout)
    if res.timed_out:
        out = no_reply("ping did not finish within %gs" % timeout)
        out["unfinished"] = True
        return out
    out = parse_ping(res.stdout, res.stderr, res.rc)
    out["bound"] = bound
    return out


def _ping_confirmed(ctx: Any, cfg: Dict[str, Any], size: int, target: str) -> Dict[str, Any]:
    """One ping; one that got no reply at all (and was not refused for its size) is sent again, slower and
    waiting longer, before the path is judged on it: three packets lost in 0.1 s on a busy moment must not
    drain a node, while a black hole loses these too. The second try decides; the first is kept under
    "first_try"."""
    first = _ping(ctx, cfg, size, target)
    if first["received"] > 0 or first["too_long"] or first["path_mtu"] is not None:
        return first
    need = int(cfg.get("count", COUNT)) * SLOW_INTERVAL + CONFIRM_WAIT_S + 0.5
    left = ctx.remaining()
    if left is not None and left < need:  # a --timeout too short for it: the first try stands, and says so
        first["error"] = "%s; no second try (%.1f s of the probe's time left)" % (first["error"], max(left, 0.0))
        return first
    again = _ping(ctx, cfg, size, target, SLOW_INTERVAL, CONFIRM_WAIT_S)
    again["first_try"] = {"loss_pct": first["loss_pct"], "error": first["error"]}
    return again


def probe(ctx: Any) -> Dict[str, Any]:
    """Ping every target with a full-size DF packet and a small one, concurrently; a ping that got no reply
    is confirmed by a second, slower one."""
    cfg = ctx.config
    if cfg.get("skip"):
        return {"skipped": cfg["skip"]}
    for key in ("iface", "size", "small_size", "targets"):
        if key not in cfg:
            raise ValueError("mtu probe config lacks %r (the plan did not run?)" % key)
    jobs: Dict[Tuple[int, str], Any] = {}
    targets = cfg["targets"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, 2 * len(targets)))) as pool:
        for i, t in enumerate(targets):
            jobs[(i, "big")] = pool.submit(_ping_confirmed, ctx, cfg, int(cfg["size"]), t["ip"])
            jobs[(i, "small")] = pool.submit(_ping_confirmed, ctx, cfg, int(cfg["small_size"]), t["ip"])
        results = []
        for i, t in enumerate(targets):
            big, small = jobs[(i, "big")].result(), jobs[(i, "small")].result()
            result = {
                "peer": t["peer"],
                "ip": t["ip"],
                "size": int(cfg["size"]),
                "small_size": int(cfg["small_size"]),
                "jumbo_ok": big["received"] > 0,
                "small_ok": small["received"] > 0,
                "loss_pct": big["loss_pct"],
                "small_loss_pct": small["loss_pct"],
                "rtt_ms": big["rtt_ms"],
                "error": big["error"],
                "small_error": small["error"],
                "too_long": big["too_long"],
                "path_mtu": big["path_mtu"],
            }
            for key, ping in (("", big), ("small_", small)):
                if ping.get("unfinished"):
                    result[key + "unfinished"] = True
                if ping.get("first_try"):
                    result[key + "first_try"] = ping["first_try"]
            results.append(result)
    return {"iface": cfg["iface"], "mtu": cfg.get("mtu"), "targets": results}


# ------------------------------------------------------------------------------------------------ rule


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
    from preflight import datanet

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
            # one end carries full-size frames on another path (seen at 1,000 simulated nodes: the black-holed
            # node's own ping went untested, and the one failing path was blamed on the healthy pinger)
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


#: expect.mtu, read by nic too (node mode judges it there: no partner to ping); declared alike in both
EXPECT_MTU = Setting("expect.mtu", "int", "the MTU every data interface has (else the cluster majority)", low=576, high=65536)

CHECK = Check(
    name=NAME,
    claim="The data interfaces share one MTU and full-size frames cross every tested path",
    why="A switch port or node left at MTU 1500 on a 9000 network passes small messages and silently drops "
    "large frames: rendezvous succeeds, then NCCL hangs on the first big collective.",
    fix="Set the same MTU on every data interface and on the switch ports between them (ip link set IF mtu 9000; "
    "persist it in netplan/NetworkManager); re-run with mtu_full_mesh: true to localise a bad link.",
    probe=probe,
    rule=rule,
    phase=2,
    plan=plan,
    needs=("nic",),
    action="fix_config",
    reads="ping -M do at full frame size to ring neighbours over the data interface (phase 2)",
    takes="0.2 s per neighbour; about 3.5 s for a path that loses every packet (it is pinged again)",
    order=70,
    settings=(
        Setting("mtu_full_mesh", "bool", "every pair of nodes pings (default: each node its ring neighbour)", default=False),
        EXPECT_MTU,
    ),
)

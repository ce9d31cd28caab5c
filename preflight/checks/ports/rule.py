"""The ports check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.ports import NAME
from preflight.checks.ports.probe import RETRY_S, WINDOW_S
from preflight.common import clock_offset, fold, plural
from preflight.derived import datanet, rendezvous
from preflight.model import ClusterView, Finding, Status, probe_error
from preflight.probe import portclaim

DEFAULT_PORT = 29500


def plan(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: probe config}: the head listens on master_port, every other node connects to it."""
    choice = datanet.of(view)
    port = int(view.cluster.get("master_port", DEFAULT_PORT))
    head = view.head.name
    head_entry = choice.nodes.get(head)
    out: Dict[str, Dict[str, Any]] = {}
    if head not in view.facts:
        for n in view.live:
            out[n.name] = {"skip": "the head node %s was not reached" % head}
        return out
    if head_entry is None:
        for n in view.live:
            out[n.name] = {"skip": "the head node %s has no data interface (see the nic check)" % head}
        return out
    peers = [n.name for n in view.live if n.name != head]
    out[head] = {
        "role": "listen",
        "name": head,
        "port": port,
        "bind_ip": head_entry["ip"],
        "wildcard": True,
        "expect_peers": [choice.nodes[p]["ip"] for p in peers if p in choice.nodes],
        "expect_names": [p for p in peers if p in choice.nodes],
        "window_s": WINDOW_S,
    }
    for p in peers:
        entry = choice.nodes.get(p)
        if entry is None:
            out[p] = {"skip": "no data interface (see the nic check)"}
            continue
        out[p] = {
            "role": "connect",
            "name": p,
            "host": head_entry["ip"],
            "port": port,
            "source_ip": entry["ip"],
            "retry_s": RETRY_S,
        }
    return out


def holder_text(holders: List[Dict[str, Any]]) -> str:
    """'pid 4242 (python3, uid 1001)', or 'a process of uid 1001 not visible to us'."""
    parts = []
    for h in holders:
        if h.get("pid") is not None:
            uid = "" if h.get("uid") is None else ", uid %s" % h["uid"]
            parts.append("pid %d (%s%s)" % (h["pid"], h.get("comm") or "?", uid))
        else:
            parts.append("a process of uid %s not visible to this user" % h.get("uid"))
    return ", ".join(parts) if parts else "another process"


def _connect_hint(err: Optional[str], errno_name: Optional[str]) -> str:
    if errno_name == "ECONNREFUSED":
        return "refused: nothing listening there, or a firewall REJECT rule"
    if errno_name in ("ETIMEDOUT", "timeout"):
        return "timed out: a firewall dropping the packets?"
    if errno_name in ("EHOSTUNREACH", "ENETUNREACH"):
        return "unreachable: no route to the head's data address"
    return err or "failed"


@dataclass
class _Head:
    """The head's side of the test as the rule judges the others by: its facts, whether it listened, whether
    its listen failed (its own FAIL says why), and the connectors that could not reach it when they were
    most of them (the head's end: they are not judged)."""

    name: str
    port: int
    facts: Any
    ok: bool = False
    failed: bool = False
    unreached: List[str] = field(default_factory=list)


def rule(view: ClusterView) -> List[Finding]:
    """The head listened on the rendezvous port and every other node connected and heard preflight's reply: a
    connector's failure FAILs it with the hint its errno gives; most connectors failing is the head's end; a
    busy head or one that began listening late is an ERROR (retest), judging no node."""
    head = _Head(view.head.name, int(view.cluster.get("master_port", DEFAULT_PORT)), None)
    facts = view.of(NAME)
    head.facts = facts.get(head.name)
    if isinstance(head.facts, dict) and "busy" in head.facts:
        # another preflight run holds the port on the head: nothing here is known to be wrong, and what
        # the other nodes reached is that run's listener or store: judge no node, say to retest
        return [Finding(NAME, None, Status.ERROR, "not tested: port %d on the head %s is in use by %s "
                        "(its all-reduce or its port test); retest when it has finished" % (
                            head.port, head.name, portclaim.describe(head.facts["busy"])),
                        action="retest", data={"busy": head.facts["busy"]})]
    out: List[Finding] = []
    if head.name in facts:
        err = probe_error(NAME, head.name, head.facts)
        if err:
            out.append(err)
        elif head.facts.get("listening"):
            head.ok = True
        else:
            head.failed = True
            out.append(_listen_failure(head.name, head.port, head.facts))
    ssh = view.of("ssh")  # the clock offsets _late_head corrects with
    out += _unreached_head(head, facts, ssh, rendezvous.head_sysctls(view)[0])
    for name, f in facts.items():
        if name != head.name:
            out.append(_connector_finding(head, name, f, ssh))
    if head.ok and not head.unreached:
        names = sorted({p["name"] for p in head.facts.get("peers") or [] if p.get("name")})
        out.append(Finding(NAME, head.name, Status.PASS, "listened on port %d; %s connected%s%s" % (
            head.port, plural(len(names), "peer"), " (%s)" % fold(names) if names else "",
            _squatter_text(head.facts)), actual=str(head.port)))
    return out


def _unreached_head(head: _Head, facts: Dict[str, Any], ssh: Dict[str, Any], somaxconn: Optional[int]) -> List[Finding]:
    """One finding on the head when most connectors could not reach the listening head (no foreign reply among
    them): the head's end, a firewall there (FAIL) or a listener too busy to answer (ERROR, retest, naming the
    head's net.core.somaxconn when it is below the connecting nodes: the kernel truncated the listener's backlog to
    it); a minority failing is each node's own path. Sets head.unreached to the nodes it covers."""
    connecting = {n: f for n, f in facts.items()
                  if n != head.name and isinstance(f, dict) and f.get("role") == "connect"}
    unreached = sorted((n for n, f in connecting.items() if not f.get("handshake") and not f.get("reply")), key=str)
    if not (head.ok and len(unreached) >= 2 and 2 * len(unreached) > len(connecting)):
        return []
    head.unreached = unreached
    busy = _overload(head.facts, unreached, sum(
        1 for n in unreached if _late_head(ssh, head.name, head.facts, n, connecting[n]) is not None))
    if busy and somaxconn is not None and somaxconn < len(connecting):
        busy += "; net.core.somaxconn %d on the head truncated its backlog below the %d connecting nodes: raise " \
                "it as the somaxconn check says" % (somaxconn, len(connecting))
    why = ("its listener, preflight's own, could not keep up (%s): the head overloaded, not a firewall; not "
           "tested, retest" % busy) if busy else "the head's end (a firewall on it dropping them), not theirs"
    return [Finding(
        NAME, head.name, Status.ERROR if busy else Status.FAIL, "%s of %s nodes could not reach or hear the head %s on "
        "port %d (%s): %s" % (len(unreached), len(connecting), head.name, head.port, fold(unreached), why),
        expected="every node connects and hears preflight's reply", actual="%d unreached" % len(unreached),
        data={"unreached": unreached}, action="retest" if busy else None)]


def _connector_finding(head: _Head, name: str, f: Any, ssh: Dict[str, Any]) -> Finding:
    """One connecting node's finding: PASS on preflight's reply; SKIP when the head's end is at fault; ERROR
    (retest) when the head was too busy to answer or listen in time; else FAIL with its errno's hint."""
    if name in head.unreached:
        return Finding(NAME, name, Status.SKIP, "not tested: most nodes could not reach the head %s on port %d "
                       "(its finding says why)" % (head.name, head.port))
    err = probe_error(NAME, name, f)
    if err:
        return err
    target = "%s:%s" % (f.get("host"), f.get("port", head.port))
    if head.failed:
        # The fault is the head's (its FAIL names it); this node is not at fault and nothing here was
        # judged: SKIP, so the node's status stays its own (an ERROR would fail every healthy node and
        # empty the hostfile)
        return Finding(NAME, name, Status.SKIP, "not tested: the head %s could not listen on port %d (its finding "
                       "says why)" % (head.name, head.port))
    if f.get("handshake"):
        return Finding(NAME, name, Status.PASS, "connected to %s on %s (%s)" % (head.name, target, _attempts(f)))
    if f.get("connected") and not f.get("reply"):
        # the head accepted the connection and said nothing, every try within the node's retry window: its
        # listener too busy to answer, which says nothing against this node; a foreign reply (below) does
        return Finding(NAME, name, Status.ERROR, "%s → %s %s: connected, but the head did not answer within "
                       "%ss (%s): not tested; retest" % (name, head.name, target, f.get("elapsed_s"),
                                                         f.get("error") or "no reply"), action="retest")
    if f.get("connected"):
        return Finding(NAME, name, Status.FAIL, "%s → %s %s: connected, but %s" % (
            name, head.name, target, f.get("error") or "no preflight reply"), expected="preflight's listener",
            actual=f.get("reply") or "no reply")
    late = _late_head(ssh, head.name, head.facts, name, f)
    if late is not None:
        when = ("only %.1fs after this node's last try" % late if late > 0 else
                "about when this node stopped trying (within the clocks' uncertainty)")
        return Finding(NAME, name, Status.ERROR, "%s → %s %s: refused for %ss, and the head began listening %s "
                       "(its probe started late: the head too busy): not tested; retest" % (
                           name, head.name, target, f.get("elapsed_s"), when), action="retest")
    closed = _closed_head(ssh, head.name, head.facts, name, f)
    if closed is not None:
        return Finding(NAME, name, Status.ERROR, "%s → %s %s: refused for %ss, and the head's listener had closed "
                       "its window %s (this node's probe started late: the node too busy): not tested; retest" % (
                           name, head.name, target, f.get("elapsed_s"),
                           "%.1fs before this node's first try" % closed if closed > 0 else
                           "about when this node began trying (within the clocks' uncertainty)"), action="retest")
    return Finding(NAME, name, Status.FAIL, "%s → %s %s: %s after %ss (%s)" % (
        name, head.name, target, _connect_hint(f.get("error"), f.get("errno")), f.get("elapsed_s"), f.get("error")),
        expected="a TCP connection to the rendezvous port", actual=f.get("errno") or f.get("error"))


def _late_head(ssh: Dict[str, Any], head: str, head_facts: Any, name: str, f: Dict[str, Any]) -> Optional[float]:
    """Seconds by which the head began listening after this node's last refused try, or None: a refusal that
    says nothing listened because nothing listened yet (at 1,000 simulated nodes on 2 cores, 6 healthy nodes
    FAILed 'refused' while the head's starved probe had not bound the port). `ssh`: view.of("ssh")."""
    if f.get("errno") != "ECONNREFUSED" or not isinstance(head_facts, dict):
        return None
    return _gap(ssh, (name, f.get("until_t")), (head, head_facts.get("from_t")))


def _closed_head(ssh: Dict[str, Any], head: str, head_facts: Any, name: str, f: Dict[str, Any]) -> Optional[float]:
    """Seconds by which the head's listener closed (its window over, preflight.checks.ports.probe.listen) before
    this node's first refused try, or None: a node whose probe started after the head had stopped listening
    was not tested (likely what FAILed 8 healthy nodes 'refused ... after 10s' at 256 simulated Slurm nodes on
    2 cores, load 330; their facts were not kept)."""
    if f.get("errno") != "ECONNREFUSED" or not isinstance(head_facts, dict) or None in (
            head_facts.get("from_t"), head_facts.get("elapsed_s"), f.get("until_t"), f.get("elapsed_s")):
        return None
    return _gap(ssh, (head, head_facts["from_t"] + head_facts["elapsed_s"]), (name, f["until_t"] - f["elapsed_s"]))


def _gap(ssh: Dict[str, Any], first: Tuple[str, Optional[float]], then: Tuple[str, Optional[float]]) -> Optional[float]:
    """Seconds from `first` to `then`, each (node, a time on its clock) taken back to the controller's clock by
    the ssh check's offsets, or None when a time is unknown or the gap is below zero by more than the clocks'
    uncertainty (counted in the gap's favour: the refusal is then not held against the node)."""
    if first[1] is None or then[1] is None:
        return None
    (first_off, first_err), (then_off, then_err) = (clock_offset(ssh.get(n) or {}) or (0.0, 0.0)
                                                    for n in (first[0], then[0]))
    gap = (then[1] - then_off) - (first[1] - first_off)
    return gap if gap + first_err + then_err > 0 else None


def _overload(head: Dict[str, Any], unreached: List[str], early: int) -> str:
    """The head's listener's traces of overload (preflight.probe.listenq), as text; '' when it left none."""
    late = set(unreached) & {p.get("name") for p in head.get("peers") or []}
    parts = [plural(n, word) + text for word, text, n in (
        ("connection", " still waiting to be accepted when its window closed", head.get("queued")),
        ("handshake", " dropped for a full accept queue", head.get("overflows")),
        ("node", " answered after giving up", len(late)),
        ("node", " stopped trying before it began listening", early)) if n]
    return ", ".join(parts)


def _attempts(f: Dict[str, Any]) -> str:
    n = f.get("attempts") or 1
    return "first try" if n == 1 else "after %d tries, %ss" % (n, f.get("elapsed_s"))


def _squatter_text(f: Dict[str, Any]) -> str:
    """'; preflight's run claim on it is held by pid 4242 of uid 1001 (...)', or '' when nobody squats it."""
    return "" if f.get("squatter") is None else "; " + portclaim.describe_squatter(f["squatter"])


def _listen_failure(head: str, port: int, f: Dict[str, Any]) -> Finding:
    free = f.get("free_ports") or []
    hint = "; try --master-port %d (free)" % free[0] if free else ""
    if f.get("errno") == "EADDRINUSE":
        message = "%s: port %d is held by %s%s" % (head, port, holder_text(f.get("holders") or []), _squatter_text(f) + hint)
    elif f.get("errno") == "EACCES":
        message = "%s: port %d needs privileges to bind (EACCES)%s" % (head, port, hint)
    else:
        message = "%s: cannot listen on port %d: %s" % (head, port, f.get("error"))
    return Finding(
        NAME,
        head,
        Status.FAIL,
        message,
        expected="port %d free on the head" % port,
        actual=f.get("errno") or f.get("error"),
        data={"holders": f.get("holders") or [], "free_ports": free},
    )

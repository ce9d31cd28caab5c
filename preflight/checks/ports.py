"""ports: the head node can listen on the rendezvous port, and every other node can connect to it.

Phase 2. The plan (from preflight.datanet.of) gives the head {role: listen, port, bind_ip, expect_peers, window_s}
and every other node {role: connect, host, port, retry_s}. All phase-2 probes start at about the same
time, so connecting nodes retry until the head's listener is up. The two ends shake hands with one line
each way, so a connection that lands on some other program holding the port is told apart from ours.

The head binds the wildcard address, as torch's TCPStore does (`wildcard: true` in the plan; bind_ip is
then informational): a holder on any local address makes the job's rendezvous fail the same way.

When the port is busy, the probe names the holder (socket inode from /proc/net/tcp{,6} matched against
/proc/*/fd links → pid and comm; the owning uid when the process is not visible) and the nearest free
ports above it.

Two preflight runs can meet on the head (a nightly audit and a manual run): the listener claims the port
for preflight first (preflight.probe.portclaim, as the all-reduce agent does while its store holds it),
and a claim held by another run is reported as that ("busy": its pid and uid), never bound over. The
rule then says the port could not be tested, at cluster level with action retest: nothing is wrong with
the head. Only a claim of this run's user or root is believed (SO_PEERCRED): a "squatter" of another uid is
named and the port tested as usual, so one that also holds the port FAILs with its pid and uid.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import clock_offset, fold, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, probe_error
from preflight.probe import listenq, portclaim

NAME = "ports"
DEFAULT_PORT = 29500
WINDOW_S = 15.0
RETRY_S = 10.0
#: how often the head's accept loop looks whether every peer has said hello, and how soon a node whose
#: connect was refused (the head not listening yet) tries again: phase 2 waits on both
POLL_S = 0.05
HELLO = b"preflight-hello "
REPLY = b"preflight-ok "
TCP_LISTEN = "0A"

_TCP_LINE = re.compile(
    r"^\s*\d+: ([0-9A-Fa-f]+):([0-9A-Fa-f]{4}) [0-9A-Fa-f]+:[0-9A-Fa-f]{4} ([0-9A-Fa-f]{2}) "
    r"[0-9A-Fa-f]+:[0-9A-Fa-f]+ [0-9A-Fa-f]+:[0-9A-Fa-f]+ [0-9A-Fa-f]+\s+(\d+)\s+\d+\s+(\d+)"
)


# ----------------------------------------------------------------------------------------------- parse


def _hex_ip(hex_addr: str) -> str:
    """/proc/net/tcp address: 32-bit words in host (little-endian) order; 8 hex digits IPv4, 32 IPv6."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return socket.inet_ntop(socket.AF_INET, words)
    if len(words) == 16:
        return socket.inet_ntop(socket.AF_INET6, words)
    raise ParseError("bad address %r in /proc/net/tcp" % hex_addr)


def parse_proc_net_tcp(text: str) -> List[Dict[str, Any]]:
    """/proc/net/tcp or tcp6 → [{local_ip, local_port, state ('0A' = LISTEN), uid, inode}]."""
    lines = text.splitlines()
    if not lines or not lines[0].strip().startswith("sl"):
        raise ParseError("/proc/net/tcp: missing header line")
    out = []
    for line in lines[1:]:
        if not line.strip():
            continue
        m = _TCP_LINE.match(line)
        if not m:
            raise ParseError("/proc/net/tcp: unexpected line %.100r" % line)
        out.append(
            {
                "local_ip": _hex_ip(m.group(1)),
                "local_port": int(m.group(2), 16),
                "state": m.group(3).upper(),
                "uid": int(m.group(4)),
                "inode": int(m.group(5)),
            }
        )
    return out


# ----------------------------------------------------------------------------------------------- probe


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def find_holders(port: int, proc: str = "/proc") -> List[Dict[str, Any]]:
    """Who holds TCP `port` on this host: [{pid, comm, uid, ip}] (pid/comm None when not visible to us)."""
    sockets: Dict[int, Dict[str, Any]] = {}
    for name in ("tcp", "tcp6"):
        text = _read(os.path.join(proc, "net", name))
        if text is None:
            continue
        for row in parse_proc_net_tcp(text):
            if row["local_port"] == port and row["inode"]:
                sockets.setdefault(row["inode"], row)
    if not sockets:
        return []
    # Listening sockets are the ones that make bind() fail; fall back to any socket on the port.
    listening = {i: r for i, r in sockets.items() if r["state"] == TCP_LISTEN}
    wanted = listening or sockets
    links = {"socket:[%d]" % inode: inode for inode in wanted}
    found: Dict[int, Dict[str, Any]] = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            inode = links.get(target)
            if inode is not None and inode not in found:
                comm = (_read(os.path.join(proc, pid, "comm")) or "").strip() or None
                found[inode] = {
                    "pid": int(pid),
                    "comm": comm,
                    "uid": wanted[inode]["uid"],
                    "ip": wanted[inode]["local_ip"],
                }
    out = []
    for inode, row in sorted(wanted.items()):
        out.append(found.get(inode) or {"pid": None, "comm": None, "uid": row["uid"], "ip": row["local_ip"]})
    return out


def _bind(addr: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
    except OSError:
        sock.close()
        raise
    return sock


def free_ports_above(addr: str, port: int, want: int = 3, limit: int = 50) -> List[int]:
    """The first `want` ports above `port` that bind and listen on `addr` right now (bind-tested)."""
    out = []
    for candidate in range(port + 1, min(port + 1 + limit, 65536)):
        try:
            sock = _bind(addr, candidate)
            sock.listen(1)
            sock.close()
        except OSError:
            continue
        out.append(candidate)
        if len(out) >= want:
            break
    return out


def _errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    return errno.errorcode.get(code, str(code)) if code is not None else type(exc).__name__


def listen(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Head side: bind, listen, accept hellos for up to window_s or until every expected peer came."""
    port = int(cfg["port"])
    addr = "0.0.0.0" if cfg.get("wildcard") else cfg.get("bind_ip") or "0.0.0.0"
    result: Dict[str, Any] = {"role": "listen", "port": port, "bind_ip": addr, "listening": False, "peers": []}
    claim = portclaim.claim(port)
    if claim.busy is not None:  # another preflight run (this user's or root's) uses the port on this node now
        result["busy"] = claim.busy
        result["error"] = "%s holds port %d" % (portclaim.describe(result["busy"]), port)
        return result
    result["squatter"] = claim.squatter  # another uid holding preflight's name: not believed, the port is tested
    try:
        return _listen_claimed(cfg, result, addr, port)
    finally:
        claim.close()


def _listen_claimed(cfg: Dict[str, Any], result: Dict[str, Any], addr: str, port: int) -> Dict[str, Any]:
    """listen(), once the port is claimed for this run."""
    window = float(cfg.get("window_s", WINDOW_S))
    expect = set(cfg.get("expect_peers") or [])
    expect_names = set(cfg.get("expect_names") or [])
    try:
        sock = _bind(addr, port)
        # every peer connects at about the same time (as a job's ranks reach TCPStore): a backlog smaller
        # than the peers overflows, and the kernel then drops the handshake's last ACK of the rest, whose
        # connect() has returned: they send hello and wait for a reply that never comes (at 1,000 simulated
        # nodes with listen(128): 972 healthy nodes "connected, then timed out")
        sock.listen(max(128, len(expect), len(expect_names)) + 16)
    except OSError as exc:
        result["error"] = "%s: %s" % (_errno_name(exc), exc.strerror or exc)
        result["errno"] = _errno_name(exc)
        if exc.errno == errno.EADDRINUSE:
            try:
                result["holders"] = find_holders(port)
            except (ParseError, OSError) as hexc:
                result["holders_error"] = str(hexc)
            result["free_ports"] = free_ports_above(addr, port)
        return result
    result["listening"] = True
    overflows = listenq.listen_overflows()  # the kernel's drops for a full accept queue: overload evidence
    started = result["from_t"] = time.time()
    lock = threading.Lock()
    workers: List[threading.Thread] = []
    seen_ips: set = set()
    seen_names: set = set()

    def serve(conn: socket.socket, peer: Tuple[Any, ...]) -> None:
        name = None
        try:
            conn.settimeout(3.0)
            data = b""
            while not data.endswith(b"\n") and len(data) < 512:
                chunk = conn.recv(512)
                if not chunk:
                    break
                data += chunk
            if data.startswith(HELLO):
                name = data[len(HELLO) :].strip().decode("utf-8", "replace")[:100]
                conn.sendall(REPLY + (cfg.get("name") or "head").encode() + b"\n")
        except OSError:
            pass
        finally:
            conn.close()
        with lock:
            result["peers"].append({"ip": peer[0], "name": name, "at_s": round(time.time() - started, 3)})
            seen_ips.add(peer[0])
            if name:
                seen_names.add(name)

    try:
        while True:
            left = window - (time.time() - started)
            with lock:
                done = (
                    (not expect and not expect_names)
                    or (expect and expect <= seen_ips)
                    or (expect_names and expect_names <= seen_names)
                )
            if left <= 0 or done:
                break
            sock.settimeout(min(left, POLL_S))  # wakes to see the last peer's hello recorded
            try:
                conn, peer = sock.accept()
            except socket.timeout:
                continue
            worker = threading.Thread(target=serve, args=(conn, peer), daemon=True)
            worker.start()
            workers.append(worker)
    finally:
        result["queued"] = listenq.accept_queue(sock)  # completed connections the listener never took
        sock.close()
        for worker in workers:
            worker.join(timeout=3.5)
    after = listenq.listen_overflows()
    result["overflows"] = after - overflows if after is not None and overflows is not None else None
    result["elapsed_s"] = round(time.time() - started, 3)
    return result


def connect(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Other nodes: connect to the head (retrying for up to retry_s), say hello, expect preflight's reply."""
    host, port = cfg["host"], int(cfg["port"])
    retry = float(cfg.get("retry_s", RETRY_S))
    source = cfg.get("source_ip")
    started = time.time()
    attempts = 0
    last_error = None
    last_errno = None
    while True:
        attempts += 1
        try:
            left = max(0.5, retry - (time.time() - started))
            conn = socket.create_connection(
                (host, port), timeout=min(3.0, left), source_address=(source, 0) if source else None
            )
        except OSError as exc:
            last_error = "%s" % (exc.strerror or exc)
            last_errno = _errno_name(exc)
            if time.time() - started + POLL_S >= retry:
                break
            time.sleep(POLL_S)  # the head's listener may start a moment after this node
            continue
        data = b""
        problem = None
        try:
            conn.settimeout(3.0)
            conn.sendall(HELLO + (cfg.get("name") or socket.gethostname()).encode() + b"\n")
            while not data.endswith(b"\n") and len(data) < 512:
                chunk = conn.recv(512)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            problem = "connected, then %s" % (exc.strerror or exc)
        finally:
            conn.close()
        handshake = data.startswith(REPLY)
        if not handshake and not data and time.time() - started + POLL_S < retry:
            # nothing came back (the head's accept queue was full, or its listener busy): not an answer from
            # some other program, so try again while this node's retry window lasts
            time.sleep(POLL_S)
            continue
        return {
            "role": "connect",
            "host": host,
            "port": port,
            "connected": True,
            "handshake": handshake,
            "reply": data[:100].decode("utf-8", "replace").strip(),
            "attempts": attempts,
            "elapsed_s": round(time.time() - started, 3),
            "error": None if handshake else (problem or "the listener did not answer as preflight"),
        }
    return {
        "role": "connect",
        "host": host,
        "port": port,
        "connected": False,
        "handshake": False,
        "attempts": attempts,
        "elapsed_s": round(time.time() - started, 3),
        "until_t": time.time(),  # when it stopped trying (the rule compares it with when the head listened)
        "error": last_error,
        "errno": last_errno,
    }


def probe(ctx: Any) -> Dict[str, Any]:
    cfg = ctx.config
    if cfg.get("skip"):
        return {"skipped": cfg["skip"]}
    role = cfg.get("role")
    if role == "listen":
        return listen(cfg)
    if role == "connect":
        return connect(cfg)
    raise ValueError("ports probe config has no role (the plan did not run?)")


# ------------------------------------------------------------------------------------------------ plan


def plan(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """{node: probe config}: the head listens on master_port, every other node connects to it."""
    from preflight import datanet

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


# ------------------------------------------------------------------------------------------------ rule


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


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    head = view.head.name
    port = int(view.cluster.get("master_port", DEFAULT_PORT))
    facts = view.of(NAME)
    head_facts = facts.get(head)
    head_ok = False
    if isinstance(head_facts, dict) and "busy" in head_facts:
        # another preflight run holds the port on the head: nothing here is known to be wrong, and what
        # the other nodes reached is that run's listener or store: judge no node, say to retest
        return [Finding(NAME, None, Status.ERROR, "not tested: port %d on the head %s is in use by %s "
                        "(its all-reduce or its port test); retest when it has finished" % (
                            port, head, portclaim.describe(head_facts["busy"])),
                        action="retest", data={"busy": head_facts["busy"]})]
    if head in facts:
        err = probe_error(NAME, head, head_facts)
        if err:
            out.append(err)
        elif head_facts.get("listening"):
            head_ok = True
        else:
            out.append(_listen_failure(head, port, head_facts))
    # Most nodes failing to reach the listening head (no foreign reply among them) is the head's end: a firewall
    # there, or a listener too busy to answer (1,000 simulated nodes on 2 cores: 606 connect timeouts, 380
    # silences). One finding on the head, those nodes not tested; a minority failing is each node's own path.
    ssh = view.of("ssh")  # the clock offsets _late_head corrects with
    connecting = {n: f for n, f in facts.items() if n != head and isinstance(f, dict) and f.get("role") == "connect"}
    unreached = sorted((n for n, f in connecting.items() if not f.get("handshake") and not f.get("reply")), key=str)
    head_unreached = head_ok and len(unreached) >= 2 and 2 * len(unreached) > len(connecting)
    if head_unreached:
        busy = _overload(head_facts, unreached, sum(
            1 for n in unreached if _late_head(ssh, head, head_facts, n, connecting[n]) is not None))
        why = ("its listener, preflight's own, could not keep up (%s): the head overloaded, not a firewall; not "
               "tested, retest" % busy) if busy else "the head's end (a firewall on it dropping them), not theirs"
        out.append(Finding(
            NAME, head, Status.ERROR if busy else Status.FAIL, "%s of %s nodes could not reach or hear the head %s on "
            "port %d (%s): %s" % (len(unreached), len(connecting), head, port, fold(unreached), why),
            expected="every node connects and hears preflight's reply", actual="%d unreached" % len(unreached),
            data={"unreached": unreached}, action="retest" if busy else None))
    for name, f in facts.items():
        if name == head:
            continue
        if head_unreached and name in unreached:
            out.append(Finding(NAME, name, Status.SKIP,
                               "not tested: most nodes could not reach the head %s on port %d (its finding says "
                               "why)" % (head, port)))
            continue
        err = probe_error(NAME, name, f)
        if err:
            out.append(err)
            continue
        target = "%s:%s" % (f.get("host"), f.get("port", port))
        if (
            head in facts
            and not head_ok
            and not probe_error(NAME, head, head_facts)
        ):
            # The fault is the head's (its FAIL names it); this node is not at fault and nothing here was
            # judged: SKIP, so the node's status stays its own (255 healthy nodes of a 256-node run read
            # 'fail' and left the hostfile when this was an ERROR: issue 22's 256-node run).
            out.append(Finding(NAME, name, Status.SKIP,
                               "not tested: the head %s could not listen on port %d (its finding says why)" % (head, port)))
            continue
        if f.get("handshake"):
            out.append(Finding(NAME, name, Status.PASS, "connected to %s on %s (%s)" % (head, target, _attempts(f))))
        elif f.get("connected") and not f.get("reply"):
            # the head accepted the connection and said nothing, every try within the node's retry window: its
            # listener too busy to answer (at 1,000 simulated nodes on 2 shared cores, 199 healthy nodes), which
            # says nothing against this node; a foreign reply (below) does
            out.append(Finding(NAME, name, Status.ERROR, "%s → %s %s: connected, but the head did not answer within "
                               "%ss (%s): not tested; retest" % (name, head, target, f.get("elapsed_s"),
                                                                 f.get("error") or "no reply"), action="retest"))
        elif f.get("connected"):
            out.append(Finding(NAME, name, Status.FAIL, "%s → %s %s: connected, but %s" % (
                name, head, target, f.get("error") or "no preflight reply"), expected="preflight's listener",
                actual=f.get("reply") or "no reply"))
        elif (late := _late_head(ssh, head, head_facts, name, f)) is not None:
            out.append(Finding(NAME, name, Status.ERROR, "%s → %s %s: refused for %ss, and the head began listening only "
                               "%.1fs after this node's last try (its probe started late: the head too busy): not "
                               "tested; retest" % (name, head, target, f.get("elapsed_s"), late), action="retest"))
        else:
            out.append(Finding(NAME, name, Status.FAIL, "%s → %s %s: %s after %ss (%s)" % (
                name, head, target, _connect_hint(f.get("error"), f.get("errno")), f.get("elapsed_s"), f.get("error")),
                expected="a TCP connection to the rendezvous port", actual=f.get("errno") or f.get("error")))
    if head_ok and not head_unreached:
        names = sorted({p["name"] for p in head_facts.get("peers") or [] if p.get("name")})
        out.append(Finding(NAME, head, Status.PASS, "listened on port %d; %s connected%s%s" % (
            port, plural(len(names), "peer"), " (%s)" % fold(names) if names else "", _squatter_text(head_facts)),
            actual=str(port)))
    return out


def _late_head(ssh: Dict[str, Any], head: str, head_facts: Any, name: str, f: Dict[str, Any]) -> Optional[float]:
    """Seconds by which the head began listening after this node's last refused try (both clocks taken back to
    the controller's by the ssh check's offsets, their uncertainty counted in the head's favour), or None: a
    refusal that says nothing listened because nothing listened yet (at 1,000 simulated nodes on 2 cores, 6
    healthy nodes FAILed 'refused' while the head's starved probe had not bound the port). `ssh`: view.of("ssh")."""
    if f.get("errno") != "ECONNREFUSED" or not isinstance(head_facts, dict) or None in (
            head_facts.get("from_t"), f.get("until_t")):
        return None
    (head_off, head_err), (off, err) = (clock_offset(ssh.get(n) or {}) or (0.0, 0.0) for n in (head, name))
    late = (head_facts["from_t"] - head_off) - (f["until_t"] - off)
    return late if late + head_err + err > 0 else None


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


CHECK = Check(
    name=NAME,
    claim="The head node can listen on the rendezvous port and every node can connect to it",
    why="torchrun/TCPStore rendezvous needs the master port free on the head and reachable from every node; "
    "a stale process or a firewall makes the job hang at startup until its timeout.",
    fix="Stop the process holding the port (or pass another --master-port), and open the port on the head's "
    "firewall for the data network (firewall-cmd --add-port=29500/tcp, or the ufw/iptables equivalent); a port "
    "another preflight run holds is reported as that: retest when it has finished.",
    probe=probe,
    rule=rule,
    phase=2,
    plan=plan,
    needs=("nic",),
    action="fix_config",
    reads="binds the rendezvous port on the head; a TCP connect from every node (phase 2)",
    takes="< 1 s",
    order=80,
)

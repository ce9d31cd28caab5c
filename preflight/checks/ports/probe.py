"""The ports check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import errno
import os
import re
import socket
import threading
import time

from preflight.node_model import ParseError
from preflight.probe import listenq, portclaim

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

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


def _bind(addr: str, port: int, backlog: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        if backlog:
            sock.listen(backlog)
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


def _open_listener(result: Dict[str, Any], addr: str, port: int, backlog: int) -> Optional[socket.socket]:
    """The listening socket, or None with why in `result`."""
    try:
        return _bind(addr, port, backlog)
    except OSError as exc:
        result["error"] = "%s: %s" % (_errno_name(exc), exc.strerror or exc)
        result["errno"] = _errno_name(exc)
        if exc.errno == errno.EADDRINUSE:
            try:
                result["holders"] = find_holders(port)
            except (ParseError, OSError) as hexc:
                result["holders_error"] = str(hexc)
            result["free_ports"] = free_ports_above(addr, port)
        return None


def _listen_claimed(cfg: Dict[str, Any], result: Dict[str, Any], addr: str, port: int) -> Dict[str, Any]:
    """listen(), once the port is claimed for this run."""
    window = float(cfg.get("window_s", WINDOW_S))
    expect = set(cfg.get("expect_peers") or [])
    expect_names = set(cfg.get("expect_names") or [])
    # peers connect at about once (as a job's ranks reach TCPStore): a backlog below their number overflows, the
    # kernel drops the last ACK of the rest, and their hello waits for a reply that never comes
    sock = _open_listener(result, addr, port, max(128, len(expect), len(expect_names)) + 16)
    if sock is None:
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

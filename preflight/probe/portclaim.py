"""A preflight run's claim on a rendezvous port, so that two runs that meet on a node tell each other apart.

Standard library only, Linux. The claim is an abstract Unix socket named for the port
("\\0preflight-port-29500"), bound and listening for as long as the run uses the port: the ports
check's listener while it proves the port, the all-reduce agent on every node while its ranks run. The
abstract namespace belongs to the network namespace, as the TCP port does, so the claim is seen exactly
where the port would clash (the same host, the same pod), whichever controller started the run. The
kernel drops the name when its last holder exits, even on SIGKILL: there is no stale lock to clean up,
and no file anyone could plant a symlink at.

A run that finds the name taken connects to it; SO_PEERCRED then names the holder's pid and uid (the
holder never accepts: the connection waits in its backlog until the client closes it).

The controller claims the nodes it runs the all-reduce on the same way ("\0preflight-node-<digest of the
host>"): two runs started from one machine on overlapping nodes see each other before either launches,
whatever ports they use.
"""

from __future__ import annotations

import errno
import hashlib
import socket
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

PREFIX = "preflight-port-"
NODE_PREFIX = "preflight-node-"


def _address(port: int) -> str:
    return "\0%s%d" % (PREFIX, int(port))


def _node_address(host: str) -> str:
    return "\0%s%s" % (NODE_PREFIX, hashlib.sha256(host.encode("utf-8", "replace")).hexdigest()[:32])


def claim(port: int) -> Optional[socket.socket]:
    """The bound, listening claim on `port` (keep it open while the port is in use; close it after), or
    None when another process holds the claim. A system without abstract Unix sockets gets a socket
    that claims nothing, so the run goes on as before."""
    return _claim(_address(port))


def claim_nodes(hosts: Sequence[str]) -> Tuple[List[socket.socket], Dict[str, Dict[str, Any]]]:
    """On the controller: claim every host for this run's all-reduce. ([claims], {}) when all were free
    (close the claims when done); ([], {host: holder()}) when another run on this machine holds some,
    none kept."""
    taken: List[socket.socket] = []
    held: Dict[str, Dict[str, Any]] = {}
    for host in sorted(set(hosts)):
        sock = _claim(_node_address(host))
        if sock is None:
            held[host] = _holder(_node_address(host)) or {}
        else:
            taken.append(sock)
    if held:
        for sock in taken:
            sock.close()
        return [], held
    return taken, {}


def _claim(address: str) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(16)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:  # another run holds the name
            return None
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # unsupported here: claim nothing
    sock.set_inheritable(False)  # the ranks and probes this process starts do not keep it alive
    return sock


def holder(port: int) -> Optional[Dict[str, Any]]:
    """{"pid", "uid"} of the process holding the claim on `port`, {} when it is held but its credentials
    cannot be read, or None when nobody holds it."""
    return _holder(_address(port))


def _holder(address: str) -> Optional[Dict[str, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(address)
    except socket.timeout:  # held, with a full backlog
        sock.close()
        return {}
    except OSError:  # ECONNREFUSED / ENOENT: nobody holds it
        sock.close()
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERCRED", 17), struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", raw)
        return {"pid": pid, "uid": uid}
    except OSError:
        return {}
    finally:
        sock.close()


def describe(found: Optional[Dict[str, Any]]) -> str:
    """'another preflight run (pid 1234, uid 0)' for a holder() answer."""
    if found and found.get("pid"):
        return "another preflight run (pid %d, uid %d)" % (found["pid"], found.get("uid", -1))
    return "another preflight run"

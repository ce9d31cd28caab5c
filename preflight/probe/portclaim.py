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

Abstract names have no permissions: any local user can bind one. So a claim is trusted only when the kernel
says (SO_PEERCRED) its holder runs as this run's user or as root; a name held by any other uid, or by a
holder whose credentials cannot be read, is a squatter: the run goes on without a claim, and what the
squatter does to the port is judged for what it is (the ports check's bind names it). Trusting it would let
anyone make a busy rendezvous port read "another preflight run, retest", or stop every all-reduce on a shared
login node by binding one node's name. Limit: where a squatter holds a name, two runs of this user that meet
there are told apart only by the port itself (the ports check's bind, the all-reduce store's run id).

The controller claims the nodes it runs the all-reduce on the same way ("\0preflight-node-<digest of the
host>"): two runs started from one machine on overlapping nodes see each other before either launches,
whatever ports they use.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Sequence, Tuple

PREFIX = "preflight-port-"
NODE_PREFIX = "preflight-node-"
#: Connections a claim keeps waiting while their runs read its holder's credentials (each closes at once).
BACKLOG = 128


class Claim:
    """This run's claim on a name: held (sock), refused because a trusted run holds it (busy), or not taken
    because a process of another uid squats the name (squatter: the run goes on). close() when done."""

    def __init__(self, sock: Optional[socket.socket] = None, busy: Optional[Dict[str, Any]] = None,
                 squatter: Optional[Dict[str, Any]] = None) -> None:
        self.sock = sock  # bound and listening: this run holds the name (None: it holds nothing)
        self.busy = busy  # {"pid", "uid"} of the trusted run (this uid or root) holding the name
        self.squatter = squatter  # {"pid", "uid"} of an untrusted holder ({}: its credentials unreadable)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def _address(port: int) -> str:
    return "\0%s%d" % (PREFIX, int(port))


def node_name(host: str) -> str:
    """The abstract name (without its leading NUL) of the controller's claim on `host`."""
    return "%s%s" % (NODE_PREFIX, hashlib.sha256(host.encode("utf-8", "replace")).hexdigest()[:32])


def _node_address(host: str) -> str:
    return "\0" + node_name(host)


def claim(port: int) -> Claim:
    """This run's claim on `port` (keep it open while the port is in use; close it after). claim.busy says
    another trusted run holds it (do not use the port); a squatter, or a system without abstract Unix
    sockets, leaves the run unclaimed and free to go on."""
    return _claim(_address(port))


def claim_nodes(hosts: Sequence[str]) -> Tuple[List[Claim], Dict[str, Dict[str, Any]]]:
    """On the controller: claim every host for this run's all-reduce. ([claims], {}) when no trusted run
    holds any (close the claims when done; a host whose name another uid squats is left unclaimed);
    ([], {host: holder}) when another trusted run on this machine holds some, none kept."""
    taken: List[Claim] = []
    held: Dict[str, Dict[str, Any]] = {}
    for host in sorted(set(hosts)):
        got = _claim(_node_address(host))
        if got.busy is not None:
            held[host] = got.busy
        else:
            taken.append(got)
    if held:
        for got in taken:
            got.close()
        return [], held
    return taken, {}


def trusted(found: Optional[Dict[str, Any]]) -> bool:
    """Whether a holder() answer is a claim this run may believe: held by this run's user or by root."""
    return bool(found) and found.get("uid") in (0, os.geteuid())


def _claim(address: str, tries: int = 3) -> Claim:
    for _ in range(tries):  # a holder that leaves between our bind and our look is retried
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address)
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:  # no abstract sockets here: claim nothing, go on as before
                return Claim()
            found = _holder(address)
            if found is None:
                continue
            return Claim(busy=found) if trusted(found) else Claim(squatter=found)
        sock.set_inheritable(False)  # the ranks and probes this process starts do not keep it alive
        return Claim(sock)
    return Claim()


def holder(port: int) -> Optional[Dict[str, Any]]:
    """{"pid", "uid"} of the process holding the claim on `port`, {} when it is held but its credentials
    cannot be read, or None when nobody holds it."""
    return _holder(_address(port))


def _holder(address: str) -> Optional[Dict[str, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)  # a full backlog answers EAGAIN at once: a squatter cannot make a run wait
    try:
        sock.connect(address)
    except BlockingIOError:  # held, with a full backlog: credentials unknown, so never believed
        sock.close()
        return {}
    except OSError:  # ECONNREFUSED / ENOENT: nobody holds it
        sock.close()
        return None
    try:  # the credentials the kernel recorded when the holder called listen(): not the holder's word
        raw = sock.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERCRED", 17), struct.calcsize("iII"))
        pid, uid, _gid = struct.unpack("iII", raw)
        return {"pid": pid, "uid": uid}
    except OSError:
        return {}
    finally:
        sock.close()


def describe_squatter(found: Dict[str, Any]) -> str:
    """"preflight's run claim on it is held by pid 4242 of uid 1001 (not …)" for a Claim.squatter."""
    who = "pid %d of uid %d" % (found["pid"], found.get("uid", -1)) if found.get("pid") else \
        "a process whose credentials could not be read"
    return "preflight's run claim on it is held by %s (not this run's user or root: not believed)" % who


def describe(found: Optional[Dict[str, Any]]) -> str:
    """'another preflight run (pid 1234, uid 0)' for a holder() answer."""
    if found and found.get("pid"):
        return "another preflight run (pid %d, uid %d)" % (found["pid"], found.get("uid", -1))
    return "another preflight run"

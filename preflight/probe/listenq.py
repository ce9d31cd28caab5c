"""What the kernel says of a listening TCP socket that could not keep up: the ports check's overload evidence.

Standard library only, Linux. When most nodes cannot reach or hear the head's rendezvous listener, the
cause is either on the path (a firewall dropping SYNs: the head's kernel never sees them) or the listener
too busy to take the connections its kernel completed. Only the second leaves traces on the head:

- connections the kernel completed and queued that the listener never accepted: a listening socket's
  TCP_INFO reports its accept queue's length in `tcpi_unacked` (and the queue's limit in `tcpi_sacked`):
  Linux net/ipv4/tcp.c, tcp_get_info(), "if (sk->sk_state == TCP_LISTEN)";
- handshakes the kernel dropped because that queue was full: TcpExt `ListenOverflows` in
  /proc/net/netstat (per network namespace; Linux net/ipv4/proc.c, LINUX_MIB_LISTENOVERFLOWS). Another
  listener of the same namespace overflowing in the window counts too: the head's finding is then an error
  to retest rather than a FAIL, the side that drains nothing.

Seen at 1,000 simulated nodes on 2 shared cores: the head's listener, starved, answered 156 of 999 nodes
and was FAILed as "a firewall on it"; a real head with its own cores is not starved, and a run where it is
says so (retest) instead of blaming the head's configuration.
"""

from __future__ import annotations

import socket
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Optional

#: offset of tcpi_unacked in struct tcp_info (linux/tcp.h): 8 one-byte fields, then rto, ato, snd_mss,
#: rcv_mss as 32-bit words
_UNACKED_AT = 8 + 4 * 4
NETSTAT = "/proc/net/netstat"


def accept_queue(sock: socket.socket) -> Optional[int]:
    """Connections waiting in a listening socket's accept queue (completed, not yet accepted); None if unknown."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError):
        return None
    if len(info) < _UNACKED_AT + 4:
        return None
    return struct.unpack_from("=I", info, _UNACKED_AT)[0]


def parse_listen_overflows(text: str) -> Optional[int]:
    """TcpExt ListenOverflows from /proc/net/netstat's text (a header line, then a value line); None if absent."""
    lines = text.splitlines()
    for header, values in zip(lines, lines[1:]):
        if header.startswith("TcpExt:") and values.startswith("TcpExt:"):
            fields = dict(zip(header.split()[1:], values.split()[1:]))
            value = fields.get("ListenOverflows")
            return int(value) if value is not None and value.isdigit() else None
    return None


def listen_overflows(path: str = NETSTAT) -> Optional[int]:
    """Handshakes this network namespace's kernel dropped for a full accept queue, since boot; None if unreadable."""
    try:
        with open(path) as fh:
            return parse_listen_overflows(fh.read())
    except OSError:
        return None

"""somaxconn: the head's listen backlog holds the rendezvous's burst of connections.

Every rank of a job connects to rank 0's TCPStore on the head at about the same moment (torchrun's workers to
the agent's store, preflight's all-reduce ranks to rank 0's). The store asks listen() for a large backlog, and
the kernel silently truncates it to net.core.somaxconn (listen(2): "If the backlog argument is greater than the
value in /proc/sys/net/core/somaxconn, then it is silently truncated to that value. Since Linux 5.4, the
default in this file is 4096; in earlier kernels, the default value is 128"; Documentation/networking/
ip-sysctl.rst: somaxconn "Limit of socket listen() backlog, known in userspace as SOMAXCONN. Defaults to 4096.
(Was 128 before linux-5.4)"). A burst larger than the accept queue overflows it: the kernel drops the SYNs (and
final ACKs) it has no room for, counts them as TcpExt ListenOverflows (the ports check reads that counter), and
each client whose SYN was dropped waits out TCP's SYN retransmission, 1 s and then 3 s after its first try.
Measured (benchmarks/rendezvous_scale.py, real torch TCPStore clients, docs/speed.md): with somaxconn 128
(RHEL 8's 4.18, Ubuntu 18.04's 4.15) 256 ranks connect in 1.12 s instead of 0.40 s and 1,024 in 3.24 s
instead of 2.2 s; 64 ranks (0.08 s) and 128 ranks (0.06 s) are not slowed.

tcp_max_syn_backlog (ip-sysctl.rst: "Maximal number of remembered connection requests (SYN_RECV) ... This is a
per-listener limit") is read and reported beside it: it bounds the SYN queue only where syncookies are off
(tcp_conn_request), so it is named in the fix, never judged alone.

Both are per network namespace and read where the store listens: the probe's own /proc/sys/net (the host's
over SSH and Slurm; the node's under Kubernetes, whose agent pod and all-reduce Jobs use hostNetwork).

Facts schema::

    somaxconn            int | None   (None: /proc/sys/net/core/somaxconn could not be read)
    tcp_max_syn_backlog  int | None   (/proc/sys/net/ipv4/tcp_max_syn_backlog)

Rule: only the head (the node hosting rank 0, view.head) is judged; every other node SKIPs. The ranks that
connect at once are the all-reduce's world size over the inventory: one per GPU with nccl (also the workers of a
torchrun job on these nodes), one per node with gloo (CPU nodes). somaxconn below them WARNs (fix_config) with
the cost and the sysctl; at or above them PASSes saying the value; unreadable WARNs 'unknown', never PASSes.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "somaxconn"

CHECK = Check(
    name=NAME,
    claim="The head's listen backlog (net.core.somaxconn) holds every rank connecting to the rendezvous store at once",
    why="The kernel truncates the store's listen backlog to net.core.somaxconn (128 before Linux 5.4: RHEL 8, "
    "Ubuntu 18.04); when more ranks connect at once, their SYNs are dropped and each waits out TCP's 1 s and 3 s "
    "SYN retransmissions: 1,024 ranks took 3.24 s instead of 2.2 s to connect at 128.",
    fix="On the head: sysctl -w net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096 (at least the number "
    "of ranks), and persist it in /etc/sysctl.d/ (e.g. 90-rendezvous.conf) so it survives a reboot.",
    action="fix_config",
    reads="/proc/sys/net/core/somaxconn, /proc/sys/net/ipv4/tcp_max_syn_backlog",
    takes="< 0.1 s",
    order=78,
)

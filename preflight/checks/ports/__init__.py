"""ports: the head node can listen on the rendezvous port, and every other node can connect to it.

Phase 2. The plan (from preflight.derived.datanet.of) gives the head {role: listen, port, bind_ip, expect_peers, window_s}
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

from preflight.model import Check

NAME = "ports"

CHECK = Check(
    name=NAME,
    claim="The head node can listen on the rendezvous port and every node can connect to it",
    why="torchrun/TCPStore rendezvous needs the master port free on the head and reachable from every node; "
    "a stale process or a firewall makes the job hang at startup until its timeout.",
    fix="Stop the process holding the port (or pass another --master-port), and open the port on the head's "
    "firewall for the data network (firewall-cmd --add-port=29500/tcp, or the ufw/iptables equivalent); a port "
    "another preflight run holds is reported as that: retest when it has finished.",
    phase=2,
    needs=("nic", "somaxconn"),
    action="fix_config",
    reads="binds the rendezvous port on the head; a TCP connect from every node (phase 2)",
    takes="< 1 s",
    order=80,
)

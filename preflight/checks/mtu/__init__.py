"""mtu: the data interfaces agree on their MTU, and full-size frames cross the network between the nodes.

Phase 2. The plan (built on the controller from the nic facts, via preflight.derived.datanet.of) has each node ping its
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

from preflight.model import Check, Setting

NAME = "mtu"
#: expect.mtu, read by nic too (node mode judges it there: no partner to ping); declared alike in both
EXPECT_MTU = Setting("expect.mtu", "int", "the MTU every data interface has (else the cluster majority)", low=576, high=65536)

CHECK = Check(
    name=NAME,
    claim="The data interfaces share one MTU and full-size frames cross every tested path",
    why="A switch port or node left at MTU 1500 on a 9000 network passes small messages and silently drops "
    "large frames: rendezvous succeeds, then NCCL hangs on the first big collective.",
    fix="Set the same MTU on every data interface and on the switch ports between them (ip link set IF mtu 9000; "
    "persist it in netplan/NetworkManager); re-run with mtu_full_mesh: true to localise a bad link.",
    phase=2,
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

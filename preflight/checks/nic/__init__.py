"""nic: every node has an up data interface, with an IPv4 address in a subnet the other nodes share.

The probe lists the node's interfaces (`ip -j -d addr show`: addresses and link kinds in one, and the sysfs attributes
speed, type and device). Which of them is each node's data network is decided on the controller by
`preflight.derived.datanet.of(view)` (the policy is documented there; derived once, carried on the view), the one
choice the mtu and ports checks, the NCCL env-file writer and the bench launcher share. The rule reports
that choice: a node with no data interface FAILs; differing interface names and a node slower than the
majority WARN. A chosen
interface that is a fallback from a data NIC that is down FAILs ("data NIC down", see _fell_back: on a
node checked alone, as `preflight node` runs, datanet has no partner node's evidence), and so does, on a
node alone, a chosen interface at another MTU than `expect.mtu` (issue 26 item 13).
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "nic"
#: expect.mtu: the data interface's MTU (the mtu check reads it too, declared alike)
EXPECT_MTU = Setting("expect.mtu", "int", "the MTU every data interface has (else the cluster majority)", low=576, high=65536)

CHECK = Check(
    name=NAME,
    claim="Every node has an up data interface with an IPv4 address in a subnet all nodes share (a node checked "
    "alone: no data NIC down, at expect.mtu)",
    why="NCCL's bootstrap and gloo pick a socket interface; a wrong pick (docker0, a 1 GbE management port, "
    "an interface that differs per node) hangs rendezvous or runs collectives at a fraction of line rate.",
    fix="Bring the data interface up with its address (ip link set IF up; check netplan/NetworkManager), or pin "
    "it with data_interface: in the inventory; export NCCL_SOCKET_IFNAME as printed in the env file.",
    action="fix_config",
    reads="ip -j -d addr show; sysfs class/net/*/{speed,operstate,device}",
    takes="< 0.1 s",
    order=50,
    settings=(EXPECT_MTU,),
)

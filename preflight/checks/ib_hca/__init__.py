"""ib_hca: every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, alike on every node.

The probe reads the sysfs tree the RDMA core publishes (`class/infiniband/<hca>/ports/<n>/...`); no
rdma-core tools (ibstat, ibv_devinfo) are needed on the node. `usable_hcas(view)` is the helper the
NCCL env-file writer uses for NCCL_IB_HCA / NCCL_IB_GID_INDEX.

Ports are judged by their role. The rails (the ports NCCL uses) are the ACTIVE ports of the link layer
most ports have, less those run at another rate by design; the others are frontend/storage ports or spares.
"The same port" is a port's name (mlx5_3:1), link layer and card model (hca_type, else board_id) on the
other nodes: a port ACTIVE on two nodes or more is expected at the rate most of them run it at.
- no HCA anywhere: SKIP ("no InfiniBand/RoCE HCA"), unless the inventory expects some (`expect.ib_hcas`
  or `expect.ib_rate_gbps`): then FAIL. A node without HCAs while other nodes have them: FAIL.
- a port not ACTIVE/LinkUp: FAIL, except when `expect.ib_hcas` is set and the node still has that many
  usable ports (an uncabled spare port): WARN. A port administratively Disabled that is not a rail (another
  layer than the rails, or Disabled on every node) is named as a spare in the PASS.
- a rail whose rate differs from `expect.ib_rate_gbps`, else from the rails' rate (the most common rate of
  the layer's ACTIVE ports); any other port whose rate differs from the same port on the other nodes:
  FAIL (a degraded width/speed paces every collective). A port of the rails' layer run at another rate on
  most nodes, or (no other node has it) on another card model than the rails, is a frontend port; with
  neither to tell, it is judged as a rail. No majority rate for a rail: FAIL naming the split.
- usable ports (ACTIVE at the expected rate) fewer than `expect.ib_hcas`, or fewer than the cluster
  majority: FAIL.
- locked-memory limit (ssh facts, memlock_soft; None = unlimited) on nodes with an active port or EFA
  device: below 1 GiB FAIL (RDMA memory registration fails or NCCL falls back to sockets), limited but
  >= 1 GiB WARN (set it unlimited), unlimited PASS.
- AWS EFA devices (the efa driver in device/uevent, else PCI vendor 0x1d0f; link_layer 'Unknown') are
  their own fabric, under "efa" in the facts with kind "efa": never an HCA for NCCL's InfiniBand transport
  nor in NCCL_IB_HCA (NCCL drives EFA through the aws-ofi-nccl plugin). PASS naming them; WARN
  (fix_config) for fewer devices than most EFA nodes have, or a device not ACTIVE. Real layout: link_layer
  'Unknown' in linux-rdma/rdma-core#884, ibstat of efa_0 in amzn/amzn-drivers#114, rdmap<bus>s0 names in
  aws/eks-charts#1110, the driver binding as NVIDIA/NVSentinel docs/nic-health-monitor.md reads it.
Real mixed nodes behind the role rules: kvcache-ai/Mooncake#2039 (ConnectX-7 InfiniBand rails at 400, CX-6
Dx Ethernet ports Down/Disabled), #1999 (CX-7 RoCE rails beside CX-6 Dx ports), imbue-ai/cluster-health#4.
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "ib_hca"

CHECK = Check(
    name=NAME,
    claim="Every InfiniBand/RoCE rail is ACTIVE at the rails' rate, every other port as on the other nodes; EFA devices ACTIVE",
    why="NCCL spreads traffic over every HCA it is told to use; one DOWN or slow port stalls or slows every "
    "collective, and a small locked-memory limit makes RDMA registration fail at startup.",
    fix="Check cables and the switch port (ibstat, mlxlink -d DEV), the subnet manager (sminfo), and firmware; "
    "set `* - memlock unlimited` in /etc/security/limits.conf (and LimitMEMLOCK=infinity for services).",
    needs=("ssh",),
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}, device ids, device/uevent",
    takes="< 0.1 s",
    order=60,
    settings=(
        Setting("expect.ib_hcas", "int", "ACTIVE HCA ports every node has (else the cluster majority)", low=0, high=65536),
        Setting("expect.ib_rate_gbps", "number", "the rate every rail (a port NCCL uses) runs at", low=0.001, high=100000, unit="Gb/s"),
    ),
)

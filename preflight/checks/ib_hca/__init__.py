"""ib_hca: every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, alike on every node.

The probe reads the sysfs tree the RDMA core publishes (`class/infiniband/<hca>/ports/<n>/...`); no
rdma-core tools (ibstat, ibv_devinfo) are needed on the node. `usable_hcas(view)` is the helper the
NCCL env-file writer uses for NCCL_IB_HCA / NCCL_IB_GID_INDEX.

Rule decisions:
- no HCA anywhere: SKIP ("no InfiniBand/RoCE HCA"), unless the inventory expects some (`expect.ib_hcas`
  or `expect.ib_rate_gbps`): then FAIL. A node without HCAs while other nodes have them: FAIL.
- a port not ACTIVE/LinkUp: FAIL, except when `expect.ib_hcas` is set and the node still has that many
  usable ports (an uncabled spare port): WARN.
- an ACTIVE port whose rate differs from `expect.ib_rate_gbps`, or else from the cluster majority for its
  link layer: FAIL (a degraded width/speed paces every collective).
- usable ports (ACTIVE at the expected rate) fewer than `expect.ib_hcas`, or fewer than the cluster
  majority: FAIL.
- locked-memory limit (ssh facts, memlock_soft; None = unlimited) on nodes with an active port:
  below 1 GiB FAIL (RDMA memory registration fails or NCCL falls back to sockets), limited but >= 1 GiB
  WARN (set it unlimited), unlimited PASS.
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "ib_hca"

CHECK = Check(
    name=NAME,
    claim="Every InfiniBand/RoCE HCA port is ACTIVE at the expected rate, with the same ports on every node",
    why="NCCL spreads traffic over every HCA it is told to use; one DOWN or slow port stalls or slows every "
    "collective, and a small locked-memory limit makes RDMA registration fail at startup.",
    fix="Check cables and the switch port (ibstat, mlxlink -d DEV), the subnet manager (sminfo), and firmware; "
    "set `* - memlock unlimited` in /etc/security/limits.conf (and LimitMEMLOCK=infinity for services).",
    needs=("ssh",),
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/{state,phys_state,rate,link_layer}, device ids",
    takes="< 0.1 s",
    order=60,
    settings=(
        Setting("expect.ib_hcas", "int", "ACTIVE HCA ports every node has (else the cluster majority)", low=0, high=65536),
        Setting("expect.ib_rate_gbps", "number", "the rate every active port runs at", low=0.001, high=100000, unit="Gb/s"),
    ),
)

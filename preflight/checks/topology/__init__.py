"""topology: every GPU and RDMA NIC links at its full PCIe width and speed, and GPU↔NIC affinity is alike on every node.

The probe walks the sysfs root: NVIDIA GPUs are the PCI functions of vendor 0x10de and class 0x0300/0x0302
under ``bus/pci/devices``; NICs are the RDMA HCAs under ``class/infiniband/<hca>/device``. For each it reads the
kernel's PCIe link attributes (``current_link_width``, ``max_link_width``, ``current_link_speed``,
``max_link_speed``; speeds as "16.0 GT/s PCIe", or "8 GT/s" on kernels before 4.19, "Unknown" without link),
the same attributes of the bridge above it (the slot), ``numa_node``, and its chain of PCI bridges (the path
of the device's real sysfs directory, ``devices/pci0000:00/0000:00:01.0/0000:01:00.0/...``).

Facts schema::

    devices [{kind "gpu"|"hca", bdf "0000:1b:00.0", name "mlx5_0"|None, numa_node int|None,
              bridges ["0000:00:01.0", "0000:01:00.0", ...] (root port first),
              link {cur_width, max_width: int|None, cur_speed, max_speed: float GT/s|None},
              slot {max_width, max_speed}|None    (the parent bridge's own maximum)}]

Rule (per GPU node; CPU-only nodes SKIP):

- no GPU found: ERROR (facts missing; the gpu check says why).
- link width below the device's maximum: FAIL, unless the slot itself is narrower (an x16 card in an x8
  slot is the platform's design, not a fault) or the same device links as narrow on most nodes (the
  fleet is built that way): then not reported. With no fleet to compare (one node) it is a WARN.
  Speed below maximum is judged the same way for NICs; not for GPUs, which lower their link speed when
  idle (the gpu check's rule).
- affinity is judged over the compute NICs only: the HCAs carrying the node's NCCL rails (preflight.derived.rails:
  the ports ib_hca picks for NCCL_IB_HCA), not storage or management ports; all HCAs where the rails are
  unknown (no ib_hca facts), said in the message.
- affinity: for each GPU (in bus order), the HCAs on its NUMA node and the HCAs under the same PCIe switch
  form the node's signature; a node whose signature differs from the strict majority of nodes FAILs (drift:
  NCCL builds different paths there). A tie has no reference: WARN on every differing node.
- where the node has at least as many HCAs as GPUs and NUMA is known: a GPU without an HCA on its own
  NUMA node FAILs (its traffic crosses the CPU interconnect).
- NUMA unknown (numa_node -1: a VM, or firmware without NUMA information): the NUMA affinity is not judged,
  a SKIP finding says so beside the link verdict (never a PASS for what was not judged).
- otherwise PASS: "8 GPUs and 8 HCAs at full PCIe width; each GPU has an HCA on its NUMA node".
"""

from __future__ import annotations

from preflight.model import Check

NAME = "topology"

CHECK = Check(
    name=NAME,
    claim="Every GPU and RDMA NIC links at its full PCIe width (NICs also speed), and GPU↔NIC NUMA/PCIe "
    "affinity is the same on every node, with an HCA on each GPU's NUMA node",
    why="A NIC or GPU trained at x8 or a lower generation halves its bandwidth and paces every collective; a node "
    "whose NICs sit on another NUMA node or switch routes RDMA across the CPU interconnect and becomes the straggler.",
    fix="Reseat the card or riser and check the slot's BIOS bifurcation setting (lspci -vv: LnkSta vs LnkCap); "
    "put NICs back in the slots the platform guide pairs with each GPU; keep BIOS NUMA settings (NPS, SNC) alike.",
    needs=("ib_hca",),
    reads="sysfs bus/pci/devices/* of GPUs and RDMA HCAs: current/max link speed and width, numa_node, bridge chain",
    takes="< 0.1 s",
    order=68,
)

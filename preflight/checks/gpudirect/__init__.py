"""gpudirect: on nodes with GPUs and RDMA HCAs, GPUDirect RDMA can work: the peer-memory module is loaded and
no PCIe switch port between a GPU and a NIC redirects peer traffic (ACS) on bare metal.

Without these NCCL silently falls back to staging through host memory: the job runs, at a fraction of the
speed. The probe reads, through the sysfs root:

- ``module/nvidia_peermem`` (driver 470+) or ``module/nv_peer_mem`` (Mellanox's older module): loaded;
- ``class/dmi/id/{sys_vendor,product_name}`` and ``hypervisor/type``: a virtual machine (ACS is then the
  hypervisor's business and is not judged);
- the PCI bridges above each GPU and HCA (``preflight.probe.pci.bridges``), and for them ``lspci -D -vvv``'s port type
  and ``ACSCtl`` line (real format, pciutils ls-ecaps.c)::

      Capabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00
      Capabilities: [f24 v1] Access Control Services
              ACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
              ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-

- the IOMMU: ``class/iommu`` entries and the GPU's ``iommu_group/type`` (identity = passthrough); noted only.

Facts schema::

    gpus [bdf], hcas [{name, bdf|None}], peermem "nvidia_peermem"|"nv_peer_mem"|None,
    virtual str|None (why the node looks like a VM), iommu "off"|"passthrough"|"translated"|"on"|None,
    dmabuf_possible bool (open NVIDIA kernel module, module/nvidia/taint without P, on Linux >= 5.12:
                       NCCL 2.19+ can use DMA-BUF instead), kernel str (uname -r),
    paths [{gpu, hca, bridges [bdf]}]   the switch ports between a GPU and an HCA under one switch
    acs {bdf: {"type": str|None, "acs_ctl": {flag: bool}|None, "access_denied": bool}} | None
    lspci_error str|None

Rule (per GPU node; CPU-only nodes SKIP): no HCA: SKIP (GPUDirect RDMA needs one). Two paths give GPUDirect
RDMA, and the PASS names the one NCCL takes (NCCL's net_ib.cc: with NCCL_DMABUF_ENABLE, default on since
2.19, it registers GPU memory through DMA-BUF where the kernel and driver support it, else through the
peer-memory module):

- DMA-BUF: the open NVIDIA kernel module on Linux >= 5.12 (NVIDIA's GPUDirect RDMA documentation and the
  driver README: nvidia_peermem is no longer needed there, and its use is deprecated upstream) with NCCL
  2.19 or later (from the driver check's facts). NCCL older than 2.19 without the module: FAIL fix_config;
  NCCL version unknown without the module: WARN (DMA-BUF possible, not known to be used).
- nvidia_peermem / nv_peer_mem loaded: PASS on any kernel module.
- neither: FAIL (action fix_config): NCCL stages every RDMA transfer through host memory. On bare metal, a switch port between a GPU and
an HCA with ACSCtl ReqRedir+ or CmpltRedir+: FAIL (fix_config); ACS unreadable (lspci missing or not root)
while such ports exist: ERROR. PASS names the module, the ports checked and the IOMMU mode.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpudirect"

CHECK = Check(
    name=NAME,
    claim="On nodes with GPUs and RDMA HCAs GPUDirect RDMA has a path (DMA-BUF on the open kernel module with NCCL "
    "2.19+, or nvidia_peermem loaded) and no PCIe "
    "switch port between a GPU and an HCA redirects peer traffic (ACS) on bare metal",
    why="Without GPUDirect RDMA NCCL silently copies every transfer through host memory: the job runs at a fraction "
    "of the speed and nothing fails.",
    fix="Use the open kernel module on Linux 5.12+ with NCCL 2.19+ (DMA-BUF), or modprobe nvidia_peermem (and add "
    "it to /etc/modules-load.d); disable ACS redirect on the switch ports: "
    "BIOS 'ACS' off, or the kernel parameter pci=disable_acs_redir=<bdf>, or setpci at boot as NVIDIA's NCCL "
    "troubleshooting guide shows; in VMs leave ACS to the hypervisor.",
    needs=("driver",),
    reads="sysfs PCI tree of GPUs and RDMA HCAs, /sys/module/{nvidia_peermem,nv_peer_mem}, the kernel version and "
    "DMA-BUF support; lspci -D -vvv (ACS) only where a PCIe switch sits between a GPU and an HCA",
    takes="< 0.5 s",
    order=67,
)

"""Cloud GPU fabrics presented to a simulated node through the interfaces the real ones use.

    install_aws(node, instance_type, efa=32, plugin=True, fi_info=FI_INFO_P5)   an EC2 p4d/p5-like node
    install_google(node, fabric, mtus, rxdm=True, plugin=True)                 an A3 High/Mega-like node

What is written, and where real nodes have it:
- EFA devices: class/infiniband/rdmap*/ as the efa driver publishes them (sim.ib_hw.efa_files, sources there).
- DMI: class/dmi/id/product_name is the instance type on EC2 Nitro instances ("p5.48xlarge"), sys_vendor
  "Amazon EC2"; on Compute Engine product_name is "Google Compute Engine" (no machine type).
- aws-ofi-nccl: /opt/amazon/ofi-nccl/lib/libnccl-net.so (the EFA installer's layout, AWS EC2 User Guide).
- fi_info: a program on PATH answering `-p efa` in libfabric's format (ofiwg/libfabric#5689's listing).
- Google GPU NICs: class/net/ethN with device/uevent DRIVER=gve, mtu and ifindex (eth0 the host NIC at 1460,
  eth1.. the GPU NICs at 8244: Google Cloud's GPUDirect-TCPX(O) guides create the GPU VPCs with --mtu=8244).
- the RxDM: /proc/<pid>/comm under the node's host root (TCPX tcpgpudmarxd, TCPXO fastrak_gpumem_manager,
  which the kernel shortens to 15 characters), the plugin at /var/lib/tcpx(o)/lib64/libnccl-net.so with
  TCPXO's nccl-env-profile.sh beside it.
The node is a SimNode (tests/sim/cluster.py) or any object with write_sys, write_host_file and
install_executable; in a SimNode class/net is the namespace's own sysfs, so install_google needs a stand-in.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional

from sim import ib_hw

#: `fi_info -p efa` on a 4-device node, in the format of ofiwg/libfabric#5689 (fi_info 1.x: one rdm and one
#: dgrm domain per device); addresses ours.
FI_INFO_P5 = "".join(
    "provider: efa\n    fabric: efa\n    domain: %s-%s\n    version: 122.0\n    type: FI_EP_%s\n    protocol: FI_PROTO_EFA\n"
    % (ib_hw.efa_name(i), kind, kind.upper()) for i in range(4) for kind in ("rdm", "dgrm"))
#: libfabric's answer where no EFA device can be opened (fi_getinfo: -61, FI_ENODATA), exit 1.
FI_INFO_NONE = "fi_getinfo: -61 (No data available)"


#: The efa driver's counters (amzn/amzn-drivers kernel/linux/efa/src/efa_verbs.c EFA_DEFINE_PORT_STATS and
#: EFA_DEFINE_DEVICE_STATS), each file one decimal count. A busy p5 device's traffic counters run to ~1e14
#: (ai-dynamo/nixl#1656: rdmap79s0 tx_bytes 113,939,005,799,538 on a p5.48xlarge); the error ones stay 0.
EFA_PORT_COUNTERS = ("tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops", "send_bytes", "send_wrs", "recv_bytes",
                     "recv_wrs", "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes",
                     "rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes", "retrans_bytes",
                     "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events", "impaired_remote_conn_events")
EFA_DEVICE_COUNTERS = ("submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd",
                       "alloc_pd_err", "create_qp_err", "create_cq_err", "reg_mr_err", "alloc_ucontext_err",
                       "create_ah_err", "mmap_err")
BUSY = 113939005799538


def write_efa_counters(node: Any, device: str, values: Optional[dict] = None) -> None:
    """Every hw_counters file of one EFA device: traffic at BUSY, errors and retransmissions 0, then `values`."""
    for name in EFA_PORT_COUNTERS + EFA_DEVICE_COUNTERS:
        quiet = name.endswith(("_err", "_drops", "_events")) or name.startswith(("retrans_", "no_completion"))
        value = 0 if quiet else BUSY
        value = (values or {}).get(name, value)
        where = "ports/1/hw_counters" if name in EFA_PORT_COUNTERS else "hw_counters"
        node.write_sys("class/infiniband/%s/%s/%s" % (device, where, name), "%s\n" % value)


def install_aws(node: Any, instance_type: str, efa: int = 32, plugin: bool = True,
                fi_info: Optional[str] = FI_INFO_P5, counters: Optional[dict] = None, ofi: str = "1.14.0") -> List[str]:
    """An EC2 node: `efa` EFA devices, its DMI, aws-ofi-nccl unless plugin=False, fi_info on PATH (None:
    absent; FI_INFO_NONE: present, finding no efa provider), and with counters ({device index: {counter:
    value}}, {} for all-healthy) every device's hw_counters. The plugin library carries aws-ofi-nccl's init
    banner "Initializing aws-ofi-nccl <ofi>" as the real one does (src/nccl_ofi_net.cpp). Returns the EFA device names."""
    names = ib_hw.install_efa(node, count=efa) if efa else []
    for i, name in enumerate(names if counters is not None else []):
        write_efa_counters(node, name, counters.get(i))
    node.write_sys("class/dmi/id/product_name", instance_type + "\n")
    node.write_sys("class/dmi/id/sys_vendor", "Amazon EC2\n")
    if plugin:
        node.write_host_file("/opt/amazon/ofi-nccl/lib/libnccl-net.so", "\x7fELF (aws-ofi-nccl, preflight simulator)\0"
                             "Initializing aws-ofi-nccl %s\0" % ofi)
    if fi_info is not None:
        ok = fi_info != FI_INFO_NONE
        node.install_executable("fi_info", "#!/bin/sh\n# fi_info (preflight simulator)\ncat <<'EOF'%s\n%s\nEOF\nexit %d\n" % (
            "" if ok else " >&2", fi_info.rstrip("\n"), 0 if ok else 1))
    return names


def gve_files(name: str, ifindex: int, mtu: int) -> dict:
    base = "class/net/%s" % name
    return {base + "/mtu": "%d\n" % mtu, base + "/ifindex": "%d\n" % ifindex,
            base + "/device/uevent": "DRIVER=gve\nPCI_CLASS=20000\nPCI_ID=1AE0:0042\n"}


def own_class_net(node: Any) -> None:
    """Give a SimNode a class/net of its own (it links the namespace's /sys/class/net, whose veths no driver
    file can make gVNICs): A3 GPU NICs are then presented as files, the same tree the probe reads on a real
    VM. Only for runs that do not judge the namespace's real interfaces (the nic and mtu checks)."""
    net = os.path.join(node.sys_dir, "class", "net")
    if os.path.islink(net):
        os.unlink(net)


def install_google(node: Any, fabric: str, mtus: Iterable[int], rxdm: bool = True, plugin: bool = True,
                   nccl: Optional[str] = "2.21.5") -> List[str]:
    """An A3-like node: the host NIC eth0 at 1460 and one GPU NIC per entry of `mtus` (eth1..), the RxDM of
    `fabric` ("tcpx" | "tcpxo") running unless rxdm=False, its plugin unless plugin=False, with the NCCL the
    installer ships beside it (libnccl.so.<nccl>, as the TCPX installer's lib64 holds libnccl.so.2.19.4 in
    elideng-sg/hypercomputer-internode-deepdive assets/lab-18/after_tcpx_inpod_fabric.txt). Returns the GPU NICs."""
    nics = ["eth%d" % (i + 1) for i, _ in enumerate(mtus)]
    for rel, text in gve_files("eth0", 2, 1460).items():
        node.write_sys(rel, text)
    for i, (name, mtu) in enumerate(zip(nics, mtus)):
        for rel, text in gve_files(name, 3 + i, mtu).items():
            node.write_sys(rel, text)
    node.write_sys("class/dmi/id/product_name", "Google Compute Engine\n")
    node.write_sys("class/dmi/id/sys_vendor", "Google\n")
    node.write_host_file("/proc/1/comm", "systemd\n")
    if rxdm:
        node.write_host_file("/proc/4242/comm", {"tcpx": "tcpgpudmarxd", "tcpxo": "fastrak_gpumem_manager"[:15]}[fabric] + "\n")
    if plugin:
        lib = "/var/lib/%s/lib64" % fabric
        node.write_host_file(lib + "/libnccl-net.so", "\x7fELF (%s plugin, preflight simulator)\n" % fabric)
        if nccl:
            node.write_host_file(lib + "/libnccl.so." + nccl, "\x7fELF (NCCL %s, preflight simulator)\n" % nccl)
        if fabric == "tcpxo":
            node.write_host_file(lib + "/nccl-env-profile.sh", "# nccl-env-profile.sh (preflight simulator)\n")
    return nics


AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"  # canonical/cloud-init DataSourceAzure.py


def install_azure_nd(node: Any, family: Optional[str] = "ndv5", hcas: int = 8) -> List[str]:
    """An Azure ND VM: DMI as Hyper-V presents it (sys_vendor Microsoft Corporation, product_name Virtual Machine,
    Azure's chassis asset tag), 8 InfiniBand HCAs, and unless family=None the Azure HPC image's per-size
    customization (/opt/microsoft/<family>/topo.xml linked to /opt/microsoft/<family>-topo.xml,
    Azure/azhpc-images components/customizations/ndv5.sh). Returns the HCA names."""
    for rel, text in (("product_name", "Virtual Machine"), ("sys_vendor", "Microsoft Corporation"),
                      ("chassis_asset_tag", AZURE_ASSET_TAG)):
        node.write_sys("class/dmi/id/" + rel, text + "\n")
    if family:
        node.write_host_file("/opt/microsoft/%s/topo.xml" % family, "<system version=\"1\"></system>\n")
    return ib_hw.install_hcas(node, [{}] * hcas)


def install_oci(node: Any, link_layer: str = "roce", hcas: int = 8) -> List[str]:
    """An OCI bare-metal GPU node: DMI chassis asset tag "OracleCloud.com" (canonical/cloud-init
    DataSourceOracle.py), `hcas` ConnectX ports on RoCE (or InfiniBand). Returns the HCA names."""
    node.write_sys("class/dmi/id/chassis_asset_tag", "OracleCloud.com\n")
    node.write_sys("class/dmi/id/sys_vendor", "Oracle Corporation\n")
    specs = [{"link_layer": link_layer, "rate_gbps": 200, "netdev": "rdma%d" % i, "ipv4": "10.224.%d.7" % i}
             if link_layer == "roce" else {} for i in range(hcas)]
    return ib_hw.install_hcas(node, specs)


class StandIn:
    """A node's sysfs root, host root and PATH directory, for probes run in-process (no sshd)."""

    def __init__(self, root: Any) -> None:
        self.sys_dir, self.root_dir, self.bin_dir = (os.path.join(str(root), d) for d in ("sys", "root", "bin"))
        for d in (self.sys_dir, self.root_dir, self.bin_dir):
            os.makedirs(d, exist_ok=True)

    def write_sys(self, relpath: str, text: str) -> None:
        ib_hw.write_tree(self.sys_dir, {relpath: text})

    def write_host_file(self, path: str, text: str) -> None:
        ib_hw.write_tree(self.root_dir, {path.lstrip("/"): text})

    def install_executable(self, name: str, text: str) -> None:
        path = os.path.join(self.bin_dir, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o755)

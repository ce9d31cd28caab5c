"""Simulated PCIe topology for a simulated node: a real-shaped sysfs device tree, GPUDirect module, fake lspci.

Presented through the interfaces real hardware uses: directories under the node's sysfs root laid out as the
kernel does (``devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`` with
``bus/pci/devices/<bdf>`` symlinks into it, ``class/infiniband/<hca>/device`` a symlink to the HCA's PCI
directory), the PCIe link attributes and ``numa_node`` files in the kernel's formats, ``module/nvidia_peermem``,
DMI identity, and an ``lspci`` on PATH printing ``lspci -D -vvv`` for the bridges in pciutils' format.

Call after gpu_hw.install_gpus and ib_hw.install_hcas (it moves their PCI/HCA directories into the tree):

    install_pcie(node)                                   # HGX-like: each GPU i and HCA i under PCIe switch i
    install_pcie(node, faults={"gpu_width": 3})          # GPU 3 trained at x8 (max x16)
    install_pcie(node, faults={"hca_width": 1, "acs": 0, "no_peermem": True, "hca_numa": {0: 1}})

Layout for a GPU at bus B: root port 0000:(B-3):01.0 -> switch upstream port 0000:(B-2):00.0 -> downstream
ports 0000:(B-1):00.0 (GPU) and 0000:(B-1):01.0 (HCA) -> GPU 0000:B:00.0 and HCA 0000:(B+1):00.0.
GPUs on buses below 0x80 are on NUMA node 0, the others on 1.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional

from tests.sim import gpu_hw, ib_hw

GEN5 = "32.0 GT/s PCIe"
GEN4 = "16.0 GT/s PCIe"


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return "0000:%02x:%02x.%d" % (bus, dev, fn)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def _place(node: Any, chain: List[str], attrs: Dict[str, str]) -> str:
    """Create the device directory for chain[-1] under devices/pci<domain:bus of the root>/..., write attrs,
    move an existing plain bus/pci/devices/<bdf> directory into it, and link bus/pci/devices/<bdf> to it."""
    root = "pci%s" % chain[0][:7]
    rel = os.path.join("devices", root, *chain)
    real = os.path.join(node.sys_dir, rel)
    os.makedirs(real, exist_ok=True)
    link = os.path.join(node.sys_dir, "bus", "pci", "devices", chain[-1])
    if os.path.isdir(link) and not os.path.islink(link):
        for name in os.listdir(link):
            src, dst = os.path.join(link, name), os.path.join(real, name)
            if os.path.isdir(dst) and not os.path.islink(dst):
                shutil.rmtree(dst)
            shutil.move(src, dst)
        os.rmdir(link)
    for name, text in attrs.items():
        _write(os.path.join(real, name), text + "\n")
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(real, os.path.dirname(link)), link)
    return real


def _link(cur_w: int, max_w: int, cur_s: str, max_s: str) -> Dict[str, str]:
    return {"current_link_width": str(cur_w), "max_link_width": str(max_w), "current_link_speed": cur_s, "max_link_speed": max_s}


def _lspci_block(bdf: str, desc: str, port: Optional[str], acs_redirect: Optional[bool]) -> str:
    lines = ["%s %s" % (bdf, desc),
             "\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr+ Stepping- SERR+ FastB2B- DisINTx+"]
    if port:
        lines.append("\tCapabilities: [68] Express (v2) %s, MSI 00" % port)
        lines.append("\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported")
    if acs_redirect is not None:
        flag = "+" if acs_redirect else "-"
        lines.append("\tCapabilities: [f24 v1] Access Control Services")
        lines.append("\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+")
        lines.append("\t\tACSCtl:\tSrcValid%s TransBlk- ReqRedir%s CmpltRedir%s UpstreamFwd%s EgressCtrl- DirectTrans-" % (flag, flag, flag, flag))
    lines.append("\tKernel driver in use: %s" % ("pcieport" if port and "Port" in port else "nvidia"))
    return "\n".join(lines) + "\n\n"


def install_pcie(node: Any, faults: Optional[Dict[str, Any]] = None, vm: bool = False) -> Dict[str, List[str]]:
    """Lay the node's GPUs and HCAs out under PCIe switches; returns {"gpus": [bdf], "hcas": [bdf]}."""
    faults = dict(faults or {})
    known = {"gpu_width", "hca_width", "acs", "no_peermem", "hca_numa", "no_lspci"}
    if set(faults) - known:
        raise ValueError("faults %s: expected some of %s" % (sorted(set(faults) - known), sorted(known)))
    state = gpu_hw._STATE.get(node.bin_dir, {})
    gpus = sorted(state.get("gpu_bdfs", []))
    hcas = sorted(os.listdir(os.path.join(node.sys_dir, "class", "infiniband")) if os.path.isdir(os.path.join(node.sys_dir, "class", "infiniband")) else [],
                  key=lambda n: int(n.rsplit("_", 1)[-1]) if n.rsplit("_", 1)[-1].isdigit() else 0)
    lspci = []
    hca_bdfs = []
    for i, gpu in enumerate(gpus):
        bus = int(gpu.split(":")[1], 16)
        numa = "0" if bus < 0x80 else "1"
        root, up, down_gpu, down_hca = _bdf(bus - 3, 1), _bdf(bus - 2), _bdf(bus - 1), _bdf(bus - 1, 1)
        bridge = {"class": "0x060400", "vendor": "0x1000", "numa_node": numa}
        _place(node, [root], dict(bridge, vendor="0x8086", **_link(16, 16, GEN5, GEN5)))
        _place(node, [root, up], dict(bridge, **_link(16, 16, GEN5, GEN5)))
        _place(node, [root, up, down_gpu], dict(bridge, **_link(16, 16, GEN5, GEN5)))
        gpu_w = 8 if faults.get("gpu_width") == i else 16
        _place(node, [root, up, down_gpu, gpu], dict(numa_node=numa, **_link(gpu_w, 16, GEN5, GEN5)))
        redirect = faults.get("acs") == i
        lspci.append(_lspci_block(root, "PCI bridge: Intel Corporation Device 352a (rev 04) (prog-if 00 [Normal decode])", "Root Port (Slot+)", True))
        lspci.append(_lspci_block(up, "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])", "Upstream Port", None))
        lspci.append(_lspci_block(down_gpu, "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])", "Downstream Port (Slot+)", redirect))
        lspci.append(_lspci_block(gpu, "3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)", "Endpoint", None))
        if i < len(hcas):
            hca = hcas[i]
            hca_bdf = _bdf(bus + 1)
            hca_numa = str((faults.get("hca_numa") or {}).get(i, numa))
            _place(node, [root, up, down_hca], dict(bridge, **_link(16, 16, GEN5, GEN5)))
            hca_w = 8 if faults.get("hca_width") == i else 16
            attrs = {"class": "0x020700", "vendor": "0x15b3", "numa_node": hca_numa}
            attrs.update(_link(hca_w, 16, GEN5, GEN5))
            real = _place(node, [root, up, down_hca, hca_bdf], attrs)
            dev = os.path.join(node.sys_dir, "class", "infiniband", hca, "device")
            if os.path.isdir(dev) and not os.path.islink(dev):
                for name in os.listdir(dev):
                    dst = os.path.join(real, name)
                    if os.path.isdir(dst):
                        shutil.rmtree(dst)
                    shutil.move(os.path.join(dev, name), dst)
                os.rmdir(dev)
            if not os.path.lexists(dev):
                os.symlink(os.path.relpath(real, os.path.dirname(dev)), dev)
            hca_bdfs.append(hca_bdf)
            lspci.append(_lspci_block(down_hca, "PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])", "Downstream Port (Slot+)", redirect))
            lspci.append(_lspci_block(hca_bdf, "Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]", "Endpoint", None))
    if not faults.get("no_peermem"):
        node.write_sys("module/nvidia_peermem/refcnt", "0\n")
    else:
        shutil.rmtree(os.path.join(node.sys_dir, "module", "nvidia_peermem"), ignore_errors=True)
    node.write_sys("class/dmi/id/sys_vendor", ("QEMU" if vm else "Supermicro") + "\n")
    node.write_sys("class/dmi/id/product_name", ("Standard PC (Q35 + ICH9, 2009)" if vm else "SYS-821GE-TNHR") + "\n")
    if faults.get("no_lspci"):
        path = os.path.join(node.bin_dir, "lspci")
        if os.path.lexists(path):
            os.unlink(path)
    else:
        node.install_executable(
            "lspci",
            "#!/bin/sh\n# lspci (preflight simulator): only -D -vvv, the node's simulated PCIe switches\n"
            'if [ "$*" != "-D -vvv" ]; then echo "lspci (preflight simulator): only -D -vvv" >&2; exit 1; fi\n'
            "cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n" % "".join(lspci),
        )
    return {"gpus": gpus, "hcas": hca_bdfs}


def install_hgx_h100(node: Any) -> None:
    """Present a node as an HGX H100 through the real interfaces: 8 GPUs (nvidia-smi, a kernel log), 4
    NVSwitches, an active fabric manager, NCCL, two NDR HCA ports under the PCIe switches of GPU 0 and 1,
    nvidia_peermem and lspci."""
    gpu_hw.install_gpus(node, "h100", count=8)
    gpu_hw.install_nvswitches(node)
    gpu_hw.install_fabric_manager(node, active=True)
    gpu_hw.install_nccl(node)
    ib_hw.install_hcas(node, [{}, {}])
    install_pcie(node)

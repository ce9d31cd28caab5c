"""PCI functions as sysfs shows them, for node-side probes: which devices exist, what sits above each.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle. Reads through the
probe context (ctx.sys_path / ctx.read / ctx.listdir), so a recorded sysfs tree replays it.

    devices(ctx)        (entry, vendor, class) of every bus/pci/devices entry: the bus listed and each
                        function's vendor/class read once per probe run, for every probe that asks
    functions(ctx)      [{"bdf", "vendor", "class"}] of bus/pci/devices, vendor/class as the kernel
                        prints them ("0x10de", "0x030200")
    upstream(ctx, bdf)  the bridge (port) directly above a function, from the real path (ctx.realpath) of its sysfs
                        directory (devices/pci0000:00/0000:00:01.0/0000:01:00.0), or None at the root
    link_rate(ctx, bdf) (GT/s, lanes) of the function's maximum link (max_link_speed, max_link_width),
                        or None where the kernel does not say (a VM's emulated device, a root bus)
    nvidia_gpus(ctx)    bus addresses of the NVIDIA GPUs (class 0x0300 VGA, 0x0302 3D controller)
    rdma_hcas(ctx)      (name, bus address or None) of every class/infiniband entry
    bridges(ctx, bdf)   the bridges above a device, root port first (its sysfs device path)
    hypervisor(ctx)     why the node looks like a VM (/sys/hypervisor/type, DMI vendor/product), or None

Used by the pcie, topology, gpudirect, gpu, fabric_manager, xid and ib_errors probes. Sources: the kernel's
sysfs-bus-pci ABI (vendor, class as 0xCCSSPP) and the PCI class codes.
"""

from __future__ import annotations

import os
import re

from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_SPEED = lazy(r"^(\d+(?:\.\d+)?) GT/s")  # compiled where a PCIe function has a link to read
GPU_CLASSES = ("0x0300", "0x0302")
#: DMI vendor/product words of hypervisors.
VM_WORDS = ("kvm", "qemu", "vmware", "virtualbox", "xen", "microsoft corporation virtual", "amazon ec2",
            "google compute engine", "openstack", "bochs", "hyper-v", "oraclecloud")


def devices(ctx: Any) -> List[Tuple[str, str, str]]:
    """(entry, vendor, class) for every entry of bus/pci/devices, as listed (vendor/class stripped, lower case).

    Read once per probe run (ctx.walk_once) for every probe that asks: pcie, topology, gpudirect,
    fabric_manager and xid each used to list the bus and read each function's files themselves."""
    return ctx.walk_once(("pci-devices",), _read_devices)


def _read_devices(ctx: Any) -> List[Tuple[str, str, str]]:
    root = ctx.sys_path("bus", "pci", "devices")
    return [(entry, (ctx.read(os.path.join(root, entry, "vendor")) or "").strip().lower(),
             (ctx.read(os.path.join(root, entry, "class")) or "").strip().lower()) for entry in ctx.listdir(root)]


def functions(ctx: Any) -> List[Dict[str, str]]:
    return [{"bdf": entry.lower(), "vendor": vendor, "class": klass} for entry, vendor, klass in devices(ctx)
            if BDF.match(entry.lower())]


def upstream(ctx: Any, bdf: str) -> Optional[str]:
    real = ctx.realpath(ctx.sys_path("bus", "pci", "devices", bdf))
    parent = os.path.basename(os.path.dirname(real)).lower()
    return parent if BDF.match(parent) else None


def link_rate(ctx: Any, bdf: str) -> Optional[Tuple[float, int]]:
    base = ctx.sys_path("bus", "pci", "devices", bdf)
    speed = _SPEED.match((ctx.read(os.path.join(base, "max_link_speed")) or "").strip())
    width = (ctx.read(os.path.join(base, "max_link_width")) or "").strip()
    if not speed or not width.isdigit() or int(width) == 0:
        return None
    return float(speed.group(1)), int(width)


def nvidia_gpus(ctx: Any) -> List[str]:
    """Bus addresses of the NVIDIA GPUs (display/3D controller functions) under bus/pci/devices."""
    return [f["bdf"] for f in functions(ctx) if f["vendor"] == "0x10de" and f["class"][:6] in GPU_CLASSES]


def rdma_hcas(ctx: Any) -> List[Tuple[str, Optional[str]]]:
    """(HCA name, its PCI bus address or None) for every class/infiniband entry; read once per probe run."""
    return list(ctx.walk_once(("rdma-hcas",), _read_rdma_hcas))


def _read_rdma_hcas(ctx: Any) -> List[Tuple[str, Optional[str]]]:
    root = ctx.sys_path("class", "infiniband")
    out = []
    for hca in ctx.listdir(root):
        real = os.path.basename(ctx.realpath(os.path.join(root, hca, "device"))).lower()
        out.append((hca, real if BDF.match(real) else None))
    return out


def bridges(ctx: Any, bdf: str) -> List[str]:
    """The PCI bridges above a device, root port first (from the real path of its sysfs directory)."""
    real = ctx.realpath(ctx.sys_path("bus", "pci", "devices", bdf))
    chain = [part.lower() for part in real.split(os.sep) if BDF.match(part.lower())]
    return chain[:-1] if chain and chain[-1] == bdf else chain


def hypervisor(ctx: Any) -> Optional[str]:
    """Why this node looks like a virtual machine (/sys/hypervisor/type, DMI vendor/product), or None; read once
    per probe run (the gpu and gpudirect probes both ask).

    A VM is given PCI functions, not the platform: partial GPU sets, NVLink/NVSwitch left to the host,
    numa_node -1, no peer-to-peer. Checks judge such a node against what it was given."""
    return ctx.walk_once(("hypervisor",), _read_hypervisor)


def _read_hypervisor(ctx: Any) -> Optional[str]:
    hyper = ctx.read(ctx.sys_path("hypervisor", "type"))
    if hyper and hyper.strip():
        return "hypervisor/type %s" % hyper.strip()
    for attr in ("sys_vendor", "product_name"):
        value = (ctx.read(ctx.sys_path("class", "dmi", "id", attr)) or "").strip()
        if any(word in value.lower() for word in VM_WORDS):
            return "DMI %s %r" % (attr, value)
    return None

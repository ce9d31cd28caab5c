"""The cloud_fabric check's node half: the node's fabric facts and their parsers (standard library only).

Facts: {"product_name": str|None, "sys_vendor": str|None,
        "efa": [EFA device names], "hcas": [other RDMA device names],
        "fi_info": None (no fi_info) | {"path", "rc", "providers": [{"provider", "fabric", "domain", "type"}],
                                         "error": str|None},
        "plugins": {"efa"|"tcpx"|"tcpxo"|"gke"|"gib": [plugin library paths]} (keys: PLUGIN_DIRS),
        "profiles": {plugin key: the vendor's NCCL env script found beside the plugin},
        "rxdm": [{"pid": int, "comm": str, "fabric": "tcpx"|"tcpxo"}],
        "gve": [{"name", "ifindex": int|None, "mtu": int|None}]  gVNIC interfaces, by ifindex,
        "efa_counters": {EFA device: {"port": {counter: int}, "device": {counter: int}}}  the efa driver's
                        hw_counters (ports/1/hw_counters/ and the device-level hw_counters/), "at": unix time,
        "chassis_asset_tag": str|None (DMI: Azure and OCI mark their VMs here), "azure_family": "ndv5"|"ndv4"|None
                        (the Azure HPC image's per-SKU customization, /opt/microsoft/<family>/topo.xml),
        "plugin_versions": {plugin key: version}  read from the plugin library's own banner (aws-ofi-nccl),
        "bundled_nccl": {plugin key: [NCCL versions of the libnccl.so.X.Y.Z files beside the plugin]}}

`fi_info -p efa` format (libfabric's fi_info, real output in ofiwg/libfabric#5689):
    provider: efa
        fabric: EFA-fe80::39:beff:fe6e:c23
        domain: efa_0-rdm
        version: 2.0
        type: FI_EP_RDM
"""

from __future__ import annotations

import os
import re
import time

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy
from preflight.probe.rdma import is_efa, natural_key

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional

#: Where each fabric's NCCL plugin is installed (read under the host root).
#: efa: the EFA installer's aws-ofi-nccl (/opt/amazon/ofi-nccl, AWS EC2 User Guide "Get started with EFA and
#:   NCCL"), older Deep Learning AMIs /opt/aws-ofi-nccl.
#: tcpx, tcpxo: the installers' lib64 on Container-Optimized OS VMs (/var/lib/tcpx, /var/lib/tcpxo) and in
#:   their images (/usr/local/tcpx, /usr/local/tcpxo), Google Cloud "Maximize GPU network bandwidth ... with
#:   GPUDirect-TCPX(O)"; gke: on GKE both installers put libnccl-net.so in /home/kubernetes/bin/nvidia/lib64,
#:   mounted in pods at /usr/local/nvidia/lib64: a plugin there belongs to the fabric whose RxDM runs.
#: gib: /usr/local/gib/lib64 (GKE mount of /home/kubernetes/bin/gib), /var/lib/gib/lib64 on VMs, Google Cloud
#:   "Troubleshoot NCCL/gIB" (cloud.google.com/ai-hypercomputer/docs/nccl).
PLUGIN_DIRS = {
    "efa": ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
            "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu", "/opt/aws-ofi-nccl/lib"),
    "tcpx": ("/usr/local/tcpx/lib64", "/var/lib/tcpx/lib64"),
    "tcpxo": ("/usr/local/tcpxo/lib64", "/var/lib/tcpxo/lib64"),
    "gke": ("/usr/local/nvidia/lib64", "/home/kubernetes/bin/nvidia/lib64"),
    "gib": ("/usr/local/gib/lib64", "/var/lib/gib/lib64", "/home/kubernetes/bin/gib/lib64"),
}
#: The vendor's NCCL env script, relative to the plugin directory's parent: TCPXO's nccl-env-profile.sh beside
#: its plugin (google/nccl-plugin-gpudirect-tcpxo README), gIB's set_nccl_env.sh (Google Cloud's NCCL/gIB docs
#: name both scripts/set_nccl_env.sh and set_nccl_env.sh). The TCPX plugin ships none.
PROFILES = ("lib64/nccl-env-profile.sh", "scripts/set_nccl_env.sh", "set_nccl_env.sh")
#: Receive-datapath managers by /proc/PID/comm (the kernel keeps 15 characters): TCPX's tcpgpudmarxd, TCPXO's
#: fastrak_gpumem_manager (google/nccl-plugin-gpudirect-tcpxo, scripts/entrypoint_rxdm_container.sh).
RXDM = {"tcpgpudmarxd": "tcpx", "fastrak_gpumem_manager"[:15]: "tcpxo"}
FI_INFO_DIRS = ("/opt/amazon/efa/bin",)
_COUNTER = lazy(r"^[a-z0-9_]{1,64}$")
_PLUGIN_FILE = lazy(r"^libnccl-net(?:-[A-Za-z0-9_.-]+)?\.so(?:\.[0-9.]+)?$")
_FIELD = lazy(r"^\s+(fabric|domain|version|type|protocol):\s*(.*?)\s*$")


def parse_fi_info(text: str) -> List[Dict[str, Optional[str]]]:
    """`fi_info -p efa` → [{"provider", "fabric", "domain", "type"}], one per listed endpoint.

    A field line before any "provider:" line, or a non-blank line that is neither, raises ParseError."""
    out: List[Dict[str, Optional[str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("provider:"):
            out.append({"provider": line.split(":", 1)[1].strip(), "fabric": None, "domain": None, "type": None})
            continue
        m = _FIELD.match(line)
        if m is None or not out:
            raise ParseError("fi_info line %d: expected 'provider: NAME' or an indented field, got %.80r" % (number, line))
        if m.group(1) in ("fabric", "domain", "type"):
            out[-1][m.group(1)] = m.group(2)
    return out


def _fi_info(ctx: Any) -> Optional[Dict[str, Any]]:
    path = ctx.which("fi_info") or next((p for p in (os.path.join(ctx.host_path(d), "fi_info") for d in FI_INFO_DIRS)
                                         if os.access(p, os.X_OK)), None)
    if path is None:
        return None
    result = ctx.run([path, "-p", "efa"], timeout=10.0)
    facts: Dict[str, Any] = {"path": path, "rc": result.rc, "providers": [], "error": None}
    if result.rc == 0:
        facts["providers"] = parse_fi_info(result.stdout)
    else:
        facts["error"] = ((result.stderr or result.stdout or "").strip().splitlines() or ["exit %d" % result.rc])[-1][:200]
    return facts


def _plugins(ctx: Any) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for fabric, dirs in PLUGIN_DIRS.items():
        found = [os.path.join(d, n) for d in dirs for n in ctx.listdir(ctx.host_path(d)) if _PLUGIN_FILE.match(n)]
        if found:
            out[fabric] = found
    return out


def _profiles(ctx: Any, plugins: Dict[str, List[str]]) -> Dict[str, str]:
    """{plugin key: the first vendor env script found beside one of its plugins}."""
    out = {}
    for key, paths in plugins.items():
        found = (c for p in paths for c in (os.path.join(os.path.dirname(os.path.dirname(p)), s) for s in PROFILES)
                 if os.path.isfile(ctx.host_path(c)))
        script = next(found, None)
        if script is not None:
            out[key] = script
    return out


#: Compute Engine's DMI product_name (cloud-init's DataSourceGCE.py reads the same file)
GCE_PRODUCT = "Google Compute Engine"


def _rxdm(ctx: Any) -> List[Dict[str, Any]]:
    proc = ctx.host_path("/proc")
    out = []
    for pid in ctx.listdir(proc):
        if pid.isdigit():
            comm = (ctx.read(os.path.join(proc, pid, "comm")) or "").strip()
            if comm in RXDM:
                out.append({"pid": int(pid), "comm": comm, "fabric": RXDM[comm]})
    return out


def _int(text: Optional[str]) -> Optional[int]:
    return int(text.strip()) if text is not None and text.strip().isdigit() else None


def _gve(ctx: Any) -> List[Dict[str, Any]]:
    """The gVNIC interfaces (device/uevent DRIVER=gve), in ifindex order."""
    root = ctx.sys_path("class", "net")
    out = []
    for name in ctx.listdir(root):
        uevent = ctx.read(os.path.join(root, name, "device", "uevent")) or ""
        if "DRIVER=gve" in uevent.splitlines():
            out.append({"name": name, "ifindex": _int(ctx.read(os.path.join(root, name, "ifindex"))),
                        "mtu": _int(ctx.read(os.path.join(root, name, "mtu")))})
    return sorted(out, key=lambda i: (i["ifindex"] is None, i["ifindex"] or 0, natural_key(i["name"])))


def parse_hw_counter(text: Optional[str], where: str) -> Optional[int]:
    """One hw_counters/<name> file → its value (a decimal count, amzn-drivers kernel/linux/efa/src/efa_verbs.c
    fills them from the device's statistics); None when the file cannot be read; anything else raises
    ParseError naming the file."""
    if text is None:
        return None
    value = text.strip()
    if not value.isdigit():
        raise ParseError("%s: expected a non-negative integer, got %.40r" % (where, text))
    return int(value)


def _counters(ctx: Any, folder: str, where: str) -> Dict[str, int]:
    out = {}
    for name in sorted(ctx.listdir(folder)):
        if _COUNTER.match(name):
            value = parse_hw_counter(ctx.read(os.path.join(folder, name)), "%s/%s" % (where, name))
            if value is not None:
                out[name] = value
    return out


def efa_counters(ctx: Any, root: str, devices: List[str]) -> Dict[str, Dict[str, Dict[str, int]]]:
    """{device: {"port": ports/1/hw_counters, "device": hw_counters}} of each EFA device (one port each)."""
    return {dev: {"port": _counters(ctx, os.path.join(root, dev, "ports", "1", "hw_counters"), dev + " port 1 hw_counters"),
                  "device": _counters(ctx, os.path.join(root, dev, "hw_counters"), dev + " hw_counters")}
            for dev in devices}


#: aws-ofi-nccl logs "Initializing " PACKAGE_STRING at init (src/nccl_ofi_net.cpp), so its library holds the
#: literal "Initializing aws-ofi-nccl 1.14.0" (autoconf's PACKAGE_STRING, "aws-ofi-nccl <version>").
BANNERS = {"efa": lazy(rb"Initializing aws-ofi-nccl (\d+\.\d+\.\d+(?:-aws)?)")}
#: The Azure HPC image links /opt/microsoft/<family>/topo.xml only on the VM size it was customised for
#: (Azure/azhpc-images components/customizations/ndv5.sh, ndv4.sh, run at boot per VM size).
AZURE_FAMILIES = ("ndv5", "ndv4")
_BUNDLED = lazy(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
_CHUNK = 1 << 20
_MAX_SCAN = 256 << 20


def library_banner(path: str, pattern: "re.Pattern[bytes]") -> Optional[str]:
    """The first match of `pattern`'s group in a library file, read in 1 MiB chunks (up to 256 MiB); None when
    absent or unreadable."""
    tail = b""
    try:
        with open(path, "rb") as handle:
            for _ in range(_MAX_SCAN // _CHUNK):
                chunk = handle.read(_CHUNK)
                if not chunk:
                    return None
                m = pattern.search(tail + chunk)
                if m:
                    return m.group(1).decode("ascii", "replace")
                tail = chunk[-128:]
    except OSError:
        return None
    return None


def _plugin_versions(ctx: Any, plugins: Dict[str, List[str]]) -> Dict[str, str]:
    out = {}
    for key, pattern in BANNERS.items():
        found = (library_banner(ctx.host_path(p), pattern) for p in plugins.get(key) or [])
        version = next((v for v in found if v), None)
        if version:
            out[key] = version
    return out


def _bundled_nccl(ctx: Any, plugins: Dict[str, List[str]]) -> Dict[str, List[str]]:
    """{plugin key: the NCCL versions of libnccl.so.X.Y.Z files in the plugin's own directory} (Google's
    installers ship the NCCL they qualify beside the plugin)."""
    out = {}
    for key, paths in plugins.items():
        dirs = sorted({os.path.dirname(p) for p in paths})
        names = [os.path.basename(os.path.realpath(os.path.join(ctx.host_path(d), n)))  # libnccl.so.2 -> .so.2.27.3
                 for d in dirs for n in ctx.listdir(ctx.host_path(d)) if n.startswith("libnccl.so.")]
        found = sorted({m.group(1) for m in map(_BUNDLED.match, names) if m})
        if found:
            out[key] = found
    return out


def probe(ctx: Any) -> Dict[str, Any]:
    """The node's fabric facts (module doc): RDMA devices, fi_info, plugins, RxDM processes, gVNICs, DMI."""
    root = ctx.sys_path("class", "infiniband")
    efa, hcas = [], []
    for dev in sorted(ctx.listdir(root), key=natural_key):
        (efa if is_efa(ctx, os.path.join(root, dev)) else hcas).append(dev)
    dmi = ctx.sys_path("class", "dmi", "id")
    plugins = _plugins(ctx)
    product = (ctx.read(os.path.join(dmi, "product_name")) or "").strip() or None
    gve = _gve(ctx)
    # the RxDM runs only on Compute Engine's TCPX/TCPXO machines: elsewhere no /proc/PID/comm is read
    # (every process's, on every run, for nothing: thousands of reads on a busy node)
    google = product == GCE_PRODUCT or bool(gve) or any(plugins.get(k) for k in ("tcpx", "tcpxo", "gke"))
    return {
        "product_name": product,
        "sys_vendor": (ctx.read(os.path.join(dmi, "sys_vendor")) or "").strip() or None,
        "efa": efa, "hcas": hcas,
        "fi_info": _fi_info(ctx) if efa else None,
        "plugins": plugins, "profiles": _profiles(ctx, plugins),
        "rxdm": _rxdm(ctx) if google else [], "gve": gve,
        "efa_counters": efa_counters(ctx, root, efa), "at": time.time(),
        "plugin_versions": _plugin_versions(ctx, plugins), "bundled_nccl": _bundled_nccl(ctx, plugins),
        "chassis_asset_tag": (ctx.read(os.path.join(dmi, "chassis_asset_tag")) or "").strip() or None,
        "azure_family": next((f for f in AZURE_FAMILIES
                              if os.path.exists(ctx.host_path("/opt/microsoft/%s/topo.xml" % f))), None),
    }

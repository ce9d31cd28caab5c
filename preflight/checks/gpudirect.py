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

import os
import platform
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node
from preflight.probe.pci import bridges, hypervisor, nvidia_gpus, rdma_hcas

NAME = "gpudirect"
MODULES = ("nvidia_peermem", "nv_peer_mem")
#: ACS controls that send peer-to-peer requests or completions up to the root complex.
REDIRECTS = ("ReqRedir", "CmpltRedir")

_DEVICE = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (.+)$")
_PORT = re.compile(r"^Capabilities: \[[0-9a-f]+\] Express \(v\d\) ([A-Za-z ]+?)(?: \(Slot[+-]\))?(?:, .*)?$")
_FLAG = re.compile(r"([A-Za-z]+)([+-])")


# --------------------------------------------------------------------------------------------- probe


def _iommu(ctx: Any, gpus: List[str]) -> Optional[str]:
    if not ctx.listdir(ctx.sys_path("class", "iommu")):
        return "off"
    for bdf in gpus:
        kind = ctx.read(ctx.sys_path("bus", "pci", "devices", bdf, "iommu_group", "type"))
        if kind:
            return "passthrough" if kind.strip() == "identity" else "translated"
    return "on"


def _dmabuf_possible(ctx: Any) -> bool:
    """The open NVIDIA kernel module (module/nvidia/taint without P: not proprietary) on Linux >= 5.12."""
    taint = ctx.read(ctx.sys_path("module", "nvidia", "taint"))
    release = platform.release().split("-")[0].split(".")
    try:
        kernel = (int(release[0]), int(release[1]))
    except (IndexError, ValueError):
        return False
    return taint is not None and "P" not in taint and kernel >= (5, 12)


def switch_paths(ctx: Any, gpus: List[str], hcas: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """GPU/HCA pairs under one PCIe switch, with the bridges below their common one (where ACS acts)."""
    chains = {bdf: bridges(ctx, bdf) for bdf in gpus + [h["bdf"] for h in hcas if h["bdf"]]}
    out = []
    for gpu in gpus:
        for hca in hcas:
            if not hca["bdf"]:
                continue
            a, b = chains[gpu], chains[hca["bdf"]]
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common < 2:  # only the root port (or nothing) in common: peer traffic crosses the root complex anyway
                continue
            ports = sorted(set(a[common:] + b[common:]))
            out.append({"gpu": gpu, "hca": hca["name"], "bridges": ports})
    return out


def probe(ctx: Any) -> Dict[str, Any]:
    gpus = nvidia_gpus(ctx)
    hcas = [{"name": name, "bdf": bdf} for name, bdf in rdma_hcas(ctx)]
    facts: Dict[str, Any] = {
        "gpus": gpus,
        "hcas": hcas,
        "peermem": next((m for m in MODULES if os.path.isdir(ctx.sys_path("module", m))), None),
        "virtual": hypervisor(ctx),
        "iommu": _iommu(ctx, gpus),
        "dmabuf_possible": _dmabuf_possible(ctx),
        "kernel": platform.release()[:64],
        "paths": [],
        "acs": None,
        "lspci_error": None,
    }
    if not gpus or not hcas or facts["virtual"]:
        return facts
    facts["paths"] = switch_paths(ctx, gpus, hcas)
    if not facts["paths"]:
        return facts
    res = ctx.run(["lspci", "-D", "-vvv"], timeout=30.0)
    if not res.ok:
        facts["lspci_error"] = "lspci -D -vvv: %s" % ("not found (install pciutils)" if res.rc == 127 else "rc %d" % res.rc)
        return facts
    wanted = {bdf for path in facts["paths"] for bdf in path["bridges"]}
    facts["acs"] = {bdf: info for bdf, info in parse_lspci_acs(res.stdout).items() if bdf in wanted}
    return facts


# --------------------------------------------------------------------------------------------- parse


def parse_lspci_acs(text: str) -> Dict[str, Dict[str, Any]]:
    """{bdf: {"type": "Downstream Port"|"Root Port"|"Endpoint"|...|None, "acs_ctl": {flag: bool}|None,
    "access_denied": bool}} from `lspci -vvv` (with or without -D; addresses get the 0000 domain)."""
    out: Dict[str, Dict[str, Any]] = {}
    current: Optional[Dict[str, Any]] = None
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        if not raw[0].isspace():
            m = _DEVICE.match(raw)
            if not m:
                raise ParseError("lspci -vvv line %d: expected 'BUS:DEV.FN description', got %.80r" % (number, raw))
            bdf = m.group(1).lower()
            bdf = bdf if bdf.count(":") == 2 else "0000:" + bdf
            current = out[bdf] = {"type": None, "acs_ctl": None, "access_denied": False}
            continue
        if current is None:
            raise ParseError("lspci -vvv line %d: indented line before any device: %.80r" % (number, raw))
        line = raw.strip()
        if line == "Capabilities: <access denied>":
            current["access_denied"] = True
            continue
        port = _PORT.match(line)
        if port:
            current["type"] = port.group(1).strip()
            continue
        if line.startswith("ACSCtl:"):
            flags = dict((name, sign == "+") for name, sign in _FLAG.findall(line[len("ACSCtl:"):]))
            if not all(f in flags for f in REDIRECTS):
                raise ParseError("lspci -vvv line %d: ACSCtl without ReqRedir/CmpltRedir: %.80r" % (number, raw))
            current["acs_ctl"] = flags
    return out


# ---------------------------------------------------------------------------------------------- rule


#: The first NCCL that registers GPU memory through DMA-BUF (NCCL 2.19 release notes: NCCL_DMABUF_ENABLE).
DMABUF_NCCL = (2, 19)


def _nccl(driver: Any) -> Optional[Tuple[int, ...]]:
    """The oldest NCCL the driver check found on the node (the Python distribution's, the system's)."""
    if not isinstance(driver, dict):
        return None
    found = [(driver.get("nccl_python") or {}).get("version")]
    found += [lib.get("version") for lib in driver.get("nccl_system") or [] if isinstance(lib, dict)]
    parsed = [tuple(int(p) for p in re.findall(r"\d+", str(v))[:3]) for v in found if v]
    return min(parsed) if parsed else None


def _path(name: str, facts: Dict[str, Any], nccl: Optional[Tuple[int, ...]]) -> Tuple[Optional[Finding], str]:
    """(a finding when GPUDirect RDMA has no path, or an unsure one; the path NCCL takes, for the PASS)."""
    peermem, dmabuf = facts.get("peermem"), facts.get("dmabuf_possible")
    version = "NCCL %s" % ".".join(map(str, nccl)) if nccl else "NCCL version unknown"
    if dmabuf and nccl and nccl >= DMABUF_NCCL:
        also = "; %s loaded too (unused)" % peermem if peermem else ""
        return None, "NCCL uses DMA-BUF (open kernel module, Linux %s, %s)%s" % (facts.get("kernel") or "?", version, also)
    if peermem:
        return None, "NCCL uses %s" % peermem
    if dmabuf and nccl is None:
        return Finding(NAME, name, Status.WARN, "%s: GPUDirect RDMA through DMA-BUF is possible (open kernel module, Linux "
                       "%s) but the NCCL version is unknown (DMA-BUF needs 2.19+) and no nvidia_peermem is loaded"
                       % (name, facts.get("kernel") or "?"), expected="NCCL >= 2.19 or nvidia_peermem",
                       actual="unknown"), ""
    if dmabuf:
        return Finding(NAME, name, Status.FAIL, "%s: GPUDirect RDMA module not loaded and %s predates DMA-BUF (2.19): NCCL "
                       "stages every RDMA transfer through host memory; upgrade NCCL or modprobe nvidia_peermem"
                       % (name, version), expected="NCCL >= 2.19 or nvidia_peermem", actual=version, action="fix_config"), ""
    return Finding(NAME, name, Status.FAIL, "%s: GPUDirect RDMA module not loaded (expected nvidia_peermem or nv_peer_mem, "
                   "or DMA-BUF: the open kernel module on Linux >= 5.12): NCCL stages every RDMA transfer through host "
                   "memory" % name, expected="nvidia_peermem loaded", actual="not loaded", action="fix_config"), ""


def _judge(node: Any, facts: Dict[str, Any], driver: Any = None) -> List[Finding]:
    name = node.name
    if not facts.get("gpus"):
        return [Finding(NAME, name, Status.ERROR, "%s: no NVIDIA GPU found in sysfs: GPUDirect RDMA not checked (see the gpu check)" % name)]
    if not facts.get("hcas"):
        return [Finding(NAME, name, Status.SKIP, "no RDMA HCA: GPUDirect RDMA does not apply")]
    out: List[Finding] = []
    missing, path = _path(name, facts, _nccl(driver))
    if missing is not None:
        out.append(missing)
    ports = sorted({b for p in facts.get("paths") or [] for b in p["bridges"]})
    if facts.get("virtual"):
        acs_note = "ACS not judged in a VM (%s)" % facts["virtual"]
    elif not ports:
        acs_note = "no GPU shares a PCIe switch with an HCA"
    elif facts.get("acs") is None or any((facts["acs"].get(b) or {}).get("access_denied") for b in ports):
        why = facts.get("lspci_error") or "lspci could not read the bridges' capabilities (run as root)"
        out.append(Finding(NAME, name, Status.ERROR, "%s: ACS on %s between GPUs and HCAs unknown: %s" % (name, plural(len(ports), "switch port"), why)))
        acs_note = ""
    else:
        redirecting = []
        for bdf in ports:
            ctl = (facts["acs"].get(bdf) or {}).get("acs_ctl")
            if ctl and any(ctl.get(flag) for flag in REDIRECTS):
                redirecting.append((bdf, "+".join(f for f in REDIRECTS if ctl.get(f))))
        for bdf, flags in redirecting:
            index = {gpu: i for i, gpu in enumerate(sorted(facts["gpus"]))}
            pairs = ", ".join("GPU %s (%s)↔%s" % (index.get(p["gpu"], "?"), p["gpu"], p["hca"]) for p in facts["paths"] if bdf in p["bridges"])
            out.append(Finding(
                NAME, name, Status.FAIL,
                "%s PCIe switch port %s: ACS %s on (expected off on bare metal): peer traffic of %s is redirected to the root complex" % (name, bdf, flags, pairs),
                expected="ReqRedir- CmpltRedir-", actual=flags, data={"bridge": bdf}, action="fix_config"))
        acs_note = "no ACS redirect on the %s between GPUs and HCAs" % plural(len(ports), "switch port")
    if not out:
        out.append(Finding(NAME, name, Status.PASS, "%s; %s; IOMMU %s" % (path, acs_note, facts.get("iommu") or "unknown")))
    return out


def rule(view: ClusterView) -> List[Finding]:
    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, view.facts[node.name].get("driver")))


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
    probe=probe,
    rule=rule,
    needs=("driver",),
    reads="sysfs PCI tree of GPUs and RDMA HCAs, /sys/module/{nvidia_peermem,nv_peer_mem}, the kernel version and "
    "DMA-BUF support; lspci -D -vvv (ACS) only where a PCIe switch sits between a GPU and an HCA",
    takes="< 0.5 s",
    order=67,
)

"""The gpudirect check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy
from preflight.probe.pci import bridges, hypervisor, nvidia_gpus, rdma_hcas

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional

MODULES = ("nvidia_peermem", "nv_peer_mem")
#: ACS controls that send peer-to-peer requests or completions up to the root complex.
REDIRECTS = ("ReqRedir", "CmpltRedir")
_DEVICE = lazy(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (.+)$")
_PORT = lazy(r"^Capabilities: \[[0-9a-f]+\] Express \(v\d\) ([A-Za-z ]+?)(?: \(Slot[+-]\))?(?:, .*)?$")
_FLAG = lazy(r"([A-Za-z]+)([+-])")


def _iommu(ctx: Any, gpus: List[str]) -> Optional[str]:
    if not ctx.listdir(ctx.sys_path("class", "iommu")):
        return "off"
    for bdf in gpus:
        kind = ctx.read(ctx.sys_path("bus", "pci", "devices", bdf, "iommu_group", "type"))
        if kind:
            return "passthrough" if kind.strip() == "identity" else "translated"
    return "on"


def kernel_release() -> str:
    """The running kernel's release (platform.release() without importing platform: its nine regular
    expressions cost every node's run more than this whole probe)."""
    return os.uname().release


def _dmabuf_possible(ctx: Any) -> bool:
    """The open NVIDIA kernel module (module/nvidia/taint without P: not proprietary) on Linux >= 5.12."""
    taint = ctx.read(ctx.sys_path("module", "nvidia", "taint"))
    release = kernel_release().split("-")[0].split(".")
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
        "kernel": kernel_release()[:64],
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

"""The gpudirect check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.gpudirect import NAME
from preflight.checks.gpudirect.probe import REDIRECTS
from preflight.common import plural
from preflight.model import ClusterView, Finding, Status, per_gpu_node

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

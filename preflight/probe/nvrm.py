"""GPU failures the NVIDIA driver logs without an "Xid N:" line, found in the kernel log on the node.

Standard library only, Python 3.8 compatible (runs in the probe bundle; xid's probe calls parse()). Real
captures, each in a fixture under tests/fixtures/xid/ with its source:

- a GPU fallen off the bus, its message spread over indented continuation lines and often with no Xid
  (NVIDIA/NVSentinel issue #155, driver 570.158.01)::

    [ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
                   NVRM: (PCI ID: 10de:26b5) installed in this system has
                   NVRM: fallen off the bus and is not responding to commands.
    [ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).

  and the older one-line form "NVRM: GPU at 0000:01:00.0 has fallen off the bus." (Bumblebee-Project/Bumblebee
  issue #554);
- a GPU the driver could not take: "nvidia: probe of 0000:01:00.0 failed with error -1" (newer kernels:
  "nvidia 0000:01:00.0: probe with driver nvidia failed with error -1") before "The NVIDIA probe routine
  failed for N device(s)", the reason in the lines before it ("... is not supported by open nvidia.ko
  because it does not include the required GPU System Processor", NVIDIA/open-gpu-kernel-modules issue #587);
- GSP firmware hangs, named by the driver's GPU number, often with no Xid 119 yet (open-gpu-kernel-modules
  issue #1230, 595.71.05, and ublue-os/bazzite issue #4449)::

    [   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs ... timeout 5200
    [   84.300480] NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.
    [   84.300488] NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout ****...

  "GPU<n>" is the driver's number; an Xid 119 line names it with its bus ("Timeout after 45s of waiting for
  RPC response from GPU4 GSP!", leptonai/gpud pull request #500), which maps it (gsp_gpus).

parse(text, source) returns the events folded per (kind, pci, gpu), each with count, first_ts, last_ts and
recent (as kernlog.fold), read from the first and last kernlog.RECENT lines of each: a GPU that logged a heartbeat
timeout every few seconds for a week sends one entry.
"""

from __future__ import annotations


from preflight.probe import kernlog
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

_BDF = r"((?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
#: The next line of one message: indented (dmesg, journalctl), or on a console without stamps "NVRM: ..." that
#: starts no message of its own (the driver prints "The NVIDIA GPU %04x:%02x:%02x.%x\nNVRM: (PCI ID: ...) installed
#: in this system has\nNVRM: fallen off the bus ..." as one printk, open-gpu-kernel-modules kernel-open/nvidia)
_MORE = r"(?:[ \t]+|(?=NVRM: (?!Xid |The NVIDIA GPU |GPU )))"
#: (kind, pattern, literal it holds): group 1 the bus id or the driver's GPU<n>; a pattern never crosses into the
#: next stamped line.
PATTERNS = (
    ("fallen_off_bus", lazy(r"NVRM: (?:The NVIDIA GPU|GPU at|GPU) (?:PCI:)?" + _BDF + r"(?::|\b)(?:[^\n]*\n" + _MORE + r"){0,3}?[^\n]*?fallen off the bus"), "fallen off the bus"),
    ("probe_failed", lazy(r"nvidia(?:: probe of " + _BDF + r"| " + _BDF + r": probe with driver nvidia) failed with error (-?\d+)"), "failed with error"),
    ("probe_failed", lazy(r"NVRM: The NVIDIA probe routine failed for (\d+) device\(s\)"), "probe routine failed"),
    ("gsp_timeout", lazy(r"NVRM: (?:(GPU\d+) )?_kgspLogRpcTimeout: \**\s*GSP Timeout"), "GSP Timeout"),
    ("gsp_heartbeat", lazy(r"NVRM: (?:(GPU\d+) )?(?:_kgspIsHeartbeatTimedOut: Heartbeat timed out|_kgspRpcRecvPoll: GSP RM heartbeat timed out)"), "eartbeat timed out"),
    ("memsys_error", lazy(r"NVRM: (?:(GPU\d+) )?\w+: Memory Subsystem Error detected"), "Memory Subsystem Error detected"),
)
#: "The NVIDIA GPU <bdf> ... is not supported ..." (a line of its own per part in old drivers, continuation
#: lines in new ones): the reason a probe failed that is the driver's, not the GPU's.
_UNSUPPORTED = lazy(r"NVRM: The NVIDIA GPU " + _BDF + r"(?:[^\n]*\n){0,3}?[^\n]*?is not supported")
#: an Xid line that names the driver's GPU<n> beside the bus id (Xid 119/120 text)
_GPU_OF_XID = lazy(r"NVRM: Xid \((?:PCI:)?" + _BDF + r"\): \d+,[^\n]*?\b(GPU\d+) GSP\b")
MAX_DETAIL = 200


def bus(address: Optional[str]) -> Optional[str]:
    """0000:b3:00.0 / 00000000:B3:00.0 / 01:00.0 -> 0000:b3:00 (how Xid lines write a GPU)."""
    if not address:
        return None
    parts = address.lower().split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    return "%s:%s:%s" % (parts[0][-4:].rjust(4, "0"), parts[1], parts[2].split(".")[0])


def gsp_gpus(text: str) -> Dict[str, str]:
    """{"GPU4": "0000:9b:00"}: the driver's GPU numbers that an Xid line names beside its bus id."""
    if " GSP" not in text:
        return {}
    return {gpu: bus(pci) or pci for pci, gpu in _GPU_OF_XID.findall(text)}


def _matches(text: str) -> Dict[Tuple[str, Optional[str], Optional[str]], List[Tuple[int, str]]]:
    """{(kind, pci, gpu): [(position, detail)]} of every match, in log order."""
    found: Dict[Tuple[str, Optional[str], Optional[str]], List[Tuple[int, str]]] = {}
    for kind, pattern, literal in PATTERNS:
        if literal not in text:
            continue
        for m in pattern.finditer(text):
            groups = [g for g in m.groups() if g is not None]
            pci = gpu = None
            if kind == "probe_failed" and pattern is PATTERNS[1][1]:
                pci, detail = bus(groups[0]), "probe of the GPU failed with error %s" % groups[1]
            elif kind == "probe_failed":
                detail = "the NVIDIA probe routine failed for %s device(s)" % groups[0]
            elif kind == "fallen_off_bus":
                pci, detail = bus(groups[0]), "GPU has fallen off the bus"
            else:
                gpu = groups[0] if groups else None
                detail = " ".join(m.group(0).replace("*", "").split())
            found.setdefault((kind, pci, gpu), []).append((m.start(), detail[:MAX_DETAIL]))
    for key, hits in found.items():  # one heartbeat timeout is written by two functions: counted once
        if key[0] == "gsp_heartbeat" and any("_kgspIsHeartbeatTimedOut" in d for _at, d in hits):
            found[key] = [(at, d) for at, d in hits if "_kgspIsHeartbeatTimedOut" in d]
    return found


def parse(text: str, source: str) -> List[Dict[str, Any]]:
    """The non-Xid GPU failure events of a kernel log (module doc), folded per (kind, pci, gpu), in log order.

    Each: {"kind": "fallen_off_bus"|"probe_failed"|"gsp_timeout"|"gsp_heartbeat"|"memsys_error", "pci":
    "0000:b3:00"|None, "gpu": "GPU6"|None (the driver's number), "detail", "reason" (probe_failed: "fallen off
    the bus"|"not supported by this driver"|None), count, first_ts, last_ts, recent}. A GSP event whose GPU<n>
    an Xid line maps gets its pci.
    """
    found = _matches(text)
    if not found:
        return []
    mapped = gsp_gpus(text) if any(key[2] for key in found) else {}
    probed = any(key[0] == "probe_failed" and key[1] for key in found)
    unsupported = {bus(m.group(1)) for m in _UNSUPPORTED.finditer(text)} if probed and "is not supported" in text else set()
    fallen = {key[1] for key in found if key[0] == "fallen_off_bus"}
    out: List[Tuple[int, Dict[str, Any]]] = []
    for (kind, pci, gpu), hits in found.items():
        kept = hits if len(hits) <= kernlog.RECENT + 1 else [hits[0]] + hits[-kernlog.RECENT:]
        stamps = []
        for at, _detail in kept:
            line = kernlog.line_at(text, at, source)
            stamps.append(line[0] if line is not None else None)
        reason = None
        if kind == "probe_failed" and pci is not None:
            reason = "fallen off the bus" if pci in fallen else "not supported by this driver" if pci in unsupported else None
        recent = stamps if len(hits) <= kernlog.RECENT else stamps[-kernlog.RECENT:]
        out.append((hits[0][0], {
            "kind": kind, "pci": pci if pci is not None or gpu is None else mapped.get(gpu), "gpu": gpu,
            "detail": hits[-1][1], "reason": reason, "count": len(hits), "first_ts": stamps[0],
            "last_ts": stamps[-1], "recent": recent}))
    return [entry for _at, entry in sorted(out, key=lambda x: x[0])]

"""GPU facts from nvidia-smi (the gpu check's fallback source): `nvidia-smi -q -x` and `nvidia-smi nvlink --status`.

Standard library only, Python 3.8 compatible: pure parsers, run on the node by the gpu probe and on recorded
outputs by the tests (tests/fixtures/gpu, and the real captures tests/realworld/test_gpu.py reads).
Formats: the nvidia-smi XML of drivers 418-595 (schemas v11-v13: clocks_throttle_reasons, later
clocks_event_reasons; ECC in the legacy single/double-bit or the sram/dram layout) and the text of
`nvidia-smi nvlink --status` (NVIDIA System Management Interface documentation).
"""

from __future__ import annotations

import re

from preflight.node_model import ParseError
from preflight.probe.gpu_facts import empty_gpu
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

# ---------------------------------------------------------------------------------- nvidia-smi -q -x

_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


def parse_nvidia_smi_xml(text: str) -> Dict[str, Any]:
    """Facts from `nvidia-smi -q -x` output (drivers 5xx: clocks_throttle_reasons or clocks_event_reasons)."""
    import xml.etree.ElementTree as ET  # here, not at the top: a node without GPUs never parses XML
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi -q -x: not well-formed XML (%s)" % exc)
    if root.tag != "nvidia_smi_log":
        raise ParseError("nvidia-smi -q -x: root element is <%s>, expected <nvidia_smi_log>" % root.tag)
    attached = _int(_req(root, "attached_gpus", "nvidia_smi_log"), "attached_gpus")
    if attached is None:
        raise ParseError("nvidia-smi -q -x: attached_gpus is N/A")
    gpus = [_parse_gpu(index, el) for index, el in enumerate(root.findall("gpu"))]
    return {
        "source": "nvidia-smi",
        "error": None,
        "driver_version": _req(root, "driver_version", "nvidia_smi_log"),
        "cuda_version": _na(_opt(root, "cuda_version")),
        "attached_gpus": attached,
        "gpus": gpus,
    }


def _req(el: Any, path: str, where: str) -> str:
    found = el.find(path)
    if found is None:
        raise ParseError("nvidia-smi -q -x: <%s> has no <%s>" % (where, path))
    return (found.text or "").strip()


def _opt(el: Any, path: str) -> Optional[str]:
    found = el.find(path)
    return None if found is None else (found.text or "").strip()


def _na(value: Optional[str]) -> Optional[str]:
    return None if value in (None, "", "N/A") else value


def _int(value: Optional[str], what: str) -> Optional[int]:
    if _na(value) is None:
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError:
        raise ParseError("nvidia-smi -q -x: %s is %r, expected an integer or N/A" % (what, value))


def _flag(value: Optional[str], what: str, true: str, false: str) -> Optional[bool]:
    if _na(value) is None:
        return None
    if value == true:
        return True
    if value == false:
        return False
    raise ParseError("nvidia-smi -q -x: %s is %r, expected %s, %s or N/A" % (what, value, true, false))


def _width(value: Optional[str], what: str) -> Optional[int]:
    if _na(value) is None:
        return None
    match = re.match(r"^(\d+)x$", value or "")
    if not match:
        raise ParseError("nvidia-smi -q -x: %s is %r, expected a width like 16x" % (what, value))
    return int(match.group(1))


def _parse_gpu(index: int, el: Any) -> Dict[str, Any]:
    where = "gpu id=%s" % el.get("id")
    gpu = empty_gpu(index)
    gpu["name"] = _req(el, "product_name", where)
    gpu["uuid"] = _req(el, "uuid", where)
    gpu["pci_bus_id"] = _req(el, "pci/pci_bus_id", where)
    gpu["serial"] = _na(_opt(el, "serial"))
    gpu["persistence_mode"] = _flag(_opt(el, "persistence_mode"), where + " persistence_mode", "Enabled", "Disabled")
    gpu["mig_enabled"] = _flag(_opt(el, "mig_mode/current_mig"), where + " current_mig", "Enabled", "Disabled")
    gpu["mig_pending"] = _flag(_opt(el, "mig_mode/pending_mig"), where + " pending_mig", "Enabled", "Disabled")
    gpu["ecc_enabled"] = _flag(_opt(el, "ecc_mode/current_ecc"), where + " current_ecc", "Enabled", "Disabled")
    gpu["ecc_pending"] = _flag(_opt(el, "ecc_mode/pending_ecc"), where + " pending_ecc", "Enabled", "Disabled")
    gpu["ecc_uncorrectable_volatile"] = _uncorrectable(el, "volatile", where, gpu["ecc_enabled"])
    gpu["ecc_uncorrectable_aggregate"] = _uncorrectable(el, "aggregate", where, gpu["ecc_enabled"])
    gpu["retired_pages_pending"] = _flag(
        _opt(el, "retired_pages/pending_retirement"), where + " pending_retirement", "Yes", "No"
    )
    gpu["remapped_rows_pending"] = _flag(
        _opt(el, "remapped_rows/remapped_row_pending"), where + " remapped_row_pending", "Yes", "No"
    )
    gpu["remapped_rows_failure"] = _flag(
        _opt(el, "remapped_rows/remapped_row_failure"), where + " remapped_row_failure", "Yes", "No"
    )
    link = "pci/pci_gpu_link_info/"
    gpu["pcie"] = {
        "gen": _int(_opt(el, link + "pcie_gen/current_link_gen"), where + " current_link_gen"),
        "max_gen": _int(_opt(el, link + "pcie_gen/max_link_gen"), where + " max_link_gen"),
        "width": _width(_opt(el, link + "link_widths/current_link_width"), where + " current_link_width"),
        "max_width": _width(_opt(el, link + "link_widths/max_link_width"), where + " max_link_width"),
    }
    gpu["clock_events"] = _clock_events(el, where)
    gpu["fabric"] = _fabric(el)
    mode = _na(_opt(el, "gpu_virtualization_mode/virtualization_mode"))
    if mode in GUEST_MODES:
        gpu["virtualization"] = mode
    return gpu


#: <virtualization_mode> values of a GPU whose driver runs inside a VM (nvmlGpuVirtualizationMode_t:
#: PASSTHROUGH, VGPU; "Host VGPU"/"Host VSGA" are the hypervisor's own side). Real captures: Pass-Through
#: in an A100-SXM4 VM (netdata testdata), AWS A10G and T4 instances (telegraf testdata); VGPU on a P4 guest.
GUEST_MODES = ("Pass-Through", "VGPU")


def _uncorrectable(el: Any, kind: str, where: str, enabled: Optional[bool]) -> Optional[int]:
    """Uncorrectable ECC errors in ecc_errors/<kind>, in either layout nvidia-smi has written:

    - Ampere onwards (and Volta on newer drivers): sram_uncorrectable[_parity|_secded], dram_uncorrectable
      counters side by side; their sum.
    - the legacy layout (Pascal/Volta on older drivers, e.g. Tesla P100 on 510): single_bit/... and
      double_bit/{device_memory, register_file, l1_cache, l2_cache, texture_memory, texture_shm, cbu,
      total}; a double-bit error is the uncorrectable one, so double_bit/total (else the sum of its parts).
    """
    block = el.find("ecc_errors/" + kind)
    if block is None:
        if enabled:
            raise ParseError("nvidia-smi -q -x: %s has ECC enabled but no ecc_errors/%s" % (where, kind))
        return None
    legacy = block.find("double_bit")
    if legacy is not None:
        total = legacy.find("total")
        if total is not None:
            return _int((total.text or "").strip(), "%s %s/double_bit/total" % (where, kind))
        counters = list(legacy)
    else:
        counters = [c for c in block if "uncorrectable" in c.tag]
    if not counters and enabled:
        raise ParseError(
            "nvidia-smi -q -x: %s ecc_errors/%s has neither *_uncorrectable counters nor double_bit" % (where, kind)
        )
    values = [_int((c.text or "").strip(), "%s %s/%s" % (where, kind, c.tag)) for c in counters]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _clock_events(el: Any, where: str) -> Optional[List[str]]:
    block = el.find("clocks_event_reasons")
    if block is None:
        block = el.find("clocks_throttle_reasons")
    if block is None:
        return None
    active = []
    seen = False
    for child in block:
        name = child.tag
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        else:
            continue  # e.g. a counters sub-block: not a reason
        state = _flag((child.text or "").strip(), "%s %s" % (where, child.tag), "Active", "Not Active")
        if state is None:
            continue
        seen = True
        if state:
            active.append(name)
    return active if seen else None


def clock_events_by_bus(text: str) -> Dict[str, Optional[List[str]]]:
    """{pci_bus_id: active clock event reasons} from `nvidia-smi -q -x` (whole, or -d PERFORMANCE)."""
    import xml.etree.ElementTree as ET  # here, not at the top: a node without GPUs never parses XML
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi -q -x -d PERFORMANCE: not well-formed XML (%s)" % exc)
    out: Dict[str, Optional[List[str]]] = {}
    for el in root.findall("gpu"):
        bus = _opt(el, "pci/pci_bus_id") or el.get("id")
        if bus:
            out[bus] = _clock_events(el, "gpu id=%s" % el.get("id"))
    return out


def _fabric(el: Any) -> Optional[Dict[str, Any]]:
    """<fabric>: state, status, cliqueId, clusterUuid (R535+; GB200 trays fill the clique and cluster)."""
    state = _na(_opt(el, "fabric/state"))
    if state is None or state == "Not Supported":
        return None
    clique = _na(_opt(el, "fabric/cliqueId"))
    return {
        "state": state,
        "status": _opt(el, "fabric/status") or "N/A",
        "clique_id": int(clique) if clique and clique.isdigit() else None,
        "cluster_uuid": _na(_opt(el, "fabric/clusterUuid")),
    }


# ------------------------------------------------------------------------- nvidia-smi nvlink --status

_GPU_LINE = lazy(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)(.*)$")
_LINK_LINE = lazy(r"^Link (\d+): (.+)$")
_RATE = lazy(r"^\d+(\.\d+)? GB/s$")


def read_nvlink_status(text: str) -> Tuple[Dict[str, Optional[Dict[str, Any]]], List[str]]:
    """({GPU uuid: link counts or None}, [lines not understood]) from `nvidia-smi nvlink --status`.

    Counts are {"active": n, "inactive": m}, plus "unreadable": k when k of this GPU's link lines were
    not understood, or {"active": 0, "inactive": 0, "error": why} when the driver printed a message
    instead of links: "NVML: Unable to retrieve NVLink information as all links are inActive" on its own
    line under the GPU header (as nvidia-smi prints it; also accepted at the end of the header line), for
    a GPU without NVLink or one whose every link is down (the rule tells them apart by the model; see
    leptonai/gpud issue 1085). A line not understood is named and skipped, never a reason to drop the rest.
    """
    out: Dict[str, Optional[Dict[str, Any]]] = {}
    unreadable: List[str] = []
    current: Optional[str] = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU_LINE.match(line)
        if gpu:
            current = gpu.group(3)
            note = gpu.group(4).strip()
            out[current] = {"active": 0, "inactive": 0, "error": note} if note else {"active": 0, "inactive": 0}
            continue
        link = _LINK_LINE.match(line)
        counts = out.get(current) if current is not None else None
        if (counts is not None and not link and line.startswith("NVML: ") and "error" not in counts
                and counts["active"] + counts["inactive"] + counts.get("unreadable", 0) == 0):
            counts["error"] = line  # the driver's message on its own line under the header (real layout)
            continue
        if link and counts is not None and "error" not in counts:
            state = link.group(2).strip()
            if state == "<inactive>":
                counts["inactive"] += 1
                continue
            if _RATE.match(state):
                counts["active"] += 1
                continue
            counts["unreadable"] = counts.get("unreadable", 0) + 1
        unreadable.append("line %d: %r" % (number, line))
    final = {}
    for uuid, c in out.items():
        empty = c is not None and c["active"] + c["inactive"] + c.get("unreadable", 0) == 0 and "error" not in c
        final[uuid] = None if empty else c
    return final, unreadable


def parse_nvlink_status(text: str) -> Dict[str, Optional[Dict[str, Any]]]:
    """read_nvlink_status, strict: any line not understood is a ParseError (for recorded fixtures)."""
    counts, unreadable = read_nvlink_status(text)
    if unreadable:
        raise ParseError("nvidia-smi nvlink --status %s: unexpected" % unreadable[0])
    return counts


def merge_nvlink(facts: Dict[str, Any], links: Dict[str, Optional[Dict[str, int]]]) -> None:
    for gpu in facts["gpus"]:
        gpu["nvlink"] = links.get(gpu["uuid"])


"""gpu: every node shows the GPUs the inventory promises, each one healthy enough to join a collective.

Facts come from NVML when ``pynvml.nvmlInit()`` works, else from ``nvidia-smi -q -x`` (plus
``nvidia-smi nvlink --status`` for link states, which the XML does not carry), else they record that no
driver answered. Set ``PREFLIGHT_NVML=off`` in the node's environment to skip NVML and read nvidia-smi
(useful where a container's libnvidia-ml does not match the host driver).

Facts schema (both sources produce the same one)::

    source          "nvml" | "nvidia-smi" | None (no driver answered)
    error           why no source worked (None when one did)
    nvml_error      why NVML was not used (None when it was)
    driver_version  "550.54.15" | None
    cuda_version    "12.4" | None          (CUDA version the driver supports)
    attached_gpus   int                    (what the driver reports; may exceed len(gpus))
    gpus            [gpu, ...] in nvidia-smi index order (PCI bus order)

    gpu = {
      index int, name str, pci_bus_id "00000000:4E:00.0", uuid str, serial str|None,
      persistence_mode bool|None, ecc_enabled bool|None, ecc_pending bool|None,
      ecc_uncorrectable_volatile int|None, ecc_uncorrectable_aggregate int|None,
      retired_pages_pending bool|None,                  (pre-Ampere page retirement)
      remapped_rows_pending bool|None, remapped_rows_failure bool|None,  (Ampere+ row remapping)
      pcie {gen, max_gen, width, max_width: int|None},
      clock_events [active reason names]|None,          (gpu_idle, sw_power_cap, hw_slowdown,
                                                         hw_thermal_slowdown, sw_thermal_slowdown,
                                                         hw_power_brake_slowdown, ...)
      nvlink {active int, inactive int}|None,           (None: no NVLink or not reported)
      fabric {state "Completed"|"In Progress"|"Not Started", status "Success"|...}|None,  (Hopper+)
      error str|None                                     (NVML could not read this GPU at all)
    }

Rule (per node; gpus_per_node from the inventory):

- gpus_per_node 0: SKIP (CPU-only node).
- no driver answered, or fewer GPUs than expected: FAIL; more than expected: WARN (fix the inventory).
- per GPU, FAIL: volatile uncorrectable ECC > 0, row-remap failure, row remap pending, retired pages
  pending, HW slowdown / HW thermal slowdown / HW power brake active (clocks cut by half or more: the
  straggler every all-reduce waits for), fewer NVLinks active than the node's other GPUs, NVML error.
- per GPU, WARN: persistence mode off, ECC disabled, SW thermal slowdown active, PCIe width below max.
  A PCIe *generation* below max alone is not reported: idle GPUs downshift the link to save power and
  speed it up under load. The width does not change with load, so a narrower link is a real fault
  (reseat / riser); the message then shows generation and width against the maximum.
- /dev/shm (from the ssh check's facts) below 1 GiB: WARN (Docker's 64 MiB default breaks NCCL's SHM
  transport).
- otherwise one PASS: "8× NVIDIA H100 80GB HBM3, healthy".

GPU fabric state (Hopper NVSwitch registration) is collected here and judged by fabric_manager.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import human_bytes, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node

NAME = "gpu"
#: Below this /dev/shm size NCCL's shared-memory transport fails on multi-GPU nodes.
MIN_SHM_BYTES = 1 << 30
#: Clock event reasons that cut clocks hard enough to make this GPU the straggler: FAIL.
HW_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
#: Reasons worth a warning: the driver is cooling the GPU down.
SW_THROTTLE = ("sw_thermal_slowdown",)

#: NVML clock event reason bits (nvmlClocksEventReason*, same values as the older *ThrottleReason*).
EVENT_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clocks_setting"),
)
#: nvmlGpuFabricState_t as nvidia-smi prints it (0 = not supported: no fabric facts).
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}


# --------------------------------------------------------------------------------------------- probe


def probe(ctx: Any) -> Dict[str, Any]:
    """GPU facts from NVML, else nvidia-smi, else a record that neither answered."""
    nvml, nvml_error = load_nvml()
    if nvml is not None:
        try:
            facts = facts_from_nvml(nvml)
            facts["nvml_error"] = None
            return facts
        except Exception as exc:  # NVML answered init but not the queries: try nvidia-smi instead
            nvml_error = "NVML query failed: %s" % (exc,)
        finally:
            nvml_shutdown(nvml)
    smi = ctx.run(["nvidia-smi", "-q", "-x"], timeout=60.0)
    if smi.rc == 127:
        return no_gpu_facts("nvidia-smi not found and NVML unavailable", nvml_error)
    if not smi.ok:
        return no_gpu_facts("nvidia-smi failed (%s): %s" % (_why(smi), _first_line(smi)), nvml_error)
    facts = parse_nvidia_smi_xml(smi.stdout)
    links = ctx.run(["nvidia-smi", "nvlink", "--status"], timeout=30.0)
    if links.ok and links.stdout.strip():
        merge_nvlink(facts, parse_nvlink_status(links.stdout))
    facts["nvml_error"] = nvml_error
    return facts


def no_gpu_facts(error: str, nvml_error: Optional[str]) -> Dict[str, Any]:
    return {
        "source": None,
        "error": error,
        "nvml_error": nvml_error,
        "driver_version": None,
        "cuda_version": None,
        "attached_gpus": 0,
        "gpus": [],
    }


#: Present whenever the NVIDIA kernel driver is loaded (also inside GPU containers).
NVIDIA_PROC = "/proc/driver/nvidia"


def load_nvml() -> Tuple[Any, Optional[str]]:
    """(pynvml module after a successful nvmlInit, None) or (None, the reason it is not usable).

    pynvml is imported only where an NVIDIA driver is loaded: compiling it costs ~40 ms of CPU on
    every node, for nothing on a node without one.
    """
    if os.environ.get("PREFLIGHT_NVML", "").lower() in ("0", "off", "no", "false"):
        return None, "disabled by PREFLIGHT_NVML"
    if not os.path.isdir(NVIDIA_PROC):
        return None, "no NVIDIA kernel driver loaded (%s absent)" % NVIDIA_PROC
    try:
        import pynvml  # shipped with the probe bundle
    except ImportError as exc:
        return None, "pynvml not importable: %s" % exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return None, str(exc) or type(exc).__name__
    return pynvml, None


def _why(res: Any) -> str:
    return "timed out" if res.timed_out else "rc %d" % res.rc


def _first_line(res: Any) -> str:
    for text in (res.stdout, res.stderr):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "no output"


# ---------------------------------------------------------------------------------------------- NVML


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def facts_from_nvml(nvml: Any) -> Dict[str, Any]:
    """The facts schema read through NVML (pynvml or anything with its function names)."""
    cuda = nvml.nvmlSystemGetCudaDriverVersion()
    count = nvml.nvmlDeviceGetCount()
    gpus = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(_gpu_from_nvml(nvml, index, handle))
        except nvml.NVMLError as exc:
            gpus.append(_empty_gpu(index, error=str(exc)))
    return {
        "source": "nvml",
        "error": None,
        "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
        "cuda_version": "%d.%d" % (cuda // 1000, (cuda % 1000) // 10),
        "attached_gpus": count,
        "gpus": gpus,
    }


def _empty_gpu(index: int, error: Optional[str] = None) -> Dict[str, Any]:
    return {
        "index": index,
        "name": None,
        "pci_bus_id": None,
        "uuid": None,
        "serial": None,
        "persistence_mode": None,
        "ecc_enabled": None,
        "ecc_pending": None,
        "ecc_uncorrectable_volatile": None,
        "ecc_uncorrectable_aggregate": None,
        "retired_pages_pending": None,
        "remapped_rows_pending": None,
        "remapped_rows_failure": None,
        "pcie": {"gen": None, "max_gen": None, "width": None, "max_width": None},
        "clock_events": None,
        "nvlink": None,
        "fabric": None,
        "error": error,
    }


def _optional(nvml: Any, fn: Any, *args: Any) -> Any:
    """fn(*args), or None where this GPU or driver does not support the query."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _gpu_from_nvml(nvml: Any, index: int, h: Any) -> Dict[str, Any]:
    gpu = _empty_gpu(index)
    gpu["name"] = _text(nvml.nvmlDeviceGetName(h))
    gpu["pci_bus_id"] = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
    gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(h))
    serial = _optional(nvml, nvml.nvmlDeviceGetSerial, h)
    gpu["serial"] = None if serial is None else _text(serial)
    pm = _optional(nvml, nvml.nvmlDeviceGetPersistenceMode, h)
    gpu["persistence_mode"] = None if pm is None else bool(pm)
    ecc = _optional(nvml, nvml.nvmlDeviceGetEccMode, h)
    if ecc is not None:
        gpu["ecc_enabled"], gpu["ecc_pending"] = bool(ecc[0]), bool(ecc[1])
        unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        gpu["ecc_uncorrectable_volatile"] = _optional(
            nvml, nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_VOLATILE_ECC
        )
        gpu["ecc_uncorrectable_aggregate"] = _optional(
            nvml, nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_AGGREGATE_ECC
        )
    pending = _optional(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    gpu["retired_pages_pending"] = None if pending is None else bool(pending)
    rows = _optional(nvml, nvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        gpu["remapped_rows_pending"], gpu["remapped_rows_failure"] = bool(rows[2]), bool(rows[3])
    gpu["pcie"] = {
        "gen": _optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "max_gen": _optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "width": _optional(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "max_width": _optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
    }
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    mask = _optional(nvml, reasons_fn, h)
    gpu["clock_events"] = None if mask is None else [name for bit, name in EVENT_BITS if mask & bit]
    gpu["nvlink"] = _nvml_links(nvml, h)
    gpu["fabric"] = _nvml_fabric(nvml, h)
    return gpu


def nvml_shutdown(nvml: Any) -> None:
    """Release NVML after the facts are read. A failing shutdown changes no fact already gathered, and
    the probe process exits right after, so its NVMLError is deliberately not reported."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        return


def _nvml_links(nvml: Any, h: Any) -> Optional[Dict[str, int]]:
    active = inactive = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError:
            break  # past this GPU's last link, or no NVLink at all
        if state:
            active += 1
        else:
            inactive += 1
    if active + inactive == 0:
        return None
    return {"active": active, "inactive": inactive}


def _nvml_fabric(nvml: Any, h: Any) -> Optional[Dict[str, str]]:
    import ctypes

    info = nvml.c_nvmlGpuFabricInfo_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    except (nvml.NVMLError, AttributeError):
        return None
    state = FABRIC_STATES.get(int(info.state))
    if state is None:
        return None
    if state != "Completed":
        status = "N/A"
    elif int(info.status) == 0:
        status = "Success"
    else:
        status = _text(nvml.nvmlErrorString(int(info.status)))
    return {"state": state, "status": status}


# ---------------------------------------------------------------------------------- nvidia-smi -q -x

_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


def parse_nvidia_smi_xml(text: str) -> Dict[str, Any]:
    """Facts from `nvidia-smi -q -x` output (drivers 5xx: clocks_throttle_reasons or clocks_event_reasons)."""
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
    gpu = _empty_gpu(index)
    gpu["name"] = _req(el, "product_name", where)
    gpu["uuid"] = _req(el, "uuid", where)
    gpu["pci_bus_id"] = _req(el, "pci/pci_bus_id", where)
    gpu["serial"] = _na(_opt(el, "serial"))
    gpu["persistence_mode"] = _flag(_opt(el, "persistence_mode"), where + " persistence_mode", "Enabled", "Disabled")
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
    return gpu


def _uncorrectable(el: Any, kind: str, where: str, enabled: Optional[bool]) -> Optional[int]:
    """Sum of the uncorrectable counters (sram_uncorrectable[_parity|_secded], dram_uncorrectable)."""
    block = el.find("ecc_errors/" + kind)
    if block is None:
        if enabled:
            raise ParseError("nvidia-smi -q -x: %s has ECC enabled but no ecc_errors/%s" % (where, kind))
        return None
    counters = [c for c in block if "uncorrectable" in c.tag]
    if not counters and enabled:
        raise ParseError("nvidia-smi -q -x: %s ecc_errors/%s has no *_uncorrectable counters" % (where, kind))
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


def _fabric(el: Any) -> Optional[Dict[str, str]]:
    state = _na(_opt(el, "fabric/state"))
    if state is None:
        return None
    return {"state": state, "status": _opt(el, "fabric/status") or "N/A"}


# ------------------------------------------------------------------------- nvidia-smi nvlink --status

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)(.*)$")
_LINK_LINE = re.compile(r"^Link (\d+): (.+)$")
_RATE = re.compile(r"^\d+(\.\d+)? GB/s$")


def parse_nvlink_status(text: str) -> Dict[str, Optional[Dict[str, int]]]:
    """{GPU uuid: {"active": n, "inactive": m} or None} from `nvidia-smi nvlink --status`."""
    out: Dict[str, Optional[Dict[str, int]]] = {}
    current: Optional[str] = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        gpu = _GPU_LINE.match(line)
        if gpu:
            current = gpu.group(3)
            # "... NVML: Unable to retrieve NVLink information as all links are inActive": no counts.
            out[current] = None if gpu.group(4).strip() else {"active": 0, "inactive": 0}
            continue
        link = _LINK_LINE.match(line)
        if link and current is not None and out[current] is not None:
            state = link.group(2).strip()
            counts = out[current]
            if state == "<inactive>":
                counts["inactive"] += 1  # type: ignore[index]
            elif _RATE.match(state):
                counts["active"] += 1  # type: ignore[index]
            else:
                raise ParseError("nvidia-smi nvlink --status line %d: unknown link state %r" % (number, state))
            continue
        raise ParseError("nvidia-smi nvlink --status line %d: unexpected %r" % (number, line))
    return {uuid: (c if c is None or c["active"] + c["inactive"] else None) for uuid, c in out.items()}


def merge_nvlink(facts: Dict[str, Any], links: Dict[str, Optional[Dict[str, int]]]) -> None:
    for gpu in facts["gpus"]:
        gpu["nvlink"] = links.get(gpu["uuid"])


# ---------------------------------------------------------------------------------------------- rule


def short_bus_id(bus_id: Optional[str]) -> str:
    """00000000:4E:00.0 -> 0000:4E:00.0 (the form lspci and sysfs use)."""
    if not bus_id:
        return "?"
    domain, _, rest = bus_id.partition(":")
    return "%s:%s" % (domain[-4:].rjust(4, "0"), rest) if rest else bus_id


def gpu_label(gpu: Dict[str, Any]) -> str:
    return "GPU %d (%s)" % (gpu["index"], short_bus_id(gpu.get("pci_bus_id")))


def _link(gen: Any, width: Any) -> str:
    return "Gen%s x%s" % ("?" if gen is None else gen, "?" if width is None else width)


def gpu_problems(gpu: Dict[str, Any], node_max_links: int) -> List[Tuple[Status, str, str, str]]:
    """(status, message, expected, actual) for everything wrong with one GPU."""
    label = gpu_label(gpu)
    out: List[Tuple[Status, str, str, str]] = []
    if gpu.get("error"):
        return [(Status.FAIL, "%s: NVML cannot read this GPU: %s" % (label, gpu["error"]), "readable", gpu["error"])]
    vol = gpu.get("ecc_uncorrectable_volatile")
    if vol:
        out.append((Status.FAIL, "%s: %d uncorrectable ECC errors since boot (expected 0)" % (label, vol), "0", str(vol)))
    if gpu.get("remapped_rows_failure"):
        out.append((Status.FAIL, "%s: row remapping failed (expected none): replace the GPU" % label, "no", "yes"))
    if gpu.get("remapped_rows_pending"):
        out.append((Status.FAIL, "%s: row remapping pending (expected none): reset the GPU" % label, "no", "yes"))
    if gpu.get("retired_pages_pending"):
        out.append((Status.FAIL, "%s: page retirement pending (expected none): reset the GPU" % label, "no", "yes"))
    events = gpu.get("clock_events") or []
    hard = [e for e in HW_THROTTLE if e in events]
    if hard:
        active = ", ".join(hard)
        out.append((Status.FAIL, "%s: clocks throttled by %s (expected none active)" % (label, active), "none", active))
    soft = [e for e in SW_THROTTLE if e in events]
    if soft:
        active = ", ".join(soft)
        out.append((Status.WARN, "%s: clocks throttled by %s (expected none active)" % (label, active), "none", active))
    links = gpu.get("nvlink")
    if links and node_max_links and links["active"] < node_max_links:
        actual = "%d/%d" % (links["active"], links["active"] + links["inactive"])
        out.append(
            (
                Status.FAIL,
                "%s: %s NVLinks active (expected %d like the other GPUs)" % (label, actual, node_max_links),
                str(node_max_links),
                actual,
            )
        )
    pcie = gpu.get("pcie") or {}
    if pcie.get("width") is not None and pcie.get("max_width") is not None and pcie["width"] < pcie["max_width"]:
        actual = _link(pcie.get("gen"), pcie["width"])
        expected = _link(pcie.get("max_gen"), pcie["max_width"])
        out.append((Status.WARN, "%s: PCIe link %s (expected %s)" % (label, actual, expected), expected, actual))
    if gpu.get("persistence_mode") is False:
        out.append((Status.WARN, "%s: persistence mode off (expected on: nvidia-smi -pm 1 or nvidia-persistenced)" % label, "on", "off"))
    if gpu.get("ecc_enabled") is False:
        out.append((Status.WARN, "%s: ECC disabled (expected enabled)" % label, "enabled", "disabled"))
    return out


def _node_findings(node: Any, facts: Dict[str, Any], ssh: Any) -> List[Finding]:
    name, expected = node.name, node.gpus_per_node
    if facts.get("source") is None:
        msg = "%s (expected %s)" % (facts.get("error") or "no NVIDIA driver answered", plural(expected, "GPU"))
        return [Finding(NAME, name, Status.FAIL, msg, expected=str(expected), actual="0")]
    gpus = facts.get("gpus") or []
    out: List[Finding] = []
    if len(gpus) < expected:
        attached = facts.get("attached_gpus")
        extra = "" if attached in (None, len(gpus)) else "; the driver reports %d attached" % attached
        out.append(
            Finding(
                NAME,
                name,
                Status.FAIL,
                "%s visible (expected %d)%s" % (plural(len(gpus), "GPU"), expected, extra),
                expected=str(expected),
                actual=str(len(gpus)),
            )
        )
    elif len(gpus) > expected:
        out.append(
            Finding(
                NAME,
                name,
                Status.WARN,
                "%s visible (expected %d): update gpus_per_node in the inventory" % (plural(len(gpus), "GPU"), expected),
                expected=str(expected),
                actual=str(len(gpus)),
            )
        )
    node_max_links = max([g["nvlink"]["active"] for g in gpus if g.get("nvlink")] or [0])
    for gpu in gpus:
        for status, msg, exp, act in gpu_problems(gpu, node_max_links):
            out.append(Finding(NAME, name, status, msg, expected=exp, actual=act))
    shm = ssh.get("shm_bytes") if isinstance(ssh, dict) else None
    if shm is not None and shm < MIN_SHM_BYTES:
        out.append(
            Finding(
                NAME,
                name,
                Status.WARN,
                "/dev/shm is %s (expected >= 1 GiB: NCCL's SHM transport needs it; docker --shm-size)" % human_bytes(shm),
                expected=">= 1 GiB",
                actual=human_bytes(shm),
            )
        )
    if not out:
        out.append(Finding(NAME, name, Status.PASS, "%s, healthy" % summary(gpus), actual=str(len(gpus))))
    return out


def summary(gpus: List[Dict[str, Any]]) -> str:
    """'8× NVIDIA H100 80GB HBM3' (models counted in order of first appearance)."""
    counts: Dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.get("name") or "unknown GPU"] = counts.get(gpu.get("name") or "unknown GPU", 0) + 1
    return " + ".join("%d× %s" % (n, model) for model, n in counts.items())


def rule(view: ClusterView) -> List[Finding]:
    return per_gpu_node(NAME, view, lambda node, facts: _node_findings(node, facts, view.facts[node.name].get("ssh")))


CHECK = Check(
    name=NAME,
    claim="Every GPU node shows its gpus_per_node GPUs, each without ECC/remap faults, HW throttling, "
    "degraded PCIe or missing NVLinks, and /dev/shm is at least 1 GiB",
    why="One missing, throttled or faulty GPU makes every collective wait for it or crash; NCCL needs a "
    "large /dev/shm for its shared-memory transport.",
    fix="Uncorrectable ECC / pending remap: drain the node and reset the GPU (nvidia-smi -r); remap failure: "
    "replace it. Missing GPU or narrow PCIe link: check dmesg for Xid 79, reseat. HW slowdown: check "
    "cooling and power (nvidia-smi -q -d PERFORMANCE). Persistence: enable nvidia-persistenced. "
    "/dev/shm: remount larger or run containers with --shm-size=16g (or --ipc=host).",
    probe=probe,
    rule=rule,
    needs=("ssh",),
    order=20,
)

"""GPU health facts beyond the gpu check's snapshot: memory wear and the state a previous job or admin left.

Standard library only (plus the pynvml handed in), Python 3.8 compatible: runs on the node inside the gpu
probe's NVML session (one nvmlInit for every GPU fact), or parses the nvidia-smi XML the gpu probe already
read (no extra command). Judged on the controller by the gpu_memory and gpu_state checks.

Facts: the gpu facts' "health" entry::

    health = {
      source "nvml" | "nvidia-smi",
      window_s float | None       (seconds between the two reads of the corrected-error counters; NVML only)
      error str | None            (the health reads stopped: a wedge or slow NVML; the gpu facts still stand)
      gpus {pci_bus_id: {
        remap {corr int, unc int, histogram {max, high, partial, low, none: banks}|None}|None,  (Ampere+)
        retired_pages {sbe int, dbe int}|None,                   (pre-Ampere dynamic page retirement)
        ce_volatile int|None, ce_volatile_after int|None,        (corrected ECC errors since the last
                                                                  reset, first and second read)
        compute_mode "Default"|"Exclusive_Process"|"Prohibited"|"Exclusive_Thread"|None,
        processes [{pid int, name str|None, used_mib int|None}]|None,  (compute processes; never this one)
        power_limit_w float|None, default_power_limit_w float|None,
        apps_clock_mhz int|None, default_apps_clock_mhz int|None,   (graphics applications clock)
        nvlink_errors {crc_flit, crc_data, replay, recovery: int (the counters this GPU has)}|None,
        nvlink_errors_after {same}|None,                       (NVML: the second read; None: no NVLink
                                                                counters, a PCIe part or a VM)
        pcie_replay int|None, pcie_replay_after int|None,     (PCIe replays, first and second read)
        util_gpu int|None,                                     (percent busy: the PCIe link is judged
                                                                against its maximum only under load)
        fabric_health {degraded_bw bool, route_unhealthy bool, incorrect_config str|None,
                       summary "Healthy"|"Unhealthy"|"Limited Capacity"|None}|None,
                                                               (nvmlDeviceGetGpuFabricInfoV v3, else v2:
                                                                GB200/GB300 NVLink fabric health; None:
                                                                not supported, or not registered)
        recovery_action "None"|"Reset"|"Reboot"|"Drain P2P"|"Drain and Reset"|...|None,
        reset_required bool|None, drain_and_reset bool|None,   (pre-R575 reset status; superseded by the
                                                                recovery action)
        query_errors [str],                                    (NVML answers other than NotSupported)
      }}
    }

Sources: nvml.h / NVML API reference R535-R580 (nvmlDeviceGetRemappedRows, nvmlDeviceGetRowRemapperHistogram
and nvmlRowRemapperHistogramValues_t, nvmlDeviceGetRetiredPages, nvmlDeviceGetTotalEccErrors,
nvmlDeviceGetComputeMode, nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetPowerManagement[Default]Limit
(milliwatts), nvmlDeviceGet[Default]ApplicationsClock, field values NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230,
NVML_FI_DEV_RESET_STATUS 226, NVML_FI_DEV_DRAIN_AND_RESET_STATUS 227 and nvmlDeviceGpuRecoveryAction_t);
the nvidia-smi XML of drivers 418-590 (tests/fixtures/gpu_health and ../shared/realworld/nvidia_smi_xml:
<remapped_rows><row_remapper_histogram>, <retired_pages>, <ecc_errors><volatile>, <processes>,
<power_readings> / <gpu_power_readings>, <applications_clocks>, <gpu_recovery_action>, <gpu_reset_status>).
"""

from __future__ import annotations

import os
import re
import time

from preflight.node_model import ParseError
from preflight.probe.nvml import NvmlSlow, NvmlWedged, bounded_nvml, call_c, cannot_say, entering, text

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional

#: Seconds between the two reads of the corrected-error counters: as long as the pcie and ib_errors
#: windows, which run concurrently with the gpu probe, so the window costs no wall time on such nodes.
WINDOW_S = 1.0
#: nvmlDeviceGpuRecoveryAction_t as nvidia-smi prints <gpu_recovery_action>.
RECOVERY_ACTIONS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset",
                    5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
FIELD_RECOVERY, FIELD_RESET, FIELD_DRAIN = 230, 226, 227
#: NVLink error counters, totals over all links (NVML_FI_DEV_NVLINK_*_COUNT_TOTAL). The FEC counters of
#: Blackwell (NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_*) are not read: corrected by design, not errors.
NVLINK_FIELDS = {38: "crc_flit", 45: "crc_data", 52: "replay", 59: "recovery"}
#: NVML_FI_DEV_PCIE_REPLAY_COUNTER: the GPU's PCIe link replays since boot (nvidia-smi's <replay_counter>).
FIELD_PCIE_REPLAY = 94
HISTOGRAM = ("max", "high", "partial", "low", "none")


FABRIC_VERSIONS = ((3, 0x3000028), (2, 0x2000024))
#: NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_* (bits 8-11; 0 not supported, 1 none).
INCORRECT_CONFIG = {2: "incorrect system GUID", 3: "incorrect chassis serial number", 4: "no partition",
                    5: "insufficient NVLinks", 6: "incompatible GPU firmware", 7: "invalid location",
                    8: "invalid GPU state"}
FABRIC_SUMMARY = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}


def _fabric_health(nvml: Any, health: Dict[str, Any], h: Any) -> Optional[Dict[str, Any]]:
    """The fabric health mask through nvmlDeviceGetGpuFabricInfoV, v3 then v2 (a driver that knows only v1
    answers ARGUMENT_VERSION_MISMATCH or FUNCTION_NOT_FOUND: no health, the gpu facts keep the v1 state)."""
    from preflight.probe.nvml_structs import FabricInfoV3, pointer

    for version, word in FABRIC_VERSIONS:
        info = FabricInfoV3()
        info.version = word
        entering("nvmlDeviceGetGpuFabricInfoV")
        try:
            call_c(nvml, "nvmlDeviceGetGpuFabricInfoV", h, pointer(info))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25):
                continue
            if not cannot_say(nvml, exc):
                health["query_errors"].append("NVML nvmlDeviceGetGpuFabricInfoV failed: %s" % exc)
            return None
        if int(info.state) != 3:  # not Completed: the gpu facts' fabric state says so, no health yet
            return None
        mask = int(info.healthMask)
        config = (mask >> 8) & 0xF
        return {"degraded_bw": (mask & 0x3) == 1, "route_unhealthy": ((mask >> 4) & 0x3) == 1,
                "incorrect_config": INCORRECT_CONFIG.get(config, "code %d" % config) if config > 1 else None,
                "summary": FABRIC_SUMMARY.get(int(info.healthSummary)) if version == 3 else None}
    return None


def empty_health() -> Dict[str, Any]:
    return {"remap": None, "retired_pages": None, "ce_volatile": None, "ce_volatile_after": None,
            "compute_mode": None, "pcie_replay": None, "pcie_replay_after": None, "util_gpu": None,
            "nvlink_errors": None, "fabric_health": None, "nvlink_errors_after": None, "processes": None, "power_limit_w": None, "default_power_limit_w": None,
            "apps_clock_mhz": None, "default_apps_clock_mhz": None, "recovery_action": None,
            "reset_required": None, "drain_and_reset": None, "query_errors": []}


# ---------------------------------------------------------------------------------------------- NVML


def health_from_nvml(nvml: Any, gpus: List[Dict[str, Any]], handles: Dict[int, Any],
                     window_s: float = WINDOW_S) -> Dict[str, Any]:
    """The health facts of the GPUs the gpu probe read, through the handles it opened ({index: handle}: a
    GPU without persistence mode initialises on every open), in one bounded NVML sequence: a first read,
    then (window_s after it) the corrected-error counters again. Never raises: a wedge or an NVML error
    is recorded as the health facts' error, the gpu facts stand."""
    out: Dict[str, Any] = {"source": "nvml", "window_s": None, "error": None, "gpus": {}}
    readable = [g for g in gpus if g.get("pci_bus_id") and not g.get("error") and g["index"] in handles]

    def read() -> None:
        started = time.monotonic()
        for g in readable:
            out["gpus"][g["pci_bus_id"]] = _first_read(nvml, handles[g["index"]])
        by_bus = {g["pci_bus_id"]: handles[g["index"]] for g in readable}
        counted = [bus for bus, health in out["gpus"].items() if health["ce_volatile"] is not None]
        linked = [bus for bus, health in out["gpus"].items() if health["nvlink_errors"]]
        replays = [bus for bus, health in out["gpus"].items() if health["pcie_replay"] is not None]
        if not counted and not linked and not replays:
            return
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))
        for bus in counted:
            out["gpus"][bus]["ce_volatile_after"] = _ask(nvml, out["gpus"][bus], by_bus[bus],
                                                         "nvmlDeviceGetTotalEccErrors", 0, 0)
        for bus in set(linked) | set(replays):
            fields = _ask(nvml, out["gpus"][bus], by_bus[bus], "nvmlDeviceGetFieldValues",
                          list(NVLINK_FIELDS) + [FIELD_PCIE_REPLAY])
            out["gpus"][bus]["nvlink_errors_after"] = _counters(fields) if bus in linked else None
            out["gpus"][bus]["pcie_replay_after"] = _field(fields, FIELD_PCIE_REPLAY)
        out["window_s"] = round(time.monotonic() - started, 3)

    try:
        bounded_nvml(read, "GPU health queries")
    except (NvmlWedged, NvmlSlow) as exc:
        out["error"] = str(exc)
    except Exception as exc:  # an answer not in pynvml's layout: reported (gpu_memory WARNs), GPU facts kept
        out["error"] = "NVML health queries failed: %s: %s" % (type(exc).__name__, exc)
    return out


def _ask(nvml: Any, health: Dict[str, Any], h: Any, name: str, *args: Any) -> Any:
    fn = getattr(nvml, name, None)
    if fn is None:  # this pynvml predates the function
        return None
    entering(name)
    try:
        return fn(h, *args)
    except nvml.NVMLError as exc:
        if not cannot_say(nvml, exc) and getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
            health["query_errors"].append("NVML %s failed: %s" % (name, exc))
        return None


def _first_read(nvml: Any, h: Any) -> Dict[str, Any]:
    health = empty_health()
    rows = _ask(nvml, health, h, "nvmlDeviceGetRemappedRows")
    if rows is not None:
        hist = _ask(nvml, health, h, "nvmlDeviceGetRowRemapperHistogram")
        histogram = None if hist is None else {k: int(getattr(hist, k)) for k in HISTOGRAM}
        health["remap"] = {"corr": int(rows[0]), "unc": int(rows[1]), "histogram": histogram}
    else:  # pre-Ampere: dynamic page retirement (cause 0: multiple single-bit errors, 1: a double-bit error)
        sbe = _ask(nvml, health, h, "nvmlDeviceGetRetiredPages", 0)
        dbe = _ask(nvml, health, h, "nvmlDeviceGetRetiredPages", 1)
        if sbe is not None and dbe is not None:
            health["retired_pages"] = {"sbe": len(sbe), "dbe": len(dbe)}
    # NVML_MEMORY_ERROR_TYPE_CORRECTED 0, NVML_VOLATILE_ECC 0: corrected errors since the last reset
    health["ce_volatile"] = _ask(nvml, health, h, "nvmlDeviceGetTotalEccErrors", 0, 0)
    mode = _ask(nvml, health, h, "nvmlDeviceGetComputeMode")
    health["compute_mode"] = None if mode is None else COMPUTE_MODES.get(int(mode), str(mode))
    procs = _ask(nvml, health, h, "nvmlDeviceGetComputeRunningProcesses")
    if procs is not None:
        health["processes"] = [_process(nvml, health, p) for p in procs if int(p.pid) != os.getpid()]
    limit = _ask(nvml, health, h, "nvmlDeviceGetPowerManagementLimit")
    default = _ask(nvml, health, h, "nvmlDeviceGetPowerManagementDefaultLimit")
    health["power_limit_w"] = None if limit is None else limit / 1000.0
    health["default_power_limit_w"] = None if default is None else default / 1000.0
    health["apps_clock_mhz"] = _ask(nvml, health, h, "nvmlDeviceGetApplicationsClock", 0)  # NVML_CLOCK_GRAPHICS
    health["default_apps_clock_mhz"] = _ask(nvml, health, h, "nvmlDeviceGetDefaultApplicationsClock", 0)
    fields = _ask(nvml, health, h, "nvmlDeviceGetFieldValues", [FIELD_RECOVERY, FIELD_RESET, FIELD_DRAIN, FIELD_PCIE_REPLAY] + list(NVLINK_FIELDS))
    health["nvlink_errors"] = _counters(fields)
    health["pcie_replay"] = _field(fields, FIELD_PCIE_REPLAY)
    health["fabric_health"] = _fabric_health(nvml, health, h)
    util = _ask(nvml, health, h, "nvmlDeviceGetUtilizationRates")
    health["util_gpu"] = None if util is None else int(util.gpu)
    for field in fields or []:
        if int(field.nvmlReturn) != 0:
            continue  # this driver has not that field (R575 added the recovery action)
        value = _value(field)
        if field.fieldId == FIELD_RECOVERY:
            health["recovery_action"] = RECOVERY_ACTIONS.get(value, "action %d" % value)
        elif field.fieldId == FIELD_RESET:
            health["reset_required"] = bool(value)
        elif field.fieldId == FIELD_DRAIN:
            health["drain_and_reset"] = bool(value)
    return health


def _value(field: Any) -> int:
    """A field value by its nvmlValueType_t (0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint)."""
    kind = int(field.valueType)
    return int((field.value.dVal, field.value.uiVal, field.value.ulVal, field.value.ullVal, field.value.sllVal,
                field.value.siVal)[kind] if kind < 6 else field.value.ullVal)


def _counters(fields: Any) -> Optional[Dict[str, int]]:
    """The NVLink error counters among the field values this GPU answered (None: it has none)."""
    got = {NVLINK_FIELDS[int(f.fieldId)]: _value(f) for f in fields or []
           if int(f.fieldId) in NVLINK_FIELDS and int(f.nvmlReturn) == 0}
    return got or None


def _field(fields: Any, field_id: int) -> Optional[int]:
    for f in fields or []:
        if int(f.fieldId) == field_id and int(f.nvmlReturn) == 0:
            return _value(f)
    return None


def _process(nvml: Any, health: Dict[str, Any], proc: Any) -> Dict[str, Any]:
    used = getattr(proc, "usedGpuMemory", None)
    name = None
    fn = getattr(nvml, "nvmlSystemGetProcessName", None)
    if fn is not None:
        entering("nvmlSystemGetProcessName")
        try:
            name = text(fn(int(proc.pid)))[:120]
        except nvml.NVMLError:
            name = None  # a process in another PID namespace (a container): its pid is still named
    return {"pid": int(proc.pid), "name": name, "used_mib": None if used is None else int(used) // (1 << 20)}


# ------------------------------------------------------------------------------------- nvidia-smi -q -x


def parse_health_xml(xml_text: str) -> Dict[str, Any]:
    """{"source": "nvidia-smi", ...} from `nvidia-smi -q -x` output (the gpu probe parsed it well-formed
    already): one sample, so no window (the corrected-error rate is NVML's)."""
    import xml.etree.ElementTree as ET  # here, not at the top: a node without GPUs never parses XML
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi -q -x: not well-formed XML (%s)" % exc)
    out: Dict[str, Any] = {"source": "nvidia-smi", "window_s": None, "error": None, "gpus": {}}
    for el in root.findall("gpu"):
        bus = _text(el, "pci/pci_bus_id")
        if bus:
            out["gpus"][bus] = _health_xml(el, "gpu %s" % bus)
    return out


def _text(el: Any, path: str) -> Optional[str]:
    found = el.find(path)
    if found is None:
        return None
    value = (found.text or "").strip()
    return None if value in ("", "N/A", "[N/A]") or "deprecated" in value or "Not Supported" in value else value


def _number(el: Any, path: str, where: str, unit: str = "") -> Optional[float]:
    value = _text(el, path)
    if value is None:
        return None
    match = re.match(r"^(-?\d+(?:\.\d+)?)\s*%s$" % re.escape(unit), value)
    if not match:
        raise ParseError("nvidia-smi -q -x: %s %s is %r, expected a number%s or N/A" % (
            where, path, value, " in " + unit if unit else ""))
    return float(match.group(1))


def _int(el: Any, path: str, where: str, unit: str = "") -> Optional[int]:
    value = _number(el, path, where, unit)
    return None if value is None else int(value)


def _yes(el: Any, path: str, where: str) -> Optional[bool]:
    value = _text(el, path)
    if value is None:
        return None
    if value not in ("Yes", "No"):
        raise ParseError("nvidia-smi -q -x: %s %s is %r, expected Yes, No or N/A" % (where, path, value))
    return value == "Yes"


def _health_xml(el: Any, where: str) -> Dict[str, Any]:
    health = empty_health()
    if el.find("remapped_rows/remapped_row_corr") is not None:
        hist = el.find("remapped_rows/row_remapper_histogram")
        histogram = None
        if hist is not None:
            histogram = {k: _int(hist, "row_remapper_histogram_" + k, where, "bank(s)") for k in HISTOGRAM}
            histogram = None if None in histogram.values() else histogram
        corr = _int(el, "remapped_rows/remapped_row_corr", where)
        unc = _int(el, "remapped_rows/remapped_row_unc", where)
        if corr is not None and unc is not None:
            health["remap"] = {"corr": corr, "unc": unc, "histogram": histogram}
    sbe = _int(el, "retired_pages/multiple_single_bit_retirement/retired_count", where)
    dbe = _int(el, "retired_pages/double_bit_retirement/retired_count", where)
    if sbe is not None and dbe is not None:
        health["retired_pages"] = {"sbe": sbe, "dbe": dbe}
    volatile = el.find("ecc_errors/volatile")
    if volatile is not None:
        if volatile.find("single_bit") is not None:  # the legacy layout (Pascal/Volta, older drivers)
            health["ce_volatile"] = _int(volatile, "single_bit/total", where)
        else:
            parts = [_int(volatile, p, where) for p in ("sram_correctable", "dram_correctable")]
            known = [p for p in parts if p is not None]
            health["ce_volatile"] = sum(known) if known else None
    health["compute_mode"] = _text(el, "compute_mode")
    health["pcie_replay"] = _int(el, "pci/replay_counter", where)
    health["util_gpu"] = _int(el, "utilization/gpu_util", where, "%")
    procs = el.find("processes")
    if procs is not None:
        health["processes"] = [
            {"pid": _int(p, "pid", where), "name": _text(p, "process_name"), "used_mib": _int(p, "used_memory", where, "MiB")}
            for p in procs.findall("process_info") if (_text(p, "type") or "C") in ("C", "C+G", "M", "M+C")
        ]
    power = el.find("gpu_power_readings")
    if power is None:
        power = el.find("power_readings")
    if power is not None:
        limit = _number(power, "current_power_limit", where, "W")
        if limit is None:
            limit = _number(power, "enforced_power_limit", where, "W")
        health["power_limit_w"] = limit
        health["default_power_limit_w"] = _number(power, "default_power_limit", where, "W")
    health["apps_clock_mhz"] = _int(el, "applications_clocks/graphics_clock", where, "MHz")
    health["default_apps_clock_mhz"] = _int(el, "default_applications_clocks/graphics_clock", where, "MHz")
    health["recovery_action"] = _text(el, "gpu_recovery_action")
    if _text(el, "fabric/state") == "Completed" and el.find("fabric/health") is not None:
        config = _text(el, "fabric/health/incorrect_configuration")
        health["fabric_health"] = {
            "degraded_bw": _text(el, "fabric/health/bandwidth") not in (None, "Full"),
            "route_unhealthy": _text(el, "fabric/health/route_unhealthy") in ("True", "Yes"),
            "incorrect_config": None if config in (None, "None") else config,
            "summary": _text(el, "fabric/health/summary"),
        }
    health["reset_required"] = _yes(el, "gpu_reset_status/reset_required", where)
    health["drain_and_reset"] = _yes(el, "gpu_reset_status/drain_and_reset_recommended", where)
    return health

"""GPU facts read through NVML (the gpu check's first source), in the schema of preflight.probe.gpu_facts.

Standard library only (plus the pynvml handed in), Python 3.8 compatible: runs on the node, inside
preflight.probe.nvml.bounded_nvml. Each call is announced with nvml.entering(name) so that a call which
does not return is named. Function names and structures: nvml.h (NVML API reference, R535-R580).
"""

from __future__ import annotations

import time

from preflight.probe.gpu_facts import empty_gpu, no_gpu_facts
from preflight.probe.nvml import call_c, cannot_say, entering, text

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional

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


def wedged_facts(partial: Dict[str, Any], why: str, slow: bool = False) -> Dict[str, Any]:
    """The facts NVML answered before a call stuck (the GPU being read carries the error), or before a
    slow but progressing sequence ran out of time (slow: the GPUs not read yet are left out, and
    "nvml_slow" says why; the driver's count still says how many there are)."""
    if "attached_gpus" not in partial:
        return no_gpu_facts(why, why)
    gpus = list(partial["gpus"])
    current = partial.get("current")
    if current is not None and not slow and (not gpus or gpus[-1] is not current):
        gpus.append(current)
    if current is not None and not slow:
        current["error"] = why
    facts = {
        "source": "nvml",
        "error": None,
        "nvml_error": why,
        "driver_version": partial.get("driver_version"),
        "cuda_version": partial.get("cuda_version"),
        "attached_gpus": partial["attached_gpus"],
        "gpus": [g for g in gpus if g is not current] if slow else gpus,
    }
    if slow:
        facts["nvml_slow"] = why
    opened = len(facts["gpus"]) + (1 if slow and current is not None else 0)
    if partial.get("open_s", 0.0) >= SLOW_OPEN_S * max(1, opened):
        facts["nvml_open_s"] = round(partial["open_s"], 2)
    return facts


#: Opening GPUs slower than this on average (nvmlDeviceGetHandleByIndex) is recorded as nvml_open_s: the
#: cost of persistence mode off (each GPU initialises on open), which the rule names with its fix.
SLOW_OPEN_S = 1.0
#: Wait before re-reading a GPU whose first sample showed a HW slowdown reason (the bits also flicker on
#: during clock and P-state changes: one sample is not a verdict).
RESAMPLE_S = 0.2
#: Clock event reasons judged only when a second sample confirms them.
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def facts_from_nvml(nvml: Any, partial: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The facts schema read through NVML (pynvml or anything with its function names).

    `partial` receives what was read so far (for a caller whose wait for this ran out).
    """
    seen: Dict[str, Any] = {"gpus": []} if partial is None else partial
    entering("nvmlSystemGetCudaDriverVersion")
    cuda = nvml.nvmlSystemGetCudaDriverVersion()
    seen["cuda_version"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
    entering("nvmlSystemGetDriverVersion")
    seen["driver_version"] = text(nvml.nvmlSystemGetDriverVersion())
    entering("nvmlDeviceGetCount")
    count = nvml.nvmlDeviceGetCount()
    seen["attached_gpus"] = count
    seen["open_s"] = 0.0
    no_permission = getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4)
    for index in range(count):
        current = empty_gpu(index)
        seen["current"] = current
        try:
            entering("nvmlDeviceGetHandleByIndex")
            started = time.monotonic()
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            finally:
                seen["open_s"] += time.monotonic() - started
            seen.setdefault("handles", {})[index] = handle  # reused by the health reads (no second open)
            gpu_from_nvml(nvml, current, handle)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == no_permission and current["name"] is None:
                # counted by the driver but not this process's to open: a Slurm cgroup (ConstrainDevices),
                # a container given some devices. Not a fault of the GPU.
                current["inaccessible"] = str(exc)
            else:
                current["error"] = str(exc)
        seen["gpus"].append(current)
    seen["current"] = None
    facts = {
        "source": "nvml",
        "error": None,
        "driver_version": seen["driver_version"],
        "cuda_version": seen["cuda_version"],
        "attached_gpus": count,
        "gpus": list(seen["gpus"]),
    }
    if count and seen["open_s"] >= SLOW_OPEN_S * count:
        facts["nvml_open_s"] = round(seen["open_s"], 2)
    return facts


class _Ask:
    """One GPU's NVML queries: NotSupported/FunctionNotFound give None; other errors are recorded."""

    def __init__(self, nvml: Any, gpu: Dict[str, Any], handle: Any) -> None:
        self.nvml, self.gpu, self.h = nvml, gpu, handle

    def __call__(self, name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, name, None)
        if fn is None:  # this pynvml predates the function: as if the driver lacked it
            return None
        entering(name)
        try:
            return fn(self.h, *args)
        except self.nvml.NVMLError as exc:
            self._record(name, exc)
            return None

    def _record(self, name: str, exc: Exception) -> None:
        """A failed query: a finding unless the driver cannot say; NO_PERMISSION (a query this user may not
        make, e.g. outside root) is said apart, as it is no fault of the GPU."""
        if getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_NO_PERMISSION", 4):
            self.gpu.setdefault("query_denied", []).append("NVML %s: %s" % (name, exc))
        elif not cannot_say(self.nvml, exc):
            self.gpu["query_errors"].append("NVML %s failed: %s" % (name, exc))

    def first(self, *names: str) -> Any:
        """The first of several equivalent functions this driver has (newest first)."""
        for name in names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            entering(name)
            try:
                return fn(self.h)
            except self.nvml.NVMLError as exc:
                if getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                    continue  # e.g. ClocksEventReasons on drivers before R535: try the older name
                self._record(name, exc)
                return None
        return None


def gpu_from_nvml(nvml: Any, gpu: Dict[str, Any], h: Any) -> Dict[str, Any]:
    ask = _Ask(nvml, gpu, h)
    entering("nvmlDeviceGetName")
    gpu["name"] = text(nvml.nvmlDeviceGetName(h))
    entering("nvmlDeviceGetPciInfo")
    gpu["pci_bus_id"] = text(nvml.nvmlDeviceGetPciInfo(h).busId)
    entering("nvmlDeviceGetUUID")
    gpu["uuid"] = text(nvml.nvmlDeviceGetUUID(h))
    serial = ask("nvmlDeviceGetSerial")
    gpu["serial"] = None if serial is None else text(serial)
    pm = ask("nvmlDeviceGetPersistenceMode")
    gpu["persistence_mode"] = None if pm is None else bool(pm)
    mig = ask("nvmlDeviceGetMigMode")
    if mig is not None:
        gpu["mig_enabled"], gpu["mig_pending"] = bool(mig[0]), bool(mig[1])
    ecc = ask("nvmlDeviceGetEccMode")
    if ecc is not None:
        gpu["ecc_enabled"], gpu["ecc_pending"] = bool(ecc[0]), bool(ecc[1])
        unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        gpu["ecc_uncorrectable_volatile"] = ask("nvmlDeviceGetTotalEccErrors", unc, nvml.NVML_VOLATILE_ECC)
        gpu["ecc_uncorrectable_aggregate"] = ask("nvmlDeviceGetTotalEccErrors", unc, nvml.NVML_AGGREGATE_ECC)
    pending = ask("nvmlDeviceGetRetiredPagesPendingStatus")
    gpu["retired_pages_pending"] = None if pending is None else bool(pending)
    rows = ask("nvmlDeviceGetRemappedRows")
    if rows is not None:
        gpu["remapped_rows_pending"], gpu["remapped_rows_failure"] = bool(rows[2]), bool(rows[3])
    gpu["pcie"] = {
        "gen": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "max_gen": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "width": ask("nvmlDeviceGetCurrPcieLinkWidth"),
        "max_width": ask("nvmlDeviceGetMaxPcieLinkWidth"),
    }
    # ClocksEventReasons from R535; ClocksThrottleReasons (same bits) on older drivers.
    names = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    mask = ask.first(*names)
    gpu["clock_events"] = None if mask is None else [name for bit, name in EVENT_BITS if mask & bit]
    if gpu["clock_events"] and any(r in gpu["clock_events"] for r in HW_REASONS):
        # One sample: re-read, and keep a HW reason only when it is still active (a clock change sets it
        # for an instant; a real slowdown holds).
        time.sleep(RESAMPLE_S)
        again = ask.first(*names)
        if again is not None:
            still = [name for bit, name in EVENT_BITS if again & bit]
            gpu["clock_events"] = [e for e in gpu["clock_events"] if e not in HW_REASONS or e in still]
    gpu["nvlink"] = nvml_links(nvml, gpu, h)
    gpu["fabric"] = nvml_fabric(nvml, gpu, h)
    mode = ask("nvmlDeviceGetVirtualizationMode")
    if mode in GUEST_MODES:
        gpu["virtualization"] = GUEST_MODES[mode]
    return gpu


#: nvmlGpuVirtualizationMode_t values of a GPU whose driver runs in a VM, as nvidia-smi prints them
#: (preflight.probe.nvidia_smi.GUEST_MODES); 0 NONE, 3 HOST_VGPU and 4 HOST_VSGA are not a guest.
GUEST_MODES = {1: "Pass-Through", 2: "VGPU"}



def nvml_links(nvml: Any, gpu: Dict[str, Any], h: Any) -> Optional[Dict[str, Any]]:
    active = inactive = 0
    entering("nvmlDeviceGetNvLinkState")
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError as exc:
            if link == 0:
                if not cannot_say(nvml, exc):
                    gpu["query_errors"].append("NVML nvmlDeviceGetNvLinkState failed: %s" % exc)
                    return None
                # No NVLink at all, or every link down: the rule tells them apart by the model.
                return {"active": 0, "inactive": 0, "error": "NVML: %s at link 0" % exc}
            break  # past this GPU's last link
        if state:
            active += 1
        else:
            inactive += 1
    return {"active": active, "inactive": inactive}



def nvml_fabric(nvml: Any, gpu: Dict[str, Any], h: Any) -> Optional[Dict[str, Any]]:
    from preflight.probe.nvml_structs import NvmlGpuFabricInfo, pointer

    info = NvmlGpuFabricInfo()
    entering("nvmlDeviceGetGpuFabricInfo")
    try:
        call_c(nvml, "nvmlDeviceGetGpuFabricInfo", h, pointer(info))
    except nvml.NVMLError as exc:
        if not cannot_say(nvml, exc):
            gpu["query_errors"].append("NVML nvmlDeviceGetGpuFabricInfo failed: %s" % exc)
        return None
    state = FABRIC_STATES.get(int(info.state))
    if state is None:
        return None
    if state != "Completed":
        status = "N/A"
    elif int(info.status) == 0:
        status = "Success"
    else:
        status = text(nvml.nvmlErrorString(int(info.status)))
    raw = bytes(bytearray(info.clusterUuid)).hex()
    uuid = "%s-%s-%s-%s-%s" % (raw[:8], raw[8:12], raw[12:16], raw[16:20], raw[20:])
    return {"state": state, "status": status, "clique_id": int(info.cliqueId), "cluster_uuid": uuid}


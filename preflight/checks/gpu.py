"""gpu: every node shows the GPUs the inventory promises, each one healthy enough to join a collective.

Facts come from NVML when ``pynvml.nvmlInit()`` works, else from ``nvidia-smi -q -x`` (plus
``nvidia-smi nvlink --status`` for link states, which the XML does not carry), else they record that no
driver answered. Set ``PREFLIGHT_NVML=off`` in the node's environment to skip NVML and read nvidia-smi
(useful where a container's libnvidia-ml does not match the host driver).

Facts schema (both sources produce the same one)::

    source          "nvml" | "nvidia-smi" | None (no driver answered)
    error           why no source worked (None when one did)
    nvml_error      why NVML was not used, or the wedge that stopped it (None when it answered)
    driver_version  "550.54.15" | None
    cuda_version    "12.4" | None          (CUDA version the driver supports)
    attached_gpus   int                    (what the driver reports; may exceed len(gpus))
    gpus            [gpu, ...] in nvidia-smi index order (PCI bus order)
    nvlink_unreadable ["line 7: 'Link 5: ...'", ...]  (nvidia-smi path only: lines not understood)

    gpu = {
      index int, name str, pci_bus_id "00000000:4E:00.0", uuid str, serial str|None,
      persistence_mode bool|None, mig_enabled bool|None, mig_pending bool|None,
      ecc_enabled bool|None, ecc_pending bool|None,
      ecc_uncorrectable_volatile int|None, ecc_uncorrectable_aggregate int|None,
                                                        (sram/dram *_uncorrectable, or the legacy
                                                         double_bit total of Pascal-era drivers)
      retired_pages_pending bool|None,                  (pre-Ampere page retirement)
      remapped_rows_pending bool|None, remapped_rows_failure bool|None,  (Ampere+ row remapping)
      pcie {gen, max_gen, width, max_width: int|None},
      clock_events [active reason names]|None,          (gpu_idle, sw_power_cap, hw_slowdown,
                                                         hw_thermal_slowdown, sw_thermal_slowdown,
                                                         hw_power_brake_slowdown, ...)
      nvlink {active int, inactive int, [error str], [unreadable int]}|None,
                                                        (None: not reported; error: the driver's message
                                                         instead of links, "all links are inActive" or
                                                         NVML's error at link 0)
      fabric {state "Completed"|"In Progress"|"Not Started", status "Success"|...,
              clique_id int|None, cluster_uuid str|None}|None,  (R535+; None: not supported)
      query_errors [str],                               (NVML queries that failed with anything but
                                                         NotSupported / FunctionNotFound)
      error str|None                                     (NVML could not read this GPU at all, or a
                                                         call on it did not return)
    }

NVML runs bounded: every NVML call sequence runs on a daemon thread waited for NVML_BUDGET_S; a call
stuck in the kernel costs only the GPU facts (what was read before it is kept, the GPU being read gets
the error), nvidia-smi is not tried after it (it would hang the same way), and the driver check falls
back to sysfs for the version so the torch and NCCL facts still arrive.

Rule (per node; gpus_per_node from the inventory; "the fleet" is every judged GPU node of the run):

- gpus_per_node 0: SKIP (CPU-only node).
- no driver answered, or fewer GPUs than expected: FAIL; more than expected: WARN (fix the inventory).
- per GPU, FAIL: volatile uncorrectable ECC > 0, row-remap failure, row remap pending, retired pages
  pending, HW slowdown / HW thermal slowdown / HW power brake active (clocks cut by half or more: the
  straggler every all-reduce waits for), an NVML query error (GPU lost, corrupted infoROM, unknown
  error: only NotSupported and FunctionNotFound mean "cannot say"), fewer NVLinks active than the
  model has (H100/H200/B200 SXM 18, A100 SXM 12: see MODEL_NVLINKS) or than the node's other GPUs,
  including every link down; MIG enabled when the run has more than one GPU node (NCCL cannot use MIG
  instances for a multi-node job), naming the nodes whose MIG mode differs.
- per GPU, WARN: SW thermal slowdown active; ECC enabled but the volatile counters unreadable (N/A
  under MIG); PCIe width below both its max and the width the fleet's GPUs of the same model train at
  (an x8 slot every A10G/T4 node shares is the platform, said in the PASS message, not a warning),
  only for GPUs the topology check did not read from sysfs in this run (topology owns the link width
  and FAILs it against the slot and the fleet; see topology_links);
  persistence mode off / ECC disabled where the fleet's majority has it on / enabled (otherwise said
  in the PASS message: the cloud images' default is not a fault). A PCIe *generation* below max alone
  is not reported: idle GPUs downshift the link to save power.
- per node, WARN: nvidia-smi nvlink --status lines not understood (named; the rest is judged).
- /dev/shm (from the ssh check's facts) below 1 GiB: WARN (Docker's 64 MiB default breaks NCCL's SHM
  transport).
- otherwise one PASS: "8× NVIDIA H100 80GB HBM3, healthy" plus the shared platform choices.

GPU fabric state (NVSwitch registration; GB200/GB300 clique and cluster) is collected here and judged by
fabric_manager.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from preflight.common import fold, human_bytes, majority, plural
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
        partial: Dict[str, Any] = {"gpus": []}
        try:
            facts = bounded_nvml(lambda: facts_from_nvml(nvml, partial), "GPU queries")
            facts["nvml_error"] = None
            return facts
        except NvmlWedged as exc:
            # The driver is stuck: nvidia-smi would hang the same way. Keep what NVML already answered.
            return wedged_facts(partial, str(exc))
        except Exception as exc:  # NVML answered init but not the queries: try nvidia-smi instead
            nvml_error = "NVML query failed: %s" % (exc,)
        finally:
            if not nvml_wedged():
                nvml_shutdown(nvml)
    smi = ctx.run(["nvidia-smi", "-q", "-x"], timeout=60.0)
    if smi.rc == 127:
        return no_gpu_facts("nvidia-smi not found and NVML unavailable", nvml_error)
    if not smi.ok:
        return no_gpu_facts("nvidia-smi failed (%s): %s" % (_why(smi), _first_line(smi)), nvml_error)
    facts = parse_nvidia_smi_xml(smi.stdout)
    facts["nvlink_unreadable"] = []
    links = ctx.run(["nvidia-smi", "nvlink", "--status"], timeout=30.0)
    if links.ok and links.stdout.strip():
        counts, unreadable = read_nvlink_status(links.stdout)
        merge_nvlink(facts, counts)
        facts["nvlink_unreadable"] = unreadable
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


def wedged_facts(partial: Dict[str, Any], why: str) -> Dict[str, Any]:
    """The facts NVML answered before a call stuck; the GPU being read carries the error."""
    if "attached_gpus" not in partial:
        return no_gpu_facts(why, why)
    gpus = list(partial["gpus"])
    current = partial.get("current")
    if current is not None and (not gpus or gpus[-1] is not current):
        gpus.append(current)
    if current is not None:
        current["error"] = why
    return {
        "source": "nvml",
        "error": None,
        "nvml_error": why,
        "driver_version": partial.get("driver_version"),
        "cuda_version": partial.get("cuda_version"),
        "attached_gpus": partial["attached_gpus"],
        "gpus": gpus,
    }


#: Present whenever the NVIDIA kernel driver is loaded (also inside GPU containers).
NVIDIA_PROC = "/proc/driver/nvidia"
#: Longest an NVML call sequence may take before the driver is taken for wedged (a healthy 8-GPU node
#: answers every query here in well under a second; the probe budget is 30 s).
NVML_BUDGET_S = 10.0
#: Set once an NVML call did not return: later NVML users in this probe process do not call in again.
_WEDGED: List[str] = []


class NvmlWedged(Exception):
    """An NVML call did not return within NVML_BUDGET_S (a driver stuck in the kernel)."""


def reset_nvml_wedge() -> None:
    del _WEDGED[:]


def nvml_wedged() -> Optional[str]:
    """Why NVML is taken for stuck in this probe process (None while it answers)."""
    return _WEDGED[0] if _WEDGED else None


def bounded_nvml(fn: Callable[[], Any], what: str, budget: Optional[float] = None, call_name: Optional[str] = None) -> Any:
    """fn() on a daemon thread, waited for at most `budget` seconds.

    An NVML call stuck in the kernel cannot be interrupted from Python; on a daemon thread it no longer
    keeps the probe process from reporting and exiting (the bundle ends with os._exit), so the node's
    other facts still arrive. After a timeout every later bounded_nvml call in this process refuses at
    once: the stuck call very likely holds the library's lock. The message names the NVML function the
    stuck thread last entered (call_name, or what fn marked with _entering).
    """
    if _WEDGED:
        raise NvmlWedged(_WEDGED[0])
    limit = NVML_BUDGET_S if budget is None else budget
    box: Dict[str, Any] = {}

    def work() -> None:
        if call_name:
            _entering(call_name)
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=work, name="preflight-nvml", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        call = _LAST_CALL.get(thread.ident or 0) or "NVML"
        why = "%s did not return within %g s (%s; driver wedged? check dmesg for Xid)" % (call, limit, what)
        _WEDGED.append(why)
        raise NvmlWedged(why)
    if "error" in box:
        raise box["error"]
    return box.get("value")


#: The NVML function each thread last entered (for the wedge message): per thread, since the gpu and
#: driver probes call NVML side by side.
_LAST_CALL: Dict[int, str] = {}


def _entering(name: str) -> None:
    _LAST_CALL[threading.get_ident()] = name


def load_nvml() -> Tuple[Any, Optional[str]]:
    """(pynvml module after a successful nvmlInit, None) or (None, the reason it is not usable).

    pynvml is imported only where an NVIDIA driver is loaded: compiling it costs ~40 ms of CPU on
    every node, for nothing on a node without one. nvmlInit runs bounded (bounded_nvml).
    """
    if os.environ.get("PREFLIGHT_NVML", "").lower() in ("0", "off", "no", "false"):
        return None, "disabled by PREFLIGHT_NVML"
    if _WEDGED:
        return None, _WEDGED[0]
    if not os.path.isdir(NVIDIA_PROC):
        return None, "no NVIDIA kernel driver loaded (%s absent)" % NVIDIA_PROC
    try:
        import pynvml  # shipped with the probe bundle
    except ImportError as exc:
        return None, "pynvml not importable: %s" % exc
    try:
        bounded_nvml(pynvml.nvmlInit, "init", call_name="nvmlInit")
    except NvmlWedged as exc:
        return None, str(exc)
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


class NvmlGpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t exactly as nvml.h (R535 onwards) declares it:

        #define NVML_GPU_FABRIC_UUID_LEN 16
        typedef unsigned char nvmlGpuFabricState_t;
        typedef struct {
            unsigned char        clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
            nvmlReturn_t         status;
            unsigned int         cliqueId;
            nvmlGpuFabricState_t state;
        } nvmlGpuFabricInfo_t;

    Defined here, not taken from pynvml: nvidia-ml-py before 13.615 declares clusterUuid as 80 bytes, so
    its structure reads state and status at the wrong offsets (every H100 then looks "not supported").
    Source: nvml.h of the CUDA 12.x nvml_dev headers (also quoted in NVSHMEM's nvml wrapper).
    """

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


def _cannot_say(nvml: Any, exc: Exception) -> bool:
    """NotSupported / FunctionNotFound: this GPU or driver cannot answer (no finding). Anything else is one."""
    codes = (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
    return getattr(exc, "value", None) in codes


def facts_from_nvml(nvml: Any, partial: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The facts schema read through NVML (pynvml or anything with its function names).

    `partial` receives what was read so far (for a caller whose wait for this ran out).
    """
    seen: Dict[str, Any] = {"gpus": []} if partial is None else partial
    _entering("nvmlSystemGetCudaDriverVersion")
    cuda = nvml.nvmlSystemGetCudaDriverVersion()
    seen["cuda_version"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
    _entering("nvmlSystemGetDriverVersion")
    seen["driver_version"] = _text(nvml.nvmlSystemGetDriverVersion())
    _entering("nvmlDeviceGetCount")
    count = nvml.nvmlDeviceGetCount()
    seen["attached_gpus"] = count
    for index in range(count):
        current = _empty_gpu(index)
        seen["current"] = current
        try:
            _entering("nvmlDeviceGetHandleByIndex")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            _gpu_from_nvml(nvml, current, handle)
        except nvml.NVMLError as exc:
            current["error"] = str(exc)
        seen["gpus"].append(current)
    seen["current"] = None
    return {
        "source": "nvml",
        "error": None,
        "driver_version": seen["driver_version"],
        "cuda_version": seen["cuda_version"],
        "attached_gpus": count,
        "gpus": list(seen["gpus"]),
    }


def _empty_gpu(index: int, error: Optional[str] = None) -> Dict[str, Any]:
    return {
        "index": index,
        "name": None,
        "pci_bus_id": None,
        "uuid": None,
        "serial": None,
        "persistence_mode": None,
        "mig_enabled": None,
        "mig_pending": None,
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
        "query_errors": [],
        "error": error,
    }


class _Ask:
    """One GPU's NVML queries: NotSupported/FunctionNotFound give None; other errors are recorded."""

    def __init__(self, nvml: Any, gpu: Dict[str, Any], handle: Any) -> None:
        self.nvml, self.gpu, self.h = nvml, gpu, handle

    def __call__(self, name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, name, None)
        if fn is None:  # this pynvml predates the function: as if the driver lacked it
            return None
        _entering(name)
        try:
            return fn(self.h, *args)
        except self.nvml.NVMLError as exc:
            if not _cannot_say(self.nvml, exc):
                self.gpu["query_errors"].append("NVML %s failed: %s" % (name, exc))
            return None

    def first(self, *names: str) -> Any:
        """The first of several equivalent functions this driver has (newest first)."""
        for name in names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            _entering(name)
            try:
                return fn(self.h)
            except self.nvml.NVMLError as exc:
                if getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                    continue  # e.g. ClocksEventReasons on drivers before R535: try the older name
                if not _cannot_say(self.nvml, exc):
                    self.gpu["query_errors"].append("NVML %s failed: %s" % (name, exc))
                return None
        return None


def _gpu_from_nvml(nvml: Any, gpu: Dict[str, Any], h: Any) -> Dict[str, Any]:
    ask = _Ask(nvml, gpu, h)
    _entering("nvmlDeviceGetName")
    gpu["name"] = _text(nvml.nvmlDeviceGetName(h))
    _entering("nvmlDeviceGetPciInfo")
    gpu["pci_bus_id"] = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
    _entering("nvmlDeviceGetUUID")
    gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(h))
    serial = ask("nvmlDeviceGetSerial")
    gpu["serial"] = None if serial is None else _text(serial)
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
    mask = ask.first("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    gpu["clock_events"] = None if mask is None else [name for bit, name in EVENT_BITS if mask & bit]
    gpu["nvlink"] = _nvml_links(nvml, gpu, h)
    gpu["fabric"] = _nvml_fabric(nvml, gpu, h)
    return gpu


def nvml_shutdown(nvml: Any) -> None:
    """Release NVML after the facts are read. A failing shutdown changes no fact already gathered, and
    the probe process exits right after, so its NVMLError is deliberately not reported."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        return


def _nvml_links(nvml: Any, gpu: Dict[str, Any], h: Any) -> Optional[Dict[str, Any]]:
    active = inactive = 0
    _entering("nvmlDeviceGetNvLinkState")
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError as exc:
            if link == 0:
                if not _cannot_say(nvml, exc):
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


def _call_c(nvml: Any, name: str, *args: Any) -> None:
    """Call the C function itself (pynvml's _nvmlGetFunctionPointer) with our own ctypes arguments, so
    no pynvml wrapper or structure of any release stands between nvml.h and us; raise NVMLError on a
    non-zero nvmlReturn_t. Without that entry point, the wrapper of the same name (it forwards the
    pointer in every release that has it)."""
    get = getattr(nvml, "_nvmlGetFunctionPointer", None)
    if get is None:
        wrapper = getattr(nvml, name, None)
        if wrapper is None:
            raise nvml.NVMLError(getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
        wrapper(*args)
        return
    ret = get(name)(*args)
    if ret != 0:
        raise nvml.NVMLError(ret)


def _nvml_fabric(nvml: Any, gpu: Dict[str, Any], h: Any) -> Optional[Dict[str, Any]]:
    info = NvmlGpuFabricInfo()
    _entering("nvmlDeviceGetGpuFabricInfo")
    try:
        _call_c(nvml, "nvmlDeviceGetGpuFabricInfo", h, ctypes.pointer(info))
    except nvml.NVMLError as exc:
        if not _cannot_say(nvml, exc):
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
        status = _text(nvml.nvmlErrorString(int(info.status)))
    raw = bytes(bytearray(info.clusterUuid)).hex()
    uuid = "%s-%s-%s-%s-%s" % (raw[:8], raw[8:12], raw[12:16], raw[16:20], raw[20:])
    return {"state": state, "status": status, "clique_id": int(info.cliqueId), "cluster_uuid": uuid}


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
    return gpu


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

_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)(.*)$")
_LINK_LINE = re.compile(r"^Link (\d+): (.+)$")
_RATE = re.compile(r"^\d+(\.\d+)? GB/s$")


def read_nvlink_status(text: str) -> Tuple[Dict[str, Optional[Dict[str, Any]]], List[str]]:
    """({GPU uuid: link counts or None}, [lines not understood]) from `nvidia-smi nvlink --status`.

    Counts are {"active": n, "inactive": m}, plus "unreadable": k when k of this GPU's link lines were
    not understood, or {"active": 0, "inactive": 0, "error": why} when the driver printed the GPU header
    with a message instead of links ("NVML: Unable to retrieve NVLink information as all links are
    inActive": a GPU without NVLink, or one whose every link is down; the rule tells them apart by the
    model). A line not understood is named and skipped, never a reason to drop the rest.
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


#: NVLinks per GPU by model (product name as NVML / nvidia-smi print it). Sources: NVIDIA H100 Tensor Core
#: GPU datasheet and Hopper architecture whitepaper (H100 SXM5: 18 fourth-generation links, 900 GB/s);
#: H200 datasheet (SXM: 900 GB/s, the same 18 links); A100 datasheet and Ampere whitepaper (A100 SXM4: 12
#: third-generation links, 600 GB/s); Blackwell datasheets (B200 / GB200: 18 fifth-generation links,
#: 1.8 TB/s). PCIe and NVL boards (NVLink bridges, 0-4 links depending on how they are bridged) are not
#: listed: for them only the comparison across the node's GPUs applies.
MODEL_NVLINKS = (
    (re.compile(r"\bH100\b.*(HBM3|SXM)"), 18),
    (re.compile(r"\bH200\b(?!.*\bNVL\b)"), 18),
    (re.compile(r"\bA100-SXM"), 12),
    (re.compile(r"\bG?B[23]00\b(?!.*\bNVL\b)"), 18),
)


def model_nvlinks(name: Optional[str]) -> Optional[int]:
    """How many NVLinks a GPU of this model has (None: not a model with a fixed count)."""
    for pattern, links in MODEL_NVLINKS:
        if name and pattern.search(name):
            return links
    return None


class Fleet:
    """What the GPUs of every judged node share: the reference a design choice is measured against."""

    def __init__(self, nodes: List[Tuple[Any, Dict[str, Any]]]) -> None:
        self.nodes = nodes
        self.multi_node = len(nodes) > 1
        widths: Dict[Optional[str], List[int]] = {}
        ecc: Dict[Optional[str], List[bool]] = {}
        persistence: List[bool] = []
        self.mig: Dict[str, bool] = {}
        for node, facts in nodes:
            gpus = facts.get("gpus") or []
            for g in gpus:
                pcie = g.get("pcie") or {}
                if pcie.get("width") is not None:
                    widths.setdefault(g.get("name"), []).append(pcie["width"])
                if g.get("ecc_enabled") is not None:
                    ecc.setdefault(g.get("name"), []).append(g["ecc_enabled"])
                if g.get("persistence_mode") is not None:
                    persistence.append(g["persistence_mode"])
            modes = [g.get("mig_enabled") for g in gpus if g.get("mig_enabled") is not None]
            if modes:
                self.mig[node.name] = any(modes)
        self.width = {name: majority(v)[0] for name, v in widths.items()}
        self.ecc = {name: majority(v)[0] for name, v in ecc.items()}
        self.persistence = majority(persistence)[0]

    def mig_others(self, node: str) -> str:
        """'MIG disabled on node[02-03]' for the nodes whose MIG mode differs from this one's ('' if none)."""
        mine = self.mig.get(node)
        other = [n for n, on in self.mig.items() if n != node and on != mine]
        if not other:
            return ""
        return "MIG %s on %s" % ("disabled" if mine else "enabled", fold(other))


def _alone(node: Any, facts: Dict[str, Any]) -> Fleet:
    return Fleet([(node, facts)])


def topology_links(topology_facts: Any) -> Set[str]:
    """Bus addresses (0000:18:00.0) of the GPUs whose PCIe link the topology check read from sysfs this run.

    One fact, one owner: topology judges those links (against the device's slot and the fleet, FAIL); gpu
    judges the width nvidia-smi/NVML reports only for GPUs topology did not see (topology not run, its probe
    failed, or no sysfs link attributes), so a narrow link is reported once, not as a WARN here and a FAIL
    there. Coordinated through topology's facts only."""
    if not isinstance(topology_facts, dict) or topology_facts.get("probe_error"):
        return set()
    return {
        _bus12(d.get("bdf"))
        for d in topology_facts.get("devices") or []
        if d.get("kind") == "gpu" and (d.get("link") or {}).get("cur_width") is not None
    }


def _bus12(address: Any) -> str:
    """00000000:4E:00.0 / 0000:4e:00.0 -> 0000:4e:00.0."""
    return str(address or "").lower()[-12:]


def gpu_problems(
    gpu: Dict[str, Any], node_max_links: int, fleet: Optional[Fleet] = None, node: str = "",
    topology_seen: Optional[Set[str]] = None,
) -> List[Tuple[Status, str, str, str]]:
    """(status, message, expected, actual) for everything wrong with one GPU. topology_seen: the GPUs whose
    PCIe width the topology check judges (topology_links): their width is not judged here."""
    label = gpu_label(gpu)
    out: List[Tuple[Status, str, str, str]] = []
    if gpu.get("error"):
        return [(Status.FAIL, "%s: NVML cannot read this GPU: %s" % (label, gpu["error"]), "readable", gpu["error"])]
    for problem in gpu.get("query_errors") or []:
        out.append((Status.FAIL, "%s: %s (expected an answer)" % (label, problem), "an answer", problem))
    if gpu.get("mig_enabled") and fleet is not None and fleet.multi_node:
        others = fleet.mig_others(node)
        out.append(
            (
                Status.FAIL,
                "%s: MIG mode enabled (expected disabled for a multi-node NCCL job%s)" % (label, "; " + others if others else ""),
                "disabled",
                "enabled",
            )
        )
    vol = gpu.get("ecc_uncorrectable_volatile")
    if vol:
        out.append((Status.FAIL, "%s: %d uncorrectable ECC errors since boot (expected 0)" % (label, vol), "0", str(vol)))
    elif vol is None and gpu.get("ecc_enabled"):
        why = "N/A (MIG mode on)" if gpu.get("mig_enabled") else "unreadable"
        out.append(
            (
                Status.WARN,
                "%s: volatile ECC counters read %s: uncorrectable errors since boot unknown" % (label, why),
                "a count",
                "unknown",
            )
        )
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
    out.extend(_link_problems(gpu, label, node_max_links))
    pcie = gpu.get("pcie") or {}
    width, max_width = pcie.get("width"), pcie.get("max_width")
    owned = _bus12(gpu.get("pci_bus_id")) in (topology_seen or set())
    if width is not None and max_width is not None and width < max_width and not owned:
        # A width every GPU of this model in the fleet shares is the platform's (an x8 slot): not a fault
        # of this node. Below that, or below max with no shared width (a tie), the link trained narrow.
        shared = fleet.width.get(gpu.get("name")) if fleet is not None else None
        reference = max_width if shared is None else min(shared, max_width)
        if width < reference:
            actual = _link(pcie.get("gen"), width)
            expected = _link(pcie.get("max_gen"), reference)
            out.append((Status.WARN, "%s: PCIe link %s (expected %s)" % (label, actual, expected), expected, actual))
    if gpu.get("persistence_mode") is False and (fleet is None or fleet.persistence is True):
        out.append((Status.WARN, "%s: persistence mode off (expected on: nvidia-smi -pm 1 or nvidia-persistenced)" % label, "on", "off"))
    if gpu.get("ecc_enabled") is False and (fleet is None or fleet.ecc.get(gpu.get("name")) is True):
        out.append((Status.WARN, "%s: ECC disabled (expected enabled like the fleet's other %s)" % (label, gpu.get("name")), "enabled", "disabled"))
    return out


def _link_problems(gpu: Dict[str, Any], label: str, node_max_links: int) -> List[Tuple[Status, str, str, str]]:
    links = gpu.get("nvlink")
    if not links or links.get("unreadable"):
        return []  # unknown, or counts incomplete (warned once for the node)
    model = model_nvlinks(gpu.get("name"))
    total = links["active"] + links["inactive"]
    note = "; %s" % links["error"] if links.get("error") else ""
    if model and links["active"] < model:
        actual = "%d/%d" % (links["active"], total or model)
        msg = "%s: %s NVLinks active (expected %d on %s%s)" % (label, actual, model, gpu.get("name"), note)
        return [(Status.FAIL, msg, str(model), actual)]
    if node_max_links and links["active"] < node_max_links:
        actual = "%d/%d" % (links["active"], total)
        msg = "%s: %s NVLinks active (expected %d like the other GPUs%s)" % (label, actual, node_max_links, note)
        return [(Status.FAIL, msg, str(node_max_links), actual)]
    return []


def _notes(gpus: List[Dict[str, Any]], fleet: Fleet) -> List[str]:
    """What the PASS message says about shared platform choices (not faults, but worth seeing)."""
    notes = []
    seen = set()
    for g in gpus:
        pcie = g.get("pcie") or {}
        name = g.get("name")
        shared = fleet.width.get(name)
        if shared is not None and pcie.get("max_width") and shared < pcie["max_width"] and name not in seen:
            seen.add(name)
            notes.append("PCIe x%d on every %s (max x%d)" % (shared, name, pcie["max_width"]))
    off = [g for g in gpus if g.get("persistence_mode") is False]
    if off:
        notes.append("persistence mode off on %s" % plural(len(off), "GPU"))
    no_ecc = [g for g in gpus if g.get("ecc_enabled") is False]
    if no_ecc:
        notes.append("ECC disabled on %s" % plural(len(no_ecc), "GPU"))
    mig = [g for g in gpus if g.get("mig_enabled")]
    if mig:
        notes.append("MIG enabled on %s" % plural(len(mig), "GPU"))
    return notes


def _node_findings(node: Any, facts: Dict[str, Any], ssh: Any, fleet: Optional[Fleet] = None,
                   topology_facts: Any = None) -> List[Finding]:
    name, expected = node.name, node.gpus_per_node
    fleet = fleet or _alone(node, facts)
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
    unreadable = facts.get("nvlink_unreadable") or []
    if unreadable:
        partial = [gpu_label(g) for g in gpus if (g.get("nvlink") or {}).get("unreadable")]
        out.append(
            Finding(
                NAME,
                name,
                Status.WARN,
                "nvidia-smi nvlink --status: %s not understood (%s)%s"
                % (
                    plural(len(unreadable), "line"),
                    "; ".join(unreadable[:3]) + ("; ..." if len(unreadable) > 3 else ""),
                    "; NVLink counts of %s are incomplete" % ", ".join(partial) if partial else "",
                ),
                expected="known link lines",
                actual=unreadable[0],
            )
        )
    node_max_links = max([g["nvlink"]["active"] for g in gpus if g.get("nvlink")] or [0])
    seen = topology_links(topology_facts)
    for gpu in gpus:
        for status, msg, exp, act in gpu_problems(gpu, node_max_links, fleet, name, seen):
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
        notes = _notes(gpus, fleet)
        msg = "%s, healthy%s" % (summary(gpus), "; " + "; ".join(notes) if notes else "")
        out.append(Finding(NAME, name, Status.PASS, msg, actual=str(len(gpus))))
    return out


def summary(gpus: List[Dict[str, Any]]) -> str:
    """'8× NVIDIA H100 80GB HBM3' (models counted in order of first appearance)."""
    counts: Dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.get("name") or "unknown GPU"] = counts.get(gpu.get("name") or "unknown GPU", 0) + 1
    return " + ".join("%d× %s" % (n, model) for model, n in counts.items())


def rule(view: ClusterView) -> List[Finding]:
    judged = []
    for node in view.live:
        facts = view.facts[node.name].get(NAME)
        if node.gpus_per_node and isinstance(facts, dict) and facts.get("source") is not None:
            judged.append((node, facts))
    fleet = Fleet(judged)
    return per_gpu_node(
        NAME, view, lambda node, facts: _node_findings(node, facts, view.facts[node.name].get("ssh"), fleet,
                                                       view.facts[node.name].get("topology"))
    )


CHECK = Check(
    name=NAME,
    claim="Every GPU node shows its gpus_per_node GPUs, each without ECC/remap faults, NVML errors, HW throttling, "
    "a PCIe link narrower than its peers' (when the topology check did not read it from sysfs), or fewer NVLinks than its model has (18 on H100/H200/B200 SXM, 12 on "
    "A100 SXM); no MIG on a multi-node run; /dev/shm is at least 1 GiB",
    why="One missing, throttled or faulty GPU makes every collective wait for it or crash; NCCL needs a "
    "large /dev/shm for its shared-memory transport.",
    fix="Uncorrectable ECC / pending remap: drain the node and reset the GPU (nvidia-smi -r); remap failure: "
    "replace it. Missing GPU or narrow PCIe link: check dmesg for Xid 79, reseat. HW slowdown: check "
    "cooling and power (nvidia-smi -q -d PERFORMANCE). Persistence: enable nvidia-persistenced. "
    "/dev/shm: remount larger or run containers with --shm-size=16g (or --ipc=host). MIG: nvidia-smi -mig 0 and "
    "reset the GPU.",
    probe=probe,
    rule=rule,
    needs=("ssh",),
    action="isolate",
    order=20,
)

"""Bounded access to NVML (libnvidia-ml through pynvml), shared by the checks that ask the driver.

Standard library only (pynvml is imported lazily, from the copy the probe bundle ships), Python 3.8
compatible: runs on the node. The gpu check reads its GPU facts through here, the driver check its
versions; both may run side by side in one probe process.

Decisions:
- Every NVML call sequence runs on a daemon thread waited for at most NVML_BUDGET_S: a call stuck in the
  kernel (a wedged driver) cannot be interrupted from Python, but on a daemon thread it no longer keeps the
  probe process from reporting and exiting. After one stuck call every later bounded call refuses at once
  (the stuck call very likely holds the library's lock), and nvidia-smi is not run either (it hangs the
  same way).
- Only NotSupported and FunctionNotFound mean "this GPU or driver cannot say" (cannot_say); any other
  NVMLError is a finding for the caller.
- Structures whose layout pynvml got wrong in some releases are declared here from nvml.h itself.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    stuck thread last entered (call_name, or what fn marked with entering).
    """
    if _WEDGED:
        raise NvmlWedged(_WEDGED[0])
    limit = NVML_BUDGET_S if budget is None else budget
    box: Dict[str, Any] = {}

    def work() -> None:
        if call_name:
            entering(call_name)
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


def entering(name: str) -> None:
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



def text(value: Any) -> str:
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


def cannot_say(nvml: Any, exc: Exception) -> bool:
    """NotSupported / FunctionNotFound: this GPU or driver cannot answer (no finding). Anything else is one."""
    codes = (getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13))
    return getattr(exc, "value", None) in codes



def nvml_shutdown(nvml: Any) -> None:
    """Release NVML after the facts are read. A failing shutdown changes no fact already gathered, and
    the probe process exits right after, so its NVMLError is deliberately not reported."""
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        return



def call_c(nvml: Any, name: str, *args: Any) -> None:
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


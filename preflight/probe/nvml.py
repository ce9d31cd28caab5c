"""Bounded access to NVML (libnvidia-ml through pynvml), shared by the checks that ask the driver.

Standard library only (pynvml is imported lazily, from the copy the probe bundle ships), Python 3.8
compatible: runs on the node. The gpu check reads its GPU facts through here, the driver check its
versions; both may run side by side in one probe process.

Decisions:
- Every NVML call sequence runs on a daemon thread: one call may take NVML_BUDGET_S, the sequence
  NVML_TOTAL_S while its calls keep returning. A call stuck in the kernel (a wedged driver) cannot be
  interrupted from Python, but on a daemon thread it no longer keeps the probe process from reporting and
  exiting. A node without persistence mode is slow (each GPU initialises when opened: NVIDIA's
  persistence daemon documentation; seconds per GPU), not wedged: it is told apart by the per-call clock.
  After one stuck call every later bounded call refuses at once (the stuck call very likely holds the
  library's lock), and nvidia-smi is not run either (it hangs the same way).
- Only NotSupported and FunctionNotFound mean "this GPU or driver cannot say" (cannot_say); any other
  NVMLError is a finding for the caller.
- Structures whose layout pynvml got wrong in some releases are declared here from nvml.h itself.
"""

from __future__ import annotations

import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Callable, Dict, List, Optional, Tuple

NVIDIA_PROC = "/proc/driver/nvidia"
#: Longest one NVML call may take before the driver is taken for wedged. Without persistence mode every
#: GPU initialises when it is opened (nvmlDeviceGetHandleByIndex, nvmlInit): seconds per GPU, well under
#: this; a call stuck in the kernel never returns.
NVML_BUDGET_S = 10.0
#: Longest a whole NVML call sequence may take while every call keeps returning (a slow, not a stuck,
#: driver: 8 GPUs without persistence mode). Below the node's 30 s probe budget, so the facts arrive.
NVML_TOTAL_S = 24.0
#: Set once an NVML call did not return (or the sequence ran out of time): later NVML users in this probe
#: process do not call in again, and nvidia-smi is not run (it would wait on the same driver).
_WEDGED: List[str] = []


class NvmlWedged(Exception):
    """An NVML call did not return within NVML_BUDGET_S (a driver stuck in the kernel)."""


class NvmlSlow(NvmlWedged):
    """The call sequence ran past NVML_TOTAL_S while each call kept returning: slow, not stuck."""


def reset_nvml_wedge() -> None:
    del _WEDGED[:]


def nvml_wedged() -> Optional[str]:
    """Why NVML is taken for stuck in this probe process (None while it answers)."""
    return _WEDGED[0] if _WEDGED else None


def bounded_nvml(fn: Callable[[], Any], what: str, budget: Optional[float] = None, call_name: Optional[str] = None) -> Any:
    """fn() on a daemon thread: one NVML call may take `budget` seconds (NVML_BUDGET_S), the whole of fn
    NVML_TOTAL_S (at least `budget`) as long as its calls keep returning.

    An NVML call stuck in the kernel cannot be interrupted from Python; on a daemon thread it no longer
    keeps the probe process from reporting and exiting (the bundle ends with os._exit), so the node's
    other facts still arrive. A call that does not return within `budget` raises NvmlWedged naming the
    NVML function the thread last entered (call_name, or what fn marked with entering); a sequence that
    is still progressing at NVML_TOTAL_S raises NvmlSlow. After either, every later bounded_nvml call in
    this process refuses at once: the thread still inside NVML very likely holds the library's lock.
    """
    if _WEDGED:
        raise NvmlWedged(_WEDGED[0])
    limit = NVML_BUDGET_S if budget is None else budget
    total = max(limit, NVML_TOTAL_S)
    box: Dict[str, Any] = {}

    def work() -> None:
        if call_name:
            entering(call_name)
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=work, name="preflight-nvml", daemon=True)
    thread.start()
    while thread.is_alive():
        now = time.monotonic()
        call, since = _LAST_CALL.get(thread.ident or 0) or ("NVML", started)
        since = max(since, started)  # an entry left by an earlier thread with the same ident
        wait = min(since + limit, started + total) - now
        if wait > 0:
            thread.join(min(wait, 0.5))
            continue
        if now - since >= limit:
            why = "%s did not return within %g s (%s; driver wedged? check dmesg for Xid)" % (call, limit, what)
            _WEDGED.append(why)
            raise NvmlWedged(why)
        why = ("NVML still answering after %g s (%s; each call returned, now in %s): slow, not stuck; without "
               "persistence mode every GPU initialises when opened (nvidia-smi -pm 1 or nvidia-persistenced)"
               % (total, what, call))
        _WEDGED.append(why)
        raise NvmlSlow(why)
    if "error" in box:
        raise box["error"]
    return box.get("value")


#: (the NVML function each thread last entered, when): for the wedge message and the stall clock; per
#: thread, since the gpu and driver probes call NVML side by side.
_LAST_CALL: Dict[int, Tuple[str, float]] = {}


def entering(name: str) -> None:
    _LAST_CALL[threading.get_ident()] = (name, time.monotonic())


def load_nvml() -> Tuple[Any, Optional[str]]:
    """(pynvml module after a successful nvmlInit, None) or (None, the reason it is not usable).

    pynvml is imported only where an NVIDIA driver is loaded: compiling it costs ~40 ms of CPU on
    every node, for nothing on a node without one. nvmlInit runs bounded (bounded_nvml). The pynvml
    expected is nvidia-ml-py's single-file module, which the controller ships in the probe bundle; the
    legacy `pynvml` 11.x package (a folder importing .nvml) is not that, and is named as such.
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
        return None, "pynvml not importable: %s (%s)" % (exc, PYNVML_FIX)
    if not hasattr(pynvml, "nvmlInit"):
        return None, "pynvml at %s is not nvidia-ml-py's (%s)" % (getattr(pynvml, "__file__", "?"), PYNVML_FIX)
    try:
        bounded_nvml(pynvml.nvmlInit, "init", call_name="nvmlInit")
    except NvmlWedged as exc:
        return None, str(exc)
    except Exception as exc:
        return None, str(exc) or type(exc).__name__
    return pynvml, None


#: What to do when the bundle carried no usable pynvml (see pynvml_source).
PYNVML_FIX = "install nvidia-ml-py on the controller: the probe bundle ships its pynvml.py"


def pynvml_source() -> Tuple[Optional[str], Optional[str]]:
    """(path of nvidia-ml-py's pynvml.py to ship in the probe bundle, None) or (None, why there is none).

    Controller side, standard library only: found, not imported. nvidia-ml-py installs one file,
    pynvml.py; the legacy `pynvml` 11.x distribution (gpuopen-analytics) installs a package folder
    pynvml/ whose __init__ imports its sibling .nvml, which a single file in the bundle cannot carry
    (every node then silently lost NVML). When that package shadows nvidia-ml-py's file, the file is
    looked for on sys.path itself.
    """
    import importlib.util
    import sys

    spec = importlib.util.find_spec("pynvml")
    origin = spec.origin if spec is not None else None
    if origin and origin.endswith(".py") and os.path.basename(origin) == "pynvml.py":
        return origin, None
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "pynvml.py")
        if os.path.isfile(candidate):
            return candidate, None
    if origin:
        return None, "the controller's pynvml is %s (the legacy pynvml package, not nvidia-ml-py's pynvml.py)" % origin
    return None, "no pynvml on the controller"


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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


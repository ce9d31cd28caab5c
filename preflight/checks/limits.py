"""limits: the node limits NCCL trips on fit it: a finite stack limit where multi-node NVLink is in use, and
/dev/shm with room for the GPUs' NCCL shared-memory segments.

Read where a job reads them: the probe's own limits (``/proc/self/limits``, the same limits the SSH session
or the srun step gives a job; Slurm propagates the submitting shell's by default), /dev/shm as the probe's
mount namespace sees it (a container's own), and the IMEX channel devices of the host
(``/dev/nvidia-caps-imex-channels/channel*``, under PREFLIGHT_HOST_ROOT), which exist where a GB200/GB300
tray is set up for multi-node NVLink (MNNVL).

Facts schema::

    stack         {"soft": int bytes | None (unlimited), "hard": int | None}
    shm           {"path": "/dev/shm", "total_bytes": int, "free_bytes": int} | {"path", "error": "..."}
    imex_channels ["channel0", ...]        (empty: no MNNVL on this node)

Rule (per GPU node; CPU-only nodes SKIP: neither limit matters to a job without GPUs):

- stack: ``ulimit -s unlimited`` crashes NCCL's MNNVL topology search (NVIDIA/nccl#2186: NCCL 2.27.5 on
  44 GB200 ranks, reproduced by NVIDIA only with the stack raised from 8192 KiB to unlimited; NCCL 2.30.4
  logs "Stack size limit (unlimited) is unsafe; will use 8192KB" instead; NCCL user guide,
  Troubleshooting, "Stack size"). Judged only where it matters: an unlimited stack on a node with an IMEX
  channel FAILs (fix_config) unless every NCCL the driver check found is 2.30 or newer; elsewhere it is
  harmless, and the PASS says so.
- /dev/shm: NCCL's SHM transport creates one segment of about 9.2 MiB (9637888 bytes: NVIDIA/nccl#342,
  #1518, pytorch/ci-infra#490) per GPU per channel, at least 2 channels (NVIDIA/nccl#1518's log), in
  /dev/shm; Docker's default 64 MiB fails from 4 GPUs on (#342, #1518). Below gpus x 2 x 9637888 bytes
  in total FAILs (fix_config: too small); enough in total but not free FAILs naming the space held
  (leftover segments of crashed jobs, #1518). One GPU: no local peer, not judged. A small /dev/shm that
  holds the GPUs' segments (a container's 256 MiB for 2 GPUs) passes. /dev/shm missing FAILs.
- The locked-memory limit RDMA needs is judged by ib_hca, on nodes with an active HCA port.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import human_bytes, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node

NAME = "limits"
#: One NCCL SHM segment (the three protocols' buffers of one connection), as NCCL reports it failing.
SHM_SEGMENT_BYTES = 9637888
#: NCCL opens at least this many channels, one segment per GPU per channel.
SHM_MIN_CHANNELS = 2
#: From this NCCL version on an unlimited stack is replaced by 8 MiB (NVIDIA/nccl#2186).
NCCL_STACK_GUARD = (2, 30)
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
_LIMIT = re.compile(r"^(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)(?:\s+(\S+))?\s*$")


# --------------------------------------------------------------------------------------------- probe


def probe(ctx: Any) -> Dict[str, Any]:
    """The stack limit, /dev/shm's size and free space, and the IMEX channels."""
    text = ctx.read("/proc/self/limits")
    if text is None:
        raise OSError("/proc/self/limits is not readable")
    stack = parse_proc_limits(text)["Max stack size"]
    try:
        st = os.statvfs("/dev/shm")
        shm: Dict[str, Any] = {"path": "/dev/shm", "total_bytes": st.f_blocks * st.f_frsize,
                               "free_bytes": st.f_bavail * st.f_frsize}
    except OSError as exc:
        shm = {"path": "/dev/shm", "error": exc.strerror or str(exc)}
    channels = [n for n in ctx.listdir(ctx.host_path(IMEX_DIR)) if n.startswith("channel")]
    return {"stack": {"soft": stack[0], "hard": stack[1]}, "shm": shm, "imex_channels": channels}


# --------------------------------------------------------------------------------------------- parse


def _value(text: str, what: str) -> Optional[int]:
    if text == "unlimited":
        return None
    if not text.isdigit():
        raise ParseError("/proc/self/limits: %s value %.20r is neither a number nor 'unlimited'" % (what, text))
    return int(text)


def parse_proc_limits(text: str) -> Dict[str, Tuple[Optional[int], Optional[int]]]:
    """/proc/<pid>/limits (proc(5): "Limit  Soft Limit  Hard Limit  Units") -> {"Max stack size": (soft,
    hard)}; None is unlimited. Every line after the header must be a limit."""
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines or not lines[0].startswith("Limit"):
        raise ParseError("/proc/self/limits: expected the header 'Limit  Soft Limit  Hard Limit  Units', got %.60r" % (lines[:1] or [""])[0])
    out: Dict[str, Tuple[Optional[int], Optional[int]]] = {}
    for number, line in enumerate(lines[1:], 2):
        m = _LIMIT.match(line)
        if not m:
            raise ParseError("/proc/self/limits line %d: expected 'Max <name>  <soft>  <hard>  [units]', got %.60r" % (number, line))
        out[m.group(1)] = (_value(m.group(2), m.group(1)), _value(m.group(3), m.group(1)))
    if "Max stack size" not in out:
        raise ParseError("/proc/self/limits: no 'Max stack size' line")
    return out


# ---------------------------------------------------------------------------------------------- rule


def _version(text: Any) -> Optional[Tuple[int, ...]]:
    m = re.match(r"^(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _nccl_versions(driver: Any) -> List[str]:
    """The NCCL versions the driver check found on the node (the Python wheel's and the system's)."""
    if not isinstance(driver, dict):
        return []
    found = [(driver.get("nccl_python") or {}).get("version")]
    found += [lib.get("version") for lib in driver.get("nccl_system") or [] if isinstance(lib, dict)]
    return [v for v in found if v]


def _stack(name: str, facts: Dict[str, Any], driver: Any) -> Tuple[Optional[Finding], str]:
    soft = (facts.get("stack") or {}).get("soft", 0)
    channels = facts.get("imex_channels") or []
    if soft is not None:
        return None, "stack %s" % human_bytes(soft)
    if not channels:
        return None, "stack unlimited (harmless without multi-node NVLink: no IMEX channel)"
    versions = _nccl_versions(driver)
    if versions and all((_version(v) or (0,)) >= NCCL_STACK_GUARD for v in versions):
        return None, "stack unlimited (NCCL %s replaces it with 8 MiB)" % ", ".join(sorted(set(versions)))
    nccl = "NCCL %s" % ", ".join(sorted(set(versions))) if versions else "NCCL version unknown"
    msg = ("%s: stack size limit (ulimit -s) is unlimited on a multi-node NVLink node (IMEX %s; %s): NCCL before "
           "2.30 crashes in its MNNVL topology search with an unlimited stack (NVIDIA/nccl#2186)" % (
               name, ", ".join(channels), nccl))
    return Finding(NAME, name, Status.FAIL, msg, expected="8192 KiB (the Linux default)", actual="unlimited",
                   action="fix_config"), ""


def _shm(name: str, facts: Dict[str, Any], gpus: int) -> Tuple[Optional[Finding], str]:
    shm = facts.get("shm") or {}
    if shm.get("error"):
        return Finding(NAME, name, Status.FAIL, "%s: /dev/shm is not usable (%s): NCCL's shared-memory transport "
                       "needs it" % (name, shm["error"]), expected="a tmpfs at /dev/shm", actual=shm["error"],
                       action="fix_config"), ""
    total, free = shm.get("total_bytes"), shm.get("free_bytes")
    if gpus < 2:
        return None, "/dev/shm %s (one GPU: no local peer for NCCL's SHM transport)" % human_bytes(total or 0)
    need = gpus * SHM_MIN_CHANNELS * SHM_SEGMENT_BYTES
    expected = ">= %s (%d GPUs x %d channels x %s NCCL segments)" % (
        human_bytes(need), gpus, SHM_MIN_CHANNELS, human_bytes(SHM_SEGMENT_BYTES))
    if total is None or free is None:
        return Finding(NAME, name, Status.ERROR, "%s: /dev/shm size unknown" % name), ""
    if total < need:
        return Finding(NAME, name, Status.FAIL, "%s: /dev/shm is %s, too small for NCCL's shared-memory segments of "
                       "%d GPUs (expected %s; Docker's default is 64 MiB)" % (name, human_bytes(total), gpus, expected),
                       expected=expected, actual=human_bytes(total), action="fix_config"), ""
    if free < need:
        return Finding(NAME, name, Status.FAIL, "%s: /dev/shm has %s free of %s: %s held (leftover nccl-* segments of "
                       "crashed jobs?), NCCL needs %s" % (name, human_bytes(free), human_bytes(total),
                                                          human_bytes(total - free), expected),
                       expected=expected + " free", actual="%s free" % human_bytes(free), action="fix_config"), ""
    return None, "/dev/shm %s free of %s (>= %s for %s)" % (human_bytes(free), human_bytes(total), human_bytes(need), plural(gpus, "GPU"))


def _judge(node: Any, facts: Dict[str, Any], view: ClusterView) -> List[Finding]:
    name = node.name
    driver = view.facts.get(name, {}).get("driver")
    out: List[Finding] = []
    notes: List[str] = []
    for finding, note in (_stack(name, facts, driver), _shm(name, facts, node.gpus_per_node)):
        if finding is not None:
            out.append(finding)
        else:
            notes.append(note)
    if not out:
        out.append(Finding(NAME, name, Status.PASS, "%s: %s" % (name, "; ".join(notes))))
    return out


def rule(view: ClusterView) -> List[Finding]:
    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, view))


CHECK = Check(
    name=NAME,
    claim="The stack limit is finite where multi-node NVLink is in use, and /dev/shm holds the GPUs' NCCL "
    "shared-memory segments",
    why="NCCL before 2.30 crashes at init on multi-node NVLink (GB200/GB300) when `ulimit -s` is unlimited; "
    "a /dev/shm too small or full of leftover segments (Docker's 64 MiB default) fails NCCL's shared-memory "
    "transport at init with 'Error while creating shared memory segment'.",
    fix="Stack: remove `ulimit -s unlimited` from the job's environment (limits.conf `stack`, the launcher, "
    "Slurm's PropagateResourceLimits) or use NCCL 2.30+. /dev/shm: run containers with --shm-size=1g or "
    "--ipc=host (Kubernetes: an emptyDir with medium: Memory at /dev/shm), remount it larger "
    "(mount -o remount,size=16G /dev/shm), or remove stale /dev/shm/nccl-* files.",
    probe=probe,
    rule=rule,
    needs=("driver",),
    reads="/proc/self/limits, statvfs(/dev/shm), /dev/nvidia-caps-imex-channels",
    takes="< 0.1 s",
    order=86,
)

"""The limits check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.limits import NAME
from preflight.common import human_bytes, plural
from preflight.model import ClusterView, Finding, Status, per_gpu_node

#: One NCCL SHM segment (the three protocols' buffers of one connection), as NCCL reports it failing.
SHM_SEGMENT_BYTES = 9637888
#: NCCL opens at least this many channels, one segment per GPU per channel.
SHM_MIN_CHANNELS = 2
#: From this NCCL version on an unlimited stack is replaced by 8 MiB (NVIDIA/nccl#2186).
NCCL_STACK_GUARD = (2, 30)


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

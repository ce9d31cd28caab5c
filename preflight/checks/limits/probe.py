"""The limits check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import re

from preflight.node_model import ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional, Tuple

IMEX_DIR = "/dev/nvidia-caps-imex-channels"
_LIMIT = re.compile(r"^(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)(?:\s+(\S+))?\s*$")


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

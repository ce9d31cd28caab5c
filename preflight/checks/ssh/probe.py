"""The ssh check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import resource
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict


def probe(ctx: Any) -> Dict[str, Any]:
    """Node basics, read from the standard library alone."""
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_frsize * shm.f_blocks
    except OSError:
        shm_bytes = None
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {
        # os.uname() and sys.version, not socket/platform: the same values, and platform's import alone (nine
        # regular expressions compiled) was a tenth of the probes' CPU on every node
        "hostname": os.uname().nodename,
        "python": sys.version.split()[0].split("."),
        "python_executable": os.path.realpath(os.sys.executable),
        "kernel": os.uname().release,
        "time": time.time(),
        "shm_bytes": shm_bytes,
        "memlock_soft": None if soft == resource.RLIM_INFINITY else soft,
        "memlock_hard": None if hard == resource.RLIM_INFINITY else hard,
        "user": _user(),
    }


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())

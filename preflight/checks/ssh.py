"""ssh: every node is reachable and authenticated, runs a new enough python, and keeps time with the rest.

The probe half also gathers the node basics other rules read: hostname, kernel, /dev/shm size and the
locked-memory limit.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import time
from typing import Any, Dict, List

from preflight.common import clock_offset
from preflight.model import FAILURE_KINDS, Check, ClusterView, Finding, Status, probe_error

MIN_PYTHON = (3, 8)
#: Clock skew above this many seconds is a warning: NCCL/gloo timeouts and log correlation suffer.
NAME = "ssh"
MAX_SKEW_S = 1.0


def probe(ctx: Any) -> Dict[str, Any]:
    """Node basics, read from the standard library alone."""
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_frsize * shm.f_blocks
    except OSError:
        shm_bytes = None
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {
        "hostname": socket.gethostname(),
        "python": list(platform.python_version_tuple()),
        "python_executable": os.path.realpath(os.sys.executable),
        "kernel": platform.release(),
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


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    kinds = view.cluster.get(FAILURE_KINDS) or {}
    for name, why in view.unreachable.items():
        if kinds.get(name) == "damaged":
            # the node ran the bundle and answered; frames of its answer were lost on the way: nothing is
            # known to be wrong with the node, so this is no verdict on it (never a drain)
            out.append(Finding(NAME, name, Status.ERROR, "%s; the node answered but its result was damaged in transit "
                               "(run again; if it repeats, check the transport's output handling)" % why,
                               data={"unreachable": True, "damaged": True}, action="retest"))
        elif kinds.get(name) == "scheduler":
            # Slurm could not run the step there (srun: "Unable to confirm allocation", the job ended under it, a
            # launch that timed out twice): nothing is known about the node (never a drain); the message says
            # where to look (preflight.slurm.fleet)
            out.append(Finding(NAME, name, Status.ERROR, why, data={"unreachable": True, "scheduler": True},
                               action="retest"))
        elif kinds.get(name) == "login_shell":
            # connected and authenticated; the shell's start-up files (a shared home's pyenv/conda init)
            # had not started the command: the login environment is slow, nothing is known of the node
            out.append(Finding(NAME, name, Status.ERROR, why, data={"unreachable": True, "login_shell": True},
                               action="retest"))
        else:
            out.append(Finding(NAME, name, Status.FAIL, why, data={"unreachable": True}, action="isolate"))
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts)
        if err:
            out.append(err)
            continue
        version = tuple(int(p) for p in facts["python"][:2])
        shown = ".".join(facts["python"])
        if version < MIN_PYTHON:
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "python %s is too old for the probe" % shown,
                    expected=">= %d.%d" % MIN_PYTHON,
                    actual=shown,
                )
            )
            continue
        skew = clock_offset(facts)
        if skew is not None and abs(skew[0]) - skew[1] > MAX_SKEW_S:
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.WARN,
                    "clock is %+.1f s off the controller's (±%.2f s); run chrony/ntpd" % skew,
                    expected="|skew| <= %.0f s" % MAX_SKEW_S,
                    actual="%+.1f s" % skew[0],
                )
            )
            continue
        out.append(Finding(NAME, name, Status.PASS, "reachable, python %s" % shown, actual=shown))
    return out


CHECK = Check(
    name=NAME,
    claim="Every node answers over SSH with a verified host key, runs python >= 3.8 and keeps time within 1 s",
    why="A node the launcher cannot reach, or whose clock drifts, stalls rendezvous and scrambles logs.",
    fix="Check sshd and the host key (ssh-keyscan HOST >> known_hosts after verifying it), the python "
    "path in the inventory, and time sync (chronyc tracking).",
    probe=probe,
    rule=rule,
    action="fix_config",
    reads="the Python standard library: hostname, kernel, clock, python version, /dev/shm size, locked-memory limit",
    takes="< 0.1 s",
    order=10,
)

"""ssh: every node is reachable and authenticated, runs a new enough python, and keeps time with the rest.

The probe half also gathers the node basics other rules read: hostname, kernel, /dev/shm size and the
locked-memory limit.
"""

from __future__ import annotations

from preflight.model import Check

#: Clock skew above this many seconds is a warning: NCCL/gloo timeouts and log correlation suffer.
NAME = "ssh"

CHECK = Check(
    name=NAME,
    claim="Every node answers over SSH with a verified host key, runs python >= 3.8 and keeps time within 1 s",
    why="A node the launcher cannot reach, or whose clock drifts, stalls rendezvous and scrambles logs.",
    fix="Check sshd and the host key (ssh-keyscan HOST >> known_hosts after verifying it), the python "
    "path in the inventory, and time sync (chronyc tracking).",
    action="fix_config",
    reads="the Python standard library: hostname, kernel, clock, python version, /dev/shm size, locked-memory limit",
    takes="< 0.1 s",
    order=10,
)

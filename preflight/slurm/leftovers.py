"""What a killed preflight run left in Slurm is named and cleaned by the next run; the owner is in the name.

A run that makes its own allocation gives what it leaves in Slurm one name, `owner_name()`:
`preflight-TOKEN-PID-START-HOST` (the controller process: its pid, its start time in clock ticks from
/proc/PID/stat, so a reused pid is not taken for it, and its host). The job (salloc -J) carries it, and so
does --resume's recheck reservation (allocation._hold): Flags=MAINT,FLEX,IGNORE_JOBS over the nodes resumed
for their recheck, with no end a run could outlive (Duration=UNLIMITED: Slurm makes it a year). Only a run
that decided deletes it (Allocation.settle, Allocation.release), so a controller killed with SIGKILL (the OOM
killer, a reboot), which cleans nothing, leaves every node it resumed for a recheck reserved: no user job
lands there (FLEX lets preflight's own job use the run's other nodes too).

`sweep()` runs before a run allocates. A preflight job or reservation whose owner ran on this host and is
gone is a dead run's: the job is cancelled (it would hold its nodes until its time limit), each node of the
reservation still in service (resumed, never decided) is drained with preflight's reason (a later --resume
rechecks it), a node someone drained or Slurm set DOWN meanwhile is left as it is, and then the reservation
is deleted. An owner on another host cannot be asked: its leftovers are named with the commands that clean
them, and stay (its nodes remain out of service, never in it).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import time
from typing import Callable, Dict, List, Optional, Tuple

from preflight.common import fold
from preflight.slurm.scontrol import (REASON_PREFIX, SCANCEL, SCONTROL, SQUEUE, SlurmError, hostnames, left_alone_why,
                                      node_info, ours, run)

log = logging.getLogger(__name__)

OWNER_RE = re.compile(r"^preflight-([0-9a-f]{8})-(\d+)-(\d+)-([A-Za-z0-9._-]+)$")
#: the reason a node gets when a dead run had resumed it for a recheck and never decided
INTERRUPTED = REASON_PREFIX + " recheck not finished: the run that resumed it (%s) was killed; --resume rechecks it"


def _started(pid: int) -> Optional[str]:
    """The start time of process pid (clock ticks since boot, /proc/PID/stat field 22), None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "(comm)", which may hold spaces
    return fields[19] if len(fields) > 19 else None


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "unknown"


def owner_name() -> str:
    """A fresh name for what this run leaves in Slurm (its job, its reservation): it says whose it is."""
    pid = os.getpid()
    return "preflight-%s-%d-%s-%s" % (secrets.token_hex(4), pid, _started(pid) or "0", _host())


def owner(name: str) -> Optional[Tuple[int, str, str]]:
    """(pid, start, host) of a name owner_name() made; None for any other name."""
    m = OWNER_RE.match(name)
    return (int(m.group(2)), m.group(3), m.group(4)) if m else None


def alive(name: str, here: Optional[str] = None, started: Callable[[int], Optional[str]] = _started) -> Optional[bool]:
    """Whether the run that owns `name` still runs: True, False (its host is this one and the process is
    gone, or the pid is another process now), None when it cannot be told (another host, not preflight's)."""
    who = owner(name)
    if who is None or who[2] != (here or _host()):
        return None
    return started(who[0]) == who[1]


def parse_reservations(text: str) -> Dict[str, List[str]]:
    """`scontrol -o show reservation` -> {name: node names}; 'No reservations in the system' -> {}."""
    out: Dict[str, List[str]] = {}
    for line in text.splitlines():
        name = re.search(r"(?:^| )ReservationName=(\S+)", line)
        nodes = re.search(r"(?:^| )Nodes=(\S+)", line)
        if name:
            out[name.group(1)] = hostnames(nodes.group(1)) if nodes and nodes.group(1) != "(null)" else []
    return out


def parse_jobs(text: str) -> Dict[str, List[str]]:
    """`squeue -h -o '%i %j'` -> {job name: [job ids]}."""
    jobs: Dict[str, List[str]] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            jobs.setdefault(parts[1].strip(), []).append(parts[0])
    return jobs


def _read(argv: List[str]) -> str:
    out = run(argv)
    if out.returncode != 0:
        raise SlurmError("%s failed: %s" % (" ".join(argv[:3]), out.stderr.strip()[:200]),
                         "check that slurmctld is up (scontrol ping)")
    return out.stdout


def sweep(say: Callable[[str], None] = log.warning) -> None:
    """Name and clean what killed preflight runs left in Slurm (see the module docstring)."""
    jobs = {n: ids for n, ids in parse_jobs(_read([SQUEUE, "-h", "-o", "%i %j"])).items() if owner(n)}
    resvs = {n: nodes for n, nodes in parse_reservations(_read([SCONTROL, "-o", "show", "reservation"])).items() if owner(n)}
    for name in sorted(set(jobs) | set(resvs)):
        pid, _, host = owner(name)  # type: ignore[misc]
        state = alive(name)
        if state:
            continue  # a run in progress on this host: its own
        what, fix = [], []
        if name in jobs:
            what.append("job %s" % ",".join(jobs[name]))
            fix.append("scancel %s" % " ".join(jobs[name]))
        if name in resvs:
            what.append("reservation %s over %s" % (name, fold(resvs[name]) or "no nodes"))
            fix.append("scontrol delete reservation=%s" % name)
        if state is None:
            say("left as is: %s of a preflight run on %s (pid %d), which this run cannot ask: if that run is over, "
                "drain the reservation's nodes that are in service and clean it: %s" % (", ".join(what), host, pid, "; ".join(fix)))
            continue
        say("a killed preflight run (pid %d on %s) left %s" % (pid, host, ", ".join(what)))
        for job in jobs.get(name, []):
            done = run([SCANCEL, job])
            say("  job %s: %s" % (job, "cancelled" if done.returncode == 0 else "scancel failed: %s" % done.stderr.strip()[:200]))
        if name in resvs:
            _close_recheck(name, resvs[name], say)


def _close_recheck(name: str, nodes: List[str], say: Callable[[str], None]) -> None:
    """A dead run's recheck reservation: drain each node still in service (resumed, never decided), leave
    the others as they are now, then delete the reservation (no node is in service and unreserved before)."""
    reason = INTERRUPTED % name
    for node in nodes:
        info = node_info([node])[node]  # re-read just before acting: it may be someone else's now
        why = left_alone_why("drain", info)
        if why is not None:
            say("  left alone: %s (%s)" % (node, why))
            continue
        if any(s.rstrip("*").startswith("DRAIN") for s in info["state"]) and ours(info.get("reason")):
            say("  %s: still drained by preflight (%s)" % (node, info["reason"]))
            continue
        out = run([SCONTROL, "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason])
        if out.returncode != 0:
            say("  could not drain %s: %s; reservation %s kept (the node stays out of service)" % (
                node, out.stderr.strip()[:200], name))
            return
        say("  %s: resumed for a recheck that never ended: drained again (reason: %s)" % (node, reason))
    if delete_reservation(name):
        say("  reservation %s deleted" % name)


def delete_reservation(name: str, wait_s: float = 10.0) -> bool:
    """Delete a reservation, waiting up to wait_s for a job still leaving its nodes. False (logged) when
    it could not be deleted; True also when it was already gone."""
    until = time.monotonic() + wait_s
    while True:
        out = run([SCONTROL, "delete", "reservation=%s" % name])
        if out.returncode == 0:
            return True
        if "invalid" in out.stderr.lower() or "not found" in out.stderr.lower():
            return True  # never created, or deleted already
        if time.monotonic() >= until:
            log.warning("could not delete reservation %s: %s; delete it: scontrol delete reservation=%s",
                        name, out.stderr.strip()[:200], name)
            return False
        time.sleep(0.5)

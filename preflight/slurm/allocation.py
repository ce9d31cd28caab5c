"""The Slurm allocation a run uses: the job's nodes, Slurm's view of them, and its lifecycle.

An allocation is either the one this process runs in (salloc shell, sbatch script: SLURM_JOB_ID) or
one preflight makes for the run (`salloc --no-shell --exclusive`) and releases at its end. Nodes Slurm
reports unusable (down, drained, not responding) are left out of it and named as failures by the fleet.
`--resume` rechecks the nodes preflight drained: they go into a MAINT reservation, are resumed inside it,
and are drained again unless they pass (see Allocation.held and the CLI's --resume). The reservation has
no end a run could outlive: only a run that decided deletes it, so a controller killed with SIGKILL leaves
those nodes reserved, out of user work, and the next run names and cleans what it left (leftovers.sweep).

`inventory(alloc)` turns an allocation into the Inventory the engine runs on (name = host = the Slurm
node name; GPUs a node from Slurm's Gres unless given).
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import expand, fold
from preflight.errors import UsageError
from preflight.inventory import NodeSpec
from preflight.slurm.scontrol import (BUSY_STATES, hostnames, GRANTED_RE, SALLOC, SCANCEL, SCONTROL, SQUEUE, SlurmError,
                                      bad_state, job_gpus, left_alone_why, node_info, ours, run)
from preflight.slurm.leftovers import delete_reservation, owner_name, sweep

log = logging.getLogger(__name__)


@dataclass
class Allocation:
    """A Slurm job whose nodes preflight runs on; owned=True when preflight made it (and releases it)."""

    job_id: str
    nodes: List[str]
    owned: bool = False
    excluded: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # nodes Slurm reported unusable
    state: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # Slurm's view of every node before the run
    held: Dict[str, str] = field(default_factory=dict)  # preflight-drained nodes resumed into our reservation
    reservation: Optional[str] = None
    minutes: int = 0  # the job's time limit (salloc -t) when preflight made it: it ends then whatever happens
    _gpus: Optional[int] = field(default=None, repr=False)  # gpus_held(), once asked

    def gpus_held(self) -> int:
        """GPUs the job holds (job_gpus of `scontrol -d -o show job`), asked once: 0 where Slurm does not
        manage the nodes' GPUs, and then a step cannot ask for them."""
        if self._gpus is None:
            out = run([SCONTROL, "-d", "-o", "show", "job", self.job_id]) if self.job_id else None
            self._gpus = job_gpus(out.stdout) if out is not None and out.returncode == 0 else 0
        return self._gpus

    def gpu_note(self) -> Optional[str]:
        """Why the GPU checks may see no GPUs: the nodes have Gres GPUs and this job holds none of them
        (with ConstrainDevices a job sees only the GPUs it holds). None when that is not the case."""
        gres = sorted({int(i.get("gpus") or 0) for n, i in self.state.items() if n in self.nodes})
        if not gres or gres[-1] == 0 or self.gpus_held() > 0:
            return None
        return ("job %s holds none of its nodes' GPUs (Gres gpu:%d): where Slurm constrains devices the GPU "
                "checks see none; allocate them (salloc --gpus-per-node=%d --exclusive)" % (self.job_id, gres[-1], gres[-1]))

    #: scancel's answer waits, one per try: a slurmctld busy with a large step's end (1,000 nodes on a
    #: loaded controller) may take longer than the first; scancel of a job already gone is harmless
    CANCEL_WAITS_S = (30.0, 90.0)

    def release_job(self) -> None:
        """Cancel the job preflight made (the fleet's close: its steps are over). A slurmctld that does not
        answer gets a second, longer try; if it still does not, the run's verdict stands and a warning
        names the job and its time limit, at which Slurm ends it anyway (allocate() sets it to the run's
        longest duration)."""
        if not self.owned:
            return
        self.owned = False
        why = ""
        for wait in self.CANCEL_WAITS_S:
            try:
                out = run([SCANCEL, self.job_id], timeout=wait)
            except SlurmError as exc:
                why = exc.message
                continue
            if out.returncode == 0 or "invalid job id" in out.stderr.lower():
                return
            why = out.stderr.strip()[:200] or "scancel rc %d" % out.returncode
        log.warning("could not cancel job %s (%s); Slurm ends it at its %d-minute time limit; cancel it now: "
                    "scancel %s", self.job_id, why, self.minutes, self.job_id)

    def settle(self) -> None:
        """The held nodes are decided (drained again or returned by --drain/--resume's plan): the recheck
        reservation goes now (what passed is in service, what failed is drained), and release() leaves
        the nodes as they are."""
        self.held = {}
        if self.reservation:
            resv, self.reservation = self.reservation, None
            delete_reservation(resv)

    def release(self) -> None:
        """Cancel the job, then undo what an unfinished --resume left: every held node not yet settled is
        drained again with its old reason (it was resumed only to be rechecked, and was not proven
        healthy), and only then is the reservation deleted (no other job can land on it in between).
        What it undoes is logged (a warning: the operator reads it on stderr)."""
        self.release_job()
        held, self.held = self.held, {}
        for node, reason in sorted(held.items()):
            try:
                why = left_alone_why("drain", node_info([node])[node])  # re-read: someone may have drained it
            except SlurmError as exc:
                log.warning("could not read %s again (%s): it stays in reservation %s, out of service",
                            node, exc.message, self.reservation)
                self.reservation = None  # kept: the next run cleans it (leftovers.sweep)
                continue
            if why is not None:
                log.warning("left alone: %s (%s)", node, why.replace("someone else", "someone else during this run", 1))
                continue
            out = run([SCONTROL, "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason])
            if out.returncode == 0:
                log.warning("%s drained again, not rechecked to the end (reason: %s)", node, reason)
            else:
                log.warning("could not drain %s again: %s; drain it by hand: scontrol update nodename=%s state=drain "
                            "reason=%s", node, out.stderr.strip()[:200], node, shlex.quote(reason))
        if self.reservation:
            resv, self.reservation = self.reservation, None
            if delete_reservation(resv) and held:
                log.warning("deleted the recheck reservation %s", resv)


def current_allocation(environ: Optional[Dict[str, str]] = None) -> Allocation:
    """The allocation this process runs in (salloc shell, sbatch script): SLURM_JOB_ID and its nodelist."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise UsageError("--slurm without --nodelist/--partition needs an allocation (SLURM_JOB_ID is not set)",
                         "run inside salloc/sbatch, or give --nodelist gpu-[001-064] or --partition P --nodes N")
    try:
        nodes = hostnames(nodelist)
    except ValueError as exc:
        raise SlurmError("SLURM_JOB_NODELIST %r: %s" % (nodelist, exc)) from None
    return Allocation(job, nodes)


#: how long salloc waits for the nodes by default (--alloc-wait)
ALLOC_WAIT_S = 120.0


def run_budget(timeout: Optional[float]) -> float:
    """The longest a run may take once it has its nodes (the job's time limit and --resume's reservation
    cover the wait for the nodes plus this): three phases of the per-node deadline (the node checks,
    the network checks, the all-reduce), and a minute for the launches and the release."""
    from preflight.inventory import DEFAULTS

    return 3 * (timeout or float(DEFAULTS.get("command_timeout", 60))) + 60


def checked_python(python: Optional[str]) -> str:
    """--python for the Slurm nodes (default python3), validated as an inventory's `python` is: it
    reaches the node's shell (quoted)."""
    from preflight.inventory import PYTHON_RE

    if python is None:
        return "python3"
    if not PYTHON_RE.match(python):
        raise UsageError("--python %r is not an interpreter name or absolute path" % python,
                         "give e.g. --python /usr/bin/python3 or --python python3.11")
    return python


def allocate(nodelist: Optional[str] = None, partition: Optional[str] = None, nodes: Optional[int] = None,
             timeout: float = ALLOC_WAIT_S, recheck_ours: bool = False, run_s: float = 600.0,
             qos: Optional[str] = None) -> Allocation:
    """Make an allocation for this run (salloc --no-shell); nodes Slurm reports unusable are left out.

    With a nodelist, down/drained nodes are named before allocating: asking for them would make the
    job wait forever, and where the nodes have Gres=gpu:N the job asks for those GPUs (cgroup device
    constraints hide GPUs a job does not hold). With --partition/--nodes, Slurm picks N usable nodes.
    The nodes are taken whole (--exclusive): the checks bind the rendezvous port and time the fabric.
    The job's time limit is the wait for the nodes plus run_s, the longest the run may take: a killed
    preflight's job (SIGKILL: nothing can clean up) holds its nodes no longer than the run would have,
    or until the next run, which cancels it first (leftovers.sweep: the job's name says whose it is).

    recheck_ours (--resume): nodes drained by preflight (reason `preflight:`, slurmd responding) are
    checked too. A drained node cannot be allocated, so they go into a MAINT reservation (FLEX: the job
    also takes the run's other nodes), are resumed inside it (no other job can start there), and the caller drains
    again every one that does not pass (Allocation.held keeps their old reasons; Allocation.release
    drains again every one not settled, on any exit: an error, Ctrl-C, SIGTERM, here while salloc waits).
    """
    sweep()  # a killed run's job would hold the nodes, its reservation keep them out of service
    minutes = max(1, int(math.ceil((timeout + run_s) / 60.0)))
    # whole nodes: the bandwidth test and the rendezvous port must not share them with a running job;
    # a name of its own, so an interrupted wait can cancel exactly this request, which says whose it is
    name = owner_name()
    argv = [SALLOC, "--no-shell", "-J", name, "-t", str(minutes), "--immediate=%d" % int(timeout), "--exclusive",
            # a node that fails mid-run (the dead one it is there to find) must not end the job for all
            "--no-kill"]
    excluded: Dict[str, Dict[str, Any]] = {}
    info: Dict[str, Dict[str, Any]] = {}
    pending = Allocation("", [])  # what to undo if this call does not return: the reservation, held nodes
    if nodelist:
        try:
            wanted = expand(nodelist)
        except ValueError as exc:
            raise UsageError("--nodelist %r: %s" % (nodelist, exc), "write ranges like gpu-[001-064]") from None
        info = node_info(wanted)
        excluded = {n: info[n] for n in wanted if bad_state(info[n]["state"])}
        held = {}
        if recheck_ours:
            held = {n: i["reason"] for n, i in excluded.items() if ours(i["reason"]) and
                    not any(x.rstrip("*") in ("DOWN", "NOT_RESPONDING") or x.endswith("*") for x in i["state"])}
            excluded = {n: i for n, i in excluded.items() if n not in held}
        usable = [n for n in wanted if n not in excluded]
        if not usable:
            return Allocation("", [], False, excluded, info)
        gres = min(int(info[n].get("gpus") or 0) for n in usable)
        argv += ["-N", str(len(usable)), "-w", fold(usable)]
        if gres:  # where Slurm manages the GPUs (Gres=gpu:N), a job that asks for none cannot see them
            argv.append("--gres=gpu:%d" % gres)
    elif nodes:
        argv += ["-N", str(nodes)]
        held = {}
    else:
        raise UsageError("--partition needs --nodes N", "e.g. --partition gpu --nodes 16")
    if partition:
        argv += ["-p", partition]
    if qos:  # a QOS the site lets user jobs preempt (--preemptible): see preflight.slurm.preempt
        argv += ["--qos", qos]
    try:
        if held:
            _hold(pending, name, held)
            argv.append("--reservation=%s" % pending.reservation)
        rc, said_all = _salloc(argv, name, timeout + 10)
        m = GRANTED_RE.search(said_all)
        if rc != 0 or not m:
            said = (said_all.strip().splitlines() or ["rc %d" % rc])[-1][:300]
            busy = {n: "+".join(i["state"]) for n, i in info.items() if n not in excluded and n not in held
                    and any(s.rstrip("*") in BUSY_STATES for s in i["state"])}
            if busy:
                raise SlurmError("salloc did not get the nodes within %g s (%s): %s busy (Slurm reports %s); preflight "
                                 "takes whole nodes" % (timeout, said, fold(busy), ", ".join(
                                     "%s %s" % (n, busy[n]) for n in sorted(busy, key=_natural)[:5])),
                                 "run it when they are idle, inside the job's own allocation (salloc/sbatch, then "
                                 "preflight check --slurm), or check a busy node alone with `preflight node`; "
                                 "--alloc-wait SECONDS waits longer")
            raise SlurmError("salloc failed: %s" % said, "check the partition and node names (sinfo); preflight takes "
                             "whole idle nodes (--exclusive), --alloc-wait SECONDS waits longer for them")
        job = m.group(1)
        pending.job_id, pending.owned, pending.minutes = job, True, minutes
        got = run([SQUEUE, "-h", "-j", job, "-o", "%N"])
        try:
            names = hostnames(got.stdout.strip())
        except ValueError:
            raise SlurmError("cannot read the nodes of job %s: %r" % (job, got.stdout.strip())) from None
    except BaseException:
        pending.release()  # the job, then every held node drained again, then the reservation
        raise
    return Allocation(job, names, True, excluded, info, pending.held, pending.reservation, minutes)


def _salloc(argv: List[str], name: str, timeout: float) -> Tuple[int, str]:
    """Run salloc; (rc, what it printed). Interrupted (Ctrl-C, SIGTERM) or past timeout while it waits:
    SIGINT makes salloc revoke its request, and a job of this name that was granted meanwhile is cancelled."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True, start_new_session=True)
    except FileNotFoundError:
        raise SlurmError("salloc not found", "install the Slurm client (slurm-client) or put it on PATH") from None
    try:
        said, _ = proc.communicate(timeout=timeout)
        return proc.returncode, said
    except BaseException as exc:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        run([SCANCEL, "--name=%s" % name], timeout=15)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise SlurmError("salloc did not answer within %g s" % timeout, "check that slurmctld is up (scontrol ping)") from None
        log.warning("cancelled the waiting allocation %s", name)
        raise


def _hold(pending: Allocation, name: str, held: Dict[str, str]) -> None:
    """A MAINT reservation `name` over the held (preflight-drained) nodes, with no end (Duration=UNLIMITED:
    only a run that decided deletes it; FLEX: the job may use the run's other nodes too), then resume
    each held node inside it if it is still drained by preflight (re-read just before). Each step is
    recorded on `pending` before it is taken, so its release() undoes what was done."""
    import pwd

    pending.reservation = name
    out = run([SCONTROL, "create", "reservation", "ReservationName=%s" % name, "Nodes=%s" % fold(held),
               "StartTime=now", "Duration=UNLIMITED", "Users=%s" % pwd.getpwuid(os.getuid()).pw_name,
               "Flags=maint,ignore_jobs,flex"])
    if out.returncode != 0:
        pending.reservation = None
        raise SlurmError("cannot reserve %s to recheck drained nodes: %s" % (fold(held), out.stderr.strip()[:200]),
                         "run --resume as a Slurm operator (root or SlurmUser)")
    for node, reason in held.items():
        why = left_alone_why("resume", node_info([node])[node])
        if why is not None:
            log.warning("left alone: %s (%s)", node, why.replace("someone else", "someone else during this run", 1))
            continue
        pending.held[node] = reason
        run([SCONTROL, "update", "nodename=%s" % node, "state=resume"])


def specs_for(alloc: Allocation, python: str = "python3", command_timeout: float = 60.0,
              gpus_per_node: Optional[int] = None) -> List[NodeSpec]:
    """NodeSpecs for Slurm nodes (name = host = the Slurm node name); GPUs from Slurm's Gres unless given."""
    names = list(alloc.nodes) + list(alloc.excluded)
    info = dict(alloc.excluded)
    info.update(alloc.state)
    return [NodeSpec(name=n, host=n, line=0, python=python, command_timeout=command_timeout,
                     gpus_per_node=gpus_per_node if gpus_per_node is not None else int(info.get(n, {}).get("gpus") or 0))
            for n in sorted(names, key=_natural)]


def _natural(name: str) -> List[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def inventory(alloc: Allocation, python: str = "python3", command_timeout: float = 60.0,
              gpus_per_node: Optional[int] = None, master_port: int = 29500) -> Any:
    """An Inventory of an allocation's nodes (plus the ones Slurm reported unusable, as failures)."""
    from preflight.inventory import Inventory

    label = "slurm job %s" % alloc.job_id if alloc.job_id else "slurm"
    if not alloc.state and alloc.nodes:
        alloc.state = node_info(alloc.nodes)
    if gpus_per_node is None:
        for name, i in alloc.state.items():
            alloc.excluded.get(name, {}).setdefault("gpus", i.get("gpus"))
    return Inventory(path=label, nodes=specs_for(alloc, python, command_timeout, gpus_per_node),
                     master_port=master_port, cluster={"master_port": master_port, "mtu_full_mesh": False, "allreduce": {}},
                     transport="slurm", allocation=alloc)

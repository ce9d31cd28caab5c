"""The Slurm allocation a run uses: the job's nodes, Slurm's view of them, and its lifecycle.

An allocation is either the one this process runs in (salloc shell, sbatch script: SLURM_JOB_ID) or
one preflight makes for the run (`salloc --no-shell --exclusive`) and releases at its end. Nodes Slurm
reports unusable (down, drained, not responding) are left out of it and named as failures by the fleet.
`--resume` rechecks the nodes preflight drained: they go into a MAINT reservation, are resumed inside it,
and are drained again unless they pass (see Allocation.held and the CLI's --resume).

`inventory(alloc)` turns an allocation into the Inventory the engine runs on (name = host = the Slurm
node name; GPUs a node from Slurm's Gres unless given).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from preflight.common import expand, fold
from preflight.errors import UsageError
from preflight.inventory import NodeSpec
from preflight.slurm.scontrol import (BUSY_STATES, GRANTED_RE, SALLOC, SCANCEL, SCONTROL, SQUEUE, SlurmError,
                                      bad_state, job_gpus, node_info, run)


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

    def release(self) -> None:
        if self.owned:
            self.owned = False
            run([SCANCEL, self.job_id])
        if self.reservation:
            resv, self.reservation = self.reservation, None
            for _ in range(20):  # the reservation can be deleted once the job has left its nodes
                if run([SCONTROL, "delete", "reservation=%s" % resv]).returncode == 0:
                    break
                time.sleep(0.5)


def current_allocation(environ: Optional[Dict[str, str]] = None) -> Allocation:
    """The allocation this process runs in (salloc shell, sbatch script): SLURM_JOB_ID and its nodelist."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise UsageError("--slurm without --nodelist/--partition needs an allocation (SLURM_JOB_ID is not set)",
                         "run inside salloc/sbatch, or give --nodelist gpu-[001-064] or --partition P --nodes N")
    try:
        nodes = expand(nodelist)
    except ValueError as exc:
        raise SlurmError("SLURM_JOB_NODELIST %r: %s" % (nodelist, exc)) from None
    return Allocation(job, nodes)


#: how long salloc waits for the nodes by default (--alloc-wait)
ALLOC_WAIT_S = 120.0


def allocate(nodelist: Optional[str] = None, partition: Optional[str] = None, nodes: Optional[int] = None,
             time_limit: str = "30", timeout: float = ALLOC_WAIT_S, recheck_ours: bool = False) -> Allocation:
    """Make an allocation for this run (salloc --no-shell); nodes Slurm reports unusable are left out.

    With a nodelist, down/drained nodes are named before allocating: asking for them would make the
    job wait forever, and where the nodes have Gres=gpu:N the job asks for those GPUs (cgroup device
    constraints hide GPUs a job does not hold). With --partition/--nodes, Slurm picks N usable nodes.
    The nodes are taken whole (--exclusive): the checks bind the rendezvous port and time the fabric.

    recheck_ours (--resume): nodes drained by preflight (reason `preflight:`, slurmd responding) are
    checked too. A drained node cannot be allocated, so they go into a MAINT reservation with the
    run's other nodes, are resumed inside it (no other job can start there), and the caller drains
    again every one that does not pass (Allocation.held keeps their old reasons).
    """
    from preflight.slurm import drain
    # whole nodes: the bandwidth test and the rendezvous port must not share them with a running job
    argv = [SALLOC, "--no-shell", "-J", "preflight", "-t", time_limit, "--immediate=%d" % int(timeout), "--exclusive"]
    excluded: Dict[str, Dict[str, Any]] = {}
    if nodelist:
        try:
            wanted = expand(nodelist)
        except ValueError as exc:
            raise UsageError("--nodelist %r: %s" % (nodelist, exc), "write ranges like gpu-[001-064]") from None
        info = node_info(wanted)
        excluded = {n: info[n] for n in wanted if bad_state(info[n]["state"])}
        held = {}
        if recheck_ours:
            held = {n: i["reason"] for n, i in excluded.items() if drain.ours(i["reason"]) and
                    not any(x.rstrip("*") in ("DOWN", "NOT_RESPONDING") or x.endswith("*") for x in i["state"])}
            excluded = {n: i for n, i in excluded.items() if n not in held}
        usable = [n for n in wanted if n not in excluded]
        if not usable:
            return Allocation("", [], False, excluded, info)
        resv = _hold(usable, held) if held else None
        argv += ["-N", str(len(usable)), "-w", fold(usable)] + (["--reservation=%s" % resv] if resv else [])
        gres = min(int(info[n].get("gpus") or 0) for n in usable)
        if gres:  # where Slurm manages the GPUs (Gres=gpu:N), a job that asks for none cannot see them
            argv.append("--gres=gpu:%d" % gres)
    elif nodes:
        argv += ["-N", str(nodes)]
        info, held, resv = {}, {}, None
        excluded = {}
    else:
        raise UsageError("--partition needs --nodes N", "e.g. --partition gpu --nodes 16")
    if partition:
        argv += ["-p", partition]
    out = run(argv, timeout + 10)
    m = GRANTED_RE.search(out.stderr + out.stdout)
    if out.returncode != 0 or not m:
        if resv:
            Allocation("", [], held=held, reservation=resv).release()
            _redrain(held)
        said = (out.stderr.strip().splitlines() or ["rc %d" % out.returncode])[-1][:300]
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
    got = run([SQUEUE, "-h", "-j", job, "-o", "%N"])
    try:
        names = expand(got.stdout.strip())
    except ValueError:
        run([SCANCEL, job])
        raise SlurmError("cannot read the nodes of job %s: %r" % (job, got.stdout.strip())) from None
    return Allocation(job, names, True, excluded, info, held, resv)


def _hold(nodes: Sequence[str], held: Dict[str, str]) -> str:
    """A MAINT reservation over `nodes`, then resume the held (preflight-drained) ones inside it."""
    import pwd

    resv = "preflight-" + secrets.token_hex(4)
    out = run([SCONTROL, "create", "reservation", "ReservationName=%s" % resv, "Nodes=%s" % fold(nodes),
                "StartTime=now", "Duration=30", "Users=%s" % pwd.getpwuid(os.getuid()).pw_name,
                "Flags=maint,ignore_jobs"])
    if out.returncode != 0:
        raise SlurmError("cannot reserve %s to recheck drained nodes: %s" % (fold(nodes), out.stderr.strip()[:200]),
                         "run --resume as a Slurm operator (root or SlurmUser)")
    for node in held:
        run([SCONTROL, "update", "nodename=%s" % node, "state=resume"])
    return resv


def _redrain(held: Dict[str, str]) -> None:
    for node, reason in held.items():
        run([SCONTROL, "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason])


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

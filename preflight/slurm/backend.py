"""The Slurm backend's hooks (preflight.transport.backends): the nodes of an allocation (this job's, or one
made for the run and released after it), reached with srun steps; drain and resume with scontrol."""

from __future__ import annotations

import argparse
import sys
from typing import Any, List, Optional, Tuple

from preflight import common
from preflight.actions import tier_gate
from preflight.errors import UsageError
from preflight.inventory import Inventory
from preflight.slurm import allocation as slurm
from preflight.slurm import drain
from preflight.slurm import fleet as slurm_fleet
from preflight.slurm import preempt


def _alloc_wait(args: argparse.Namespace) -> float:
    wait = getattr(args, "alloc_wait", None)
    if wait is None:
        return slurm.ALLOC_WAIT_S
    if wait < 1:
        raise UsageError("--alloc-wait must be at least 1 second", "e.g. --alloc-wait 300")
    return wait


def _recheck(args: argparse.Namespace) -> bool:
    """--resume rechecks the nodes preflight drained: they are resumed into a reservation for the run."""
    return getattr(args, "resume", False) and not getattr(args, "dry_run", False)


def inventory_of(args: argparse.Namespace) -> Inventory:
    """The allocation as the inventory: this job's nodes, or an allocation made now (released after the run)."""
    if args.inventory:
        raise UsageError("--slurm takes its nodes from Slurm, not from an inventory file",
                         "drop the inventory, or write `transport: slurm` under `cluster:` in it")
    if args.nodes is not None and args.nodes < 1:
        raise UsageError("--nodes must be at least 1", "e.g. --nodes 16")
    python = slurm.checked_python(args.python)
    if args.nodelist and args.nodes:
        raise UsageError("give --nodelist or --partition/--nodes, not both", "e.g. --nodelist gpu-[001-064]")
    qos = getattr(args, "qos", None)
    allocating = bool(args.nodelist or args.partition or args.nodes)
    if getattr(args, "preemptible", False) and allocating and not (args.partition or qos):
        raise UsageError("--preemptible needs the partition or QOS your site lets user jobs preempt",
                         "e.g. --partition burnin --preemptible (slurm.conf: PreemptType=preempt/partition_prio, "
                         "PriorityTier lower than the users' partitions), or run it inside a batch job there: "
                         "sbatch --requeue --partition burnin")
    if allocating:
        alloc = slurm.allocate(nodelist=args.nodelist, partition=args.partition, nodes=args.nodes,
                               recheck_ours=_recheck(args), timeout=_alloc_wait(args), run_s=slurm.run_budget(args.timeout),
                               qos=qos)
    elif qos:
        raise UsageError("--qos applies when preflight allocates", "add --nodelist NODES, or give the QOS to sbatch/salloc")
    else:  # inside a job; with --preemptible, a batch job in the burn-in partition (preflight.slurm.preempt)
        alloc = slurm.current_allocation()
        if getattr(args, "preemptible", False):
            preempt.yield_to_preemption(alloc.job_id)
    try:
        inv = slurm.inventory(alloc, python=python, gpus_per_node=args.gpus_per_node)
        note = alloc.gpu_note()
        if note:
            sys.stderr.write("preflight: note: %s\n" % note)
    except BaseException:
        alloc.release()
        raise
    return inv


def prepare(args: argparse.Namespace, inv: Inventory, acting: bool) -> None:
    """--alloc-wait for the allocation the transport makes; with --drain/--resume on an inventory's Slurm
    nodes, that allocation made now (as the transport would), with --resume's recheck of the nodes
    preflight drained: a drained node cannot be allocated otherwise."""
    if getattr(args, "alloc_wait", None) is not None:
        inv.cluster["alloc_wait_s"] = _alloc_wait(args)
    if acting and inv.allocation is None:
        inv.allocation = slurm.allocate(nodelist=common.fold([s.name for s in inv.nodes]), recheck_ours=_recheck(args),
                                        timeout=_alloc_wait(args), run_s=slurm.run_budget(args.timeout))


def open_fleet(inv: Inventory, opts: Any) -> Any:
    """srun steps across the allocation (made now when the inventory named Slurm nodes)."""
    return slurm_fleet.fleet_for(inv, opts.progress)


def set_aside(findings: List[Any], inv: Inventory, args: argparse.Namespace) -> List[Any]:
    """Nodes Slurm had out of service when the run began: unavailable, not this run's failures; a preempted
    burn-in job's nodes: preempted (preflight.slurm.preempt); with --resume --tier standard|burn-in, the nodes
    rechecked for return held back unless the tier passed on them (preflight.actions.tier_gate)."""
    if inv.allocation is None:
        return findings
    findings = drain.set_aside(findings, inv.allocation.excluded, strict=getattr(args, "count_unavailable", False))
    if getattr(args, "preemptible", False):
        findings = preempt.mark(findings, inv.allocation)
    tier = tier_gate.demanded(args)
    if tier is not None:
        findings = tier_gate.hold(findings, tier, list(inv.allocation.held))
    return findings


def outputs(args: argparse.Namespace, inv: Inventory, result: Any) -> List[Tuple[str, str, str]]:
    return []


def applier(inv: Inventory) -> Optional[drain.SlurmApplier]:
    return drain.SlurmApplier(inv.allocation)

"""preflight check / env: load the inventory (or this machine, or a Slurm allocation), run the engine, act on the fleet
(drain, resume, cordon) and write the outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
from typing import Any, Iterator

from preflight.cli import k8s as k8s_command
from preflight.errors import UsageError


def _load_inventory(args: argparse.Namespace) -> Any:
    from preflight import inventory

    if getattr(args, "slurm", False) and not getattr(args, "k8s", False):
        return _slurm_inventory(args)
    k8s = k8s_command.wanted(args)  # --k8s: the nodes from Kubernetes (its options without it: a usage error)
    if not k8s and (getattr(args, "nodelist", None) or getattr(args, "partition", None) or getattr(args, "nodes", None)):
        raise UsageError("--nodelist/--partition/--nodes apply only with --slurm", "add --slurm")
    if args.inventory and not k8s:
        if args.gpus_per_node is not None:
            raise UsageError("--gpus-per-node applies only without an inventory", "set gpus_per_node in the inventory")
        if args.max_nodes is not None and args.max_nodes < 1:
            raise UsageError("--max-nodes must be at least 1", "e.g. --max-nodes 20000")
        inv = inventory.load(args.inventory, max_nodes=args.max_nodes)
    else:
        inv = k8s_command.inventory(args) if k8s else inventory.local_inventory(args.gpus_per_node)
    if args.master_port is not None:
        if not 0 < args.master_port < 65536:
            raise UsageError("--master-port %d is out of range" % args.master_port, "use 1-65535")
        inv.master_port = args.master_port
        inv.cluster["master_port"] = args.master_port
    return inv


def _alloc_wait(args: argparse.Namespace) -> float:
    from preflight.slurm import allocation

    wait = getattr(args, "alloc_wait", None)
    if wait is None:
        return allocation.ALLOC_WAIT_S
    if wait < 1:
        raise UsageError("--alloc-wait must be at least 1 second", "e.g. --alloc-wait 300")
    return wait


def _slurm_inventory(args: argparse.Namespace) -> Any:
    """The allocation as the inventory: this job's nodes, or an allocation made now (released after the run)."""
    from preflight.slurm import allocation as slurm

    if args.inventory:
        raise UsageError("--slurm takes its nodes from Slurm, not from an inventory file",
                         "drop the inventory, or write `transport: slurm` under `cluster:` in it")
    if args.nodes is not None and args.nodes < 1:
        raise UsageError("--nodes must be at least 1", "e.g. --nodes 16")
    python = slurm.checked_python(args.python)
    if args.nodelist and args.nodes:
        raise UsageError("give --nodelist or --partition/--nodes, not both", "e.g. --nodelist gpu-[001-064]")
    qos = getattr(args, "qos", None)
    if getattr(args, "preemptible", False) and not (args.partition or qos):
        raise UsageError("--preemptible needs the partition or QOS your site lets user jobs preempt",
                         "e.g. --partition burnin --preemptible (slurm.conf: PreemptType=preempt/partition_prio, "
                         "PriorityTier lower than the users' partitions)")
    if args.nodelist or args.partition or args.nodes:
        recheck = getattr(args, "resume", False) and not getattr(args, "dry_run", False)
        alloc = slurm.allocate(nodelist=args.nodelist, partition=args.partition, nodes=args.nodes, recheck_ours=recheck,
                               timeout=_alloc_wait(args), run_s=slurm.run_budget(args.timeout), qos=qos)
    elif qos or getattr(args, "preemptible", False):
        raise UsageError("--qos/--preemptible apply when preflight allocates", "add --nodelist NODES")
    else:
        alloc = slurm.current_allocation()
    try:
        inv = slurm.inventory(alloc, python=python, gpus_per_node=args.gpus_per_node)
        note = alloc.gpu_note()
        if note:
            sys.stderr.write("preflight: note: %s\n" % note)
        if args.master_port is not None:
            if not 0 < args.master_port < 65536:
                raise UsageError("--master-port %d is out of range" % args.master_port, "use 1-65535")
            inv.master_port = args.master_port
            inv.cluster["master_port"] = args.master_port
    except BaseException:
        alloc.release()
        raise
    return inv


def run(args: argparse.Namespace) -> int:
    if args.parallel < 1:
        raise UsageError("--parallel must be at least 1", "e.g. -j 64")
    if args.timeout is not None and not (math.isfinite(args.timeout) and 0 < args.timeout <= 86400):
        raise UsageError("--timeout %s is not a usable deadline" % args.timeout, "give seconds from 0.1 to 86400, e.g. --timeout 30")
    acting = getattr(args, "drain", False) or getattr(args, "resume", False)
    if acting and not getattr(args, "slurm", False) and not getattr(args, "k8s", False) and not args.inventory:
        raise UsageError("--drain/--resume act on Slurm or Kubernetes nodes", "add --slurm or --k8s")
    if not 0 <= getattr(args, "max_drain_fraction", 0.2) <= 1:
        raise UsageError("--max-drain-fraction must be between 0 and 1", "e.g. --max-drain-fraction 0.2")
    inv = _load_inventory(args)
    if getattr(args, "plan", False):
        from preflight.checks.allreduce.timeplan import print_plan
        return print_plan(inv, args.json, print, getattr(args, "tier", "quick"))
    inv.cluster["tier"] = getattr(args, "tier", "quick")  # the checks that run only in a tier read it (nvbandwidth)
    if getattr(args, "dcgm_level", None) is None:  # burn-in runs DCGM's long diagnostic where dcgmi exists
        from preflight import engine

        args.dcgm_level = 3 if inv.cluster["tier"] == "burn-in" else 1
        if args.dcgm_level == 3 and args.timeout is None:
            args.timeout = engine.dcgm_budget_s(3)  # a burn-in takes its time: the deadline fits level 3
        elif args.dcgm_level == 3 and args.timeout < engine.dcgm_budget_s(3):
            args.dcgm_level = 1
            sys.stderr.write("preflight: note: --tier burn-in runs `dcgmi diag -r 3` only with a --timeout of %.0f s or "
                             "more; level 1 in this run\n" % engine.dcgm_budget_s(3))
    if getattr(args, "dcgm_level", None):
        from preflight import engine

        args.timeout = engine.dcgm_timeout(args.dcgm_level, args.timeout)
        inv.cluster["dcgm_level"] = args.dcgm_level
    if inv.transport == "slurm" and getattr(args, "alloc_wait", None) is not None:
        inv.cluster["alloc_wait_s"] = _alloc_wait(args)  # for the allocation the transport makes
    if acting and inv.transport not in ("slurm", "k8s"):
        raise UsageError("--drain/--resume act on Slurm nodes; %s uses transport %s" % (inv.path, inv.transport),
                         "add `transport: slurm` under `cluster:` in it (Slurm node names), or use --slurm")
    if acting and inv.allocation is None:
        from preflight import common
        from preflight.slurm import allocation as slurm

        # the inventory's nodes, allocated now (as the transport would), with --resume's recheck of the
        # nodes preflight drained: a drained node cannot be allocated otherwise
        recheck = getattr(args, "resume", False) and not getattr(args, "dry_run", False)
        inv.allocation = slurm.allocate(nodelist=common.fold([s.name for s in inv.nodes]), recheck_ours=recheck,
                                        timeout=_alloc_wait(args), run_s=slurm.run_budget(args.timeout))
    try:
        return _check_inventory(args, inv)
    finally:
        if inv.allocation is not None:
            # an allocation preflight made never outlives the run, nor its --resume reservation, and a node
            # resumed only to be rechecked is drained again unless the run settled it (logged: stderr)
            inv.allocation.release()


def _check_inventory(args: argparse.Namespace, inv: Any) -> int:
    from rich.console import Console

    from preflight import engine
    from preflight.output import files

    json_to_stdout = getattr(args, "json", None) == "-"
    console = Console(stderr=json_to_stdout)
    if args.command == "env":
        only = ["driver", "nic", "ib_hca", "ports"] + (["allreduce"] if args.with_allreduce else [])
        args.only, args.skip = only, []
        if not args.env_file:
            raise UsageError("`preflight env` needs --env-file PATH", "e.g. preflight env hosts.yaml --env-file nccl.env")
    opts = engine.Options(
        gather_also=("nic", "ib_hca", "ports", "driver") if args.env_file else (),
        only=args.only,
        skip=args.skip,
        parallel=args.parallel,
        timeout=args.timeout,
        accept_new_host_keys=args.accept_new_host_keys,
        capture=bool(getattr(args, "capture", None)),
        tier=getattr(args, "tier", "quick"),
    )
    engine.select_checks(opts.only, opts.skip)  # usage errors before any connection
    if getattr(args, "capture", None):
        files.check_capture_dir(args.capture)
    files.check_output_paths(args)
    say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
    with _history(args, say) as hist:
        if hist is not None:
            opts.previous = hist[0].previous(inv.sha256)
        return _run_and_act(args, inv, opts, console, hist, say)


@contextlib.contextmanager
def _history(args: argparse.Namespace, say: Any) -> Iterator[Any]:
    """(History, JSON directory or None) for --history, else None; --shadow without it is a usage error."""
    if getattr(args, "shadow", False) and not getattr(args, "history", None):
        raise UsageError("--shadow records what would have been drained in the history", "add --history PATH")
    if not getattr(args, "history", None):
        yield None
        return
    from preflight.history import recorder

    h, directory = recorder.open_history(args.history, say)
    try:
        yield h, directory
    finally:
        h.close()


def _run_and_act(args: argparse.Namespace, inv: Any, opts: Any, console: Any, hist: Any, say: Any) -> int:
    from preflight import engine
    from preflight.output import files, report

    if inv.transport == "ssh" and any(not s.local for s in inv.nodes):
        from preflight.transport import ssh_config

        try:
            ssh_config.load_ssh_configs(s.ssh_config for s in inv.nodes if not s.local)
        except ssh_config.SSHConfigError as exc:
            raise UsageError(str(exc), "fix the ssh_config (preflight reads it as OpenSSH does, Include included)") from None
    if getattr(args, "hostfile", None):
        files.check_hostfile_names(inv, args.hostfile_format)
    progress = None if args.no_progress or not console.is_terminal else _Progress(console, len(inv.nodes))
    opts.progress = progress.event if progress else None
    try:
        if progress:
            with progress.live:
                result = engine.run(inv, opts)
        else:
            result = engine.run(inv, opts)
    finally:
        if progress:
            progress.close()
    if inv.transport == "slurm" and inv.allocation is not None:
        from preflight.slurm import drain

        # nodes Slurm had out of service when the run began: unavailable, not this run's failures
        result.findings = drain.set_aside(result.findings, inv.allocation.excluded, strict=getattr(args, "count_unavailable", False))
        result.findings = _gated(args, inv, result.findings)
    doc = report.to_json(result)
    report.render(result, console, verbose=getattr(args, "verbose", False))
    findings, actions = result.findings, []
    if hist is not None:
        from preflight.history import recorder

        findings, actions = recorder.decide(hist[0], doc, result.findings, inv.cluster, _would_drain(args, inv),
                                            getattr(args, "shadow", False), say)
    # act on the verdict before writing files: an interrupt or a write error from here on leaves the
    # nodes as the verdict says, never a rechecked node resumed without it
    if inv.transport == "k8s":
        k8s_command.after_run(args, inv, result, console)
    else:
        _drain(args, inv, findings, console)
    metrics = None
    if hist is not None:
        recorder.record(hist[0], hist[1], doc, result.view.facts, actions, inv.cluster, say)
        metrics = recorder.metrics(hist[0], inv.cluster) if getattr(args, "prometheus", None) else None
    timelines = _timelines(hist, doc) if getattr(args, "html", None) else None
    files.write_outputs(args, result, doc, say, metrics, timelines)
    return result.exit_code


def _timelines(hist: Any, doc: dict) -> Any:
    """{node: its recent runs, newest first} for the --html page, or None without --history."""
    if hist is None:
        return None
    from preflight.history import queries
    from preflight.output.html import HISTORY_RUNS

    return {n["name"]: queries.timeline(hist[0], n["name"], limit=HISTORY_RUNS) for n in doc["nodes"]}


def _gated(args: argparse.Namespace, inv: Any, findings: Any) -> Any:
    """--resume --tier standard|burn-in: the nodes rechecked for return hold back unless the tier passed on
    them (preflight.actions.tier_gate); a preempted burn-in job is reported as such (preflight.slurm.preempt)."""
    from preflight.actions import tier_gate
    from preflight.slurm import preempt

    if getattr(args, "preemptible", False):
        findings = preempt.mark(findings, inv.allocation)
    if getattr(args, "resume", False) and getattr(args, "tier", "quick") != "quick":
        findings = tier_gate.hold(findings, args.tier, list(inv.allocation.held))
    return findings


def _would_drain(args: argparse.Namespace, inv: Any) -> Any:
    """For the history's drain policy: the nodes Slurm's drain step would drain from given findings
    (Slurm's state before the run; none known without an allocation), or None without --drain/--shadow."""
    if not (getattr(args, "drain", False) or getattr(args, "shadow", False)) or inv.transport == "k8s":
        return None
    from preflight.slurm import drain

    state = inv.allocation.state if inv.allocation is not None else {}
    nodes = [s.name for s in inv.nodes]
    return lambda findings: sorted(drain.plan(findings, nodes, state, drain=True, resume=False,
                                              max_fraction=args.max_drain_fraction).drain)


def _drain(args: argparse.Namespace, inv: Any, findings: Any, console: Any) -> None:
    """--drain / --resume: act on Slurm node states from this run's findings (see preflight.slurm.drain)."""
    from preflight.slurm import drain

    if inv.allocation is not None and (getattr(args, "drain", False) or getattr(args, "resume", False) or inv.allocation.held):
        drain.act(findings, [s.name for s in inv.nodes], inv.allocation, args.drain, args.resume,
                  args.max_drain_fraction, args.dry_run, lambda line: console.print(line, markup=False, highlight=False))


class _Progress:
    """A rich progress line: nodes done / failed / running in the current phase."""

    def __init__(self, console: Any, total: int) -> None:
        from rich.live import Live
        from rich.text import Text

        self.total = total
        self.state: dict = {}  # node -> "running" | "done" | "failed" (a node's latest event)
        self._lock = threading.Lock()  # events come from the fan-out's worker threads
        self._text = Text
        self.live = Live(self._render(), console=console, transient=True, refresh_per_second=8)

    def _render(self) -> Any:
        counts = {k: sum(1 for v in self.state.values() if v == k) for k in ("done", "failed", "running")}
        return self._text.assemble(
            ("preflight ", "bold"),
            ("%d done" % counts["done"], "green"),
            " · ",
            ("%d failed" % counts["failed"], "red" if counts["failed"] else "dim"),
            " · %d running · %d pending" % (counts["running"], self.total - len(self.state)),
        )

    def event(self, kind: str, node: str) -> None:
        with self._lock:
            if kind == "start" and self.state.get(node) == "done":
                # the next phase begins: count nodes from zero again
                self.state = {n: v for n, v in self.state.items() if v == "failed"}
            self.state[node] = "running" if kind == "start" else kind
            self.live.update(self._render())

    def close(self) -> None:
        self.live.stop()

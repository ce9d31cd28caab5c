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

from preflight.actions import policy
from preflight.actions import settings as drain_settings
from preflight.actions.policy import Request
from preflight.errors import UsageError
from preflight.transport import backends


def _load_inventory(args: argparse.Namespace, backend: Any) -> Any:
    """The nodes from the backend the command line chose (preflight.transport.backends)."""
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError("--master-port %d is out of range" % args.master_port, "use 1-65535")
    inv = backend.module().inventory_of(args)
    if args.master_port is not None:
        inv.master_port = args.master_port
        inv.cluster["master_port"] = args.master_port
    return inv


def _acting_check(args: argparse.Namespace, backend: Any, inv: Any) -> None:
    """--drain/--resume need a backend that acts on nodes (a scheduler's: the registry's `acts`)."""
    acts = backends.acting()
    if inv is None and not backend.acts and not args.inventory:
        raise UsageError("--drain/--resume act on %s nodes" % " or ".join(b.title for b in acts),
                         "add %s" % " or ".join(b.switch for b in acts))
    if inv is not None and not backends.get(inv.transport).acts:
        named = [b for b in acts if b.in_inventory]
        raise UsageError("--drain/--resume act on %s nodes; %s uses transport %s" % (
            " or ".join(b.title for b in named), inv.path, inv.transport),
            "add %s under `cluster:` in it (%s node names), or use %s" % (
                " or ".join("`transport: %s`" % b.name for b in named), "/".join(b.title for b in named),
                " or ".join(b.switch for b in named)))


def run(args: argparse.Namespace) -> int:
    if args.parallel < 1:
        raise UsageError("--parallel must be at least 1", "e.g. -j 64")
    if args.timeout is not None and not (math.isfinite(args.timeout) and 0 < args.timeout <= 86400):
        raise UsageError("--timeout %s is not a usable deadline" % args.timeout, "give seconds from 0.1 to 86400, e.g. --timeout 30")
    acting = getattr(args, "drain", False) or getattr(args, "resume", False)
    backend = backends.chosen(args)
    if acting:
        _acting_check(args, backend, None)
    if not 0 <= getattr(args, "max_drain_fraction", 0.2) <= 1:
        raise UsageError("--max-drain-fraction must be between 0 and 1", "e.g. --max-drain-fraction 0.2")
    drain_settings.check(args)
    inv = _load_inventory(args, backend)
    try:
        if getattr(args, "plan", False):
            from preflight.checks.allreduce.timeplan import print_plan
            return print_plan(inv, args.json, print, getattr(args, "tier", "quick"))
        _tier_settings(args, inv)
        if getattr(args, "dcgm_level", None):
            from preflight import engine

            args.timeout = engine.dcgm_timeout(args.dcgm_level, args.timeout)
            inv.cluster["dcgm_level"] = args.dcgm_level
        if acting:
            _acting_check(args, backend, inv)
        drain_settings.apply(args, inv.cluster)
        backends.get(inv.transport).module().prepare(args, inv, acting)
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

    hooks = backends.get(inv.transport).module()
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
    # nodes the scheduler had out of service when the run began: unavailable, not this run's failures
    result.findings = hooks.set_aside(result.findings, inv, args)
    doc = report.to_json(result)
    report.render(result, console, verbose=getattr(args, "verbose", False))
    applier = hooks.applier(inv)
    findings, actions = result.findings, []
    if hist is not None:
        from preflight.history import recorder

        findings, actions = recorder.decide(hist[0], doc, result.findings, inv.cluster, _would_drain(args, inv, applier),
                                            getattr(args, "shadow", False), say, kind=applier.kind if applier else "drain")
    for path, text, note in hooks.outputs(args, inv, result):
        files.write(path, text)
        say(note)
    # act on the verdict before writing files: an interrupt or a write error from here on leaves the
    # nodes as the verdict says, never a rechecked node resumed without it
    request = _request(args)
    if applier is not None and applier.wanted(request):
        actions += applier.act(findings, [s.name for s in inv.nodes], request, say)
    metrics = None
    if hist is not None:
        recorder.record(hist[0], hist[1], doc, result.view.facts, actions, inv.cluster, say)
        metrics = recorder.metrics(hist[0], inv.cluster) if getattr(args, "prometheus", None) else None
    timelines = _timelines(hist, doc) if getattr(args, "html", None) else None
    files.write_outputs(args, result, doc, say, metrics, timelines)
    return result.exit_code


def _request(args: argparse.Namespace) -> Request:
    return Request(drain=getattr(args, "drain", False), resume=getattr(args, "resume", False),
                   max_fraction=getattr(args, "max_drain_fraction", 0.2), dry_run=getattr(args, "dry_run", False))


def _timelines(hist: Any, doc: dict) -> Any:
    """{node: its recent runs, newest first} for the --html page, or None without --history."""
    if hist is None:
        return None
    from preflight.history import queries
    from preflight.output.html import HISTORY_RUNS

    return {n["name"]: queries.timeline(hist[0], n["name"], limit=HISTORY_RUNS) for n in doc["nodes"]}


def _tier_settings(args: argparse.Namespace, inv: Any) -> None:
    """The tier into the run's settings (the checks that run only in a tier read it: nvbandwidth); burn-in runs
    DCGM's long diagnostic (level 3) where dcgmi exists, with a deadline that fits it unless --timeout is shorter."""
    inv.cluster["tier"] = getattr(args, "tier", "quick")
    if getattr(args, "dcgm_level", None) is not None:
        return
    from preflight import engine

    args.dcgm_level = 3 if inv.cluster["tier"] == "burn-in" else 1
    if args.dcgm_level == 3 and args.timeout is None:
        args.timeout = engine.dcgm_budget_s(3)
    elif args.dcgm_level == 3 and args.timeout < engine.dcgm_budget_s(3):
        args.dcgm_level = 1
        sys.stderr.write("preflight: note: --tier burn-in runs `dcgmi diag -r 3` only with a --timeout of %.0f s or "
                         "more; level 1 in this run\n" % engine.dcgm_budget_s(3))


def _would_drain(args: argparse.Namespace, inv: Any, applier: Any) -> Any:
    """For the history's drain policy: the nodes the drain step would take out from given findings (the
    applier's marks of its nodes before the run; without an applier, e.g. --shadow over SSH, every node
    in service), or None without --drain/--shadow."""
    if not (getattr(args, "drain", False) or getattr(args, "shadow", False)):
        return None
    return policy.would_drain(applier.marks() if applier is not None else {}, [s.name for s in inv.nodes],
                              args.max_drain_fraction)


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

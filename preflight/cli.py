"""The `preflight` command line. The only place errors become messages and exit codes.

Exit codes: 0 nothing failed or errored, 1 a check failed or errored (or `diff` found regressions),
2 a usage or inventory error (one line, never a traceback), 128+N stopped by signal N: 130 Ctrl-C
(SIGINT), 143 SIGTERM, 129 SIGHUP. On any of these the remote runs are killed first; a second signal
exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
from typing import Any, Iterator, List, Optional

from preflight import __version__
from preflight.errors import PreflightError, UsageError
from preflight.k8s import command as k8s_command

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: unwinds like Ctrl-C (remote runs killed, cursor restored)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_stopping: List[int] = []


def _on_signal(signum: int, frame: Any) -> None:
    if _stopping:  # a second signal while the first one is being cleaned up: leave now, quietly
        os.write(2, b"preflight: interrupted again; exiting without waiting for cleanup\n")
        os._exit(128 + _stopping[0])
    _stopping.append(signum)
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP all raise Interrupted in the main thread (systemd stop, `timeout`, CI)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    del _stopping[:]
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        if not _stopping:  # after a signal ours stay: a second one exits at once, never a traceback
            for s, handler in old.items():
                signal.signal(s, handler)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_USAGE, "preflight: error: %s (see `%s --help`)\n" % (message, self.prog))


def _names(text: str) -> List[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="preflight", description="Find the node that will hang your multi-node GPU job, before you launch it.")
    parser.add_argument("--version", action="version", version="preflight %s" % __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    check = sub.add_parser("check", help="check the nodes of an inventory (or this machine)")
    check.add_argument("inventory", nargs="?", help="hosts.yaml; omit to check this machine locally, without SSH")
    _common(check)
    check.add_argument("--only", type=_names, metavar="NAMES", help="run only these checks (comma-separated)")
    check.add_argument("--skip", type=_names, default=[], metavar="NAMES", help="skip these checks (comma-separated)")
    check.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-' = stdout)")
    check.add_argument("--junit", metavar="PATH", help="write a JUnit XML report (one test case per check and node)")
    check.add_argument("--prometheus", metavar="PATH", help="write a node_exporter textfile-collector file, atomically")
    check.add_argument("--history", metavar="PATH", help="record this run in the history database PATH (a .sqlite file; a "
                       "directory keeps the JSON reports for `preflight diff` too, imported once, with PATH/history.sqlite); "
                       "see `preflight history`")
    check.add_argument("--shadow", action="store_true", help="with --history: decide drains and escalations, record and "
                       "print them, drain nothing")
    check.add_argument("--plan", action="store_true", help="print how long each all-reduce phase should take on this fleet (sizes, rounds, deadlines; with --json: as JSON) and exit; touches no node")
    check.add_argument("--tier", choices=("quick", "standard", "burn-in"), default="quick", help="quick: the node checks "
                       "and the all-reduce; standard: + GEMM, copy and SDC digest in the all-reduce's ranks (gpu_compute); "
                       "burn-in: the compute phase as a soak (--plan prints each tier's expected time)")
    check.add_argument("--hostfile", metavar="PATH", help="write the nodes that passed, for a launcher")
    check.add_argument("--hostfile-format", choices=("plain", "deepspeed", "mpi", "mpich", "slurm"), default="plain")
    check.add_argument("-v", "--verbose", action="store_true", help="one line per finding, passes included")
    check.add_argument("--capture", metavar="DIR", help="write every node's raw command outputs and sysfs reads "
                       "to DIR as test fixtures (DIR/<node>/<check>.json), to send with a bug report")
    check.add_argument("--dcgm-level", type=int, choices=(1, 2, 3), default=1, metavar="N",
                       help="where dcgmi exists: run `dcgmi diag -r N` (1 quick, default; 2 medium, raises the deadline to fit; "
                       "3 long, only with --timeout that fits it)")
    check.add_argument("--drain", action="store_true", help="with Slurm: drain failing nodes (reason 'preflight: <check>: <finding>')")
    check.add_argument("--resume", action="store_true", help="with Slurm: return to service nodes preflight drained that now pass")
    check.add_argument("--dry-run", action="store_true", help="with --drain/--resume: print the scontrol commands, change nothing")
    check.add_argument("--count-unavailable", action="store_true",
                       help="with Slurm: count nodes Slurm has out of service (drained, down) as failures (exit 1), "
                            "not as unavailable")
    check.add_argument("--max-drain-fraction", type=float, default=0.2, metavar="F",
                       help="drain nothing when more than this share of nodes fails (default 0.2)")

    env = sub.add_parser("env", help="fast path: gather what the NCCL env needs and write the env file")
    env.add_argument("inventory", nargs="?", help="hosts.yaml; omit for this machine")
    _common(env)
    env.add_argument("--with-allreduce", action="store_true", help="also prove the env with the all-reduce test")
    k8s_command.extend(sub, _Parser, check, env)  # --k8s and its options; `preflight k8s manifest`

    node = sub.add_parser("node", help="this machine alone, fast, log lines and exit code (Slurm HealthCheckProgram / Prolog)")
    node.add_argument("--only", type=_names, metavar="NAMES", help="run only these checks (comma-separated)")
    node.add_argument("--skip", type=_names, default=[], metavar="NAMES", help="skip these checks (comma-separated)")
    node.add_argument("--gpus-per-node", type=int, metavar="N", help="GPUs this machine should have (default: from --inventory, else what the driver registered)")
    node.add_argument("--inventory", metavar="FILE", help="judge this machine by the inventory preflight check uses: its cluster.expect (versions, MTU, HCAs, rates), shared_paths, xid_window_s, and this node's entry (gpus_per_node, data_interface)")
    node.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-' = stdout; the lines then go to stderr)")
    node.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline for the probes (default 60; a hung probe is then an error)")
    node.add_argument("--dcgm-level", type=int, choices=(1, 2, 3), default=1, metavar="N",
                      help="where dcgmi exists: run `dcgmi diag -r N` (as for `preflight check`)")
    node.add_argument("--debug", action="store_true", help="log details to stderr")

    checks = sub.add_parser("checks", help="list every check with its claim")
    checks.add_argument("--markdown", action="store_true", help="print README.md's check table (claim, why, fix) and check settings table")

    history = sub.add_parser("history", help="what the history database says: a node's timeline, flapping nodes, "
                             "lemons, repeat faults, failure rates, time between incidents")
    history.add_argument("path", help="the --history PATH of `preflight check` (a .sqlite file or a directory)")
    history.add_argument("--node", metavar="NODE", help="this node's timeline")
    history.add_argument("--show", type=_names, metavar="SECTIONS", help="only these sections (comma-separated): "
                         "timeline, flapping, lemons, repeats, rates, incidents, actions (default: all)")
    history.add_argument("--window-runs", type=int, default=30, metavar="N", help="flapping and failure rates: over the fleet's last N runs (default 30)")
    history.add_argument("--limit", type=int, default=30, metavar="N", help="timeline and decisions: the newest N (default 30)")
    history.add_argument("--json", action="store_true", help="one JSON document instead of tables")

    diff = sub.add_parser("diff", help="compare two JSON reports (from --json or --history)")
    diff.add_argument("old")
    diff.add_argument("new")
    diff.add_argument("--bw-threshold", type=float, default=0.10, metavar="FRACTION", help="busbw change that counts (default 0.10)")
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-nodes", type=int, metavar="N", help="refuse inventories of more nodes (default 10000, or cluster.max_nodes)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="per-node command deadline (overrides command_timeout)")
    p.add_argument("-j", "--parallel", type=int, default=64, metavar="N", help="nodes worked on at once (default 64)")
    p.add_argument("--accept-new-host-keys", action="store_true", help="record unknown host keys (changed keys still fail)")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="without an inventory: GPUs this machine should have")
    p.add_argument("--master-port", type=int, metavar="PORT", help="override cluster.master_port")
    p.add_argument("--env-file", metavar="PATH", help="write the recommended NCCL env file (sourced by launch scripts)")
    p.add_argument("--slurm", action="store_true", help="nodes and transport from Slurm: this allocation (SLURM_JOB_ID), or --nodelist / --partition --nodes")
    p.add_argument("--nodelist", metavar="NODES", help="with --slurm: allocate these Slurm nodes for the run (e.g. gpu-[001-064]); with --k8s: check these Kubernetes nodes")
    p.add_argument("--partition", metavar="P", help="with --slurm: allocate --nodes N nodes of partition P for the run")
    p.add_argument("--nodes", type=int, metavar="N", help="with --slurm --partition: how many nodes")
    p.add_argument("--python", metavar="PATH", help="with --slurm: the interpreter the nodes run the probe with "
                   "(default python3 on the nodes' PATH under srun)")
    p.add_argument("--alloc-wait", type=float, metavar="SECONDS", help="when preflight allocates Slurm nodes: how long to wait for them (default 120; whole nodes: one running a job is waited for)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--debug", action="store_true", help="log transport details to stderr")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "debug", False) else logging.WARNING, format="preflight: %(message)s")
    if getattr(args, "debug", False) is False:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    logging.getLogger("invoke").setLevel(logging.WARNING)  # fabric's config merging, every connection: noise
    try:
        with _signals():
            try:
                if args.command == "checks":
                    return _cmd_checks(args.markdown)
                if args.command == "diff":
                    return _cmd_diff(args)
                if args.command == "history":
                    return _cmd_history(args)
                if args.command == "node":
                    from preflight import nodecheck

                    return nodecheck.run(args)
                if args.command in ("check", "env", "k8s"):
                    return _cmd_check(args) if args.command != "k8s" else k8s_command.run(args)
                parser.print_help(sys.stderr)
                return EXIT_USAGE
            except PreflightError as exc:
                sys.stderr.write("preflight: error: %s\n" % exc)
                return exc.exit_code
            except KeyboardInterrupt as exc:
                signum = getattr(exc, "signum", signal.SIGINT)
                sys.stderr.write("preflight: %s (%s); remote runs were killed\n"
                                 % ("interrupted" if signum == signal.SIGINT else "terminated", signal.Signals(signum).name))
                sys.stderr.flush()
                return 128 + signum
    except KeyboardInterrupt:  # a signal between the handler's install and its removal
        return EXIT_INTERRUPTED


def _cmd_checks(markdown: bool = False) -> int:
    if markdown:
        from preflight.output.report import checks_markdown, settings_markdown

        sys.stdout.write(checks_markdown() + "\n" + settings_markdown())
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from preflight import checks as catalogue
    from preflight.model import ACTION_MEANINGS

    table = Table(box=None, header_style="bold")
    for column in ("check", "claim", "reads on each node", "takes", "on fail"):
        table.add_column(column)
    for name, check in catalogue.entries().items():  # the declarations: no check code imported
        table.add_row(*(Text(cell) for cell in (name, check.claim, check.reads or "(not declared)", check.takes or "?", check.action)))
    console = Console()
    console.print(table, markup=False)
    console.print("\nactions (a failing finding names one; `on fail` is the check's default):", markup=False)
    for action, meaning in ACTION_MEANINGS.items():
        console.print("  %-10s %s" % (action, meaning), markup=False)
    return EXIT_OK


def _cmd_diff(args: argparse.Namespace) -> int:
    import json

    from preflight.output import diff as differ

    docs = []
    for path in (args.old, args.new):
        try:
            with open(path) as handle:
                docs.append(json.load(handle))
        except OSError as exc:
            raise UsageError("cannot read %s: %s" % (path, exc.strerror), "give the path of a JSON report") from None
        except ValueError as exc:
            raise UsageError("%s is not a JSON report: %s" % (path, exc), "give a file written by --json or --history") from None
        try:
            differ.validate(docs[-1])
        except ValueError as exc:
            raise UsageError("%s is not a preflight report (%s)" % (path, exc), "give a file written by --json or --history") from None
    if not (math.isfinite(args.bw_threshold) and args.bw_threshold >= 0):
        raise UsageError("--bw-threshold %s is not usable" % args.bw_threshold, "give a fraction such as 0.10")
    result = differ.diff(docs[0], docs[1], bw_threshold=args.bw_threshold)
    for line in differ.render_diff(result):
        sys.stdout.write(line + "\n")
    return EXIT_PROBLEMS if result.has_regressions else EXIT_OK


def _cmd_history(args: argparse.Namespace) -> int:
    from preflight.history import render
    from preflight.history.db import History, location

    sections = args.show or list(render.SECTIONS)
    unknown = [s for s in sections if s not in render.SECTIONS]
    if unknown:
        raise UsageError("unknown section %s" % ", ".join(unknown), "choose from %s" % ", ".join(render.SECTIONS))
    if args.window_runs < 2 or args.limit < 1:
        raise UsageError("--window-runs must be at least 2 and --limit at least 1", "e.g. --window-runs 30 --limit 30")
    database, _ = location(args.path)
    if not os.path.isfile(database):
        raise UsageError("no history database at %s" % database, "give the --history PATH of `preflight check`")
    with History(database, lambda line: sys.stderr.write("preflight: %s\n" % line)) as h:
        data = render.gather(h, sections, args.node, args.window_runs, args.limit)
    sys.stdout.write(render.to_json(data) if args.json else "\n".join(render.lines(data)) + "\n")
    return EXIT_OK


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
    if args.nodelist and (args.partition or args.nodes):
        raise UsageError("give --nodelist or --partition/--nodes, not both", "e.g. --nodelist gpu-[001-064]")
    if args.nodelist or args.partition or args.nodes:
        recheck = getattr(args, "resume", False) and not getattr(args, "dry_run", False)
        alloc = slurm.allocate(nodelist=args.nodelist, partition=args.partition, nodes=args.nodes, recheck_ours=recheck,
                               timeout=_alloc_wait(args), run_s=slurm.run_budget(args.timeout))
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


def _cmd_check(args: argparse.Namespace) -> int:
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
    files.write_outputs(args, result, doc, say, metrics)
    return result.exit_code


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

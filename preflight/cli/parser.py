"""The command line: every command's options (one parser; each command's module reads what it declares here)."""

from __future__ import annotations

import argparse
from typing import List

from preflight import __version__
from preflight.actions import settings as drain_settings
from preflight.cli import k8s as k8s_command
from preflight.errors import EXIT_USAGE
from preflight.transport import backends


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
    _common(check, "check")
    check.add_argument("--only", type=_names, metavar="NAMES", help="run only these checks (comma-separated)")
    check.add_argument("--skip", type=_names, default=[], metavar="NAMES", help="skip these checks (comma-separated)")
    check.add_argument("--json", metavar="PATH", help="write the JSON report to PATH ('-' = stdout)")
    check.add_argument("--junit", metavar="PATH", help="write a JUnit XML report (one test case per check and node)")
    check.add_argument("--prometheus", metavar="PATH", help="write a node_exporter textfile-collector file, atomically")
    check.add_argument("--html", metavar="PATH", help="write one self-contained HTML page of the run (node grid, failures, "
                       "all-reduce rounds; with --history each node's recent runs); it loads nothing from the network")
    check.add_argument("--history", metavar="PATH", help="record this run in the history database PATH (a .sqlite file; a "
                       "directory keeps the JSON reports for `preflight diff` too, imported once, with PATH/history.sqlite); "
                       "see `preflight history`")
    check.add_argument("--shadow", action="store_true", help="with --history: decide drains and escalations, record and "
                       "print them, drain nothing")
    check.add_argument("--plan", action="store_true", help="print how long each all-reduce phase should take on this fleet (sizes, rounds, deadlines; with --json: as JSON) and exit; touches no node")
    check.add_argument("--tier", choices=("quick", "standard", "burn-in"), default="quick", help="quick: the node checks "
                       "and the all-reduce; standard: + GEMM, copy and SDC digest in the all-reduce's ranks (gpu_compute); "
                       "burn-in: soaks, DCGM level 3, nvbandwidth (--plan prints each tier's expected time)")
    check.add_argument("--hostfile", metavar="PATH", help="write the nodes that passed, for a launcher")
    check.add_argument("--hostfile-format", choices=("plain", "deepspeed", "mpi", "mpich", "slurm"), default="plain")
    check.add_argument("-v", "--verbose", action="store_true", help="one line per finding, passes included")
    check.add_argument("--capture", metavar="DIR", help="write every node's raw command outputs and sysfs reads "
                       "to DIR as test fixtures (DIR/<node>/<check>.json), to send with a bug report")
    check.add_argument("--dcgm-level", type=int, choices=(1, 2, 3), default=None, metavar="N",
                       help="where dcgmi exists: run `dcgmi diag -r N` (1 quick, default; 2 medium, raises the deadline to fit; "
                       "3 long, only with --timeout that fits it; --tier burn-in: 3 by default, the deadline raised to fit)")
    check.add_argument("--drain", action="store_true", help="with Slurm: drain failing nodes (reason 'preflight: <check>: "
                       "<finding>'); with Kubernetes: cordon and taint them")
    check.add_argument("--resume", action="store_true", help="with Slurm or Kubernetes: return to service nodes preflight "
                       "took out that now pass")
    check.add_argument("--dry-run", action="store_true", help="with --drain/--resume: print the scontrol (kubectl) commands, change nothing")
    check.add_argument("--max-drain-fraction", type=float, default=0.2, metavar="F",
                       help="drain nothing when more than this share of nodes fails (default 0.2)")
    drain_settings.add_options(check)  # --drain-after N/W, --drain-limit F[/W]

    env = sub.add_parser("env", help="fast path: gather what the NCCL env needs and write the env file")
    env.add_argument("inventory", nargs="?", help="hosts.yaml; omit for this machine")
    _common(env, "env")
    env.add_argument("--with-allreduce", action="store_true", help="also prove the env with the all-reduce test")
    k8s_command.extend(sub, _Parser)  # `preflight k8s manifest`

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
    checks.add_argument("--markdown", action="store_true", help="print the user guide's check table (claim, why, fix) and check settings table (docs/checks.md, docs/inventory.md)")

    history = sub.add_parser("history", help="what the history database says: a node's timeline, flapping nodes, "
                             "lemons, repeat faults, failure rates, time between incidents")
    history.add_argument("path", help="the --history PATH of `preflight check` (a .sqlite file or a directory)")
    history.add_argument("--node", metavar="NODE", help="this node's timeline")
    history.add_argument("--show", type=_names, metavar="SECTIONS", help="only these sections (comma-separated): "
                         "timeline, flapping, lemons, repeats, rates, incidents, actions (default: all)")
    history.add_argument("--window-runs", type=int, default=30, metavar="N", help="flapping and failure rates: over the fleet's last N runs (default 30)")
    history.add_argument("--limit", type=int, default=30, metavar="N", help="timeline and decisions: the newest N (default 30)")
    history.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    history.add_argument("--html", metavar="PATH", help="also write the sections as one self-contained HTML page")

    dash = sub.add_parser("dashboard", help="print the Grafana dashboard for the --prometheus textfile (JSON)")
    dash.add_argument("-o", "--output", metavar="PATH", help="write it to PATH instead (a directory, e.g. a Grafana provider's folder: PATH/preflight.json)")

    diff = sub.add_parser("diff", help="compare two JSON reports (from --json or --history)")
    diff.add_argument("old")
    diff.add_argument("new")
    diff.add_argument("--bw-threshold", type=float, default=0.10, metavar="FRACTION", help="busbw change that counts (default 0.10)")
    return parser


def _common(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--max-nodes", type=int, metavar="N", help="refuse inventories of more nodes (default 10000, or cluster.max_nodes)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="per-node command deadline (overrides command_timeout)")
    p.add_argument("-j", "--parallel", type=int, default=64, metavar="N", help="nodes worked on at once (default 64)")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="without an inventory: GPUs this machine should have")
    p.add_argument("--master-port", type=int, metavar="PORT", help="override cluster.master_port")
    p.add_argument("--env-file", metavar="PATH", help="write the recommended NCCL env file (sourced by launch scripts)")
    backends.add_options(p, command)  # each transport backend's own (--slurm, --k8s, ... and theirs)
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument("--debug", action="store_true", help="log transport details to stderr")

"""`preflight node`: this machine alone, for Slurm's HealthCheckProgram and Prolog.

Runs the checks that need no partner node (phase-1 checks without a cross-node test: ssh basics, gpu,
driver, fabric manager, nic, ib_hca) locally through the same probe bundle and rules as `preflight
check` without an inventory, and prints one plain line per problem, the form slurmd's and syslog's logs
keep (no colours, no table, no progress display):

    preflight: FAIL gpu: n001 GPU 3 (0000:...): 2 uncorrectable ECC errors (expected 0)

then one summary line. Exit 0 when the node may run jobs (warnings included), 1 when a check failed or
errored, 2 on a usage error.

Cross-node rules on one node: drift against the majority has no majority to compare with on one node.
The rules compare a node's values with the majority of the nodes they are given; here that is the node
itself, so drift can neither fire nor be claimed: their findings name the node's own values, and every
other claim (missing GPU, ECC, link state, expected values from --gpus-per-node) is judged on data.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from preflight import checks as catalogue
from preflight.common import printable
from preflight.errors import UsageError
from preflight.model import Finding, Status


def node_checks() -> List[str]:
    """The checks one node can answer alone: phase-1 probes, and rules that judge only their facts (gpu_memory
    reads the gpu probe's), no cross-node test."""
    return [name for name, e in catalogue.entries().items() if e.phase == 1 and not catalogue.has_stage(name)]


def select(only: Optional[Sequence[str]], skip: Sequence[str]) -> List[str]:
    """--only/--skip over the node checks; naming a cross-node check is a usage error that says why."""
    names = list(catalogue.CHECK_NAMES)
    local = node_checks()
    for given in list(only or []) + list(skip):
        if given not in names:
            raise UsageError("unknown check %r" % given, "choose from: %s" % ", ".join(local))
        if given not in local and given in (only or []):  # skipping a cross-node check is a no-op, not an error
            raise UsageError("check %r needs a partner node; `preflight node` checks this machine alone" % given,
                             "choose from: %s, or run `preflight check` across nodes" % ", ".join(local))
    if "ssh" in skip:
        raise UsageError("the ssh check cannot be skipped", "it gathers the node basics every other check reads")
    return [n for n in local if (not only or n in only or n == "ssh") and n not in skip]


def line(finding: Finding) -> str:
    """One log line: `preflight: FAIL gpu: <message>` (newlines folded: a log line is one line)."""
    message = " ".join(finding.message.split())
    if finding.expected is not None and finding.expected not in message:
        message += " (expected %s)" % " ".join(str(finding.expected).split())
    return printable("preflight: %s %s: %s" % (finding.status.value.upper(), finding.check, message))


def adopt(local: Any, source: Any, gpus_given: bool = False) -> Optional[str]:
    """This machine judged by an inventory file: its cluster.expect and node-level cluster settings, and
    the entry naming this host (by name or address): gpus_per_node (unless given) and data_interface.
    Without such an entry, a gpus_per_node every entry agrees on. Returns where the GPU count came from
    (None: not from the inventory)."""
    import dataclasses
    import socket

    local.expect = dict(source.expect)
    local.cluster.update({k: source.cluster[k] for k in catalogue.settings() if k in source.cluster})  # checks' keys
    names = {local.nodes[0].name, socket.getfqdn(), socket.gethostname()}
    mine = [s for s in source.nodes if s.name in names or s.host in names]
    node = local.nodes[0]
    changes: Dict[str, Any] = {}
    came = None
    if mine:
        changes["data_interface"] = mine[0].data_interface
        if not gpus_given:
            changes["gpus_per_node"] = mine[0].gpus_per_node
            came = "from %s (%s)" % (source.path, mine[0].name)
    elif not gpus_given and len({s.gpus_per_node for s in source.nodes}) == 1:
        changes["gpus_per_node"] = source.nodes[0].gpus_per_node
        came = "from %s (every node)" % source.path
    local.nodes[0] = dataclasses.replace(node, **changes)
    return came


def run(args: Any) -> int:
    from preflight import engine, inventory
    from preflight.output import report

    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be positive", "give seconds, e.g. --timeout 10")
    if args.gpus_per_node is not None and args.gpus_per_node < 0:
        raise UsageError("--gpus-per-node must be 0 or more", "e.g. --gpus-per-node 8")
    selected = select(args.only, args.skip)
    t0 = time.monotonic()
    inv = inventory.local_inventory(args.gpus_per_node)
    source = "given" if args.gpus_per_node is not None else "as the driver registered them"
    if getattr(args, "inventory", None):
        source = adopt(inv, inventory.load(args.inventory), gpus_given=args.gpus_per_node is not None) or source
    if getattr(args, "dcgm_level", None):
        if args.dcgm_level > 1:  # level 1 fits any deadline: the dcgm module is imported only when it runs
            args.timeout = engine.dcgm_timeout(args.dcgm_level, args.timeout)
        inv.cluster["dcgm_level"] = args.dcgm_level
    opts = engine.Options(only=selected, skip=[], parallel=1, timeout=args.timeout)
    result = engine.run(inv, opts)
    wall = time.monotonic() - t0
    out = sys.stderr if args.json == "-" else sys.stdout
    problems = [f for f in report.sort_findings(result.findings) if f.status in (Status.FAIL, Status.ERROR, Status.WARN)]
    for finding in problems:
        out.write(line(finding) + "\n")
    counts: Dict[str, int] = report.summary(result.findings)
    # Without --gpus-per-node the count is what the driver registered: a node whose driver lost every GPU
    # then looks CPU-only, so the line says where the expectation came from.
    gpus = "%d GPUs%s" % (inv.nodes[0].gpus_per_node, "" if source == "given" else " " + source)
    out.write("preflight: node %s %s: %d fail, %d error, %d warn, %d pass, %d skip (%s; %s; %.1f s)\n" % (
        inv.nodes[0].name, "UNHEALTHY" if result.exit_code else "ok", counts["fail"], counts["error"],
        counts["warn"], counts["pass"], counts["skip"], gpus, ",".join(result.selected), wall))
    out.flush()
    if args.json:
        doc = report.to_json(result)
        if args.json == "-":
            try:
                report.write_stdout(report.dumps(doc))
            except OSError as exc:
                raise UsageError("cannot write the standard output: %s" % (exc.strerror or exc), "keep its reader open") from None
        else:
            from preflight.output.history import atomic_write_text

            try:
                atomic_write_text(args.json, report.dumps(doc), mode=0o644)
            except OSError as exc:
                raise UsageError("cannot write %s: %s" % (args.json, exc.strerror or exc), "check the directory exists and is writable") from None
    return result.exit_code

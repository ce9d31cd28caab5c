"""Render a run: the JSON document for machines, the rich console report for people.

The console report stays readable at 1,000 nodes: failures first, one line per distinct finding with
its nodes folded (gpu-[001-063]), passes folded into one line per check unless verbose.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Dict, Iterable, List, Optional, Tuple

from preflight import __version__
from preflight import checks as catalogue
from preflight import common
from preflight.common import plural
from preflight.engine import RunReport
from preflight.model import ACTIONS, Finding, Status, is_consequence, not_run, unavailable
from preflight.transport import backends

STYLE = {
    Status.PASS: "green",
    Status.SKIP: "dim",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}


def fold(names: Iterable[Optional[str]]) -> str:
    """Node names folded (n001 n002 n003 n005 → n[001-003,005]); None (a cluster-wide finding) shows as 'cluster'."""
    names = list(names)
    folded = common.fold(names)
    return folded if all(names) else ", ".join(filter(None, ["cluster", folded]))


#: Version of the --json document's shape (report.schema.json, shipped beside this module). Raise it on
#: any change a reader could trip on (a key removed or renamed, a meaning changed); adding keys is 1.x.
SCHEMA_VERSION = "1.0"

#: A node's status, the same in the terminal, the JSON, JUnit and Prometheus:
#:   pass         every finding on it passed or was skipped ("does not apply")
#:   warn         a warning, nothing failed
#:   fail         a finding failed or errored in this run (what the exit code counts)
#:   unavailable  not checked: Slurm already had it out of service (DRAIN, DOWN, ...), its state and
#:                reason in the finding; not this run's failure (see preflight.slurm.drain.set_aside)
NODE_STATUSES = ("pass", "warn", "fail", "unavailable")

#: data key of the one finding of a node set aside as unavailable: {"state": [...], "reason": str|None}


def node_statuses(findings: Iterable[Finding], nodes: Iterable[str]) -> Dict[str, str]:
    """{node: pass | warn | fail | unavailable} (NODE_STATUSES). A node without any finding is `fail`:
    nothing vouches for it (ssh always runs, so this is a defect, never a pass)."""
    seen: Dict[str, List[Finding]] = {}
    for f in findings:
        if f.node is not None:
            seen.setdefault(f.node, []).append(f)
    out: Dict[str, str] = {}
    for name in nodes:
        mine = seen.get(name, [])
        if any(unavailable(f) and not f.status.is_problem for f in mine):  # --count-unavailable: fail
            out[name] = "unavailable"
        elif not mine or any(f.status.is_problem for f in mine):
            out[name] = "fail"
        elif any(f.status is Status.WARN for f in mine):
            out[name] = "warn"
        else:
            out[name] = "pass"
    return out


def node_counts(statuses: Dict[str, str]) -> Dict[str, int]:
    """{status: nodes} for every NODE_STATUSES entry (zeros included)."""
    return {s: sum(1 for v in statuses.values() if v == s) for s in NODE_STATUSES}


def summary(findings: Iterable[Finding]) -> Dict[str, int]:
    """Findings per status, as the terminal counts them: a check that could not run on an unreachable
    node is counted once under `not_run` (its node's ssh FAIL is the cause), never as an error."""
    counts = OrderedDict((s.value, 0) for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR))
    counts["not_run"] = 0
    for f in findings:
        counts["not_run" if not_run(f) else f.status.value] += 1
    return dict(counts)


def to_json(report: RunReport) -> Dict[str, Any]:
    """The machine-readable report (the --json document; its shape: report.schema.json)."""
    inv = report.inventory
    statuses = node_statuses(report.findings, [s.name for s in inv.nodes])
    return {
        "schema_version": SCHEMA_VERSION,
        "preflight_version": __version__,
        "started_at": report.started_at,
        "duration_s": round(report.duration_s, 3),
        "phase_times_s": {k: round(v, 3) for k, v in report.phase_times.items()},
        "transport": report.transport,
        "inventory": inv.path,
        "inventory_sha256": inv.sha256,
        "checks": list(report.selected),
        "nodes": [
            {
                "name": s.name,
                "host": s.host,
                "gpus": s.gpus_per_node,
                "head": s.name == inv.head_name,
                "status": statuses[s.name],
            }
            for s in inv.nodes
        ],
        "results": [f.to_json() for f in sort_findings(report.findings)],
        "hardware": hardware(report.view),
        "summary": summary(report.findings),
        "node_summary": node_counts(statuses),
        "allreduce": report.allreduce,
        "exit_code": report.exit_code,
    }


def schema() -> Dict[str, Any]:
    """The published JSON Schema of the --json document (report.schema.json, package data)."""
    import importlib.resources

    return json.loads(importlib.resources.files("preflight.output").joinpath("report.schema.json").read_text("utf-8"))


def hardware(view: Any) -> Dict[str, Any]:
    """{node: {"gpus": [{index, pci_bus_id, uuid, serial, failed}]}} from the gpu facts, for `preflight diff`.

    failed: the gpu check's per-GPU judgement (gpu_rule.gpu_problems) found a FAIL on that GPU, so a later run
    can recognise the same serial coming back (a "lemon"). Nodes without GPU facts are left out.
    """
    from preflight.checks.gpu import rule as gpu_rule
    from preflight.derived.gpus import node_gpus

    out: Dict[str, Any] = {}
    for node in view.live:
        record = node_gpus(view, node.name)
        if record is None or not record.gpus:
            continue
        links = record.max_nvlinks
        shape = gpu_rule.node_shape(node.gpus_per_node, (view.facts.get(node.name) or {}).get("gpu") or {})
        out[node.name] = {
            "gpus": [
                {
                    "index": g.index,
                    "pci_bus_id": g.pci_bus_id,
                    "uuid": g.uuid,
                    "serial": g.serial,
                    "failed": any(p[0] is Status.FAIL for p in gpu_rule.gpu_problems(dict(g.facts), links, shape=shape)),
                }
                for g in record.gpus
            ]
        }
    return out


def dumps(doc: Dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def write_stdout(text: str) -> None:
    """Write text to the standard output whole, or raise OSError. Not through sys.stdout: when the
    reader of a pipe goes away while a write is blocked, its buffered writer keeps what the pipe
    refused and reports nothing (CPython 3.11: exit 0 with half a report)."""
    import os
    import sys

    sys.stdout.flush()
    data = memoryview(text.encode("utf-8"))
    fd = sys.stdout.fileno()
    while data:
        data = data[os.write(fd, data):]


#: The order findings are shown in: root causes first. A FAIL is a decided fault and names its cause; an
#: ERROR says a check could not decide (often because of that FAIL: "not tested: no data interface"), so
#: it comes after the FAILs, and consequences after every other error.
SHOW_ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 3, Status.SKIP: 4, Status.PASS: 5}


def show_rank(finding: Finding) -> int:
    """Where a finding stands in SHOW_ORDER (a consequence after the errors with a cause of their own)."""
    return 2 if is_consequence(finding) else SHOW_ORDER[finding.status]


def sort_findings(findings: Iterable[Finding]) -> List[Finding]:
    order = {name: i for i, name in enumerate(catalogue.CHECK_NAMES)}
    return sorted(findings, key=lambda f: (show_rank(f), order.get(f.check, 99), f.node or ""))


def group(findings: Iterable[Finding], verbose: bool = False) -> List[Tuple[Status, str, List[Optional[str]], str]]:
    """(status, check, nodes, message) rows: identical findings on several nodes become one row.

    Passes fold into one row per check ("8 nodes") unless verbose, and checks that passed on exactly
    the same nodes share that row ("13 checks", their names after the count): on 1,000 nodes with five
    failing the passes take a line per distinct set of nodes, not one per check.
    """
    rows: "OrderedDict[Tuple[Status, str, str], List[Optional[str]]]" = OrderedDict()
    for f in sort_findings(findings):
        message = f.message
        if f.status == Status.PASS and not verbose:
            message = ""
        rows.setdefault((f.status, f.check, message), []).append(f.node)
    out = []
    for (status, check, message), nodes in rows.items():
        if status == Status.PASS and not verbose:
            message = "%d node%s" % (len(nodes), "" if len(nodes) == 1 else "s") if any(nodes) else "ok"
        out.append((status, check, nodes, message))
    return out if verbose else merge_passes(out)


def where(status: Status, nodes: List[Optional[str]], everyone: List[str]) -> str:
    """A row's nodes as printed: folded; a PASS row over most of the fleet names the nodes it leaves out
    when that is shorter ("all but gpu-[0142,0333]" for gpu-[0001-0141,0143-0332,0334-1000]), which keeps
    the column narrow when a few nodes failed."""
    folded = fold(nodes)
    if status == Status.PASS and None not in nodes and 2 * len(nodes) > len(everyone) and set(nodes) <= set(everyone):
        rest = sorted(set(everyone) - set(nodes))
        if rest and len("all but " + common.fold(rest)) < len(folded):
            return "all but " + common.fold(rest)
    return folded


def merge_passes(rows: List[Tuple[Status, str, List[Optional[str]], str]]) -> List[Tuple[Status, str, List[Optional[str]], str]]:
    """PASS rows with the same nodes become one row, where the first of them stood: ("N checks", the
    nodes, "<count>: check, check, ..."). Other rows are kept as they are, in their order."""
    same: "OrderedDict[Any, List[Tuple[Status, str, List[Optional[str]], str]]]" = OrderedDict()
    for i, row in enumerate(rows):
        key = ("pass", tuple(row[2])) if row[0] == Status.PASS else i
        same.setdefault(key, []).append(row)
    out = []
    for group_rows in same.values():
        status, check, nodes, message = group_rows[0]
        if len(group_rows) > 1:
            check = plural(len(group_rows), "check")
            message = "%s: %s" % (message, ", ".join(r[1] for r in group_rows))
        out.append((status, check, nodes, message))
    return out


def render(report: RunReport, console: Any, verbose: bool = False) -> None:
    """The terminal report on a rich Console."""
    from rich.table import Table
    from rich.text import Text

    inv = report.inventory
    console.print(
        Text.assemble(
            ("preflight %s" % __version__, "bold"),  # the inventory path is shown as text, not markup
            " · %s · %d node%s · %s · %.1f s"
            % (inv.path, len(inv.nodes), "" if len(inv.nodes) == 1 else "s", ", ".join(report.selected), report.duration_s),
        )
    )
    # An unreachable node's "not checked" findings fold into its ssh line: one cause, one line. Nodes
    # Slurm had out of service get their own block (state and reason), not a table row.
    skipped: Dict[str, int] = {}
    for f in report.findings:
        if not_run(f) and f.node is not None:
            skipped[f.node] = skipped.get(f.node, 0) + 1
    shown = [f for f in report.findings if not not_run(f) and not (unavailable(f) and not f.status.is_problem)]
    shown = [
        replace(f, message="%s · %s not run" % (f.message, plural(skipped[f.node], "check")))
        if f.check == "ssh" and f.node in skipped and f.status.is_problem else f
        for f in shown
    ]
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("nodes", overflow="fold")
    table.add_column("finding", overflow="fold")
    everyone = [n.name for n in report.view.nodes]
    for status, check, nodes, message in group(shown, verbose):
        # facts from nodes are data, never rich markup ("[/usr/lib/...]" in an error must print as is)
        # and never terminal escapes: control characters in node text print escaped (common.printable)
        table.add_row(Text(status.value.upper(), style=STYLE[status]), Text(check), Text(common.printable(where(status, nodes, everyone))),
                      Text(common.printable(message)))
    console.print(table)

    aside = [f for f in report.findings if unavailable(f) and not f.status.is_problem]
    if aside:
        console.print()
        console.print(Text("unavailable (not checked, not counted as failures)", style="bold"))
        for f in sorted(aside, key=lambda f: f.node or ""):
            console.print(Text("  %s: %s" % (f.node, f.message)))

    curve = _curve(report)
    if curve:
        console.print(_curve_table(curve))

    todo = actions(shown, [n.name for n in report.view.nodes])
    if todo:
        console.print()
        console.print(Text("what to do", style="bold"))
        for line in todo:
            console.print(Text("  " + common.printable(line)))

    failed = [c for c in report.selected if any(f.check == c and f.status.is_problem for f in shown)]
    if failed:
        console.print()
        for name in failed:  # from the catalogue's index: no check module is imported to print these
            if len(failed) <= WHY_MAX:
                console.print(Text.assemble((name, "bold"), ": ", catalogue.entry(name).why))  # Text: no markup parsing
                console.print(Text.assemble("  fix: ", (fix_text(report, name), "cyan")))
            else:
                console.print(Text.assemble((name, "bold"), " fix: ", (fix_text(report, name), "cyan")))
        if len(failed) > WHY_MAX:
            console.print(Text("why each check matters: preflight checks", style="dim"))
    counts = summary(report.findings)
    parts = [
        Text("%d %s" % (counts[s.value], s.value), style=STYLE[s] if counts[s.value] else "dim")
        for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP, Status.ERROR)
    ]
    if counts["not_run"]:
        parts.append(Text("%d not run" % counts["not_run"], style="bold magenta"))
    nodes = node_counts(node_statuses(report.findings, [s.name for s in inv.nodes]))
    console.print()
    console.print(Text("nodes: ") + Text(" · ").join(
        Text("%d %s" % (nodes[s], s), style=NODE_STYLE[s] if nodes[s] else "dim") for s in NODE_STATUSES))
    console.print(Text(" · ").join(parts) + Text("  → exit %d" % report.exit_code, style="bold"))


NODE_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "unavailable": "yellow"}

#: up to this many failed checks the report prints why each matters as well as its fix; beyond it, the
#: fixes alone (the why stays in `preflight checks`), so a many-cause incident still fits one screen
WHY_MAX = 3


def fix_text(report: RunReport, check: str) -> str:
    """A check's fix as printed under the report: the catalogue's, except where the transport changes
    what an operator does about it (an unreachable node under Slurm is slurmd/munge, not sshd/keys)."""
    backend = backends.by_kind((report.transport or {}).get("kind"))
    if check == "ssh" and backend is not None and backend.unreachable_fix:
        return backend.unreachable_fix  # the backend's words (slurmd/munge, the agent pod), not SSH's
    return catalogue.entry(check).fix


#: How the console words each action for an operator.
ACTION_WORDS = {
    "isolate": "drain (isolate)",
    "reboot": "reboot",
    "reset_gpu": "reset the GPU on",
    "fix_config": "fix the config on",
    "check_app": "check the application on",
    "retest": "retest",
}


def actions(findings: Iterable[Finding], all_nodes: List[str]) -> List[str]:
    """One line per action the failing findings ask for, most drastic first, with its nodes and checks.

    'drain (isolate) 2 nodes: n[002-003] (ib_errors, gpu)'; a fix asked of every node says 'all N nodes'.
    A node is listed under its most drastic action only (a node to drain needs no config fix first);
    cluster-wide findings are listed as 'cluster'.
    """
    findings = list(findings)
    # a node Slurm already has out of service (counted as failing under --count-unavailable) is not
    # drained again: it is named once, as it stands
    out_of_service = sorted({f.node for f in findings if unavailable(f) and f.node is not None})
    by_action: Dict[str, List[Finding]] = {}
    for f in findings:
        if f.status.is_problem and f.node not in out_of_service:
            by_action.setdefault(f.action or "retest", []).append(f)
    placed: set = set()
    lines = []
    if out_of_service:
        lines.append("leave as Slurm has them (out of service already) %s: %s" % (
            common.plural(len(out_of_service), "node"), common.fold(out_of_service)))
    for action in ACTIONS:
        group = by_action.get(action)
        if not group:
            continue
        nodes = sorted({f.node for f in group if f.node is not None and f.node not in placed})
        cluster_wide = any(f.node is None for f in group)
        checks = list(OrderedDict((f.check, None) for f in group if f.node is None or f.node in nodes))
        if not nodes and not cluster_wide:
            continue
        if nodes and len(nodes) == len(all_nodes) and len(all_nodes) > 1:
            where = "all %d nodes" % len(nodes)
        elif nodes:
            where = "%s: %s" % (common.plural(len(nodes), "node"), common.fold(nodes))
        else:
            where = ""
        if cluster_wide:
            where = "cluster" + (", " + where if where else "")
        placed.update(nodes)
        lines.append("%s %s (%s)" % (ACTION_WORDS[action], where, ", ".join(checks)))
    return lines


def _curve(report: RunReport) -> List[Dict[str, Any]]:
    for f in report.findings:
        if f.check == "allreduce" and f.data and f.data.get("curve"):
            return list(f.data["curve"])
    return []


def _curve_table(curve: List[Dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="all-reduce", box=None, header_style="bold", title_justify="left")
    for col in ("size", "time", "algbw GB/s", "busbw GB/s", ""):
        table.add_column(col, justify="right" if col else "left")
    peak = max((p.get("busbw_gbps") or 0.0) for p in curve) or 1.0
    for point in curve:
        bus = point.get("busbw_gbps") or 0.0
        bar = "█" * max(1, int(round(20 * bus / peak))) if bus else ""
        table.add_row(
            common.human_bytes(point["bytes"]),
            "%.3f ms" % (1000 * point["time_s"]) if point.get("time_s") is not None else "-",
            "%.3f" % point["algbw_gbps"] if point.get("algbw_gbps") is not None else "-",
            "%.3f" % bus,
            bar,
        )
    return table

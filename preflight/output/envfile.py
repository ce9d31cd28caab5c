"""The recommended NCCL env file: derived only from verified facts, explained line by line, safe to source.

Every value comes from a check's facts, is validated against the characters NCCL, gloo and torch accept
for that variable, and is written single-quoted. A fact that fails validation (an interface may legally
be named `x$(id)`) is refused with a named finding and never written; a node whose own fact was refused
is left out of the env (and, through that FAIL finding, out of the hostfile), so the file stays right for
the nodes it names. The all-reduce test runs with exactly these variables (preflight.checks.allreduce.stage), so the file
the user sources is the one that was proven.

    derive(view, healthy) -> Derived(variables, refused, notes, nodes, left_out, per_node, versions)   pure
    render(report)        -> the file's text: header, then per variable the why and `export K='v'`

The socket, rendezvous and torch variables are derived here; the fabric ones (NCCL_IB_*, the RoCE GID,
NCCL_NVLS_ENABLE, NCCL_NET_PLUGIN) in preflight.derived.envfabric; the shared types and value validation in
preflight.derived.envvars.

Which value wins (issue 25, read against NCCL's env parsing, src/misc/param.cc and utils.cc, and torch's
ProcessGroupNCCL.hpp): most variables are authoritative, `export K='v'`, because the environment beats
~/.nccl.conf and /etc/nccl.conf and a leftover value in the launch environment is exactly what hangs jobs.
NCCL_DEBUG, MASTER_ADDR and MASTER_PORT are the user's to choose (a launcher sets MASTER_* per job, and
the proof ran with NCCL_DEBUG=INFO anyway): they are written `K=${K:-'v'}`, so a value already set wins.
A value that is right on some nodes only (an interface named differently across nodes, a RoCE GID
index that differs) is never written globally: the file lists the per-node values in comments.
"""

from __future__ import annotations

import datetime
from typing import Any, Dict, List, Sequence, Tuple

from preflight import __version__
from preflight.common import one_line
from preflight.model import ClusterView, Finding
from preflight.derived import envfabric
from preflight.derived.envvars import Derived, EnvVar, fold_names, quote
from preflight.derived.ncclenv import derive


# ------------------------------------------------------------------------------------------------ render


def render(report: Any) -> str:
    """The env file text for a finished run (a preflight.engine.RunReport)."""
    view: ClusterView = report.view
    unreachable = set(view.unreachable)
    real = [f for f in report.findings if f.status.is_problem and not _echo(f, unreachable)]
    problems = {f.node for f in real if f.node} | unreachable
    healthy = [n.name for n in view.live if n.name not in problems]
    derived = report.env if getattr(report, "env", None) is not None else derive(view, healthy)
    real += [f for f in derived.refused if f not in real]  # (the engine adds them to the findings already)
    problems |= {f.node for f in derived.refused if f.node}
    healthy = [n for n in healthy if n not in problems]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    inv = report.inventory
    total = len(view.nodes)
    lines = [
        "# NCCL environment recommended by preflight %s; source it in your launch script (bash or sh)." % __version__,
        "# generated %s from %s (sha256 %s)" % (stamp, inv.path, (inv.sha256 or "-")[:16]),
        "# nodes: %s (%d of %d)" % (fold_names(healthy), len(healthy), total),
    ]
    for reason, names in _left_out(view, real, problems):
        lines.append("# left out: %s (%s)" % (fold_names(names), reason))
    failed = _failed_checks(real)
    if failed:
        lines.append("# checks that failed or errored: %s" % failed)
    proof = _proof(report, unreachable)
    logs = envfabric.proof_logs(report) if proof.startswith("proven") else {}
    lines.append("# %s" % proof)
    lines.append("# %s" % _versions_line(derived, logs))
    variables, notes = envfabric.with_proof(derived, logs)
    lines.append("# authoritative (the file's value replaces one already set): %s" % (", ".join(v.key for v in variables if not v.default) or "none"))
    lines.append("# yours win (kept when already set, else the file's): %s" % (", ".join(v.key for v in variables if v.default) or "none"))
    for note in derived.notes + notes:
        lines.append("# note: %s" % note)
    lines.extend(_per_node_lines(derived.per_node))
    for var in variables:
        lines.append("")
        lines.extend("# %s" % why for why in var.why)
        lines.append(assignment(var))
    return "".join(one_line(line) + "\n" if line.startswith("#") else line + "\n" for line in lines)


def assignment(var: EnvVar) -> str:
    """`export K='v'`, or for a variable whose already-set value wins `K=${K:-'v'}; export K` (a plain
    assignment: no field splitting or globbing in sh or bash, whatever IFS the environment holds)."""
    if var.default:
        return "%s=${%s:-%s}; export %s" % (var.key, var.key, quote(var.value), var.key)
    return "export %s=%s" % (var.key, quote(var.value))


def _per_node_lines(per_node: Dict[str, Dict[str, str]]) -> List[str]:
    """'#   n[001-002]: NCCL_SOCKET_IFNAME='=eth1' GLOO_SOCKET_IFNAME='eth1'', nodes with the same values together."""
    if not per_node:
        return []
    groups: Dict[Tuple[Tuple[str, str], ...], List[str]] = {}
    for node, values in per_node.items():
        groups.setdefault(tuple(sorted(values.items())), []).append(node)
    lines = ["# per-node values (no single value is right on every node, so none is exported): "
             "export these in each node's launch, e.g. from a per-host env file"]
    for values, on in groups.items():
        lines.append("#   %s: %s" % (fold_names(on), " ".join("%s=%s" % (k, quote(v)) for k, v in values)))
    return lines


def _versions_line(derived: Derived, logs: Dict[str, Dict[str, Any]]) -> str:
    torch = ", ".join(derived.versions.get("torch") or []) or "not found"
    proven = envfabric.seen(logs, "version")
    if proven:
        return "proven with NCCL %s (the all-reduce's NCCL log) and torch %s (driver check)" % (", ".join(proven), torch)
    nccl = ", ".join(derived.versions.get("nccl") or []) or "not found"
    return "on the nodes: NCCL %s, torch %s (driver check)" % (nccl, torch)


def _left_out(view: ClusterView, real: Sequence[Finding], problems: set) -> List[Tuple[str, List[str]]]:
    """[(reason, nodes)] for the left-out nodes, nodes with the same reason together, inventory order."""
    reasons: Dict[str, List[str]] = {}
    for node in [n.name for n in view.nodes if n.name in problems]:
        if node in view.unreachable:
            reason = "unreachable: ssh"
        else:
            checks = sorted({f.check for f in real if f.node == node}, key=_check_order)
            reason = "failed: %s" % ", ".join(checks)
        reasons.setdefault(reason, []).append(node)
    return list(reasons.items())


def _failed_checks(real: Sequence[Finding]) -> str:
    by_check: Dict[str, set] = {}
    for f in real:
        by_check.setdefault(f.check, set()).add(f.node)
    parts = []
    for check in sorted(by_check, key=_check_order):
        nodes = sorted(n for n in by_check[check] if n)
        where = [fold_names(nodes)] if nodes else []
        if None in by_check[check]:
            where.append("cluster-wide")
        parts.append("%s (%s)" % (check, ", ".join(where)))
    return ", ".join(parts)


def _echo(f: Finding, unreachable: set) -> bool:
    """A check's "not checked: node unreachable" finding, which only repeats the ssh failure."""
    return f.node in unreachable and f.check != "ssh"


def _proof(report: Any, unreachable: set) -> str:
    allreduce = getattr(report, "allreduce", None)
    if not allreduce:
        return "not yet proven by the all-reduce test (run `preflight check` with the allreduce check)"
    if allreduce.get("verdict") == "skip":
        return "not proven: the all-reduce test was skipped (%s)" % (allreduce.get("reason") or "no reason given")
    own = [f for f in report.findings if f.check == "allreduce" and not _echo(f, unreachable)]
    worst = max((f.status for f in own), key=lambda s: s.rank, default=None)
    summary = allreduce.get("summary") or ""
    on = fold_names(allreduce.get("nodes") or [])
    if worst is not None and not worst.is_problem and allreduce.get("summary"):
        return "proven: the all-reduce test ran with exactly these variables on %s: %s" % (on, summary)
    return "NOT proven: the all-reduce test with these variables on %s did not pass (%s); see the report" % (on, summary or (worst.value if worst else "no verdict"))


def _check_order(name: str) -> int:
    from preflight.checks import CHECK_NAMES

    return CHECK_NAMES.index(name) if name in CHECK_NAMES else 99

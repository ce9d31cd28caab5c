"""nvbandwidth's controller half: each node's copy figures against the fleet median of the same testcase
and matrix position (the same GPU pair or host->GPU path), among nodes with the same matrix shape.

Pure. Positions are compared across nodes, never within one: on a PCIe node the peer figures differ by
topology (NVIDIA/nvbandwidth#50: 26.3 GB/s for GPUs under one switch, 21.8 across), which is healthy.
A figure more than WARN_FRACTION below its position's fleet median WARNs, more than FAIL_FRACTION FAILs
(isolate: a link trained narrow or slow halves it). Fewer than MIN_PEERS nodes of a shape: the figures are
reported, not judged.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Tuple

from preflight.checks.nvbandwidth import NAME
from preflight.common import printable
from preflight.model import ClusterView, Finding, Status

WARN_FRACTION = 0.15
FAIL_FRACTION = 0.30
MIN_PEERS = 3


def prepare(cluster: Mapping[str, Any], node: str, is_head: bool) -> Dict[str, Any]:
    """Phase-1 config: run only with --tier burn-in (the CLI puts the tier in the cluster settings)."""
    return {"run": cluster.get("tier") == "burn-in"}


def _skip(node: str, facts: Mapping[str, Any]) -> Finding:
    if facts.get("not_started"):
        return Finding(NAME, node, Status.SKIP, "not run: %s" % facts["not_started"])
    return Finding(NAME, node, Status.SKIP, "nvbandwidth not installed (not on PATH)")


def _cells(result: Mapping[str, Any]) -> Dict[Tuple[str, str, int], float]:
    """{(testcase, row, column): GB/s} for every figure (N/A cells left out)."""
    out = {}
    for name, test in (result.get("tests") or {}).items():
        for row, cells in (test.get("rows") or {}).items():
            for col, value in zip(test.get("columns") or [], cells):
                if value is not None:
                    out[(name, row, col)] = value
    return out


def rule(view: ClusterView) -> List[Finding]:
    findings: List[Finding] = []
    measured: Dict[str, Dict[Tuple[str, str, int], float]] = {}
    for node in view.nodes:
        if node.name not in view.facts:
            continue  # unreachable: the ssh check names it
        facts = view.facts[node.name].get(NAME)
        if not isinstance(facts, dict):
            findings.append(Finding(NAME, node.name, Status.ERROR, "no nvbandwidth facts from this node", action="retest"))
            continue
        if not facts.get("ran"):
            findings.append(_skip(node.name, facts))
        elif facts.get("result") is None:
            why = "timed out" if facts.get("timed_out") else "exited %s: %s" % (
                facts.get("rc"), printable(facts.get("stderr_tail") or "", keep_newlines=False))
            findings.append(Finding(NAME, node.name, Status.ERROR if facts.get("timed_out") else Status.FAIL,
                                    "nvbandwidth %s" % why.strip(), action="retest"))
        else:
            measured[node.name] = _cells(facts["result"])
    shapes: Dict[Tuple[Any, ...], List[str]] = {}
    for node, cells in measured.items():
        shapes.setdefault(tuple(sorted(cells)), []).append(node)
    for shape, nodes in shapes.items():
        medians = {k: statistics.median(measured[n][k] for n in nodes) for k in shape} if len(nodes) >= MIN_PEERS else {}
        for node in sorted(nodes):
            findings.append(_judge(node, measured[node], medians, len(nodes)))
    return findings


def _judge(node: str, cells: Dict[Tuple[str, str, int], float], medians: Dict[Tuple[str, str, int], float],
           peers: int) -> Finding:
    where = lambda k: "%s %s->%d" % (k[0], k[1], k[2])  # noqa: E731
    low = sorted(((1.0 - v / medians[k], k, v) for k, v in cells.items() if k in medians and medians[k] > 0
                  and v < (1.0 - WARN_FRACTION) * medians[k]), reverse=True)
    if not medians:
        return Finding(NAME, node, Status.PASS, "%d copy figures, %.4g-%.4g GB/s (%d node%s of this shape: too few to "
                       "judge against a fleet median)" % (len(cells), min(cells.values()), max(cells.values()), peers,
                                                            "" if peers == 1 else "s"), data={"cells": len(cells)})
    if not low:
        return Finding(NAME, node, Status.PASS, "%d copy figures within %.0f%% of the fleet median of their position" % (
            len(cells), 100 * WARN_FRACTION))
    worst, key, value = low[0]
    status = Status.FAIL if worst > FAIL_FRACTION else Status.WARN
    said = "; ".join("%s %.4g GB/s (fleet median %.4g, %.0f%% below)" % (where(k), v, medians[k], 100 * f)
                     for f, k, v in low[:4])
    return Finding(NAME, node, status, "%s: %d copy path%s slow: %s" % (node, len(low), "" if len(low) == 1 else "s", said),
                   expected=">= %.0f%% of the fleet median" % (100 * (1 - WARN_FRACTION)), actual="%.0f%% below" % (100 * worst),
                   data={"low": [[where(k), v, medians[k]] for _, k, v in low]},
                   action="isolate" if status is Status.FAIL else "retest")

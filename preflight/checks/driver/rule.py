"""The driver check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.driver import NAME
from preflight.common import fold, majority, plural
from preflight.derived.versions import nccl_version, public
from preflight.model import ClusterView, Finding, Status, probe_error

NOT_FOUND = "not found"


#: (key, label, applies to CPU-only nodes)
ITEMS = (
    ("driver_version", "driver", False),
    ("cuda_version", "CUDA", False),
    ("nccl_version", "NCCL", False),
    ("torch_version", "torch", True),
)


def _values(node: Any, facts: Dict[str, Any]) -> Dict[str, Optional[str]]:
    torch = facts.get("torch") or {}
    gpu = node.gpus_per_node > 0
    return {
        "driver_version": facts.get("driver_version") if gpu else None,
        "cuda_version": facts.get("cuda_version") if gpu else None,
        "nccl_version": nccl_version(facts) if gpu else None,
        # full on GPU nodes only when every compared node is a GPU node (decided in rule)
        "torch_version": torch.get("version"),
    }


def _compare(
    key: str, label: str, values: Dict[str, str], expect: Optional[str]
) -> Tuple[Dict[str, Tuple[str, str, str]], Optional[Finding]]:
    """({node: (message, expected, actual)} for nodes that differ, cluster-wide summary finding or None)."""
    bad: Dict[str, Tuple[str, str, str]] = {}
    if not values:
        return bad, None
    groups: Dict[str, List[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    if expect is not None:
        for node, value in values.items():
            if value != expect:
                bad[node] = ("%s %s (expected %s)" % (label, value, expect), expect, value)
        return bad, None
    if len(groups) == 1 or set(groups) == {NOT_FOUND}:
        return bad, None
    # "not found" is never the reference: the nodes lacking a value are the ones to fix.
    ranked = sorted(groups.items(), key=lambda kv: (kv[0] == NOT_FOUND, -len(kv[1]), kv[0]))
    top_value, top_nodes = ranked[0]
    tie = majority([v for v in values.values() if v != NOT_FOUND])[0] is None
    word = "majority " if len(top_nodes) * 2 > len(values) else "most common: "
    for value, nodes in ranked:
        if value == top_value and not tie:
            continue
        for node in nodes:
            if tie and value != NOT_FOUND:
                others = "; ".join("%s on %s" % (v, fold(n)) for v, n in ranked if v != value)
                bad[node] = ("%s %s (no majority: %s)" % (label, value, others), "one version", value)
            else:
                bad[node] = (
                    "%s %s (%s%s on %s)" % (label, value, word, top_value, plural(len(top_nodes), "node")),
                    top_value,
                    value,
                )
    summary = " · ".join("%s: %s %s" % (fold(nodes), label, value) for value, nodes in ranked)
    cluster = Finding(NAME, None, Status.FAIL, "%s drift: %s" % (label, summary), data={"versions": {v: fold(n) for v, n in ranked}})
    return bad, cluster


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    live: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
    for node in view.live:
        facts = view.facts[node.name].get(NAME)
        err = probe_error(NAME, node.name, facts)
        if err:
            out.append(err)
        else:
            live[node.name] = (node, facts)
    per_node: Dict[str, Dict[str, Optional[str]]] = {n: _values(node, f) for n, (node, f) in live.items()}
    all_gpu = all(node.gpus_per_node > 0 for node, _ in live.values())
    if not all_gpu:  # mixed or CPU-only cluster: torch compared on its public version
        for values in per_node.values():
            values["torch_version"] = public(values["torch_version"])
    problems: Dict[str, List[Tuple[str, str, str]]] = {n: [] for n in live}
    cluster: List[Finding] = []
    for name, (node, facts) in live.items():
        if node.gpus_per_node > 0 and not facts.get("driver_version"):
            problems[name].append(
                ("no NVIDIA driver found (expected one for %d GPUs)" % node.gpus_per_node, "a driver", NOT_FOUND)
            )
    for key, label, on_cpu in ITEMS:
        expect = view.expect.get(key)
        expect = None if expect is None else str(expect)
        applies = {n: v for n, v in per_node.items() if on_cpu or live[n][0].gpus_per_node > 0}
        if key in ("driver_version", "cuda_version"):  # a missing driver is reported above, not as drift
            applies = {n: v for n, v in applies.items() if v["driver_version"]}
        values = {n: (v[key] or NOT_FOUND) for n, v in applies.items()}
        if expect is not None and key == "torch_version" and not all_gpu:
            expect = public(expect)
        if expect is None and not any(v != NOT_FOUND for v in values.values()):
            continue
        bad, summary = _compare(key, label, values, expect)
        for name, problem in bad.items():
            problems[name].append(problem)
        if summary:
            cluster.append(summary)
    for name, (node, facts) in live.items():
        problems[name].extend(_cuda_compat(facts) if node.gpus_per_node > 0 else [])
        if problems[name]:
            for message, expected, actual in problems[name]:
                out.append(Finding(NAME, name, Status.FAIL, message, expected=expected, actual=actual))
        else:
            out.append(_pass(node, facts, per_node[name]))
    return out + cluster


def _cuda_compat(facts: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    torch = facts.get("torch") or {}
    built, driver = torch.get("cuda"), facts.get("cuda_version")
    if not built or not driver:
        return []
    try:
        if int(built.split(".")[0]) > int(driver.split(".")[0]):
            return [
                (
                    "torch %s is built for CUDA %s but the driver supports CUDA %s (expected a driver for CUDA %s.x)"
                    % (torch.get("version"), built, driver, built.split(".")[0]),
                    "CUDA >= %s" % built,
                    driver,
                )
            ]
    except ValueError:
        pass
    return []


def _pass(node: Any, facts: Dict[str, Any], values: Dict[str, Optional[str]]) -> Finding:
    torch = values["torch_version"]
    if node.gpus_per_node == 0:
        if torch is None:
            return Finding(
                NAME, node.name, Status.SKIP, "CPU-only node (gpus_per_node: 0) without torch: nothing to compare"
            )
        return Finding(
            NAME,
            node.name,
            Status.PASS,
            "torch %s (CPU-only node: driver, CUDA and NCCL do not apply)" % torch,
            actual=torch,
        )
    parts = ["driver %s" % values["driver_version"]]
    if values["cuda_version"]:
        parts.append("CUDA %s" % values["cuda_version"])
    parts.append("NCCL %s" % (values["nccl_version"] or NOT_FOUND))
    parts.append("torch %s" % (torch or NOT_FOUND))
    return Finding(NAME, node.name, Status.PASS, ", ".join(parts), actual=values["driver_version"])

"""A --json report document for a synthetic fleet, built from Finding objects through the report's own
functions (node statuses, summaries, ordering): the --html page's tests and benchmark render it
without running a fleet.

The all-reduce section has the shape preflight.checks.allreduce.stage.summary() writes: a curve, a
per-node "nic" round and pair rounds whose groups localized a slow node (a screening round of pairs,
then the suspect's pair split against known-good partners).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from preflight.model import Finding, Status
from preflight.output import report

CHECKS = ("ssh", "gpu", "ib_errors", "nic", "allreduce")


def findings_for(names: Sequence[str], failing: Dict[str, Finding], warn: Optional[Dict[str, Finding]] = None) -> List[Finding]:
    """A PASS of every check on every node, except the failing/warning findings given per node."""
    out: List[Finding] = []
    for name in names:
        special = failing.get(name) or (warn or {}).get(name)
        for check in CHECKS[:-1]:
            if special is not None and special.check == check:
                out.append(special)
            else:
                out.append(Finding(check, name, Status.PASS, "ok"))
    return out


def allreduce_section(names: Sequence[str], slow: Optional[str], gbps: float = 180.0) -> Dict[str, Any]:
    """stage.summary()'s shape: curve, per-node round, pair rounds that found `slow` (None: all fine)."""
    curve = [{"bytes": 1 << s, "time_s": (1 << s) / (gbps * 1e9) * 1.1, "algbw_gbps": gbps * 0.55,
              "busbw_gbps": gbps * (0.3 + 0.1 * i)} for i, s in enumerate(range(24, 31))]
    per_node = {n: (gbps * 0.4 if n == slow else gbps * (0.97 + 0.0001 * (i % 200))) for i, n in enumerate(names)}
    section: Dict[str, Any] = {
        "backend": "nccl", "world_size": 8 * len(names), "nodes": list(names), "master": "198.19.0.2:29500",
        "verdict": "fail" if slow else "pass",
        "summary": ("busbw 121.3 GB/s < 150 GB/s at 1 GiB; exclude %s" % slow) if slow else "busbw 181.2 GB/s at 1 GiB",
        "busbw_gbps": 121.3 if slow else 181.2, "threshold_gbps": 150.0, "curve": curve, "elapsed_s": 41.2,
        "node_rounds": [{"name": "nic", "what": "each node with a known-good partner over the NICs",
                         "median_gbps": gbps, "named": [slow] if slow else [], "nodes": per_node}],
        "localization": None,
    }
    if slow:
        pairs = [list(names[i:i + 2]) for i in range(0, len(names) - 1, 2)]
        groups = [{"nodes": p, "busbw_gbps": gbps * (0.45 if slow in p else 0.98), "failure": None, "round": 0} for p in pairs]
        partner = next(n for n in names if n != slow and all(n not in p or slow not in p for p in pairs))
        groups.append({"nodes": [slow, partner], "busbw_gbps": gbps * 0.44, "failure": None, "round": 1})
        mate = next(m for p in pairs if slow in p for m in p if m != slow)
        groups.append({"nodes": [mate, partner], "busbw_gbps": gbps * 0.99, "failure": None, "round": 1, "control": True})
        section["localization"] = {"rounds": 2, "in_process_rotations": 0, "why": "the whole-cluster busbw was low",
                                   "sizes": [1 << 30], "deadlines": None, "by_bandwidth": True, "exclude": [slow],
                                   "groups": groups}
    return section


def document(names: Sequence[str], findings: Sequence[Finding], allreduce: Optional[Dict[str, Any]] = None,
             inventory: str = "hosts.yaml") -> Dict[str, Any]:
    """The --json document (report.to_json's keys) for these nodes and findings."""
    statuses = report.node_statuses(findings, names)
    return {
        "schema_version": report.SCHEMA_VERSION, "preflight_version": "test", "started_at": "2026-11-28T06:00:00Z",
        "duration_s": 52.4, "phase_times_s": {}, "transport": {"kind": "ssh"}, "inventory": inventory,
        "inventory_sha256": "0" * 64, "checks": list(CHECKS),
        "nodes": [{"name": n, "host": "10.0.%d.%d" % (i // 250, i % 250 + 1), "gpus": 8, "head": i == 0,
                   "status": statuses[n]} for i, n in enumerate(names)],
        "results": [f.to_json() for f in report.sort_findings(findings)],
        "hardware": {}, "summary": report.summary(findings), "node_summary": report.node_counts(statuses),
        "allreduce": allreduce, "exit_code": 1 if any(f.status.is_problem for f in findings) else 0,
    }


def fleet(count: int, failing: int = 2, warn: int = 1) -> Dict[str, Any]:
    """A `count`-node run (gpu-0001...) with `failing` failing nodes (an Xid GPU fault, IB symbol errors,
    alternately), `warn` warning nodes and (4 nodes or more) one more failing node: the slow node the
    all-reduce's rounds localized."""
    names = ["gpu-%04d" % (i + 1) for i in range(count)]
    step = max(1, count // (failing + warn + 1))
    bad: Dict[str, Finding] = {}
    for k in range(failing):
        node = names[(k + 1) * step - 1]
        if k % 2 == 0:
            bad[node] = Finding("gpu", node, Status.FAIL, "GPU 3 (00000000:4E:00.0): Xid 79 (fallen off the bus)",
                                expected="no Xid 79", actual="Xid 79 at 2026-11-28 05:41:07", action="isolate",
                                data={"gpu": 3, "xid": 79, "serial": "1654922008374"})
        else:
            bad[node] = Finding("ib_errors", node, Status.FAIL, "mlx5_2 port 1: symbol_error +1843 in 60 s",
                                expected="< 10 per 60 s", actual="1843", action="isolate")
    warned = {names[(failing + k + 1) * step - 1]: Finding("nic", names[(failing + k + 1) * step - 1], Status.WARN,
                                                           "eth0 MTU 1500 (the fleet's is 9000)") for k in range(warn)}
    findings = findings_for(names, bad, warned)
    slow = names[count // 2] if count >= 4 else None
    if slow:  # the node the rounds named: a FAIL of its own, as the allreduce rule writes it
        findings.append(Finding("allreduce", slow, Status.FAIL, "nic: busbw 72.00 GB/s, 40%% of the fleet's median "
                                "180.00 GB/s; pair test: busbw 79.20 GB/s beside %s, which measured 178.20 GB/s "
                                "elsewhere" % names[0], action="isolate", data={"fleet": ["nic: busbw 72.00 GB/s"]}))
    findings.append(Finding("allreduce", None, Status.FAIL if slow else Status.PASS,
                            "busbw 121.3 GB/s < 150 GB/s at 1 GiB; exclude %s" % slow if slow else "busbw 181.2 GB/s",
                            action="isolate" if slow else None))
    return document(names, findings, allreduce_section(names, slow))

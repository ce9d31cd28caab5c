"""Reports of simulated nightly runs over a fleet, in the --json document's shape, for the history tests
and benchmarks/history_*.py: every node with its checks' findings and 8 GPUs with serials, and faults
injected as the real checks word them (an Xid finding carries data.kind/code/pci as preflight/checks/xid/rule.py
writes it; an IB port finding data.port as preflight/checks/ib_hca/rule.py does)."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

SHA = "5e" * 32
PASS_CHECKS = ("ssh", "driver", "fabric_manager", "nic", "ib_hca", "mtu", "ports", "nccl_env", "topology",
               "pcie", "gpu_pcie", "gpu_memory", "gpu_state", "nvlink_errors", "ib_errors", "limits", "storage",
               "gpudirect", "dcgm", "xid", "gpu")
BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def node_names(count: int) -> List[str]:
    return ["gpu-%04d" % i for i in range(1, count + 1)]


def serial(node: str, index: int) -> str:
    return "1650%s%02d" % (node[-4:], index)


def stamp(day: int, base: str = "2026-01-01T02:00:00") -> str:
    when = _dt.datetime.fromisoformat(base) + _dt.timedelta(days=day)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def xid(node: str, index: int, code: int = 79, action: str = "reset_gpu") -> Dict[str, Any]:
    """An Xid finding on GPU `index` of `node`, worded and shaped as preflight/checks/xid/rule.py writes it."""
    bus = "0000:%s:00" % BUS[index]
    return {"check": "xid", "node": node, "status": "fail", "action": action,
            "message": "%s GPU %d (%s.0): Xid %d in the last 24 h (last 3 h ago): GPU has fallen off the bus" % (node, index, bus, code),
            "expected": "no hardware Xid/SXid", "actual": "Xid %d" % code,
            "data": {"kind": "xid", "code": code, "pci": bus, "count": 1}}


def ib_port(node: str, port: str = "mlx5_3/1", status: str = "fail", action: Optional[str] = "isolate") -> Dict[str, Any]:
    return {"check": "ib_hca", "node": node, "status": status, "action": action,
            "message": "%s %s: state DOWN (expected ACTIVE at 400 Gb/s)" % (node, port), "data": {"port": port}}


def flaky(node: str, check: str = "ib_errors", status: str = "fail", action: str = "isolate") -> Dict[str, Any]:
    return {"check": check, "node": node, "status": status, "action": action,
            "message": "%s mlx5_1 port 1: link_downed +1 since the last run (a flap)" % node, "data": {"flaps": 1}}


def undecided(node: str) -> Dict[str, Any]:
    return {"check": "gpu_state", "node": node, "status": "error", "action": "retest",
            "message": "%s: result damaged in transit: could not decide" % node}


def report(day: int, nodes: Sequence[str], faults: Iterable[Mapping[str, Any]] = (), failed_gpus: Mapping[str, int] = {},
           moved: Mapping[str, str] = {}, busbw: float = 182.5) -> Dict[str, Any]:
    """One run's document. faults: findings replacing the passing one of their check on their node;
    failed_gpus {node: GPU index the gpu check failed}; moved {serial: node whose slot 0 it now sits in}."""
    faults = list(faults)
    bad = {(f["node"], f["check"]) for f in faults}
    results: List[Dict[str, Any]] = []
    hardware: Dict[str, Any] = {}
    for i, node in enumerate(nodes):
        for check in PASS_CHECKS:
            if (node, check) not in bad:
                results.append({"check": check, "node": node, "status": "pass",
                                "message": "%s: ok (%d.%d)" % (check, i % 7, day % 3)})
        gpus = [{"index": g, "pci_bus_id": "00000000:%s:00.0" % BUS[g], "uuid": "GPU-%s-%d" % (node, g),
                 "serial": serial(node, g), "failed": failed_gpus.get(node) == g} for g in range(8)]
        for board, where in moved.items():
            if where == node:
                gpus[0] = dict(gpus[0], serial=board, uuid="GPU-board-%s" % board)
        hardware[node] = {"gpus": gpus}
    results.extend(faults)
    failing = {f["node"] for f in faults if f["status"] in ("fail", "error")}
    for node, index in failed_gpus.items():
        failing.add(node)
        results.append({"check": "gpu", "node": node, "status": "fail", "action": "reset_gpu",
                        "message": "%s GPU %d: 2 uncorrectable ECC errors (retired pages pending)" % (node, index)})
        results[:] = [r for r in results if not (r["node"] == node and r["check"] == "gpu" and r["status"] == "pass")]
    return {
        "schema_version": "1.0", "preflight_version": "0.1.0", "started_at": stamp(day), "duration_s": 60.0,
        "inventory": "hosts.yaml", "inventory_sha256": SHA, "checks": list(PASS_CHECKS),
        "nodes": [{"name": n, "host": n, "gpus": 8, "head": i == 0, "status": "fail" if n in failing else "pass"}
                  for i, n in enumerate(nodes)],
        "results": results, "hardware": hardware, "summary": {}, "node_summary": {},
        "allreduce": {"backend": "nccl", "world_size": 8 * len(nodes), "verdict": "pass", "busbw_gbps": busbw, "curve": []},
        "exit_code": 1 if failing else 0,
    }

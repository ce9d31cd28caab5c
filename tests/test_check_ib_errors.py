"""ib_errors: counter parsing on real-format trees, the probe's two reads, and the rule's rates."""

import os

import pytest

from preflight.checks import ib_errors
from preflight.model import ClusterView, NodeInfo, Status
from preflight.probe.context import NodeContext
from tests.sim import ib_hw

ZERO = dict.fromkeys(ib_errors.COUNTERS, 0)


def test_saturation_widths():
    assert ib_errors.saturated("excessive_buffer_overrun_errors", 15)
    assert not ib_errors.saturated("excessive_buffer_overrun_errors", 14)
    assert ib_errors.saturated("link_downed", 255)
    assert not ib_errors.saturated("symbol_error", 255)


def test_probe_reads_the_sim_tree_twice(tmp_path):
    ib_hw.write_tree(str(tmp_path), ib_hw.cluster_files([{}, {"counters": {"symbol_error": 7}}]))
    facts = ib_errors.probe(NodeContext({"interval_s": 0.01}, sysfs_root=str(tmp_path)))
    assert [ib_errors.label(p) for p in facts["ports"]] == ["mlx5_0:1", "mlx5_1:1"]
    assert facts["ports"][1]["after"]["symbol_error"] == 7
    assert facts["ports"][0]["state"] == "ACTIVE" and facts["ports"][0]["link_layer"] == "ib"
    assert "dir" not in facts["ports"][0]


def test_probe_without_hcas_does_not_sleep(tmp_path):
    facts = ib_errors.probe(NodeContext({"interval_s": 30}, sysfs_root=str(tmp_path)))
    assert facts["ports"] == [] and facts["interval_s"] == 0.0


def _port(before=None, after=None, hca="mlx5_0"):
    b = dict(ZERO, **(before or {}))
    return {"hca": hca, "port": 1, "link_layer": "ib", "state": "ACTIVE", "before": b, "after": dict(b, **(after or {}))}


def _view(ports_by_node, previous=None, at=1000.0):
    nodes = [NodeInfo(n, n, 8) for n in ports_by_node]
    facts = {n: {"ib_errors": {"interval_s": 1.0, "at": at, "ports": ps}} for n, ps in ports_by_node.items()}
    cluster = {"previous": previous} if previous else {}
    return ClusterView(nodes, facts, cluster=cluster)


def by_node(findings):
    return {f.node: f for f in findings}


def test_quiet_ports_pass_and_carry_counters():
    out = by_node(ib_errors.rule(_view({"n1": [_port()], "n2": [_port(before={"port_rcv_errors": 14})]})))
    assert out["n1"].status is Status.PASS and out["n2"].status is Status.PASS  # old errors are not judged
    assert out["n2"].data["counters"]["mlx5_0:1"]["port_rcv_errors"] == 14


def test_link_flap_during_probe_fails_with_isolate():
    out = by_node(ib_errors.rule(_view({"n1": [_port()], "n2": [_port(after={"link_downed": 1}, hca="mlx5_3")]})))
    f = out["n2"]
    assert f.status is Status.FAIL and f.action == "isolate"
    assert "n2 mlx5_3 port 1: link went down 1 time (link flap)" in f.message
    assert out["n1"].status is Status.PASS


def test_symbol_error_rate_above_threshold_warns():
    f = ib_errors.rule(_view({"n1": [_port(after={"symbol_error": 50})]}))[0]
    assert f.status is Status.WARN and "symbol_error +50 in 1s = 50/s (threshold 10/s)" in f.message
    f = ib_errors.rule(_view({"n1": [_port(after={"symbol_error": 5})]}))[0]
    assert f.status is Status.PASS


def test_saturated_counter_warns_never_passes():
    f = ib_errors.rule(_view({"n1": [_port(before={"link_downed": 255})]}))[0]
    assert f.status is Status.WARN and "link_downed saturated at 255" in f.message


def test_unavailable_counters_warn():
    p = _port()
    p["after"] = dict.fromkeys(ib_errors.COUNTERS)
    f = ib_errors.rule(_view({"n1": [p]}))[0]
    assert f.status is Status.WARN and "unavailable" in f.message


def _previous(node, counters, at):
    return {"started_at": "2026-11-22T10:00:00Z",
            "results": [{"check": "ib_errors", "node": node, "status": "pass", "message": "",
                         "data": {"counters": {"mlx5_0:1": dict(ZERO, **counters)}, "at": at}}]}


def test_symbol_errors_since_last_run_above_ibta_bound_fail():
    prev = _previous("n1", {"symbol_error": 100}, at=1000.0 - 3600)
    f = ib_errors.rule(_view({"n1": [_port(before={"symbol_error": 400})]}, previous=prev))[0]
    assert f.status is Status.FAIL and "symbol_error +300 since the last run (2026-11-22T10:00:00Z) = 300/h" in f.message


def test_slow_symbol_errors_and_cleared_counters_pass():
    prev = _previous("n1", {"symbol_error": 100}, at=1000.0 - 3600)
    assert ib_errors.rule(_view({"n1": [_port(before={"symbol_error": 150})]}, previous=prev))[0].status is Status.PASS
    # lower than before: cleared (reboot, perfquery -R), not compared
    assert ib_errors.rule(_view({"n1": [_port(before={"symbol_error": 3})]}, previous=prev))[0].status is Status.PASS


def test_link_downed_since_last_run_warns():
    prev = _previous("n1", {"link_downed": 2}, at=0.0)
    f = ib_errors.rule(_view({"n1": [_port(before={"link_downed": 3})]}, previous=prev))[0]
    assert f.status is Status.WARN and "link went down 1 time since the last run" in f.message


def test_no_hca_skips_and_missing_facts_error():
    view = ClusterView([NodeInfo("n1", "n1", 0), NodeInfo("n2", "n2", 0)],
                       {"n1": {"ib_errors": {"interval_s": 0, "at": 1, "ports": []}}, "n2": {}})
    out = by_node(ib_errors.rule(view))
    assert out["n1"].status is Status.SKIP and out["n2"].status is Status.ERROR

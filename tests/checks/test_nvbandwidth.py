"""nvbandwidth: the probe through an `nvbandwidth` on PATH (burn-in tier only, GPU nodes only) and the rule's
verdicts per matrix position against the fleet median (real formats: tests/fixtures/nvbandwidth/)."""

from __future__ import annotations

import copy
import os
import shlex

import pytest

from preflight.checks.nvbandwidth import probe as nvb_probe
from preflight.checks.nvbandwidth import rule as nvb_rule
from preflight.model import Status
from preflight.probe.context import NodeContext
from tests import fixture_cases as fc
from tests.builders import StubNode, view

FIXTURES = os.path.join(fc.ROOT, "nvbandwidth")
D2D = "device_to_device_memcpy_read_ce"


@pytest.fixture
def node(tmp_path, monkeypatch):
    stub = StubNode(tmp_path)
    monkeypatch.setenv("PATH", stub.bin_dir)
    return stub


def _install(node, case, rc=0, stderr=""):
    """An nvbandwidth that prints a recorded output and logs its argv (the interface the probe uses)."""
    log = os.path.join(os.path.dirname(node.bin_dir), "nvbandwidth.argv")
    node.install_executable("nvbandwidth", "#!/bin/sh\necho \"$@\" > %s\n/bin/cat %s\necho %s >&2\nexit %d\n" % (
        shlex.quote(log), shlex.quote(os.path.join(FIXTURES, case + ".txt")), shlex.quote(stderr), rc))
    return log


def _ctx(run=True, gpus=8):
    return NodeContext({"run": run, "node": {"gpus_per_node": gpus}})


def test_probe_runs_the_three_copy_testcases_and_parses_them(node):
    log = _install(node, "h100x8_h2d_d2h_waived_v06")
    facts = nvb_probe.probe(_ctx())
    assert facts["ran"] and facts["rc"] == 0 and not facts["timed_out"]
    assert open(log).read().split() == ["-t"] + list(nvb_probe.TESTCASES)
    assert facts["result"] == fc.expected("nvbandwidth", "h100x8_h2d_d2h_waived_v06")


def test_probe_runs_nothing_outside_burn_in_on_cpu_nodes_or_without_the_tool(node):
    assert nvb_probe.probe(_ctx()) == {"nvbandwidth": None, "ran": False}
    log = _install(node, "h100x8_h2d_d2h_waived_v06")
    assert nvb_probe.probe(_ctx(run=False))["not_started"] == "not this tier (--tier burn-in runs it)"
    assert nvb_probe.probe(_ctx(gpus=0))["not_started"] == "CPU-only node"
    assert not os.path.exists(log)


def test_prepare_runs_it_with_the_burn_in_tier_only():
    assert nvb_rule.prepare({"tier": "burn-in"}, "n1", True) == {"run": True}
    assert nvb_rule.prepare({"tier": "standard"}, "n1", True) == {"run": False}


def _facts(case="a6000x6_d2d_read_v08", scale=None):
    result = copy.deepcopy(fc.expected("nvbandwidth", case))
    for (test, row, col), factor in (scale or {}).items():
        result["tests"][test]["rows"][row][col] *= factor
    return {"nvbandwidth": {"nvbandwidth": "/usr/bin/nvbandwidth", "ran": True, "rc": 0, "timed_out": False,
                            "result": result}}


def test_a_slow_peer_path_fails_isolate_and_a_bit_slow_one_warns():
    v = view({"n1": _facts(), "n2": _facts(), "n3": _facts(scale={(D2D, "3", 4): 0.5}), "n4": _facts(scale={(D2D, "0", 1): 0.8})})
    got = {f.node: f for f in nvb_rule.rule(v)}
    assert got["n1"].status is Status.PASS and got["n2"].status is Status.PASS
    assert got["n3"].status is Status.FAIL and got["n3"].action == "isolate"
    assert "device_to_device_memcpy_read_ce 3->4 13.15 GB/s (fleet median 26.3, 50% below)" in got["n3"].message
    assert got["n4"].status is Status.WARN and got["n4"].action == "retest"


def test_healthy_twins_topology_levels_within_a_node_and_a_small_fleet_are_not_named():
    """26.3 GB/s under one PCIe switch, 21.8 across (NVIDIA/nvbandwidth#50) is the topology, not a fault;
    two nodes are too few for a fleet median: reported, not judged."""
    findings = nvb_rule.rule(view({"n%d" % i: _facts() for i in range(1, 4)}))
    assert [f.status for f in findings] == [Status.PASS] * 3
    small = nvb_rule.rule(view({"n1": _facts(), "n2": _facts(scale={(D2D, "3", 4): 0.5})}))
    assert [f.status for f in small] == [Status.PASS] * 2 and "too few to judge" in small[1].message


def test_skips_errors_and_missing_facts():
    v = view({"n1": {"nvbandwidth": {"nvbandwidth": None, "ran": False}},
              "n2": {"nvbandwidth": {"nvbandwidth": "/usr/bin/nvbandwidth", "ran": False,
                                     "not_started": "not this tier (--tier burn-in runs it)"}},
              "n3": {"nvbandwidth": {"nvbandwidth": "/x", "ran": True, "rc": 1, "timed_out": False, "result": None,
                                     "stderr_tail": "CUDA error: \x1b]52;c;bad\x07 device 3"}},
              "n4": {}})
    got = {f.node: f for f in nvb_rule.rule(v)}
    assert got["n1"].status is Status.SKIP and "not installed" in got["n1"].message
    assert got["n2"].status is Status.SKIP and "not this tier" in got["n2"].message
    assert got["n3"].status is Status.FAIL and "\x1b" not in got["n3"].message and "device 3" in got["n3"].message
    assert got["n4"].status is Status.ERROR

"""The engine runs cross-node tests through Check.crossnode, never by name: a new one needs no engine edit."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from preflight import checks, engine
from preflight.inventory import local_inventory
from preflight.model import Check, Finding, Status


@pytest.fixture
def pair_check(monkeypatch):
    """A second cross-node check, `pairtest`, registered in the catalogue as a module would be."""
    calls = []

    def run(fleet, inv, view, healthy, env, opts):
        calls.append({"healthy": list(healthy), "facts_seen": sorted(view.facts[healthy[0]]) if healthy else []})
        return types.SimpleNamespace(docs={n: {"rtt_ms": 0.5} for n in healthy}, meta={"pairs": len(healthy)})

    def rule(view):
        meta = view.cluster.get("pairtest") or {}
        docs = {n: (view.facts.get(n) or {}).get("pairtest") for n in [x.name for x in view.live]}
        status = Status.PASS if meta.get("pairs") and all(docs.values()) else Status.FAIL
        return [Finding("pairtest", None, status, "pairs %s, docs %s" % (meta.get("pairs"), docs))]

    def summary(findings, meta, seconds):
        return {"verdict": findings[-1].status.value, "pairs": meta.get("pairs"), "timed": seconds is not None}

    def plant(name, **attrs):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []  # a package, as a check folder is: its missing parts (probe.py) are simply not found
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)

    # a check folder as the catalogue reads it: the declaration, rule.py and stage.py (no probe.py)
    declared = Check(name="pairtest", claim="c", why="w", fix="f", order=95, needs=("ssh",))
    plant("preflight.checks.pairtest", CHECK=declared)
    plant("preflight.checks.pairtest.rule", rule=rule)
    plant("preflight.checks.pairtest.stage", run=run, summary=summary)
    # the catalogue gains the check, last (as its order 95 places it)
    monkeypatch.setattr(checks, "_declarations", [dict(checks.entries(), pairtest=declared)])
    monkeypatch.setattr(checks, "_loaded", {})
    return calls


def test_a_declared_crossnode_check_runs_after_the_node_checks_and_is_judged_on_its_facts(pair_check):
    inv = local_inventory(gpus_per_node=0)
    report = engine.run(inv, engine.Options(only=["pairtest"]))
    node = inv.nodes[0].name
    assert pair_check == [{"healthy": [node], "facts_seen": ["ssh"]}]  # after phase 1, on the healthy node
    mine = [f for f in report.findings if f.check == "pairtest"]
    assert [f.status for f in mine] == [Status.PASS], [f.message for f in report.findings]
    assert report.view.facts[node]["pairtest"] == {"rtt_ms": 0.5}
    assert report.summaries["pairtest"] == {"verdict": "pass", "pairs": 1, "timed": True}
    assert "pairtest_s" in report.phase_times and report.allreduce is None


def test_allreduce_declares_the_hook():
    assert checks.get("allreduce").crossnode is not None
    assert [n for n, c in checks.catalogue().items() if c.crossnode is not None] == ["allreduce"]


def test_the_data_network_is_chosen_once_a_run_and_carried_on_the_view(monkeypatch):
    """nic, mtu and ports rules, phase 2's plans and the env file all read datanet.of(view): one choice."""
    from preflight.derived import datanet

    calls = []
    choose = datanet.choose

    def counted(view):
        calls.append(view)
        return choose(view)

    monkeypatch.setattr(datanet, "choose", counted)
    inv = local_inventory(gpus_per_node=0)
    report = engine.run(inv, engine.Options(only=["nic", "mtu", "ports", "nccl_env"], gather_also=("nic",)))
    assert {f.check for f in report.findings} >= {"nic", "mtu", "ports", "nccl_env"}
    assert len(calls) == 1
    assert report.view.derived[datanet.DERIVED] is datanet.of(report.view)  # the later views carry it
    assert len(calls) == 1

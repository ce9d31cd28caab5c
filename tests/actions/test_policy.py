"""The scheduler-neutral drain policy (preflight.actions), the transport registry it is reached through
(preflight.transport.backends), the drain-policy flags, and the history's cordon and resume rows.

The appliers through real schedulers: tests/actions/test_slurm_ops.py, tests/history/test_history_slurm.py
(Slurm) and tests/transport/test_k8s_e2e.py (the real kubectl against tests/sim/kubeapi.py)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from preflight.actions import policy, settings
from preflight.actions.policy import Mark
from preflight.errors import UsageError
from preflight.k8s import nodes as k8s_nodes
from preflight.k8s.kubectl import NodeState
from preflight.model import Finding, Status
from preflight.slurm import drain as slurm_drain
from preflight.transport import backends
from tests.paths import REPO

HOOKS = ("inventory_of", "prepare", "open_fleet", "set_aside", "outputs", "applier")


# --- the registry -----------------------------------------------------------------------------------------------


def test_every_registered_backend_brings_every_hook_and_its_options():
    for b in backends.REGISTRY.values():
        module = b.module()
        missing = [h for h in HOOKS if not callable(getattr(module, h, None))]
        assert not missing, "%s (%s) lacks %s" % (b.name, b.hooks, ", ".join(missing))
        assert b.options, b.name  # each brings its own options (ssh: --accept-new-host-keys)
        assert (b.switch is None) == (not b.chosen_by), b.name
    assert list(backends.REGISTRY)[-1] == "ssh" and backends.get("ssh").switch is None  # the default comes last
    assert backends.inventory_names() == ("ssh", "slurm")
    assert [b.name for b in backends.acting()] == ["slurm", "k8s"]


@pytest.mark.parametrize("given,chosen", [
    ({}, "ssh"), ({"slurm": True}, "slurm"), ({"k8s": True}, "k8s"), ({"selector": "a=b"}, "k8s"),
    ({"k8s": True, "slurm": True}, "k8s"),  # Kubernetes' inventory names --slurm the mistake
])
def test_the_command_line_chooses_the_first_backend_its_options_name(given, chosen):
    args = argparse.Namespace(**dict({"slurm": False, "k8s": False, "selector": None, "k8s_deploy": False}, **given))
    assert backends.chosen(args).name == chosen


def test_the_report_takes_the_unreachable_fix_from_the_backend_that_carried_the_run():
    assert backends.by_kind("local") is backends.get("ssh") and backends.get("ssh").unreachable_fix is None
    assert "slurmd" in backends.by_kind("slurm").unreachable_fix and "agent pod" in backends.by_kind("k8s").unreachable_fix
    assert backends.by_kind(None) is None


def test_no_transport_name_is_compared_above_the_transports():
    """engine, inventory, cli/ and output/ read the registry: a `transport == "slurm"` (or `kind in ("slurm", ...)`)
    comparison there fails here by file and line."""
    pattern = re.compile(r"""(transport|kind)\s*(==|!=|\bin\b|\bnot in\b)\s*[(\[]?\s*["'](ssh|local|slurm|k8s)["']""")
    wrong = []
    for rel in ["preflight/engine.py", "preflight/inventory.py"] + [
            os.path.join(d, f) for d in ("preflight/cli", "preflight/output") for f in os.listdir(os.path.join(REPO, d))
            if f.endswith(".py")]:
        with open(os.path.join(REPO, rel), encoding="utf-8") as fh:
            wrong += ["%s:%d: %s" % (rel, n, line.strip()) for n, line in enumerate(fh, 1) if pattern.search(line)]
    assert not wrong, "read preflight.transport.backends instead:\n" + "\n".join(wrong)


# --- the policy, one for every scheduler ----------------------------------------------------------------------


def _fail(node, check="mtu", action="fix_config"):
    return Finding(check, node, Status.FAIL, "eth1: jumbo frames black-holed", action=action)


def _pass(node):
    return Finding("ssh", node, Status.PASS, "ok")


def _node(name, unschedulable=False, annotation=None, taints=()):
    return NodeState(name=name, address=None, gpus=8, ready=True, unschedulable=unschedulable, resource_version="7",
                     annotations={k8s_nodes.ANNOTATION: annotation} if annotation else {}, taints=list(taints))


def test_slurm_and_kubernetes_marks_say_the_same_thing_in_the_policys_words():
    """A hand drain and a hand cordon are someone else's; preflight's own is out and may come back; a node in
    service may be taken out and has nothing to resume."""
    hand = {"state": ["IDLE", "DRAIN"], "reason": "RMA"}
    ours = {"state": ["IDLE", "DRAIN"], "reason": "preflight: mtu: x"}
    idle = {"state": ["IDLE"], "reason": None}
    assert slurm_drain.mark_of(hand) == Mark(out=True, theirs="drained by someone else: RMA", back="drained by someone else: RMA")
    assert slurm_drain.mark_of(ours) == Mark(out=True)
    assert slurm_drain.mark_of(idle).refuses("drain") is None and slurm_drain.mark_of(idle).refuses("resume")

    taint = [{"key": k8s_nodes.TAINT_KEY, "value": "mtu", "effect": "NoSchedule"}]
    cordon = _node("a", unschedulable=True)
    mine = _node("b", unschedulable=True, annotation="preflight: mtu: x", taints=taint)
    free = _node("c")
    assert k8s_nodes.mark_of(cordon).theirs.startswith("cordoned by someone else: unschedulable without")
    assert k8s_nodes.mark_of(mine) == Mark(out=True)
    assert k8s_nodes.mark_of(free).refuses("drain") is None and k8s_nodes.mark_of(free).refuses("resume")


def test_one_plan_for_both_schedulers_from_the_same_findings():
    findings = [_fail("a"), _pass("b"), _pass("c")] + [_pass(n) for n in "defghij"]
    names = list("abcdefghij")
    slurm = slurm_drain.plan(findings, names, {"b": {"state": ["IDLE", "DRAIN"], "reason": "RMA"},
                                               "c": {"state": ["IDLE", "DRAIN"], "reason": "preflight: mtu: old"}},
                             drain=True, resume=True)
    taint = [{"key": k8s_nodes.TAINT_KEY, "value": "mtu", "effect": "NoSchedule"}]
    state = {n: _node(n) for n in names}
    state["b"] = _node("b", unschedulable=True)
    state["c"] = _node("c", unschedulable=True, annotation="preflight: mtu: old", taints=taint)
    kube = k8s_nodes.plan(findings, state, drain=True, resume=True).plan
    for p in (slurm, kube):
        assert (p.drain, p.resume, list(p.left_alone)) == ({"a": "preflight: mtu: eth1: jumbo frames black-holed"}, ["c"], ["b"])


def test_apply_records_what_it_carried_out_and_leaves_what_someone_took_meanwhile():
    p = policy.Plan(drain={"a": "preflight: x", "b": "preflight: x"}, resume=["c"])
    now = {"a": Mark(), "b": Mark(out=True, theirs="cordoned by someone else: by hand"), "c": Mark(out=True)}
    errors = policy.apply(p, lambda node, kind: None, now.__getitem__)
    assert errors == [] and p.done == [("a", "drain"), ("c", "resume")]
    assert p.left_alone == {"b": "cordoned by someone else during this run: by hand"}
    assert policy.resumed(p, "how") == [{"node": "c", "kind": "resume", "reason": "passed this run (how)", "shadow": False}]


# --- --drain-after N/W, --drain-limit F[/W] ----------------------------------------------------------------------


def test_drain_flags_parse_into_the_history_settings():
    assert settings.parse("--drain-after", "3/7d") == {"drain_after": 3, "drain_window_s": 7 * 86400.0}
    assert settings.parse("--drain-limit", "0.1/1h") == {"breaker_fraction": 0.1, "breaker_window_s": 3600.0}
    assert settings.parse("--drain-limit", "0.25") == {"breaker_fraction": 0.25}
    cluster = {"history": {"drain_after": 5, "reboot_threshold": 3}}
    args = argparse.Namespace(drain_after="2/12h", drain_limit=None, history="h.sqlite")
    settings.apply(args, cluster)
    assert cluster["history"] == {"drain_after": 2, "drain_window_s": 43200.0, "reboot_threshold": 3}
    untouched = {"history": {"drain_after": 5}}
    settings.apply(argparse.Namespace(drain_after=None, drain_limit=None), untouched)
    assert untouched == {"history": {"drain_after": 5}}  # the inventory stays the default source


@pytest.mark.parametrize("flag,text,says", [
    ("--drain-after", "3", "give the window too, N/W"),
    ("--drain-after", "x/7d", "'x' is not a whole number of runs"),
    ("--drain-after", "3/7w", "'7w' is not a duration"),
    ("--drain-after", "0/7d", "drain_after 0 is out of range (1 to 100)"),
    ("--drain-limit", "1.5", "breaker_fraction 1.5 is out of range (0 to 1)"),
    ("--drain-limit", "0.1/0s", "breaker_window_s 0 is out of range"),
])
def test_a_malformed_drain_flag_is_one_usage_error(flag, text, says):
    with pytest.raises(UsageError) as caught:
        settings.parse(flag, text)
    assert says in str(caught.value), str(caught.value)


def test_drain_flags_without_history_are_one_line_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "preflight", "check", "--drain-after", "3/7d"], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=120, cwd=str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == "preflight: error: --drain-after counts runs in the history database; add --history PATH"


# --- the history's cordon and resume rows ------------------------------------------------------------------------


def test_cordons_are_recorded_under_kubernetes_word_and_count_toward_the_breaker(tmp_path):
    from preflight.history import escalation, recorder
    from preflight.history.db import History, epoch
    from tests import history_fleet as fleet

    NODES = fleet.node_names(6)
    with History(str(tmp_path / "h.sqlite")) as h:
        first = fleet.report(0, NODES, [fleet.xid(NODES[0], 3, code=79, action="isolate")])
        out, actions = recorder.decide(h, first, [], {}, lambda fs: [NODES[0]], False, lambda line: None, kind="cordon")
        assert [(a["node"], a["kind"]) for a in actions] == [(NODES[0], "cordon")]
        run = recorder.record(h, None, first, None, actions + [{"node": NODES[1], "kind": "resume", "reason": "passed"}],
                              {}, lambda line: None)
        kinds = h.conn.execute("SELECT n.name, a.kind FROM actions a JOIN nodes n ON n.id = a.node_id WHERE a.run_id=?"
                               " ORDER BY a.kind", (run,)).fetchall()
        assert kinds == [(NODES[0], "cordon"), (NODES[1], "resume")]
        s = escalation.Settings(breaker_fraction=0.2, breaker_window_s=3 * 86400)
        later = epoch(fleet.stamp(1))
        why = escalation.breaker(h, later, s, len(NODES), [NODES[2]], "cordon")
        assert why is not None and why.startswith("2 nodes cordoned by preflight")  # the cordon counted
        assert why.endswith("cordoned nothing new: find the common cause")  # in Kubernetes' word, not Slurm's
        assert escalation.breaker(h, later, escalation.Settings(breaker_fraction=0.5, breaker_window_s=3 * 86400),
                                  len(NODES), [NODES[2]]) is None  # the twin: within the fraction

"""runner.run_probes on plain threads: a probe that raises is reported with where it raised, beside the others' facts."""

from __future__ import annotations

from preflight.probe import runner


def _probes(monkeypatch, behaviours):
    def fake(name, ctx):
        return behaviours[name]()

    monkeypatch.setattr(runner, "_run_probe", fake)
    return runner.run_probes({name: {} for name in behaviours}, timeout_s=30)


def _raise(exc):
    def go():
        raise exc

    return go


def test_a_probe_that_raises_is_named_with_its_place_and_the_others_keep_their_facts(monkeypatch):
    facts = _probes(monkeypatch, {"broken": _raise(ValueError("unexpected sysfs text")), "fine": lambda: {"ok": 1}})
    assert facts["fine"] == {"ok": 1}
    error = facts["broken"]["probe_error"]
    assert error.startswith("ValueError: unexpected sysfs text (at ") and "test_runner_threads.py:" in error
    assert facts["broken"]["message"] == "unexpected sysfs text" and "raw" in facts["broken"]


def test_a_probe_that_calls_sys_exit_is_an_error_not_a_crash(monkeypatch):
    facts = _probes(monkeypatch, {"exits": _raise(SystemExit(3)), "fine": lambda: {"ok": 1}})
    assert facts["exits"]["probe_error"].startswith("SystemExit: 3 (at ")
    assert facts["fine"] == {"ok": 1}


def test_every_healthy_probe_answers(monkeypatch):
    """The healthy twin: many probes at once, each its own facts, none reported as an error."""
    facts = _probes(monkeypatch, {"p%d" % i: (lambda i=i: {"i": i}) for i in range(12)})
    assert facts == {"p%d" % i: {"i": i} for i in range(12)}

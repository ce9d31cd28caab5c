"""What the history says and decides: timelines, flapping nodes, lemons, repeat faults, rates,
incidents; the escalation ladder, the flap-proof drain policy, the circuit breaker and --shadow; the
Prometheus figures and `preflight history` itself. Each fault next to its healthy-but-unusual twin."""

import json

import pytest

from preflight import cli
from preflight.history import escalation, queries, recorder
from preflight.history.db import History, epoch
from preflight.model import Finding, Status
from preflight.output.prometheus import history_metrics
from tests import history_fleet as fleet

NODES = fleet.node_names(6)
A, B, C, D, E, F = NODES


@pytest.fixture
def h(tmp_path):
    with History(str(tmp_path / "h.sqlite")) as db:
        yield db


def _nights(h, plan):
    """plan: {day: (faults, failed_gpus, moved)}; every day in range(max+1) is recorded."""
    for day in range(max(plan) + 1):
        faults, failed, moved = plan.get(day, ([], {}, {}))
        h.record(fleet.report(day, NODES, faults, failed, moved))


def test_timeline_flapping_and_incidents(h):
    # A: fail-pass-fail-pass-fail (flaps); B: fails three nights in a row then recovers (one incident)
    _nights(h, {0: ([fleet.flaky(A)], {}, {}), 2: ([fleet.flaky(A), fleet.undecided(B)], {}, {}),
                3: ([fleet.undecided(B)], {}, {}), 4: ([fleet.flaky(A), fleet.undecided(B)], {}, {}), 5: ([], {}, {})})
    line = queries.timeline(h, A, limit=3)
    assert [r["status"] for r in line] == ["pass", "fail", "pass"]
    assert line[1]["problems"][0]["check"] == "ib_errors" and line[1]["started_at"] == epoch(fleet.stamp(4))
    flaps = queries.flapping(h, window_runs=30, min_flips=2)
    assert [(d["node"], d["pattern"]) for d in flaps] == [(A, "F.F.F."), (B, "..FFF.")]
    assert [d["flips"] for d in flaps] == [5, 2]
    assert queries.flapping(h, min_flips=3) == [flaps[0]]  # B's one long incident is not a flap
    found = queries.incidents(h)
    assert found["nodes"][A]["incidents"] == 3 and found["nodes"][A]["mean_days_between"] == 2.0
    assert found["nodes"][B]["incidents"] == 1 and found["nodes"][B]["consecutive_failures"] == 0
    assert found["nodes"][C]["incidents"] == 0 and found["nodes"][C]["days_since_last"] is None
    assert found["fleet"]["node_days"] == 36.0 and found["fleet"]["incidents"] == 4
    assert found["fleet"]["incidents_per_1000_node_days"] == pytest.approx(1000 * 4 / 36)
    assert queries.timeline(h, "gpu-9999") == []


def test_a_board_failing_in_two_nodes_is_a_lemon_and_a_one_off_is_not(h):
    board = fleet.serial(C, 0)
    # C's GPU 0 fails night 0; the board is moved to D's slot 0 and fails there on night 3.
    # E's GPU 2 fails once (a one-off: not a lemon)
    _nights(h, {0: ([], {C: 0, E: 2}, {}), 2: ([], {}, {board: D}), 3: ([], {D: 0}, {board: D})})
    lemons = queries.lemons(h)
    assert [(d["serial"], d["failed_runs"], d["failed_in"]) for d in lemons] == [(board, 2, ["%s/0" % C, "%s/0" % D])]
    assert lemons[0]["slots"] == ["%s/0" % C, "%s/0" % D]


def test_repeat_faults_count_per_part_and_rates_per_check(h):
    _nights(h, {0: ([fleet.xid(A, 3)], {}, {}), 1: ([fleet.xid(A, 3), fleet.xid(B, 1)], {}, {}),
                2: ([fleet.xid(A, 4)], {}, {})})
    repeats = queries.repeat_faults(h)
    assert [(d["subject"], d["fault"], d["runs"]) for d in repeats] == [("gpu:" + fleet.serial(A, 3), "xid:xid79", 2)]
    rates = {d["check"]: d for d in queries.failure_rates(h)}
    assert rates["xid"]["problems"] == 4 and rates["xid"]["findings"] == 18 and rates["ssh"]["problems"] == 0


# --- escalation ---------------------------------------------------------------------------------


def _ladder(h, docs, s=escalation.Settings()):
    out = []
    for doc in docs:
        out.append([(e.node, e.seen, e.action) for e in escalation.escalate(h, doc, epoch(doc["started_at"]), s)])
        h.record(doc)
    return out


def test_an_xid_on_one_gpu_climbs_reset_reboot_inspect(h):
    docs = [fleet.report(day, NODES, [fleet.xid(A, 3)]) for day in range(5)]
    assert _ladder(h, docs) == [[], [(A, 2, "reboot")], [(A, 3, "reboot")], [(A, 4, "inspect")], [(A, 5, "inspect")]]


def test_a_reboot_class_fault_starts_at_reboot_and_gpuds_threshold_is_a_setting(h):
    docs = [fleet.report(day, NODES, [fleet.xid(A, 3, code=48, action="reboot")]) for day in range(3)]
    assert _ladder(h, docs, escalation.Settings(reboot_threshold=1)) == [[], [(A, 2, "inspect")], [(A, 3, "inspect")]]


def test_the_count_follows_the_board_to_another_node(h):
    board = fleet.serial(A, 0)
    docs = [fleet.report(0, NODES, [fleet.xid(A, 0)]),
            fleet.report(1, NODES, [fleet.xid(D, 0)], moved={board: D})]
    assert _ladder(h, docs) == [[], [(D, 2, "reboot")]]


def test_twins_another_gpu_or_outside_the_window_do_not_escalate(h):
    docs = [fleet.report(0, NODES, [fleet.xid(A, 3)]), fleet.report(1, NODES, [fleet.xid(A, 4)]),
            fleet.report(9, NODES, [fleet.xid(A, 3)])]  # 9 days after its first: outside 7 days
    assert _ladder(h, docs) == [[], [], []]


# --- the drain policy ---------------------------------------------------------------------------


def _finding(r):
    return Finding(r["check"], r["node"], Status(r["status"]), r["message"], action=r.get("action"), data=r.get("data"))


def test_a_flap_is_held_until_seen_twice_a_hardware_fault_drains_at_once(h):
    s = escalation.Settings()
    first = fleet.report(0, NODES, [fleet.flaky(A), fleet.xid(B, 2), fleet.ib_port(C)])
    policy = escalation.drain_policy(h, first, epoch(first["started_at"]), s)
    assert list(policy.held) == [A] and "ib_errors seen in 1 of the 2 runs needed within 7 d (flap-prone check)" in policy.held[A]
    assert policy.confirmed == {}
    h.record(first)
    h.record(fleet.report(1, NODES))  # A clean for a night
    again = fleet.report(2, NODES, [fleet.flaky(A)])
    policy = escalation.drain_policy(h, again, epoch(again["started_at"]), s)
    assert policy.held == {} and policy.confirmed == {}  # seen twice in 7 days: it drains as the check says


def test_a_retest_class_fault_is_held_then_confirmed_and_drained(h):
    s = escalation.Settings()
    docs = [fleet.report(day, NODES, [fleet.undecided(E)]) for day in range(2)]
    policy = escalation.drain_policy(h, docs[0], epoch(docs[0]["started_at"]), s)
    assert list(policy.held) == [E] and "retest-class" in policy.held[E]
    h.record(docs[0])
    policy = escalation.drain_policy(h, docs[1], epoch(docs[1]["started_at"]), s)
    assert policy.held == {} and "gpu_state seen in 2 runs within 7 d" in policy.confirmed[E]
    findings = escalation.drain_input([_finding(r) for r in docs[1]["results"]], policy)
    drained = [f for f in findings if f.node == E and f.status.is_problem]
    assert [f.action for f in drained] == ["isolate"] and "no longer a one-off" in drained[0].message


def test_the_circuit_breaker_counts_drains_across_runs(h):
    s = escalation.Settings(breaker_fraction=0.5, breaker_window_s=3 * 86400)
    run = h.record(fleet.report(0, NODES))
    h.add_actions(run, [{"node": n, "kind": "drain", "reason": "xid"} for n in (A, B)])
    h.add_actions(run, [{"node": C, "kind": "drain", "reason": "xid", "shadow": True}])  # shadow: never drained
    now = epoch(fleet.stamp(1))
    assert escalation.breaker(h, now, s, len(NODES), [C]) is None  # 3 of 6: at the limit, not over it
    why = escalation.breaker(h, now, s, len(NODES), [C, D])
    assert why.startswith("4 nodes drained by preflight within 259200 s with this run's 2 (67% of 6 > breaker_fraction 50%)")
    assert escalation.breaker(h, epoch(fleet.stamp(5)), s, len(NODES), [C, D]) is None  # the old drains left the window


def test_shadow_records_every_decision_and_drains_nothing(h):
    doc = fleet.report(0, NODES, [fleet.xid(B, 2), fleet.flaky(A)])
    findings = [_finding(r) for r in doc["results"]]
    lines = []
    would = lambda fs: sorted({f.node for f in fs if f.status.is_problem and f.action not in (None, "retest")})  # noqa: E731
    out, actions = recorder.decide(h, doc, findings, {}, would, True, lines.append)
    assert [f.node for f in out if f.status.is_problem and f.action != "retest"] == []
    assert sorted((a["node"], a["kind"], a["shadow"]) for a in actions) == [(A, "hold", True), (B, "drain", True)]
    assert "shadow: would have drained %s; drained nothing" % B in lines
    live, actions = recorder.decide(h, doc, findings, {}, would, False, lines.append)
    assert [f.node for f in live if f.status.is_problem and f.action != "retest"] == [B]
    assert [(a["node"], a["kind"], a["shadow"]) for a in actions if a["kind"] == "drain"] == [(B, "drain", False)]


# --- Prometheus and the command -----------------------------------------------------------------


def test_history_metrics_in_the_textfile(h):
    _nights(h, {0: ([fleet.xid(A, 3)], {}, {}), 2: ([fleet.xid(A, 3)], {}, {}), 3: ([fleet.xid(A, 3)], {}, {})})
    text = history_metrics(recorder.metrics(h, {}))
    lines = set(text.splitlines())
    assert 'preflight_history_consecutive_failures{node="%s"} 2' % A in lines
    assert 'preflight_history_incidents{node="%s"} 2' % A in lines
    assert 'preflight_history_seconds_since_last_incident{node="%s"} 86400.0' % A in lines
    assert 'preflight_history_repeat_fault_runs{node="%s",subject="gpu:%s",fault="xid:xid79"} 3' % (A, fleet.serial(A, 3)) in lines
    assert 'preflight_history_consecutive_failures{node="%s"} 0' % B in lines
    assert 'preflight_history_incidents_per_1000_node_days %r' % (1000 * 2 / 24.0) in lines
    assert "preflight_history_runs 4" in lines


def test_preflight_history_table_and_json(h, tmp_path, capsys):
    _nights(h, {0: ([fleet.xid(A, 3)], {}, {}), 1: ([fleet.xid(A, 3)], {}, {})})
    assert cli.main(["history", h.path, "--node", A, "--show", "timeline,repeats,incidents"]) == 0
    out = capsys.readouterr().out
    assert "timeline of %s (newest first)" % A in out and "xid fail: %s GPU 3" % A in out
    assert "gpu:%s  xid:xid79  2" % fleet.serial(A, 3) in out
    assert "fleet: 1 incidents over 12 node-days" in out
    assert cli.main(["history", h.path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 2 and doc["repeats"][0]["runs"] == 2 and "timeline" not in doc


@pytest.mark.parametrize("argv, words", [
    (["history", "/nonexistent/h.sqlite"], "no history database at /nonexistent/h.sqlite"),
    (["history", "{db}", "--show", "lemons,gossip"], "unknown section gossip"),
    (["check", "--shadow"], "--shadow records what would have been drained in the history; add --history PATH"),
])
def test_usage_errors_are_one_line_exit_2(h, capsys, argv, words):
    assert cli.main([a.format(db=h.path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_check_records_each_run_and_the_textfile_carries_the_history(tmp_path, capsys):
    """`preflight check` on this machine, twice, into a database file: two runs, the second run's
    Prometheus file with the history's figures; the database's JSON directory twin is test_e2e_audit."""
    db, prom = tmp_path / "audit.sqlite", tmp_path / "preflight.prom"
    argv = ["check", "--only", "ssh,driver", "--no-progress", "--gpus-per-node", "0", "--history", str(db),
            "--prometheus", str(prom)]
    assert cli.main(argv) in (0, 1)
    assert cli.main(argv + ["--shadow"]) in (0, 1)
    capsys.readouterr()
    with History(str(db)) as h:
        assert h.conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        assert h.conn.execute("SELECT count(*) FROM node_runs WHERE facts_sha256 IS NOT NULL").fetchone()[0] == 2
        first, second = (h.report(r) for (r,) in h.conn.execute("SELECT id FROM runs ORDER BY id"))
        assert second["checks"] == first["checks"] == ["ssh", "driver"]
    assert "preflight_history_runs 2" in prom.read_text().splitlines()
    assert not (tmp_path / "history.sqlite").exists() and sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == []


def test_a_node_read_serial_reaches_the_terminal_escaped(h, capsys):
    evil = "SN\x1b]52;c;cm0gLXJm\x07"
    docs = [fleet.report(day, NODES, [fleet.xid(A, 0)], moved={evil: A}) for day in range(2)]
    h.record(docs[0])
    lines = []
    recorder.decide(h, docs[1], [_finding(r) for r in docs[1]["results"]], {}, None, False, lines.append)
    assert lines == ["escalate: %s xid:xid79 on gpu:SN\\x1b]52;c;cm0gLXJm\\x07 seen in 2 runs within the window: reboot "
                     "(the check said reset_gpu)" % A]
    h.record(docs[1])
    assert cli.main(["history", h.path, "--show", "repeats"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "gpu:SN\\x1b]52;c;cm0gLXJm\\x07" in out


@pytest.mark.parametrize("setting, words", [
    ("drain_after: 0", "drain_after 0 is out of range; use a value from 1 to 100"),
    ("breaker_fraction: 2", "breaker_fraction 2 is out of range"),
    ("flap_checks: [ib_errors, gossip]", "flap_checks must list check names"),
    ("drain_afer: 2", "drain_afer"),
])
def test_bad_history_settings_name_the_line(tmp_path, setting, words):
    from preflight import inventory
    from preflight.errors import InventoryError

    path = tmp_path / "hosts.yaml"
    path.write_text("cluster:\n  history:\n    %s\nnodes: [a]\n" % setting)
    with pytest.raises(InventoryError) as caught:
        inventory.load(str(path))
    assert str(caught.value).startswith("%s:3: " % path) and words in str(caught.value)


def test_history_settings_reach_the_policy(tmp_path):
    from preflight import inventory

    path = tmp_path / "hosts.yaml"
    path.write_text("cluster:\n  history: {drain_after: 3, breaker_fraction: 0.1, flap_checks: [ssh], retention_days: 400}\n"
                    "nodes: [a]\n")
    s = escalation.Settings.from_cluster(inventory.load(str(path)).cluster)
    assert (s.drain_after, s.breaker_fraction, s.flap_checks, s.retention_days, s.reboot_threshold) == (3, 0.1, ("ssh",), 400, 2)


def test_the_history_defaults_have_one_source():
    """Settings' defaults are read from inventory.HISTORY_SETTINGS (no second copy to drift) and it has every key."""
    import ast
    import dataclasses
    import inspect

    from preflight import inventory

    fields = {f.name: f.default for f in dataclasses.fields(escalation.Settings)}
    assert set(fields) == set(inventory.HISTORY_SETTINGS) | {"flap_checks"}, "Settings and HISTORY_SETTINGS list other keys"
    assert fields == dict({k: v[0] for k, v in inventory.HISTORY_SETTINGS.items()}, flap_checks=inventory.HISTORY_FLAP_CHECKS)
    body = ast.parse(inspect.getsource(escalation.Settings)).body[0].body
    copies = [
        "%s = %s" % (st.target.id, ast.unparse(st.value))
        for st in body
        if isinstance(st, ast.AnnAssign) and st.value is not None
        and ast.unparse(st.value) not in ("_default(%r)" % st.target.id, "HISTORY_FLAP_CHECKS")
    ]
    assert not copies, "Settings restates defaults HISTORY_SETTINGS holds: %s" % ", ".join(copies)

"""mtu: the iputils ping parser on recorded output, the plan (ring / mesh), a real ping of 127.0.0.1, the rule."""

import json
import os
import shutil
from pathlib import Path

import pytest

from preflight.checks.mtu import probe as mtu_probe
from preflight.checks.mtu import rule as mtu_rule
from preflight.model import ParseError, Status
from preflight.probe.context import NodeContext
from tests.builders import data_node, names, view
from tests.paths import TESTS

FIXTURES = Path(TESTS) / "fixtures" / "mtu"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


# ---------------------------------------------------------------------------------------------- parser


# parse_ping cases: tests/fixtures/mtu/*.json, run by tests/checks/test_fixtures.py


def test_recorded_pings_are_df_pings():
    for case in CASES:
        assert json.loads((FIXTURES / (case + ".json")).read_text())["argv"][:3] == ["ping", "-M", "do"]


def test_recorded_cases_cover_the_failure_kinds():
    docs = {c: json.loads((FIXTURES / (c + ".json")).read_text()).get("expected") for c in CASES}
    assert docs["success"]["received"] == 3 and docs["success"]["rtt_ms"] == pytest.approx(0.271)
    assert docs["total_loss"]["loss_pct"] == 100.0 and not docs["total_loss"]["too_long"]
    assert docs["local_error_mtu"]["path_mtu"] == 1500 and docs["local_error_mtu"]["too_long"]
    assert docs["sendmsg_message_too_long"]["too_long"] and docs["sendmsg_message_too_long"]["path_mtu"] is None
    assert docs["host_unreachable"]["error"] == "destination host unreachable"


def test_parse_frag_needed_from_a_router():
    out = (
        "PING 10.0.1.12 (10.0.1.12) from 10.0.0.11 ens1f0: 8972(9000) bytes of data.\n"
        "From 10.0.0.1 icmp_seq=1 Frag needed and DF set (mtu = 1500)\n\n"
        "--- 10.0.1.12 ping statistics ---\n"
        "3 packets transmitted, 0 received, +1 errors, 100% packet loss, time 2046ms\n"
    )
    parsed = mtu_probe.parse_ping(out, "", 1)
    assert parsed["path_mtu"] == 1500 and parsed["too_long"] and parsed["errors"] == 1


def test_partial_loss():
    out = (
        "--- x ping statistics ---\n3 packets transmitted, 2 received, 33.3333% packet loss, time 404ms\n"
        "rtt min/avg/max/mdev = 0.050/0.060/0.070/0.010 ms\n"
    )
    parsed = mtu_probe.parse_ping(out)
    assert (
        parsed["received"] == 2
        and parsed["loss_pct"] == pytest.approx(33.3333)
        and parsed["error"] == "1 of 3 replies lost"
    )


@pytest.mark.parametrize(
    "stdout, stderr",
    [
        ("", ""),
        ("PING 198.19.0.4 (198.19.0.4) from 198.19.0.3 eth1: 8972(9000) bytes of data.\n", ""),  # truncated
        ("3 packets transmitted, 3 received, time 2ms\n", ""),  # no loss figure
        ("garbage\n", "more garbage\n"),
    ],
)
def test_parse_rejects_output_it_does_not_understand(stdout, stderr):
    with pytest.raises(ParseError):
        mtu_probe.parse_ping(stdout, stderr, 1)


def test_ping_argv_keeps_hostile_interface_name_as_one_argument():
    argv = mtu_probe.ping_argv("eth$(reboot) x", 8972, "198.19.0.4")
    assert argv == [
        "ping",
        "-M",
        "do",
        "-s",
        "8972",
        "-c",
        "3",
        "-i",
        "0.05",
        "-W",
        "1",
        "-I",
        "eth$(reboot) x",
        "198.19.0.4",
    ]


# ------------------------------------------------------------------------------------------------ plan


def cluster(n=4, mtus=None, down=(), mtu_facts=None, **kw):
    facts = {}
    for i, name in enumerate(names(n), 1):
        facts[name] = {"nic": data_node(i, (mtus or {}).get(name, 9000), name not in down)}
        if mtu_facts is not None and name in mtu_facts:
            facts[name]["mtu"] = mtu_facts[name]
    return view(facts, **kw)


def test_plan_ring_over_chosen_interfaces():
    plan = mtu_rule.plan(cluster(4, down=("n003",)))
    assert plan["n003"] == {"skip": "no data interface (see the nic check)"}
    assert [t["peer"] for t in plan["n001"]["targets"]] == ["n002"]
    assert [t["peer"] for t in plan["n002"]["targets"]] == ["n004"]  # n003 has no data interface
    assert [t["peer"] for t in plan["n004"]["targets"]] == ["n001"]
    cfg = plan["n001"]
    assert cfg["iface"] == "eth1" and cfg["size"] == 8972 and cfg["small_size"] == 1000
    assert cfg["targets"][0]["ip"] == "198.19.0.2" and cfg["source_ip"] == "198.19.0.1"
    json.dumps(plan)


def test_plan_full_mesh():
    plan = mtu_rule.plan(cluster(3, cluster={"mtu_full_mesh": True}))
    assert [t["peer"] for t in plan["n002"]["targets"]] == ["n001", "n003"]


def test_plan_single_node_has_no_targets():
    assert mtu_rule.plan(cluster(1))["n001"]["targets"] == []


# ----------------------------------------------------------------------------------------------- probe


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils ping not installed")
def test_probe_pings_localhost_for_real():
    cfg = {
        "iface": "lo",
        "source_ip": "127.0.0.1",
        "mtu": 1500,
        "size": 1472,
        "small_size": 56,
        "count": 2,
        "targets": [{"peer": "self", "ip": "127.0.0.1"}],
    }
    facts = mtu_probe.probe(NodeContext(cfg))
    if facts["targets"][0]["error"] and "permitted" in facts["targets"][0]["error"]:
        pytest.skip("ping is not permitted here: %s" % facts["targets"][0]["error"])
    t = facts["targets"][0]
    assert t["jumbo_ok"] and t["small_ok"] and t["loss_pct"] == 0.0 and t["size"] == 1472
    json.dumps(facts)


def _lossy_ping(tmp_path, monkeypatch, script):
    """A `ping` on PATH that runs `script` (sh, with $big set when the payload is over 1000 bytes) before, or
    instead of, the real one; every call's argv is logged."""
    real = shutil.which("ping")
    if real is None:
        pytest.skip("no ping here")
    log = tmp_path / "argv.log"
    fake = tmp_path / "ping"
    fake.write_text('#!/bin/sh\necho "$*" >> %s\nbig=; case " $* " in *" -s 1472 "*) big=1;; esac\n%s\nexec %s "$@"\n'
                    % (log, script, real))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    return log


def test_older_iputils_refusing_a_fast_interval_gets_the_slow_one(tmp_path, monkeypatch):
    """iputils before 20210202 refuses -i under 0.2 to users: the probe pings again at 0.2 s (a `ping`
    on PATH that answers as such an iputils does, then runs the real one)."""
    log = _lossy_ping(tmp_path, monkeypatch, 'case " $* " in *" -i 0.05 "*)\n'
                      '  echo "ping: cannot flood; minimal interval allowed for user is 200ms" >&2; exit 2;;\nesac')
    cfg = {"iface": "lo", "source_ip": "127.0.0.1", "mtu": 1500, "size": 1472, "small_size": 56, "count": 2,
           "targets": [{"peer": "self", "ip": "127.0.0.1"}]}
    facts = mtu_probe.probe(NodeContext(cfg))
    t = facts["targets"][0]
    if t["error"] and "permitted" in t["error"]:
        pytest.skip("ping is not permitted here: %s" % t["error"])
    assert t["jumbo_ok"] and t["small_ok"] and t["loss_pct"] == 0.0, t
    intervals = sorted(line.split(" -i ")[1].split()[0] for line in log.read_text().splitlines())
    assert intervals == ["0.05", "0.05", "0.2", "0.2"]  # each ping refused fast, then run at 0.2 s


#: what iputils prints when no reply came back (ping 127.0.0.1 with the packets dropped), exit 1
LOST = ('echo "PING 127.0.0.1 (127.0.0.1) 1472(1500) bytes of data."; echo; echo "--- 127.0.0.1 ping statistics ---"; '
        'echo "3 packets transmitted, 0 received, 100% packet loss, time 102ms"; exit 1')
LO_CFG = {"iface": "lo", "source_ip": "127.0.0.1", "mtu": 1500, "size": 1472, "small_size": 56, "count": 3,
          "targets": [{"peer": "n002", "ip": "127.0.0.1"}]}


def _judged(t):
    facts = ring_facts(2)
    facts["n001"]["targets"][0] = dict(t, peer="n002")
    return [f for f in mtu_rule.rule(cluster(2, mtu_facts=facts)) if f.node == "n001" or f.status != Status.PASS]


def test_a_burst_of_loss_is_confirmed_by_a_slower_second_ping_before_any_verdict(tmp_path, monkeypatch):
    """The healthy-but-unusual twin of a black hole: the first full-size ping loses all three packets (a busy
    moment), the second, slower one gets its replies: the path passes, the first try kept in the facts."""
    log = _lossy_ping(tmp_path, monkeypatch, 'if [ -n "$big" ] && [ ! -e %s/once ]; then : > %s/once; %s; fi'
                      % (tmp_path, tmp_path, LOST))
    t = mtu_probe.probe(NodeContext(dict(LO_CFG)))["targets"][0]
    if t["error"] and "permitted" in str(t["error"]):
        pytest.skip("ping is not permitted here: %s" % t["error"])
    assert t["jumbo_ok"] and t["small_ok"] and t["loss_pct"] == 0.0, t
    assert t["first_try"] == {"loss_pct": 100.0, "error": "3 of 3 replies lost"} and "small_first_try" not in t, t
    calls = log.read_text().splitlines()
    big = [c for c in calls if " -s 1472 " in " %s " % c]
    assert len(big) == 2 and " -i 0.05 " in big[0] and " -i 0.2 " in big[1] and " -W 2 " in big[1], calls
    (passed,) = _judged(t)
    assert passed.status == Status.PASS and passed.message.endswith("(n002 answered the second, slower try only)")


def test_a_black_hole_loses_both_tries_and_fails(tmp_path, monkeypatch):
    _lossy_ping(tmp_path, monkeypatch, 'if [ -n "$big" ]; then %s; fi' % LOST)
    t = mtu_probe.probe(NodeContext(dict(LO_CFG)))["targets"][0]
    if t["small_error"] and "permitted" in str(t["small_error"]):
        pytest.skip("ping is not permitted here: %s" % t["small_error"])
    assert not t["jumbo_ok"] and t["small_ok"] and t["first_try"]["loss_pct"] == 100.0, t
    (fail,) = [f for f in _judged(t) if f.status == Status.FAIL]
    assert fail.message.startswith("n001 → n002: 1472-byte DF ping lost on two tries (56-byte ping ok): jumbo "
                                   "frames black-holed"), fail.message


def test_no_time_left_for_a_second_try_keeps_the_first_and_says_so(tmp_path, monkeypatch):
    """A --timeout too short for the confirmation: the first try's loss stands (as before there was a second
    try), and the evidence says there was none."""
    import time

    log = _lossy_ping(tmp_path, monkeypatch, 'if [ -n "$big" ]; then %s; fi' % LOST)
    t = mtu_probe.probe(NodeContext(dict(LO_CFG), deadline=time.monotonic() + 2.0))["targets"][0]
    if t["small_error"] and "permitted" in str(t["small_error"]):
        pytest.skip("ping is not permitted here: %s" % t["small_error"])
    assert not t["jumbo_ok"] and "first_try" not in t and "; no second try (" in t["error"], t
    assert sum(1 for c in log.read_text().splitlines() if " -s 1472 " in " %s " % c) == 1
    (fail,) = [f for f in _judged(t) if f.status == Status.FAIL]
    assert "lost (56-byte ping ok)" in fail.message


def test_a_ping_that_outruns_its_own_schedule_is_not_tested_not_failed(tmp_path, monkeypatch):
    """ping ends on its own schedule whatever the network does: one still running PING_SLACK_S later is a
    starved node (1,000 simulated nodes on two cores), not evidence against the path: ERROR, retest."""
    monkeypatch.setattr(mtu_probe, "PING_SLACK_S", 0.3)
    _lossy_ping(tmp_path, monkeypatch, 'if [ -n "$big" ]; then exec sleep 30; fi')
    t = mtu_probe.probe(NodeContext(dict(LO_CFG)))["targets"][0]
    assert t["unfinished"] and not t["jumbo_ok"] and t["error"].startswith("ping did not finish within"), t
    (err,) = _judged(t)
    assert err.status == Status.ERROR and err.action == "retest" and "not tested" in err.message, err
    assert not [f for f in _judged(t) if f.status == Status.FAIL]


def test_probe_skip_and_bad_config():
    assert mtu_probe.probe(NodeContext({"skip": "no data interface"})) == {"skipped": "no data interface"}
    with pytest.raises(ValueError):
        mtu_probe.probe(NodeContext({}))


# ------------------------------------------------------------------------------------------------ rule


def target(peer, ip, jumbo=True, small=True, error=None, too_long=False, path_mtu=None, loss=None):
    return {
        "peer": peer,
        "ip": ip,
        "size": 8972,
        "small_size": 1000,
        "jumbo_ok": jumbo,
        "small_ok": small,
        "loss_pct": (0.0 if jumbo else 100.0) if loss is None else loss,
        "small_loss_pct": 0.0 if small else 100.0,
        "rtt_ms": 0.1 if jumbo else None,
        "error": error,
        "small_error": None if small else "3 of 3 replies lost",
        "too_long": too_long,
        "path_mtu": path_mtu,
    }


def ring_facts(n, bad=None, **bad_kw):
    """Ring results where every path touching `bad` lost its jumbo pings."""
    names = ["n%03d" % i for i in range(1, n + 1)]
    out = {}
    for i, name in enumerate(names):
        peer = names[(i + 1) % n]
        broken = bad in (name, peer)
        kw = dict(jumbo=False, **bad_kw) if broken else {}
        out[name] = {"iface": "eth1", "mtu": 9000, "targets": [target(peer, "198.19.0.%d" % ((i + 1) % n + 1), **kw)]}
    return out


def test_all_paths_ok_pass():
    findings = mtu_rule.rule(cluster(4, mtu_facts=ring_facts(4)))
    assert [f.status for f in findings] == [Status.PASS] * 4
    assert findings[0].message == "eth1 mtu 9000: 8972-byte DF pings reach n002"


def test_mtu_mismatch_names_the_minority():
    view = cluster(4, mtus={"n003": 1500}, mtu_facts=ring_facts(4))
    fail = [f for f in mtu_rule.rule(view) if f.status == Status.FAIL]
    assert [f.node for f in fail] == ["n003"]
    assert fail[0].message == "n003 eth1: mtu 1500 (n[001-002,004]: 9000)"


def test_mtu_against_expectation():
    view = cluster(2, mtu_facts=ring_facts(2), expect={"mtu": 4200})
    fail = [f for f in mtu_rule.rule(view) if f.status == Status.FAIL]
    assert {f.node for f in fail} == {"n001", "n002"} and "expected 4200" in fail[0].message


def test_black_holed_node_is_named_as_common_end():
    view = cluster(5, mtu_facts=ring_facts(5, bad="n004"))
    findings = mtu_rule.rule(view)
    fail = [f for f in findings if f.status == Status.FAIL]
    assert {f.node for f in fail} == {"n004"}
    messages = [f.message for f in fail]
    assert "n004 is the common end of 2 failing paths" in messages
    assert "n003 → n004: 8972-byte DF ping lost (1000-byte ping ok): jumbo frames black-holed" in messages
    assert "n004 → n005: 8972-byte DF ping lost (1000-byte ping ok): jumbo frames black-holed" in messages
    passes = {f.node: f for f in findings if f.status == Status.PASS}
    assert set(passes) == {"n001", "n002", "n003", "n005"}
    assert "blamed on n004" in passes["n003"].message


def _untested(peer, ip):
    return dict(target(peer, ip, jumbo=False, small=False, error="ping did not finish within 17.6s"), unfinished=True)


def test_one_failing_path_is_blamed_on_the_end_that_carries_no_full_frame_elsewhere():
    """Recorded at 1,000 simulated nodes: n501 black-holed, its own ping to n502 not tested (too busy), so
    n500 → n501 was the one failing path, and it was FAILed on n500, a healthy node whose path from n499
    carried full-size frames both ways. The fault is at n501's end."""
    facts = ring_facts(5, bad="n003")
    facts["n003"]["targets"][0] = _untested("n004", "198.19.0.4")
    findings = mtu_rule.rule(cluster(5, mtu_facts=facts))
    fail = [f for f in findings if f.status == Status.FAIL]
    assert [f.node for f in fail] == ["n003"], [(f.node, f.message) for f in fail]
    assert fail[0].message.endswith("(n002 carries full-size frames on another path: the fault is at n003's end)")
    status = {f.node: f.status for f in findings}
    assert status["n002"] == Status.PASS and status["n004"] == Status.PASS
    assert "blamed on n003" in next(f.message for f in findings if f.node == "n002")
    assert [f.node for f in findings if f.status == Status.ERROR] == ["n003"]  # its untested path: retest


def test_and_the_pinger_is_blamed_when_it_is_the_end_without_a_full_frame_elsewhere():
    facts = ring_facts(5, bad="n002")  # n001 → n002 and n002 → n003 lose jumbo frames
    facts["n001"]["targets"][0] = _untested("n002", "198.19.0.2")
    findings = mtu_rule.rule(cluster(5, mtu_facts=facts))
    fail = [f for f in findings if f.status == Status.FAIL]
    assert [f.node for f in fail] == ["n002"]
    assert fail[0].message.endswith("(n003 carries full-size frames on another path: the fault is at n002's end)")


def test_one_failing_path_between_two_ends_that_both_carry_full_frames_stays_either_end():
    """Both ends pass full-size frames with their other neighbours: the fault is between them (or a route on
    one), and nothing says which end; unchanged: either end."""
    facts = ring_facts(4)
    facts["n002"]["targets"][0] = target("n003", "198.19.0.3", jumbo=False)
    fail = [f for f in mtu_rule.rule(cluster(4, mtu_facts=facts)) if f.status == Status.FAIL]
    assert [f.node for f in fail] == ["n002"] and "either end" in fail[0].message


def test_no_route_told_apart_from_black_hole():
    view = cluster(3, mtu_facts=ring_facts(3, bad="n002", small=False))
    messages = [f.message for f in mtu_rule.rule(view) if f.status == Status.FAIL]
    assert any(
        "n001 → n002: no reply to 1000-byte pings either: no route, host down or firewall" in m for m in messages
    )


def test_locally_refused_big_ping():
    facts = ring_facts(3)
    facts["n001"]["targets"][0] = target(
        "n002", "198.19.0.2", jumbo=False, too_long=True, path_mtu=1500, error="message too long, mtu=1500"
    )
    fail = [f for f in mtu_rule.rule(cluster(3, mtu_facts=facts)) if f.status == Status.FAIL]
    assert len(fail) == 1 and fail[0].node == "n001"
    assert fail[0].message.startswith("n001 → n002: 8972-byte DF ping refused as too big (message too long, mtu=1500)")
    assert "either end" in fail[0].message


def test_two_node_ring_failing_both_ways_blames_no_one():
    view = cluster(2, mtu_facts=ring_facts(2, bad="n002"))
    fail = [f for f in mtu_rule.rule(view) if f.status == Status.FAIL]
    assert {f.node for f in fail} == {"n001", "n002"}
    assert not any("common end" in f.message for f in fail)


def test_partial_loss_warns():
    facts = ring_facts(2)
    facts["n001"]["targets"][0] = target("n002", "198.19.0.2", loss=33.3)
    warn = [f for f in mtu_rule.rule(cluster(2, mtu_facts=facts)) if f.status == Status.WARN]
    assert [f.node for f in warn] == ["n001"] and "33.3% loss" in warn[0].message


def test_probe_error_skip_and_missing():
    facts = ring_facts(3)
    facts["n001"] = {"probe_error": "RuntimeError: ping is not installed"}
    facts["n002"] = {"skipped": "no data interface (see the nic check)"}
    del facts["n003"]
    found = {f.node: f.status for f in mtu_rule.rule(cluster(3, mtu_facts=facts))}
    assert found == {"n001": Status.ERROR, "n002": Status.ERROR, "n003": Status.ERROR}


def test_common_end():
    assert mtu_rule.common_end([("a", "b"), ("b", "c")]) == "b"
    assert mtu_rule.common_end([("a", "b")]) is None
    assert mtu_rule.common_end([("a", "b"), ("b", "a")]) is None
    assert mtu_rule.common_end([("a", "b"), ("c", "d")]) is None


@pytest.mark.parametrize(
    "line, path_mtu",
    [
        ("ping: local error: Message too long, mtu=1500", 1500),  # iputils <= s20180629
        ("ping: local error: message too long, mtu=1500", 1500),  # iputils >= s20190324, IPv4
        ("ping: local error: message too long, mtu: 1280", 1280),  # iputils >= s20190324, IPv6
        ("ping: sendmsg: Message too long", None),  # strerror(EMSGSIZE), no MTU given
    ],
)
def test_message_too_long_in_every_iputils_spelling(line, path_mtu):
    out = "--- x ping statistics ---\n3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 4ms\n"
    parsed = mtu_probe.parse_ping(out, line + "\n", 1)
    assert parsed["too_long"] is True and parsed["path_mtu"] == path_mtu


def test_mtu_tie_has_no_majority_and_fails_every_node_naming_the_split():
    # Two nodes at 9000, two at 1500: no reference value (preflight.common.majority), so no side is
    # silently taken (the old rule picked the larger MTU and failed only the 1500 nodes).
    view = cluster(4, mtus={"n003": 1500, "n004": 1500}, mtu_facts=ring_facts(4))
    fail = [f for f in mtu_rule.rule(view) if f.status == Status.FAIL and "no majority" in f.message]
    assert [f.node for f in fail] == ["n001", "n002", "n003", "n004"]
    assert fail[2].message == "n003 eth1: mtu 1500 (no majority: 9000 on n[001-002] · 1500 on n[003-004]; set expect.mtu)"
    assert fail[0].expected == "one MTU on every node"

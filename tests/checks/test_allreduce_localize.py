"""preflight.checks.allreduce.localize: pair rounds that name the node to exclude, and groups read from agent documents."""

from __future__ import annotations

import re

import pytest

from preflight.checks.allreduce import localize, plan

from tests.allreduce_docs import GiB, eight_ranks_on, fake_round, hung_entry


def test_plan_pairs_covers_every_node_once():
    nodes = ["n%03d" % i for i in range(1, 9)]
    pairs = localize.plan_pairs(nodes)
    assert pairs == [["n001", "n005"], ["n002", "n006"], ["n003", "n007"], ["n004", "n008"]]
    odd = localize.plan_pairs(nodes[:5])
    assert odd == [["n001", "n003"], ["n002", "n004"]]  # n005 waits for a known-good partner in round 2
    assert localize.plan_pairs(nodes[:3]) == [["n001", "n002"]]  # never the whole cluster as a "pair"
    assert localize.plan_pairs(["n001"]) == [] and localize.plan_pairs([]) == []


def test_eight_nodes_one_bad_is_found_in_two_rounds():
    nodes = ["n%03d" % i for i in range(1, 9)]
    run_round, calls = fake_round({"n004"})
    verdict = localize.localize(nodes, run_round)
    assert list(verdict["bad"]) == ["n004"] and verdict["undecided"] == {}
    # n004 and n008 each beside a good node, and a control pair of two more good nodes
    assert verdict["rounds"] == 2 and len(calls[1]) == 3
    assert all(len(set(g)) == len(g) for g in calls[1]) and len({n for g in calls[1] for n in g}) == 6
    assert [g.get("control", False) for g in verdict["results"] if g["round"] == 1] == [False, False, True]
    assert verdict["message"].startswith("exclude n004: n004 failed beside known-good")


def test_plan_suspects_pairs_each_suspect_with_a_distinct_good_node():
    results = [{"nodes": ["a", "b"], "busbw_gbps": None, "failure": "hung"},
               {"nodes": ["c", "d"], "busbw_gbps": 40.0, "failure": None}]
    assert localize.plan_suspects(results) == [["a", "c"], ["b", "d"]]
    # a hang is judged on completion: no control pair; a bandwidth round gets one when two good nodes are spare
    assert localize.plan_round(results, by_bandwidth=False)["controls"] == []
    wide = results + [{"nodes": ["e", "f"], "busbw_gbps": 40.0, "failure": None}]
    planned = localize.plan_round(wide)
    assert planned["groups"] == [["a", "c"], ["b", "d"]] and planned["controls"] == [["e", "f"]]


def test_odd_count_the_odd_one_out_is_tested_beside_a_good_node():
    nodes = ["n%03d" % i for i in range(1, 6)]
    run_round, calls = fake_round({"n005"})
    verdict = localize.localize(nodes, run_round)
    assert calls[0] == [["n001", "n003"], ["n002", "n004"]] and calls[1][0] == ["n005", "n001"]
    assert calls[1][1:] == [["n003", "n002"]]  # the control pair
    assert list(verdict["bad"]) == ["n005"] and sorted(verdict["good"]) == ["n001", "n002", "n003", "n004"]
    assert verdict["rounds"] == 2


@pytest.mark.parametrize("bad,rounds", [("n003", 2), ("n002", 2), ("n001", 3)])
def test_three_nodes_localize_any_one_bad_node(bad, rounds):
    nodes = ["n001", "n002", "n003"]
    run_round, calls = fake_round({bad})
    verdict = localize.localize(nodes, run_round)
    assert list(verdict["bad"]) == [bad] and not verdict["shared_fault"] and verdict["undecided"] == {}, verdict
    assert verdict["rounds"] == rounds and all(len(g) == 2 for c in calls for g in c)


def test_three_nodes_all_failing_is_shared_after_every_pair_was_tried():
    run_round, calls = fake_round({"n001", "n002", "n003"})
    verdict = localize.localize(["n001", "n002", "n003"], run_round)
    assert verdict["shared_fault"] and verdict["bad"] == {} and len(calls) == 3


def test_more_suspects_than_good_nodes_takes_a_third_round_and_stops():
    nodes = ["n%03d" % i for i in range(1, 7)]
    run_round, calls = fake_round({"n001", "n002"})  # pairs n001+n004, n002+n005 fail; n003+n006 pass
    verdict = localize.localize(nodes, run_round)
    assert sorted(verdict["bad"]) == ["n001", "n002"]
    assert sorted(verdict["good"]) == ["n003", "n004", "n005", "n006"]
    assert verdict["rounds"] <= 1 + localize.max_rounds(6)


def test_every_pair_failing_is_a_shared_fault():
    nodes = ["n%03d" % i for i in range(1, 5)]
    run_round, calls = fake_round(set(nodes))
    verdict = localize.localize(nodes, run_round)
    assert verdict["shared_fault"] and verdict["bad"] == {} and len(calls) == 1
    assert "the fault is shared" in verdict["message"]


def test_a_slow_node_is_localized_without_a_threshold():
    nodes = ["n%03d" % i for i in range(1, 9)]
    run_round, _calls = fake_round(set(), slow={"n007"})
    verdict = localize.localize(nodes, run_round)
    assert list(verdict["bad"]) == ["n007"] and "75% below the fleet median 40.00 GB/s (limit 20%)" in verdict["bad"]["n007"]
    # 25% below the median: named at the default 20%, not when the inventory allows 30%
    run_round, _calls = fake_round(set(), slow={"n007"}, slow_gbps=30.0)
    assert list(localize.localize(nodes, run_round)["bad"]) == ["n007"]
    run_round, _calls = fake_round(set(), slow={"n007"}, slow_gbps=30.0)
    assert localize.localize(nodes, run_round, slow_fraction=0.3)["bad"] == {}


def test_group_result_from_agent_documents():
    sizes = [GiB]
    docs = eight_ranks_on(2, 8, sizes, time_s=0.02)
    g = localize.group_result(["n001", "n002"], {"n001": docs[0], "n002": docs[1]})
    assert g["failure"] is None and g["busbw_gbps"] == pytest.approx(GiB / 0.02 / 1e9 * 1.875, rel=1e-3)
    hung = eight_ranks_on(2, 1, sizes, status={1: hung_entry()})
    g = localize.group_result(["n001", "n002"], {"n001": hung[0], "n002": hung[1]})
    assert g["failure"].startswith("hung at 2 KiB (rank 1")
    g = localize.group_result(["n001", "n002"], {"n001": docs[0]})
    assert g["failure"] == "n002: no result"


def _pair_docs(figures, failed=()):
    """Agent documents with in-process pair entries: figures {(rotation, node a, node b): seconds}."""
    names = sorted({n for (_r, a, b) in figures for n in (a, b)})
    docs = {n: {"backend": "gloo", "world_size": len(names), "ranks": [
        {"rank": i, "status": "ok", "sizes": [], "pairs": [], "pairs_error": None}]} for i, n in enumerate(names)}
    for (r, a, b), t in figures.items():
        ranks = sorted([names.index(a), names.index(b)])
        for n in (a, b):
            if (r, n) not in failed:
                docs[n]["ranks"][0]["pairs"].append({"rotation": r, "ranks": ranks, "bytes": 4 * MB, "time_s": t,
                                                     "min_s": t, "ok": True})
    configs = {n: {"rank_offset": i, "local_world_size": 1} for i, n in enumerate(names)}
    return docs, configs, names


MB = 1 << 20


def test_one_disturbed_pair_measurement_names_nobody_a_slow_link_is_named():
    nodes = ["n%03d" % i for i in range(1, 9)]
    rot = plan.pair_rotations(nodes)
    healthy = {(r, a, b): 0.04 for r, rotation in enumerate(rot) for a, b in rotation}
    noisy = dict(healthy)
    noisy[(1, "n002", "n007")] = 0.12  # a busy neighbour: 3x slower once
    docs, configs, names = _pair_docs(noisy)
    results = localize.pair_results(docs, configs, rot)
    assert len(results) == 12 and all(g["failure"] is None for g in results)
    calls = []
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [], results=results)
    assert verdict["bad"] == {} and verdict["rounds"] == 0 and calls == [], verdict  # no follow-up round
    slow = {k: (4.0 if "n007" in k[1:] else v) for k, v in healthy.items()}  # n007's link throttled
    docs, configs, names = _pair_docs(slow)
    run_round, calls = fake_round(set(), slow={"n007"}, slow_gbps=0.4)
    verdict = localize.localize(names, run_round, results=localize.pair_results(docs, configs, rot))
    # slow beside its three screening partners: confirmed in two more rounds, beside others, with a control
    assert list(verdict["bad"]) == ["n007"] and verdict["rounds"] == localize.CONFIRM_ROUNDS == 2, verdict
    assert calls[0][0][1] != calls[1][0][1]  # a different known-good partner each time
    (suspect, control) = calls[0]
    assert suspect[0] == "n007" and suspect[1] not in ("n003", "n004", "n001") and "n007" not in control
    assert "below the fleet median" in verdict["bad"]["n007"] and "confirmed beside" in verdict["bad"]["n007"]


def test_a_node_slow_in_the_screening_but_fine_on_confirmation_is_not_named():
    """The flake this fixes: under load every screening pair of a healthy node can measure 20-44% low at
    once (they run within a second of each other). A later measurement beside another known-good partner,
    with a control pair at the same moment, clears it, and the evidence says "not confirmed"."""
    nodes = ["n%03d" % i for i in range(1, 9)]
    rot = plan.pair_rotations(nodes)
    disturbed = {(r, a, b): (0.06 if "n006" in (a, b) else 0.04) for r, rotation in enumerate(rot) for a, b in rotation}
    docs, configs, names = _pair_docs(disturbed)
    run_round, calls = fake_round(set())
    verdict = localize.localize(names, run_round, results=localize.pair_results(docs, configs, rot))
    assert verdict["bad"] == {} and verdict["warn"] == {} and verdict["undecided"] == {}, verdict
    assert verdict["rounds"] == 1 and "n006" in verdict["not_confirmed"]
    assert verdict["not_confirmed"]["n006"].startswith("not confirmed: slow: busbw")
    assert verdict["message"].startswith("no node stands out; n006 not confirmed"), verdict["message"]
    # the whole confirmation round slowed by load (control pair too): still not named
    run_round, calls = fake_round(set(), scale=0.5)
    verdict = localize.localize(names, run_round, results=localize.pair_results(docs, configs, rot))
    assert verdict["bad"] == {} and verdict["warn"] == {} and "n006" in verdict["not_confirmed"], verdict


@pytest.mark.parametrize("gbps,level", [(40.0, None), (37.0, None), (34.0, "warn"), (30.0, "bad"), (10.0, "bad")])
def test_ten_percent_below_is_a_warning_twenty_a_failure_once_confirmed(gbps, level):
    nodes = ["n%03d" % i for i in range(1, 9)]
    run_round, calls = fake_round(set(), slow={"n003"}, slow_gbps=gbps)
    verdict = localize.localize(nodes, run_round)
    named = {"bad": list(verdict["bad"]), "warn": list(verdict["warn"])}
    assert named == {k: (["n003"] if k == level else []) for k in named}, verdict
    assert verdict["undecided"] == {}
    if level:  # screening pair, then two confirmation rounds beside other good partners
        assert verdict["rounds"] == 3 and "confirmed beside" in verdict[level]["n003"]
    if level == "warn":
        assert re.search(r"15% below the control n\d+\+n\d+ measured beside it 40.00 GB/s \(limit 10%\)", verdict["warn"]["n003"])


@pytest.mark.parametrize("n", [4, 16, 64, 256])
def test_rounds_stay_logarithmic_and_never_name_a_healthy_node(n):
    """Group halving: a quarter of the fleet bad (hung) and every screening pair failing beside it: each
    round every undecided node sits beside a known-good one, k to a group, k halving; max_rounds(n)
    bounds it, and what is left undecided is said, not guessed."""
    nodes = ["n%03d" % i for i in range(1, n + 1)]
    bad = set(nodes[:: 4])
    run_round, calls = fake_round(bad)
    verdict = localize.localize(nodes, run_round)
    assert verdict["rounds"] <= 1 + localize.max_rounds(n) and localize.max_rounds(n) <= 2 + n.bit_length()
    assert set(verdict["bad"]) <= bad and not set(verdict["good"]) & bad
    assert set(verdict["bad"]) | set(verdict["undecided"]) == bad, verdict["message"]
    if n <= 16:
        assert set(verdict["bad"]) == bad
    # slow nodes (a quarter) are named or left undecided, healthy ones never named
    slow = set(nodes[1:: 4])
    run_round, calls = fake_round(set(), slow=slow, slow_gbps=10.0)
    verdict = localize.localize(nodes, run_round)
    assert not set(verdict["bad"]) - slow and not set(verdict["good"]) & slow
    assert set(verdict["bad"]) | set(verdict["undecided"]) == slow


def test_a_pair_the_phase_did_not_reach_is_a_failed_group_naming_why():
    rot = plan.pair_rotations(["a", "b", "c"])
    docs, configs, _names = _pair_docs({(0, "a", "b"): 0.01, (1, "a", "c"): 0.01, (2, "b", "c"): 0.01},
                                       failed={(1, "c")})
    docs["c"]["ranks"][0]["pairs_error"] = "no progress within the op deadline (10 s) in the pair phase"
    first, second, _third = localize.pair_results(docs, configs, rot)
    assert first["failure"] is None and first["busbw_gbps"] > 0
    assert "c rank 2: pair test did not complete (no progress within the op deadline" in second["failure"]
    # no rank ran the phase (an older agent, or the sweep failed): None, the separate rounds run instead
    for d in docs.values():
        d["ranks"][0]["pairs"] = None
    assert localize.pair_results(docs, configs, rot) is None


def test_three_nodes_the_slow_middle_one_is_named_though_its_pairs_are_the_majority():
    """Issue 23 item 2: with three nodes every pair is measured; two of the three hold the slow node, so the
    median of the pairs is the slow figure. The fleet figure is the median of each node's own median: the
    slow node is named, slow beside both known-good partners and again in a confirmation round."""
    rot = plan.pair_rotations(["a", "b", "c"])
    slow = {(0, "a", "b"): 4.0, (1, "a", "c"): 0.04, (2, "b", "c"): 4.0}  # b's link throttled 100x
    docs, configs, names = _pair_docs(slow)
    results = localize.pair_results(docs, configs, rot)
    unconfirmed = localize.localize(names, lambda groups: [], results=results)
    assert unconfirmed["bad"] == {} and "b" in unconfirmed["undecided"], unconfirmed  # no second moment: not named
    assert unconfirmed["message"].startswith("could not localize b")
    run_round, calls = fake_round(set(), slow={"b"}, slow_gbps=0.001, healthy_gbps=0.05)
    verdict = localize.localize(names, run_round, results=results)
    assert list(verdict["bad"]) == ["b"] and verdict["good"] == ["a", "c"], verdict
    assert verdict["bad"]["b"].startswith("failed beside known-good a: slow: busbw"), verdict["bad"]
    # three nodes: no spare pair, so each round's control shares the partner (the round alternates them)
    assert calls == [[["b", "a"], ["c", "a"]], [["b", "c"], ["a", "c"]]]
    assert [g.get("control", False) for g in verdict["results"] if g["round"] > 0] == [False, True, False, True]
    # the twin: three healthy nodes, one pair disturbed once (a busy neighbour): nobody is named
    noisy = {(0, "a", "b"): 0.04, (1, "a", "c"): 0.04, (2, "b", "c"): 0.07}
    docs, configs, names = _pair_docs(noisy)
    calls = []
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [],
                                results=localize.pair_results(docs, configs, rot))
    assert verdict["bad"] == {}, verdict


def test_a_node_test_names_a_node_only_when_every_confirmation_beside_a_known_good_node_is_low():
    from preflight.checks.allreduce import judge

    def g(node, bw, pas=0, **kw):
        return dict({"nodes": [node], "busbw_gbps": bw, "best_gbps": bw, "failure": None, "pass": pas}, **kw)

    first = [g("a", 1.0), g("b", 1.02), g("c", 0.98), g("d", 0.6)]
    assert judge.node_suspects(first) == (["d"], ["b", "a", "c"])
    both_low = first + [g("d", 0.5, 1, beside="b"), g("b", 1.0, 1, control_for="d"),
                        g("d", 0.55, 1, beside="a"), g("a", 1.1, 1, control_for="d")]
    verdict = judge.judge_nodes(both_low)
    assert list(verdict["fail"]) == ["d"] and "below b measured beside it" in verdict["fail"]["d"]
    assert "below a measured beside it" in verdict["fail"]["d"]
    one_fine = first + [g("d", 0.5, 1, beside="b"), g("b", 1.0, 1, control_for="d"),
                        g("d", 1.05, 1, beside="a"), g("a", 1.1, 1, control_for="d")]
    verdict = judge.judge_nodes(one_fine)
    assert verdict["fail"] == {} and verdict["warn"] == {} and verdict["not_confirmed"]["d"].startswith("not confirmed")
    # the whole machine slowed during the confirmation (the control as much as the suspect): not named
    loaded = first + [g("d", 0.3, 1, beside="b"), g("b", 0.31, 1, control_for="d")]
    assert judge.judge_nodes(loaded)["fail"] == {}


def _three_screened_low(node="b"):
    """Three healthy nodes whose screening caught `node` in a busy moment: both its pairs 44% low."""
    rot = plan.pair_rotations(["a", "b", "c"])
    figures = {(r, x, y): (0.0714 if node in (x, y) else 0.04) for r, rotation in enumerate(rot) for x, y in rotation}
    docs, configs, names = _pair_docs(figures)
    return names, localize.pair_results(docs, configs, rot)


def test_three_healthy_nodes_a_load_burst_during_the_confirmation_names_nobody():
    """The verdict defect (tests/e2e/test_allreduce.py, 3 nodes, load 18): the screening caught b low beside
    both partners, then CPU load came back during both confirmation rounds. Judged against the screening's
    median, measured earlier, b was confirmed "44% below the fleet median". Each round now times a control
    beside the suspect pair (on 3 nodes alternating with it, sharing the partner); the burst slows the
    control as much, and nobody is named."""
    names, results = _three_screened_low()
    healthy = 4 * MB / 0.04 / 1e9  # the screening's healthy pairs, GB/s
    run_round, calls = fake_round(set(), healthy_gbps=healthy, scale=0.56)  # the whole round slowed by the burst
    verdict = localize.localize(names, run_round, results=results)
    assert verdict["bad"] == {} and verdict["warn"] == {} and verdict["undecided"] == {}, verdict
    assert "b" in verdict["not_confirmed"] and verdict["rounds"] == 1, verdict
    assert all(len(c) == 2 for c in calls), calls  # every round held a control
    # the twin: b's link really slow, its control healthy at the same moment: named, with that evidence
    run_round, calls = fake_round(set(), slow={"b"}, slow_gbps=0.001, healthy_gbps=healthy)
    verdict = localize.localize(names, run_round, results=results)
    assert list(verdict["bad"]) == ["b"] and "measured beside it" in verdict["bad"]["b"], verdict


def test_a_round_without_a_control_clears_a_node_but_never_confirms_one():
    """A round whose control did not complete is judged against the screening's median (another moment):
    it can clear the suspect, never name it; the node is "not confirmed" (a WARN: retest), not a FAIL."""
    names, results = _three_screened_low()

    def no_control(groups):
        return [{"nodes": g, "busbw_gbps": 0.001, "failure": None} if i == 0 else
                {"nodes": g, "busbw_gbps": None, "failure": "c rank 2: pair test did not complete"}
                for i, g in enumerate(groups)]

    verdict = localize.localize(names, no_control, results=results)
    assert verdict["bad"] == {} and verdict["warn"] == {}, verdict
    assert "not confirmed: no control pair was timed beside it (retest)" in verdict["undecided"]["b"], verdict


def test_groups_sharing_a_node_alternate_in_one_launch():
    assert localize.interleaved([["b", "a"], ["d", "c"]]) == []  # disjoint: side by side
    turns = localize.interleaved([["b", "a"], ["c", "a"]])
    # every other alternation reversed: a burst from the round's start holds no more of one side's turns
    assert turns == [[["b", "a"]], [["c", "a"]], [["c", "a"]], [["b", "a"]], [["b", "a"]], [["c", "a"]]]
    assert localize.ALTERNATIONS == 3
    measured = [{"nodes": ["b", "a"], "busbw_gbps": v, "best_gbps": v + 1, "failure": None, "bytes": 4}
                for v in (1.0, 3.0, 2.0)] + [{"nodes": ["a", "c"], "busbw_gbps": 5.0, "failure": None}] * 2
    merged = localize.merge_turns([["b", "a"], ["c", "a"], ["b", "c"]], measured)
    assert merged[0] == {"nodes": ["b", "a"], "busbw_gbps": 2.0, "best_gbps": 4.0, "failure": None, "turns": 3,
                         "bytes": 4, "turn_gbps": [2.0, 4.0, 3.0]}
    assert merged[1]["busbw_gbps"] == 5.0 and merged[1]["failure"] is None
    assert merged[2]["failure"] == "no result"


def _turn_round(suspect_turns, control_turns):
    """run_round for localize(): an interleaved round (the suspect's group and its control share a node) whose
    turns measured these figures (GB/s, each side's in its own launch order), merged as stage._Rounds does."""

    def run_round(groups):
        turns = localize.interleaved(groups)
        assert turns, groups  # 3 nodes: the control shares the partner
        figures = {0: list(suspect_turns), 1: list(control_turns)}
        measured = [{"nodes": side[0], "busbw_gbps": figures[groups.index(side[0])].pop(0), "failure": None,
                     "bytes": 4 * MB} for side in turns]
        return localize.merge_turns(groups, measured)

    return run_round


def test_a_confirmation_needs_the_suspects_turns_apart_from_its_controls():
    """The suite's flake (tests/e2e/test_allreduce_confirm.py, a healed node): 23% and 25% below its control
    on the median of three turns, in two rounds running, and named FAIL. A median of three short turns moves
    with load that lasts two of them; a round now confirms only when every turn of the suspect measured below
    every turn of its control. Here one of b's turns is as fast as the control's: not named, retest."""
    names, results = _three_screened_low()
    run_round = _turn_round([0.07, 0.072, 0.096], [0.095, 0.094, 0.1])  # medians 24% apart
    verdict = localize.localize(names, run_round, results=results)
    assert verdict["bad"] == {} and verdict["warn"] == {}, verdict
    why = verdict["undecided"]["b"]
    assert "not confirmed: its turns overlapped its control's (busbw" in why and why.endswith("(retest)"), why
    rounds = [g for g in verdict["results"] if g["round"] > 0 and "b" in g["nodes"]]
    assert rounds and all(g["turn_gbps"] == [0.07, 0.072, 0.096] for g in rounds), rounds
    # the twin: the same medians, every turn of b below every turn of its control: named, as before
    run_round = _turn_round([0.07, 0.072, 0.073], [0.095, 0.094, 0.1])
    verdict = localize.localize(names, run_round, results=results)
    assert list(verdict["bad"]) == ["b"] and "confirmed beside" in verdict["bad"]["b"], verdict
    assert "slow: busbw" in verdict["bad"]["b"] and "overlapped" not in verdict["bad"]["b"], verdict


def _with_recheck(docs, names, turns):
    """Add the ranks' recheck entries (bench_worker._recheck): turns [(rotation, a, b, seconds, control)]."""
    for r, a, b, t, control in turns:
        ranks = sorted([names.index(a), names.index(b)])
        for n in (a, b):
            docs[n]["ranks"][0]["pairs"].append(dict({"rotation": r, "ranks": ranks, "bytes": 4 * MB, "time_s": t,
                                                      "min_s": t, "ok": True, "recheck": True},
                                                     **({"control": True} if control else {})))
    return docs


def test_the_screenings_recheck_clears_a_busy_moment_without_a_round_and_keeps_a_slow_link():
    """Healthy 4 nodes: n003's two screening pairs caught a busy moment (both 2x slow). The ranks re-measured
    it in-process beside n004 with n001+n002 as the control at the same moment: fine, so no round is
    launched, and the evidence says "not confirmed". Its twin: the recheck slow as well (a throttled link):
    the rounds still run and name it."""
    names = ["n001", "n002", "n003", "n004"]
    rot = plan.pair_rotations(names)
    screening = {(0, "n001", "n003"): 0.08, (0, "n002", "n004"): 0.04, (1, "n001", "n004"): 0.04,
                 (1, "n002", "n003"): 0.08}
    docs, configs, _n = _pair_docs(screening)
    docs = _with_recheck(docs, names, [(2, "n003", "n004", 0.042, False), (2, "n001", "n002", 0.04, True)])
    results = localize.pair_results(docs, configs, rot)
    assert [(g["nodes"], g.get("recheck", False), g.get("control", False)) for g in results][4:] == [
        (["n001", "n002"], True, True), (["n003", "n004"], True, False)]
    calls = []
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [], results=results)
    assert calls == [] and verdict["rounds"] == 0 and verdict["bad"] == {} and verdict["undecided"] == {}, verdict
    assert verdict["not_confirmed"]["n003"].startswith("not confirmed: slow: busbw"), verdict
    # the twin: slow on the recheck too, against its control: rounds follow and name it
    docs, configs, _n = _pair_docs({k: (4.0 if v > 0.05 else v) for k, v in screening.items()})
    docs = _with_recheck(docs, names, [(2, "n003", "n004", 4.0, False), (2, "n001", "n002", 0.04, True)])
    run_round, calls = fake_round(set(), slow={"n003"}, slow_gbps=0.001, healthy_gbps=4 * MB / 0.04 / 1e9)
    verdict = localize.localize(names, run_round, results=localize.pair_results(docs, configs, rot))
    assert list(verdict["bad"]) == ["n003"] and verdict["rounds"] == 2, verdict


def test_a_recheck_whose_control_ran_alone_still_clears_a_node_fine_against_the_fleet():
    """Measured (benchmarks/allreduce_rounds.py, 4 healthy nodes, load 39): n001 was 11% low beside both partners;
    its recheck beside n002 measured 0.167 GB/s, as good as the screening's median, while the control n003+n004,
    timed at once, got the two cores to itself and measured 0.598. Judged against that control alone a round
    was ordered; the recheck only clears, so the screening's median suffices and no round runs."""
    names = ["n001", "n002", "n003", "n004"]
    rot = plan.pair_rotations(names)
    secs = {gbps: 4 * MB / (gbps * 1e9) for gbps in (0.124, 0.1777, 0.1251, 0.1442)}  # the GB/s measured
    screening = {(0, "n001", "n003"): secs[0.124], (0, "n002", "n004"): secs[0.1777],
                 (1, "n001", "n004"): secs[0.1251], (1, "n002", "n003"): secs[0.1442]}
    docs, configs, _n = _pair_docs(screening)
    docs = _with_recheck(docs, names, [(2, "n001", "n002", 4 * MB / 0.1669e9, False),
                                       (2, "n003", "n004", 4 * MB / 0.5981e9, True)])
    calls = []
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [],
                                results=localize.pair_results(docs, configs, rot))
    assert calls == [] and verdict["bad"] == {} and verdict["undecided"] == {}, verdict
    assert "n001" in verdict["not_confirmed"], verdict


def test_may_start_is_asked_with_the_groups_of_the_round_it_would_start():
    """localize asks before each round after the screening, naming that round's groups (controls included)."""
    asked = []
    slow = {"nodes": ["a", "b"], "busbw_gbps": 1.0, "best_gbps": 1.0, "failure": None}
    fast = {"nodes": ["c", "d"], "busbw_gbps": 10.0, "best_gbps": 10.0, "failure": None}
    verdict = localize.localize(["a", "b", "c", "d"], lambda groups: [], threshold=5.0, results=[slow, fast],
                                may_start=lambda groups: asked.append(groups) or False)
    assert verdict["out_of_time"] is True and verdict["rounds"] == 0
    assert asked and all(isinstance(g, list) for g in asked[0]) and {"a", "b"} & {n for g in asked[0] for n in g}


def test_a_round_that_failed_with_its_control_names_nobody_one_whose_control_completed_does():
    """On 3 nodes a round is one launch of the suspect's pair and its control, alternating: a stall of any of
    its ranks past the op deadline ends every group of it (tests/e2e/test_allreduce_confirm.py). A failure
    shared with the round's control is the moment's, not the suspect's: it names nobody, and the next round
    measures again (b, healthy, is cleared). The twin: the control completed while b's group failed: b is
    named at once, as before; and a failed recheck (which only clears) sends b to the rounds, never names it."""
    names, results = _three_screened_low()
    healthy = 4 * MB / 0.04 / 1e9
    calls = []

    def stalled_then_fine(groups):
        calls.append(groups)
        if len(calls) == 1:  # the whole launch hung: every group of it, the control too
            return [{"nodes": g, "busbw_gbps": None, "failure": "hung at 4 MiB (rank 0: no progress within the op "
                     "deadline (6 s))"} for g in groups]
        return [{"nodes": g, "busbw_gbps": healthy, "failure": None} for g in groups]

    verdict = localize.localize(names, stalled_then_fine, results=results)
    assert verdict["bad"] == {} and verdict["warn"] == {} and verdict["undecided"] == {}, verdict
    assert "b" in verdict["not_confirmed"] and verdict["rounds"] == 2, verdict
    # with no round after it, the spoiled round leaves b undecided and says why: retest
    calls.clear()
    spoiled = localize.localize(names, stalled_then_fine, results=results, max_rounds_=1)
    assert spoiled["bad"] == {} and "its control failed in the same round (retest)" in spoiled["undecided"]["b"]

    def control_completed(groups):
        return [{"nodes": g, "busbw_gbps": None, "failure": "hung at 4 MiB"} if "b" in g else
                {"nodes": g, "busbw_gbps": healthy, "failure": None} for g in groups]

    verdict = localize.localize(names, control_completed, results=results)
    assert list(verdict["bad"]) == ["b"] and verdict["rounds"] == 1, verdict
    assert verdict["bad"]["b"].startswith("failed beside known-good") and "hung at 4 MiB" in verdict["bad"]["b"]
    recheck = [dict({"nodes": g}, round=0, recheck=True, busbw_gbps=None, failure="b rank 1: pair test did not complete",
                    **({"control": True} if i else {})) for i, g in enumerate([["b", "a"], ["c", "a"]])]
    verdict = localize.localize(names, lambda groups: [], results=results + recheck, max_rounds_=0)
    assert verdict["bad"] == {} and "b" in verdict["undecided"], verdict

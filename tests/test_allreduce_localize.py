"""preflight.allreduce.localize: pair rounds that name the node to exclude, and groups read from agent documents."""

from __future__ import annotations

import pytest

from preflight.allreduce import localize, plan

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
    assert verdict["rounds"] == 2 and len(calls[1]) == 2  # n004 and n008 each beside a good node
    assert all(len(set(g)) == len(g) for g in calls[1])
    assert verdict["message"].startswith("exclude n004: n004 failed beside known-good")


def test_plan_suspects_pairs_each_suspect_with_a_distinct_good_node():
    results = [{"nodes": ["a", "b"], "busbw_gbps": None, "failure": "hung"},
               {"nodes": ["c", "d"], "busbw_gbps": 40.0, "failure": None}]
    assert localize.plan_suspects(results) == [["a", "c"], ["b", "d"]]
    assert localize.plan_suspects(results, suspects=["b"], good=["d"]) == [["b", "d"]]


def test_odd_count_the_odd_one_out_is_tested_beside_a_good_node():
    nodes = ["n%03d" % i for i in range(1, 6)]
    run_round, calls = fake_round({"n005"})
    verdict = localize.localize(nodes, run_round)
    assert calls[0] == [["n001", "n003"], ["n002", "n004"]] and calls[1] == [["n005", "n001"]]
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
    assert verdict["rounds"] <= localize.MAX_ROUNDS


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
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [],
                                 results=localize.pair_results(docs, configs, rot))
    assert list(verdict["bad"]) == ["n007"] and calls == [], verdict
    assert "below the fleet median" in verdict["bad"]["n007"]


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
    slow node is named, confirmed beside both known-good partners."""
    rot = plan.pair_rotations(["a", "b", "c"])
    slow = {(0, "a", "b"): 4.0, (1, "a", "c"): 0.04, (2, "b", "c"): 4.0}  # b's link throttled 100x
    docs, configs, names = _pair_docs(slow)
    verdict = localize.localize(names, lambda groups: [], results=localize.pair_results(docs, configs, rot))
    assert list(verdict["bad"]) == ["b"] and verdict["good"] == ["a", "c"], verdict
    assert verdict["bad"]["b"].startswith("failed beside known-good a: slow: busbw"), verdict["bad"]
    # the twin: three healthy nodes, one pair disturbed once (a busy neighbour): nobody is named
    noisy = {(0, "a", "b"): 0.04, (1, "a", "c"): 0.04, (2, "b", "c"): 0.07}
    docs, configs, names = _pair_docs(noisy)
    calls = []
    verdict = localize.localize(names, lambda groups: calls.append(groups) or [],
                                results=localize.pair_results(docs, configs, rot))
    assert verdict["bad"] == {}, verdict

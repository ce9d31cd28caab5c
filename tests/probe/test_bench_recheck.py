"""preflight.probe.bench_worker.recheck_plan: which nodes the in-process pair screening re-measures before the
controller orders a localization round, beside whom, and with which control timed at the same moment."""

from __future__ import annotations

from preflight.probe import bench_worker


def _four(slow_pairs):
    """Four nodes in the screening's two rotations (plan.pair_rotations): pairs 0+2, 1+3, then 0+3, 1+2."""
    pairs = [[0, 2], [1, 3], [0, 3], [1, 2]]
    times = [0.08 if p in slow_pairs else 0.04 for p in range(4)]
    return pairs, times


def test_a_node_low_beside_every_partner_is_rechecked_beside_a_new_partner_with_a_control_at_once():
    pairs, times = _four({0, 3})  # node 2 low beside both its partners (0 and 1)
    turns = bench_worker.recheck_plan(pairs, times, times, 0.1)
    assert turns == [[([2, 3], False), ([0, 1], True)]]  # beside 3, which it had not met; control 0+1, same turn


def test_healthy_or_one_disturbed_pair_rechecks_nothing():
    for slow in (set(), {0}, {1}):  # one low pair: both its nodes passed beside another partner
        pairs, times = _four(slow)
        assert bench_worker.recheck_plan(pairs, times, times, 0.1) == [], slow
    # the best iteration is the benefit of the doubt: a pair whose median was spoiled but whose best was not
    pairs, times = _four({0, 3})
    assert bench_worker.recheck_plan(pairs, times, [0.04] * 4, 0.1) == []


def test_three_nodes_the_control_shares_the_partner_and_alternates_with_the_suspect():
    pairs = [[0, 1], [0, 2], [1, 2]]  # plan.pair_rotations of three nodes: every pair, one a rotation
    times = [0.07, 0.04, 0.07]  # node 1 low beside both
    turns = bench_worker.recheck_plan(pairs, times, times, 0.1)
    suspect, control = [([1, 0], False)], [([2, 0], True)]
    assert turns == [suspect, control, control, suspect, suspect, control]  # every other alternation reversed
    assert bench_worker.RECHECK_ALTERNATIONS == 3
    # every pair alike (the whole machine slow): nobody stands out, nothing to recheck
    assert bench_worker.recheck_plan(pairs, [0.07] * 3, [0.07] * 3, 0.1) == []

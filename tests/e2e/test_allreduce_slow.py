"""The all-reduce end to end with a throttled data link (every packet arrives, late), on four nodes with no
threshold: named slow against the fleet. Three nodes (the throttled node is in two of the three pairs, yet it
alone is named, with a stall of its partner on top): tests/e2e/test_allreduce_confirm.py's twin.

Shared helpers: tests/e2e/allreduce_sim.py.
"""

from __future__ import annotations

from tests.e2e.allreduce_sim import allreduce_results, inventory, report_time, run_preflight


def test_a_throttled_data_link_is_named_slow_by_the_fleet_with_no_threshold(sim_cluster):
    cluster = sim_cluster(4)
    cluster.throttle(3)  # n003's eth1 at 8 Mbit/s: every packet arrives, late
    rc, doc, wall = run_preflight(cluster, inventory(cluster, {"init_timeout": 120, "op_timeout": 10}),
                                  "--only", "allreduce")
    assert rc == 1
    section = doc["allreduce"]
    mains = [r for r in allreduce_results(doc) if r["node"] is None]
    assert len(mains) == 1 and mains[0]["status"] == "fail", mains  # one cluster verdict, never a PASS beside it
    main = mains[0]
    # the sweep ends before a size that would run into the op deadline: a slow measurement, no reset
    assert main["message"].startswith("all-reduce busbw ") and "sweep stopped before" in main["message"], main
    assert "Connection" not in main["message"] and "no absolute threshold set: judged against the fleet" in main["message"]
    assert section["localization"]["exclude"] == ["n003"], section["localization"]
    # slow beside both its screening partners (in-process rotations), who passed beside others; then
    # confirmed in two rounds beside other known-good partners, each with a control pair timed at the same moment
    assert section["localization"]["in_process_rotations"] == 2 and section["localization"]["rounds"] == 2
    (named,) = [r for r in allreduce_results(doc, "fail") if r["node"] is not None]
    assert named["node"] == "n003" and "slow: busbw" in named["message"] and "below the fleet median" in named["message"]
    assert "confirmed beside" in named["message"] and "measured beside it" in named["message"], named
    # the sweep completed on every node (slow is the fleet's verdict, not a node's fault), so it left no
    # spares and the first round starts cold; the second round's ranks were started during the first and
    # adopted (preflight.probe.bench_spares)
    assert section["timings_s"]["rounds_warm_ranks"] == [0, 4], section["timings_s"]
    report_time("4 nodes, n003's data link throttled, no threshold", wall, section)
    assert cluster.leftover_processes() == {}

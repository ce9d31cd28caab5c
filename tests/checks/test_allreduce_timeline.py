"""The first launch's timeline (stage._timeline): each step's earliest and latest time over the ranks,
from the controller's bench call, out of the agents' documents (bench_agent: "at")."""

from __future__ import annotations

from preflight.checks.allreduce import stage


def _doc(start, end, *ranks):
    return {"at": {"start": start, "end": end}, "ranks": [{"at": r} for r in ranks]}


def test_each_step_spans_its_earliest_and_latest_rank_in_order_from_the_bench_call():
    t0 = 1000.0
    docs = {
        "n001": _doc(1000.1, 1009.0, {"imported": 998.0, "store": 1004.0, "init_done": 1004.5, "done": 1008.0,
                                      "exit": 1008.9}),
        "n002": _doc(1000.2, 1008.7, {"imported": 1003.5, "store": 1003.9, "init_done": 1004.5, "done": 1008.1,
                                      "exit": 1008.6}),
    }
    line = stage._timeline(docs, t0)
    # a warm rank that imported during the node checks is before the bench call: negative
    assert line == {"agent_start": [0.1, 0.2], "imported": [-2.0, 3.5], "store": [3.9, 4.0],
                    "init_done": [4.5, 4.5], "done": [8.0, 8.1], "exit": [8.6, 8.9], "agent_end": [8.7, 9.0]}
    assert list(line) == ["agent_start", "imported", "store", "init_done", "done", "exit", "agent_end"]


def test_a_rank_that_never_got_somewhere_leaves_the_step_to_those_that_did():
    # a tree's agent without "at" (an older bundle) or a rank killed at its import: only what was seen
    docs = {"n001": {"ranks": [{"status": "timeout"}]},
            "n002": _doc(10.0, 12.0, {"imported": 11.0})}
    assert stage._timeline(docs, 10.0) == {"agent_start": [0.0, 0.0], "imported": [1.0, 1.0],
                                           "agent_end": [2.0, 2.0]}
    assert stage._timeline({}, 10.0) == {}

"""preflight.checks.allreduce.plan: the agents' configs, the cluster metadata skeleton, sweeps, pair rotations."""

from __future__ import annotations

from preflight.checks.allreduce import localize, plan
from preflight.model import NodeInfo

from tests.allreduce_docs import GiB, KiB, MiB, doc


def test_make_configs_and_cluster_meta():
    nodes = [NodeInfo("n001", "h1", 8), NodeInfo("n002", "h2", 8, settings={"python": "/opt/py/bin/python3"})]
    cfgs = plan.make_configs(nodes, "10.0.0.1", 29501, env={"NCCL_SOCKET_IFNAME": "=eth1"})
    assert [c["rank_offset"] for c in cfgs.values()] == [0, 8]
    assert cfgs["n002"]["world_size"] == 16 and cfgs["n002"]["backend"] == "nccl"
    assert cfgs["n002"]["sizes"] == plan.GPU_SIZES and cfgs["n002"]["python"] == "/opt/py/bin/python3"
    meta = plan.cluster_meta(cfgs)
    assert meta["ranks"] == {"n001": [0, 7], "n002": [8, 15]} and meta["master"] == "10.0.0.1:29501"
    cpu = plan.make_configs([NodeInfo("c1", "c1", 0), NodeInfo("c2", "c2", 0)], "c1")
    assert [c["local_world_size"] for c in cpu.values()] == [1, 1] and cpu["c1"]["backend"] == "gloo"
    assert plan.outer_deadline(cpu["c1"]) > cpu["c1"]["deadlines"]["total_s"]


def test_default_sweeps():
    assert plan.GPU_SIZES[0] == MiB and plan.GPU_SIZES[-1] == 4 * GiB
    assert plan.CPU_SIZES[0] == KiB and plan.CPU_SIZES[-1] == 4 * MiB
    assert any(1500 < s <= 9000 for s in plan.CPU_SIZES) and any(s > 9000 for s in plan.CPU_SIZES)


def test_pair_rotations_give_every_node_distinct_cross_half_partners():
    nodes = ["n%03d" % i for i in range(1, 9)]
    rot = plan.pair_rotations(nodes)
    assert rot[0] == localize.plan_pairs(nodes) and len(rot) == plan.PAIR_ROTATIONS
    for rotation in rot:
        flat = [n for g in rotation for n in g]
        assert sorted(flat) == nodes  # disjoint, every node once
    partners = {n: {m for rotation in rot for g in rotation if n in g for m in g if m != n} for n in nodes}
    assert all(len(p) == plan.PAIR_ROTATIONS for p in partners.values()), partners
    # three nodes: every pair, so every node is measured beside two partners
    assert plan.pair_rotations(["a", "b", "c"]) == [[["a", "b"]], [["a", "c"]], [["b", "c"]]]
    assert plan.pair_spec({"a": {"rank_offset": 0, "local_world_size": 2}, "b": {"rank_offset": 2,
                                "local_world_size": 2}}, [[["a", "b"]]], 20) == {"rotations": [[[0, 1, 2, 3]]], "iters": 20,
                                                                 "nodes": [[0, 1], [2, 3]]}


def test_round_iterations_fit_half_the_op_deadline_at_the_pace_the_sweep_measured():
    docs = {"n001": doc(0, [0], [KiB, MiB], time_s=0.5, backend="gloo", world=2),
            "n002": doc(1, [1], [KiB, MiB], time_s=0.5, backend="gloo", world=2)}
    # 1 MiB at 0.5 s an iteration: 2 warm-up + k iterations within 5 s -> 8 (the last timed one is the check:
    # no extra run to leave room for)
    assert plan.round_iters(docs, [MiB], 2, 20, 5, 10.0) == 8
    assert plan.round_iters(docs, [KiB], 2, 20, 5, 10.0) == 20  # fast size: as many as asked
    assert plan.round_iters(docs, [MiB], 2, 20, 5, 2.0) == 5  # never below the configured iterations

"""The allreduce rule over agent documents built here, the profiles, and the localization planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight import common
from preflight.allreduce import plan as benchplan
from preflight.checks import allreduce as ar
from preflight.model import ClusterView, NodeInfo, Status

GiB, MiB, KiB = common.GiB, common.MiB, common.KiB


def doc(node_rank, ranks, sizes, time_s=0.01, slow=None, status=None, world=None, backend="nccl", **extra):
    """One node's agent document: `ranks` global ranks, each done with every size in `sizes`.

    slow: {rank: factor} multiplies that rank's times; status: {rank: rank-entry overrides}.
    """
    entries = []
    for local, rank in enumerate(ranks):
        factor = (slow or {}).get(rank, 1.0)
        entry = {"rank": rank, "local_rank": local, "pid": 100 + rank, "status": "ok", "stage": None, "step": None,
                 "bytes": None, "error": None, "exit": 0, "stderr_tail": "",
                 "sizes": [{"bytes": b, "time_s": time_s * factor * b / sizes[-1], "ok": True} for b in sizes]}
        entry.update((status or {}).get(rank, {}))
        entries.append(entry)
    out = {"node_rank": node_rank, "hostname": "n%03d" % (node_rank + 1), "backend": backend,
           "world_size": world, "deadline": None, "error": None, "ranks": entries, "elapsed_s": 1.0}
    out.update(extra)
    return out


def cluster(docs, gpus=8, expect=None, **meta):
    """A view of len(docs) nodes n001.. with those documents and the cluster metadata."""
    names = ["n%03d" % (i + 1) for i in range(len(docs))]
    infos = [NodeInfo(n, n, gpus) for n in names]
    facts = {n: {"allreduce": d} for n, d in zip(names, docs) if d is not None}
    world = sum(len(d["ranks"]) for d in docs if d is not None)
    base = {"backend": docs[0]["backend"] if docs[0] else "nccl", "world_size": world, "nodes": names,
            "deadlines": {"init_s": 30, "op_s": 20, "total_s": 120}}
    base.update(meta)
    return ClusterView(infos, facts, expect or {}, {"allreduce": base})


def eight_ranks_on(n_nodes, per_node, sizes, **kw):
    world = n_nodes * per_node
    return [doc(i, list(range(i * per_node, (i + 1) * per_node)), sizes, world=world, **kw) for i in range(n_nodes)]


def the(findings, node=None):
    (f,) = [f for f in findings if f.node == node]
    return f


# ------------------------------------------------------------------------------------------------ maths


def test_busbw_factor_is_the_nccl_tests_definition():
    assert ar.busbw_factor(8) == 1.75
    assert ar.busbw_factor(2) == 1.0
    assert ar.busbw_factor(1) == 0.0


def test_curve_takes_the_slowest_rank_per_size():
    sizes = [MiB, GiB]
    docs = eight_ranks_on(2, 4, sizes, time_s=0.01, slow={5: 2.0, 2: 0.5})
    points = ar.curve({"a": docs[0], "b": docs[1]}, 8)
    top = points[-1]
    assert top["bytes"] == GiB and top["time_s"] == pytest.approx(0.02)
    assert (top["slowest_rank"], top["fastest_rank"]) == (5, 2)
    assert top["algbw_gbps"] == pytest.approx(GiB / 0.02 / 1e9, rel=1e-4)
    assert top["busbw_gbps"] == pytest.approx(top["algbw_gbps"] * 1.75, rel=1e-4)
    assert set(top) >= {"bytes", "time_s", "algbw_gbps", "busbw_gbps", "slowest_rank", "fastest_rank"}


def test_curve_skips_sizes_not_every_rank_reported():
    docs = eight_ranks_on(1, 2, [KiB, 2 * KiB])
    docs[0]["ranks"][1]["sizes"].pop()
    assert [p["bytes"] for p in ar.curve({"a": docs[0]}, 2)] == [KiB]


# ---------------------------------------------------------------------------------------------- verdicts


def test_pass_and_fail_against_expect():
    sizes = [MiB << i for i in range(13)]  # up to 4 GiB
    docs = eight_ranks_on(2, 8, sizes, time_s=0.05)  # 4 GiB in 50 ms: algbw 85.9, busbw 161 GB/s
    ok = ar.rule(cluster(docs, expect={"busbw_gbps": 150}))
    f = the(ok)
    assert f.status is Status.PASS and "busbw 161.06 GB/s" in f.message and "at 4 GiB across 16 ranks on 2 nodes" in f.message
    assert f.expected == "busbw >= 150 GB/s (expect.busbw_gbps)"
    assert len(f.data["curve"]) == 13 and f.data["verdict_bytes"] == 4 * GiB

    bad = the(ar.rule(cluster(eight_ranks_on(2, 8, sizes, time_s=0.05, slow={11: 3.0}), expect={"busbw_gbps": 150})))
    assert bad.status is Status.FAIL and "below 150 GB/s" in bad.message
    assert "slowest rank 11 (n002) at 3.0x the median rank" in bad.message


def test_gpu_verdict_needs_a_size_of_at_least_1_gib():
    f = the(ar.rule(cluster(eight_ranks_on(1, 8, [MiB, 512 * MiB]), expect={"busbw_gbps": 1})))
    assert f.status is Status.WARN and "below 1 GiB" in f.message


def test_cpu_verdict_uses_the_largest_size_and_warns_without_threshold():
    sizes = benchplan.CPU_SIZES
    docs = [doc(i, [i], sizes, time_s=0.004, world=2, backend="gloo") for i in range(2)]
    f = the(ar.rule(cluster(docs, gpus=0)))
    assert f.status is Status.WARN and "no threshold applies" in f.message and "at 4 MiB" in f.message
    passed = the(ar.rule(cluster(docs, gpus=0, expect={"busbw_gbps": 0.5})))
    assert passed.status is Status.PASS


def test_builtin_profiles():
    h100 = ar.profile_threshold("nccl", 1, 8, "NVIDIA H100 80GB HBM3", None)
    assert h100[0] == 315.0 and "H100 SXM" in h100[1]
    assert ar.profile_threshold("nccl", 1, 8, "NVIDIA A100-SXM4-80GB", None)[0] == 210.0
    assert ar.profile_threshold("nccl", 1, 8, "NVIDIA H100 PCIe", None) is None
    assert ar.profile_threshold("nccl", 1, 4, "NVIDIA H100 80GB HBM3", None) is None
    net = ar.profile_threshold("nccl", 4, 8, "NVIDIA H100 80GB HBM3", 3200)
    assert net[0] == 280.0 and "3200 Gb/s" in net[1]
    assert ar.profile_threshold("nccl", 4, 8, "NVIDIA H100 80GB HBM3", None) is None
    assert ar.profile_threshold("gloo", 4, 0, None, 100) is None

    sizes = [GiB]
    docs = eight_ranks_on(1, 8, sizes, time_s=0.01)  # busbw 187.9 GB/s: below the H100 profile
    f = the(ar.rule(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3")))
    assert f.status is Status.FAIL and "H100 SXM 8-GPU NVLink4 profile" in f.message


def test_wrong_sums_fail():
    status = {3: {"sizes": [{"bytes": KiB, "time_s": 1e-4, "ok": False, "expected": 36.0, "got": 35.0,
                             "mismatches": 4}]}}
    docs = [doc(0, list(range(4)), [KiB], world=8, backend="gloo", status=status),
            doc(1, list(range(4, 8)), [KiB], world=8, backend="gloo")]
    f = the(ar.rule(cluster(docs, gpus=0)))
    assert f.status is Status.FAIL
    assert f.message == "all-reduce returned wrong sums at 1 KiB on rank 3 (n001): expected 36, got 35 (4 elements)"


# ----------------------------------------------------------------------------------------- hangs and errors


def _hung(stage="size", nbytes=2 * KiB, step=None):
    return {"status": "timeout", "stage": stage, "bytes": nbytes, "step": step,
            "error": "no progress within the op deadline (20 s)"}


def test_hang_names_the_rank_and_node_that_did_not_finish():
    sizes = [KiB, 2 * KiB, 4 * KiB]
    ahead = _hung(nbytes=4 * KiB)
    docs = [doc(i, [i], sizes, world=4, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                status={i: dict(ahead, sizes=[{"bytes": b, "time_s": 1e-4, "ok": True} for b in sizes[:2]])})
            for i in range(3)]
    docs.append(doc(3, [3], sizes, world=4, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                    status={3: dict(_hung(), sizes=[{"bytes": KiB, "time_s": 1e-4, "ok": True}])}))
    findings = ar.rule(cluster(docs, gpus=0))
    f = the(findings)
    assert f.status is Status.FAIL
    assert f.message.startswith("all-reduce hung at 2 KiB: rank 3 (n004) did not finish within 20 s")
    assert "(ranks 0-2 (n[001-003]) got past it)" in f.message
    assert the(findings, "n004").status is Status.FAIL
    assert f.data["implicated"] == ["n004"] and [p["bytes"] for p in f.data["curve"]] == [KiB]


def test_everyone_stuck_above_one_frame_hints_at_mtu():
    sizes = [KiB, 2 * KiB]
    docs = [doc(i, [i], sizes, world=2, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                status={i: dict(_hung(), sizes=[{"bytes": KiB, "time_s": 1e-4, "ok": True}])}) for i in range(2)]
    findings = ar.rule(cluster(docs, gpus=0))
    f = the(findings)
    assert f.message.startswith("all-reduce hung at 2 KiB: ranks 0-1 (n[001-002]) did not finish within 20 s")
    assert "sizes up to 1 KiB completed" in f.message and "MTU mismatch" in f.message
    assert "the pair localization below names the node" in f.message
    assert [x for x in findings if x.node] == []  # nobody stands out


def test_init_hang_names_ranks_that_never_reached_the_rendezvous():
    init = _hung("init", None, "group")
    docs = [doc(0, [0, 1], [KiB], world=4, backend="gloo", deadline={"kind": "init", "limit_s": 30},
                status={0: init, 1: init}, rendezvous={"addr": "198.19.0.2", "port": 29500, "arrived": [0, 1]}),
            None]
    view = cluster(docs, gpus=0, world_size=4, ranks={"n001": [0, 1], "n002": [2, 3]},
                   unanswered={"n002": "no answer within 150 s (outer deadline)"})
    findings = ar.rule(view)
    f = the(findings)
    assert f.message == ("all-reduce hung at init: ranks 2-3 (n002) never reached the rendezvous at "
                         "198.19.0.2:29500 within 30 s; no result from n002 (ranks 2-3)")
    assert the(findings, "n002").message == "no answer within 150 s (outer deadline)"


def test_init_hang_after_everyone_arrived_points_at_the_interfaces():
    init = _hung("init", None, "group")
    docs = [doc(i, [i], [KiB], world=2, backend="gloo", deadline={"kind": "init", "limit_s": 30},
                status={i: init}) for i in range(2)]
    docs[0]["rendezvous"] = {"addr": "10.0.0.1", "port": 29500, "arrived": [0, 1]}
    f = the(ar.rule(cluster(docs, gpus=0)))
    assert "reached the rendezvous but the process group did not form within 30 s" in f.message
    assert "GLOO_SOCKET_IFNAME" in f.message


def test_error_is_led_by_the_rank_that_died():
    dead = {"status": "error", "stage": "size", "bytes": 4 * KiB, "error": "rank process killed by signal 9"}
    peer = {"status": "error", "stage": "size", "bytes": 4 * KiB, "error": "RuntimeError: Connection closed by peer"}
    docs = [doc(0, [0, 1], [KiB], world=4, backend="gloo", status={0: peer, 1: peer}),
            doc(1, [2, 3], [KiB], world=4, backend="gloo", status={2: peer, 3: dead})]
    findings = ar.rule(cluster(docs, gpus=0))
    f = the(findings)
    assert f.message == ("all-reduce failed at 4 KiB: rank 3 (n002): rank process killed by signal 9; "
                         "ranks 0-2 (n[001-002]) stopped too")
    assert the(findings, "n002").status is Status.FAIL
    assert [x.node for x in findings if x.node] == ["n002"]


def test_init_error_is_led_by_the_earliest_step_not_the_peer_that_noticed():
    """A rank that cannot import torch fails at init's first step; a peer may report its own error
    first (the store connection it shared with that rank drops): the message names the import."""
    no_torch = {"status": "error", "stage": "init", "step": "import", "error": "ModuleNotFoundError: No module named 'torch'"}
    store = {"status": "error", "stage": "init", "step": "store",
             "error": "DistNetworkError: failed to recv, got 0 bytes"}
    waiting = {"status": "error", "stage": "init", "step": "group", "error": "DistNetworkError: Connection reset by peer"}
    docs = [doc(0, [0], [KiB], world=3, backend="gloo", status={0: store}),
            doc(1, [1], [KiB], world=3, backend="gloo", status={1: waiting}),
            doc(2, [2], [KiB], world=3, backend="gloo", status={2: no_torch})]
    findings = ar.rule(cluster(docs, gpus=0))
    assert the(findings).message.startswith("all-reduce failed at init: rank 2 (n003): ModuleNotFoundError: "
                                            "No module named 'torch'; ranks 0-1 (n[001-002]) stopped too")
    assert [x.node for x in findings if x.node and x.status is Status.FAIL] == ["n003"]


def test_no_results_at_all_is_an_error_and_skip_needs_a_reason():
    view = ClusterView([NodeInfo("n001", "n001", 8)], {"n001": {}})
    assert the(ar.rule(view)).status is Status.ERROR
    view = ClusterView([NodeInfo("n001", "n001", 8)], {"n001": {}}, cluster={"allreduce": {"skip": "one node only"}})
    assert the(ar.rule(view)).status is Status.SKIP


def test_agent_error_document_is_a_node_failure():
    docs = [doc(0, [0], [KiB], world=2, backend="gloo"), {"probe_error": "did not finish within 30 s"}]
    names = ["n001", "n002"]
    view = ClusterView([NodeInfo(n, n, 0) for n in names], {n: {"allreduce": d} for n, d in zip(names, docs)},
                       cluster={"allreduce": {"backend": "gloo", "world_size": 2, "nodes": names}})
    findings = ar.rule(view)
    assert the(findings, "n002").message == "bench agent failed: did not finish within 30 s"
    assert the(findings).status is Status.FAIL


# ------------------------------------------------------------------------------------------ controller helpers


def test_make_configs_and_cluster_meta():
    nodes = [NodeInfo("n001", "h1", 8), NodeInfo("n002", "h2", 8, settings={"python": "/opt/py/bin/python3"})]
    cfgs = benchplan.make_configs(nodes, "10.0.0.1", 29501, env={"NCCL_SOCKET_IFNAME": "=eth1"})
    assert [c["rank_offset"] for c in cfgs.values()] == [0, 8]
    assert cfgs["n002"]["world_size"] == 16 and cfgs["n002"]["backend"] == "nccl"
    assert cfgs["n002"]["sizes"] == benchplan.GPU_SIZES and cfgs["n002"]["python"] == "/opt/py/bin/python3"
    meta = benchplan.cluster_meta(cfgs)
    assert meta["ranks"] == {"n001": [0, 7], "n002": [8, 15]} and meta["master"] == "10.0.0.1:29501"
    cpu = benchplan.make_configs([NodeInfo("c1", "c1", 0), NodeInfo("c2", "c2", 0)], "c1")
    assert [c["local_world_size"] for c in cpu.values()] == [1, 1] and cpu["c1"]["backend"] == "gloo"
    assert benchplan.outer_deadline(cpu["c1"]) > cpu["c1"]["deadlines"]["total_s"]


def test_default_sweeps():
    assert benchplan.GPU_SIZES[0] == MiB and benchplan.GPU_SIZES[-1] == 4 * GiB
    assert benchplan.CPU_SIZES[0] == KiB and benchplan.CPU_SIZES[-1] == 4 * MiB
    assert any(1500 < s <= 9000 for s in benchplan.CPU_SIZES) and any(s > 9000 for s in benchplan.CPU_SIZES)


# ------------------------------------------------------------------------------------------- localization


def fake_round(bad, slow=(), slow_gbps=10.0):
    """run_round for localize(): a group fails when it holds a bad node, is slow with a slow one."""
    calls = []

    def run_round(groups):
        calls.append(groups)
        out = []
        for g in groups:
            if any(n in bad for n in g):
                out.append({"nodes": g, "busbw_gbps": None, "failure": "hung at init"})
            else:
                out.append({"nodes": g, "busbw_gbps": slow_gbps if any(n in slow for n in g) else 40.0, "failure": None})
        return out

    return run_round, calls


def test_plan_pairs_covers_every_node_once():
    nodes = ["n%03d" % i for i in range(1, 9)]
    pairs = benchplan.plan_pairs(nodes)
    assert pairs == [["n001", "n005"], ["n002", "n006"], ["n003", "n007"], ["n004", "n008"]]
    odd = benchplan.plan_pairs(nodes[:5])
    assert odd == [["n001", "n003"], ["n002", "n004"]]  # n005 waits for a known-good partner in round 2
    assert benchplan.plan_pairs(nodes[:3]) == [["n001", "n002"]]  # never the whole cluster as a "pair"
    assert benchplan.plan_pairs(["n001"]) == [] and benchplan.plan_pairs([]) == []


def test_eight_nodes_one_bad_is_found_in_two_rounds():
    nodes = ["n%03d" % i for i in range(1, 9)]
    run_round, calls = fake_round({"n004"})
    verdict = benchplan.localize(nodes, run_round)
    assert list(verdict["bad"]) == ["n004"] and verdict["undecided"] == {}
    assert verdict["rounds"] == 2 and len(calls[1]) == 2  # n004 and n008 each beside a good node
    assert all(len(set(g)) == len(g) for g in calls[1])
    assert verdict["message"].startswith("exclude n004: n004 failed beside known-good")


def test_plan_suspects_pairs_each_suspect_with_a_distinct_good_node():
    results = [{"nodes": ["a", "b"], "busbw_gbps": None, "failure": "hung"},
               {"nodes": ["c", "d"], "busbw_gbps": 40.0, "failure": None}]
    assert benchplan.plan_suspects(results) == [["a", "c"], ["b", "d"]]
    assert benchplan.plan_suspects(results, suspects=["b"], good=["d"]) == [["b", "d"]]


def test_odd_count_the_odd_one_out_is_tested_beside_a_good_node():
    nodes = ["n%03d" % i for i in range(1, 6)]
    run_round, calls = fake_round({"n005"})
    verdict = benchplan.localize(nodes, run_round)
    assert calls[0] == [["n001", "n003"], ["n002", "n004"]] and calls[1] == [["n005", "n001"]]
    assert list(verdict["bad"]) == ["n005"] and sorted(verdict["good"]) == ["n001", "n002", "n003", "n004"]
    assert verdict["rounds"] == 2


@pytest.mark.parametrize("bad,rounds", [("n003", 2), ("n002", 2), ("n001", 3)])
def test_three_nodes_localize_any_one_bad_node(bad, rounds):
    nodes = ["n001", "n002", "n003"]
    run_round, calls = fake_round({bad})
    verdict = benchplan.localize(nodes, run_round)
    assert list(verdict["bad"]) == [bad] and not verdict["shared_fault"] and verdict["undecided"] == {}, verdict
    assert verdict["rounds"] == rounds and all(len(g) == 2 for c in calls for g in c)


def test_three_nodes_all_failing_is_shared_after_every_pair_was_tried():
    run_round, calls = fake_round({"n001", "n002", "n003"})
    verdict = benchplan.localize(["n001", "n002", "n003"], run_round)
    assert verdict["shared_fault"] and verdict["bad"] == {} and len(calls) == 3


def test_more_suspects_than_good_nodes_takes_a_third_round_and_stops():
    nodes = ["n%03d" % i for i in range(1, 7)]
    run_round, calls = fake_round({"n001", "n002"})  # pairs n001+n004, n002+n005 fail; n003+n006 pass
    verdict = benchplan.localize(nodes, run_round)
    assert sorted(verdict["bad"]) == ["n001", "n002"]
    assert sorted(verdict["good"]) == ["n003", "n004", "n005", "n006"]
    assert verdict["rounds"] <= benchplan.MAX_ROUNDS


def test_every_pair_failing_is_a_shared_fault():
    nodes = ["n%03d" % i for i in range(1, 5)]
    run_round, calls = fake_round(set(nodes))
    verdict = benchplan.localize(nodes, run_round)
    assert verdict["shared_fault"] and verdict["bad"] == {} and len(calls) == 1
    assert "the fault is shared" in verdict["message"]


def test_a_slow_node_is_localized_without_a_threshold():
    nodes = ["n%03d" % i for i in range(1, 9)]
    run_round, _calls = fake_round(set(), slow={"n007"})
    verdict = benchplan.localize(nodes, run_round)
    assert list(verdict["bad"]) == ["n007"] and "75% below the fleet median 40.00 GB/s (limit 20%)" in verdict["bad"]["n007"]
    # 25% below the median: named at the default 20%, not when the inventory allows 30%
    run_round, _calls = fake_round(set(), slow={"n007"}, slow_gbps=30.0)
    assert list(benchplan.localize(nodes, run_round)["bad"]) == ["n007"]
    run_round, _calls = fake_round(set(), slow={"n007"}, slow_gbps=30.0)
    assert benchplan.localize(nodes, run_round, slow_fraction=0.3)["bad"] == {}


def test_rule_reports_the_localization_from_cluster_metadata():
    nodes = ["n%03d" % i for i in range(1, 5)]
    run_round, _calls = fake_round({"n002"})
    verdict = benchplan.localize(nodes, run_round)
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo")
    view = cluster(docs, gpus=0, localization={"results": verdict["results"]})
    findings = ar.CHECK.rule(view)
    (main,) = [f for f in findings if f.node is None]  # one cluster verdict, the pair test folded in
    assert main.status is Status.FAIL and "pair test: exclude n002" in main.message, main.message
    assert the([f for f in findings if f.message.startswith("pair test")], "n002").status is Status.FAIL


def test_group_result_from_agent_documents():
    sizes = [GiB]
    docs = eight_ranks_on(2, 8, sizes, time_s=0.02)
    g = benchplan.group_result(["n001", "n002"], {"n001": docs[0], "n002": docs[1]})
    assert g["failure"] is None and g["busbw_gbps"] == pytest.approx(GiB / 0.02 / 1e9 * 1.875, rel=1e-3)
    hung = eight_ranks_on(2, 1, sizes, status={1: _hung()})
    g = benchplan.group_result(["n001", "n002"], {"n001": hung[0], "n002": hung[1]})
    assert g["failure"].startswith("hung at 2 KiB (rank 1")
    g = benchplan.group_result(["n001", "n002"], {"n001": docs[0]})
    assert g["failure"] == "n002: no result"


# ------------------------------------------------------------------------------------------ NCCL log parser
# Every case under tests/fixtures/allreduce runs in tests/test_fixtures.py; here, what they must cover.

_NCCL_FIXTURES = Path(__file__).parent / "fixtures" / "allreduce"
_NCCL_CASES = sorted(p.stem for p in _NCCL_FIXTURES.glob("*.json"))


def test_nccl_fixtures_cover_the_four_paths():
    got = {c: json.loads((_NCCL_FIXTURES / (c + ".json")).read_text()).get("expected") for c in _NCCL_CASES}
    assert got["ib_gdr"]["transport"] == "NET/IB" and got["ib_gdr"]["gdr_used"] is True
    assert got["ib_no_gdr"]["gdr"] == {"mlx5_0": False, "mlx5_1": False} and got["ib_no_gdr"]["gdr_used"] is False
    assert got["socket_fallback"]["transport"] == "NET/Socket" and got["socket_fallback"]["ib_no_device"]
    assert got["wrong_interface"]["devices"] == [{"name": "lo", "addr": "127.0.0.1"}]
    assert got["old_2_4_socket"]["intra"] == ["SHM"] and got["old_2_4_socket"]["version"] == "2.4.7"
    assert "NVLS" in got["plugin_ibext_nvls"]["intra"]


# ------------------------------------------------------------------------------------ what NCCL chose (rule)


def _nccl_view(logs, env=None, ib_ports=None, gpudirect=None):
    """Two nccl nodes that passed the sweep; node n00k's rank logs are logs[k-1] (fixture file names)."""
    docs = eight_ranks_on(2, 1, [GiB], time_s=0.01)
    for d, name in zip(docs, logs):
        d["ranks"][0]["nccl_log"] = (_NCCL_FIXTURES / name).read_text()
        d["ranks"][0]["init_s"] = 5.0
    view = cluster(docs, gpus=1, env=env or {"NCCL_SOCKET_IFNAME": "=eth1"})
    for i, n in enumerate(["n001", "n002"]):
        port = {"hca": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "link_layer": "ib",
                "rate_gbps": 400}
        view.facts[n]["ib_hca"] = {"hcas": {}, "ports": [port] if (ib_ports or {}).get(n) else []}
        if gpudirect is not None:
            view.facts[n]["gpudirect"] = gpudirect
    return view


def _node_findings(view, node):
    return [f for f in ar.CHECK.rule(view) if f.node == node and f.data and "nccl" in f.data]


def test_nccl_socket_fallback_with_an_active_hca_fails_the_node():
    view = _nccl_view(["socket_fallback.log", "socket_fallback.log"], ib_ports={"n001": True})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and "fell back to sockets although mlx5_0:1 is ACTIVE" in f.message, f.message
    assert f.message.startswith("NCCL 2.18.5, NET/Socket on eth1"), f.message
    (g,) = _node_findings(view, "n002")  # no ACTIVE HCA there: sockets are what it has
    assert g.status is Status.PASS and "intra-node P2P/IPC" in g.message


def test_nccl_bound_to_an_interface_the_env_file_does_not_name_fails():
    view = _nccl_view(["wrong_interface.log", "socket_fallback.log"])
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and "bound lo, not the interface the env file names (NCCL_SOCKET_IFNAME==eth1)" \
        in f.message, f.message
    assert _node_findings(view, "n002")[0].status is Status.PASS


def test_nccl_gdr_disabled_where_gpudirect_should_work_fails_and_is_skipped_without_facts():
    good = {"hcas": [{"name": "mlx5_0", "bdf": "0000:18:00.0"}], "peermem": "nvidia_peermem", "virtual": None,
            "paths": [], "acs": {}}
    view = _nccl_view(["ib_no_gdr.log", "ib_gdr.log"], env={"NCCL_SOCKET_IFNAME": "=eth1,ib0"}, gpudirect=good)
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and "GPUDirect RDMA disabled (mlx5_0,mlx5_1) although gpudirect: " \
        "nvidia_peermem loaded" in f.message, f.message
    (g,) = _node_findings(view, "n002")
    assert g.status is Status.PASS and "GPUDirect RDMA enabled" in g.message and "P2P/CUMEM" in g.message
    view = _nccl_view(["ib_no_gdr.log", "ib_gdr.log"], env={"NCCL_SOCKET_IFNAME": "=eth1,ib0"})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.PASS and "GPUDirect RDMA not judged: no gpudirect facts" in f.message
    assert f.data["gdr_note"]


def test_an_unreadable_nccl_log_is_an_error_not_a_pass():
    view = _nccl_view(["warn_only.log", "ib_gdr.log"], env={"NCCL_SOCKET_IFNAME": "ib"})
    (f,) = [x for x in ar.CHECK.rule(view) if x.node == "n001"]
    assert f.status is Status.ERROR and "no 'NCCL INFO' line" in f.message


@pytest.mark.parametrize("spec,name,ok", [
    ("=eth1", "eth1", True), ("=eth1", "eth10", False), ("eth", "eth10", True), ("^docker,lo", "eth0", True),
    ("^docker,lo", "docker0", False), (None, "lo", False), (None, "ens3", True), ("=eth1,ib0", "ib0", True)])
def test_ifname_syntax(spec, name, ok):
    assert ar.ifname_allows(spec, name) is ok


def test_sku_profiles_warn_below_the_published_figure_above_the_fail_floor():
    h100 = ar.sku_warn_level("nccl", 1, 8, "NVIDIA H100 80GB HBM3", None)
    assert h100[0] == 368.0 and "460" in h100[1] and "alayanew" in h100[1]
    assert ar.sku_warn_level("nccl", 2, 8, "NVIDIA H200", 3200)[0] == 320.0
    assert ar.sku_warn_level("nccl", 2, 8, "NVIDIA H200", 1600) is None  # fewer NICs than it was measured with
    assert ar.sku_warn_level("nccl", 4, 8, "NVIDIA B200", 3200)[0] == 320.0
    assert "NVIDIA/nccl#778" in ar.sku_warn_level("nccl", 2, 8, "NVIDIA A100-SXM4-80GB", 1600)[1]
    assert ar.sku_warn_level("gloo", 2, 0, None, None) is None
    # 8x H100, one node at 340 GB/s busbw: above the 315 GB/s FAIL floor, below 80% of the published 460
    t = GiB / (340e9 / ar.busbw_factor(8))
    docs = eight_ranks_on(1, 8, [GiB], time_s=t)
    f = the(ar.rule(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3")))
    assert f.status is Status.WARN and "below 368 GB/s" in f.message and f.data["warn_gbps"] == 368.0, f.message
    docs = eight_ranks_on(1, 8, [GiB], time_s=GiB / (470e9 / ar.busbw_factor(8)))
    assert the(ar.rule(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3"))).status is Status.PASS


# ------------------------------------------------------------------------- fleet judgement (rounds -> rule)


def _node_round(figures, name="loopback", fraction=None):
    rnd = {"name": name, "what": "two local ranks", "sizes": [4 * MiB],
           "results": [{"nodes": [n], "busbw_gbps": bw, "best_gbps": bw, "failure": None} for n, bw in figures.items()]}
    if fraction is not None:
        rnd["slow_fraction"] = fraction
    return rnd


def test_no_threshold_a_healthy_fleet_passes_and_a_slow_node_is_named():
    docs = eight_ranks_on(4, 1, ar_cpu_sizes(), backend="gloo")
    even = {"n%03d" % i: 1.0 + 0.05 * i for i in range(1, 5)}
    view = cluster(docs, gpus=0, node_rounds=[_node_round(even, "nvlink")])
    (main,) = ar.CHECK.rule(view)
    assert main.status is Status.PASS, main.message
    assert "no absolute threshold set: judged against the fleet" in main.message
    assert "node round nvlink at 4 MiB: every node within 20% of the fleet median" in main.message
    slow = dict(even, n003=0.7)  # 33% below the median of the others: named at the default 20%
    findings = ar.CHECK.rule(cluster(docs, gpus=0, node_rounds=[_node_round(slow, "nvlink")]))
    main = the(findings)
    assert main.status is Status.FAIL and "node round nvlink at 4 MiB: n003" in main.message
    n3 = the(findings, "n003")
    assert n3.status is Status.FAIL and "alone (two local ranks): slow: busbw 0.70 GB/s" in n3.message
    assert [f.node for f in findings if f.status is Status.FAIL] == [None, "n003"]
    # the gloo loopback round is judged on completion only: a slow figure names nobody, a failure does
    loose = dict(_node_round(slow), by_bandwidth=False)
    assert [f.status for f in ar.CHECK.rule(cluster(docs, gpus=0, node_rounds=[loose]))] == [Status.PASS]
    broken = dict(loose, results=loose["results"][:2] + [{"nodes": ["n003"], "busbw_gbps": None,
                                                          "failure": "failed at 4 MiB (rank 0: boom)"}])
    named = ar.CHECK.rule(cluster(docs, gpus=0, node_rounds=[broken]))
    assert [f.node for f in named if f.status is Status.FAIL] == [None, "n003"]


def test_a_rank_slowest_at_most_sizes_is_named_a_straggler():
    sizes = [KiB << i for i in range(6)]
    docs = eight_ranks_on(4, 1, sizes, backend="gloo", slow={2: 1.6})
    main = the(ar.rule(cluster(docs, gpus=0)))
    assert "straggler: rank 2 (n003) slowest at 6 of 6 sizes, 1.6x the median rank" in main.message, main.message
    assert main.data["straggler"]["node"] == "n003" and len(main.data["slowest_per_size"]) == 6
    even = eight_ranks_on(4, 1, sizes, backend="gloo", slow={2: 1.1})
    assert "straggler" not in the(ar.rule(cluster(even, gpus=0))).message  # within 20% of the median rank


def test_half_the_fleet_slow_in_a_node_round_is_still_named_by_the_healthy_majority():
    docs = eight_ranks_on(5, 1, ar_cpu_sizes(), backend="gloo")
    figures = {"n001": 10.0, "n002": 10.2, "n003": 9.9, "n004": 4.0, "n005": 4.1}  # 2 of 5 slow
    findings = ar.CHECK.rule(cluster(docs, gpus=0, node_rounds=[_node_round(figures, "nic")]))
    assert sorted(f.node for f in findings if f.node and f.status is Status.FAIL) == ["n004", "n005"]


def test_a_failed_run_and_its_localization_print_one_cluster_verdict():
    hung = {"status": "timeout", "stage": "size", "bytes": 2 * KiB, "error": "no progress"}
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo", status={r: hung for r in range(4)})
    groups = [{"nodes": ["n001", "n003"], "busbw_gbps": 0.1, "failure": None},
              {"nodes": ["n002", "n004"], "busbw_gbps": 0.1, "failure": None}]
    view = cluster(docs, gpus=0, localization={"results": groups, "by_bandwidth": False})
    cluster_findings = [f for f in ar.CHECK.rule(view) if f.node is None]
    assert len(cluster_findings) == 1 and cluster_findings[0].status is Status.FAIL
    assert "pair test: every group passed: no node stands out" in cluster_findings[0].message


def test_a_stall_blames_no_rank_that_only_reported_the_reset():
    reset = {"status": "error", "stage": "size", "bytes": 2 * MiB,
             "error": "RuntimeError: Connection closed by peer [198.19.0.6]:57505. This is typically caused by a remote"}
    stopped = {"status": "timeout", "stage": "size", "bytes": 2 * MiB, "error": "no progress within the op deadline (20 s)"}
    status = {0: reset, 1: reset, 2: reset, 3: stopped}
    docs = eight_ranks_on(4, 1, [MiB], backend="gloo", status=status)
    findings = ar.rule(cluster(docs, gpus=0))
    (main,) = findings  # no node finding: the ranks that saw the reset did not cause it
    assert main.status is Status.FAIL and main.message.startswith(
        "all-reduce stalled at 2 MiB: rank 3 (n004) made no progress within the 20 s op deadline"), main.message
    assert "ranks 0-2 (n[001-003]) then lost the connection" in main.message


def ar_cpu_sizes():
    return [KiB, 4 * MiB]


def test_pair_rotations_give_every_node_distinct_cross_half_partners():
    nodes = ["n%03d" % i for i in range(1, 9)]
    rot = benchplan.pair_rotations(nodes)
    assert rot[0] == benchplan.plan_pairs(nodes) and len(rot) == benchplan.PAIR_ROTATIONS
    for rotation in rot:
        flat = [n for g in rotation for n in g]
        assert sorted(flat) == nodes  # disjoint, every node once
    partners = {n: {m for rotation in rot for g in rotation if n in g for m in g if m != n} for n in nodes}
    assert all(len(p) == benchplan.PAIR_ROTATIONS for p in partners.values()), partners
    # three nodes: every pair, so every node is measured beside two partners
    assert benchplan.pair_rotations(["a", "b", "c"]) == [[["a", "b"]], [["a", "c"]], [["b", "c"]]]
    assert benchplan.pair_spec({"a": {"rank_offset": 0, "local_world_size": 2}, "b": {"rank_offset": 2,
                                "local_world_size": 2}}, [[["a", "b"]]], 20) == {"rotations": [[[0, 1, 2, 3]]], "iters": 20}


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
    rot = benchplan.pair_rotations(nodes)
    healthy = {(r, a, b): 0.04 for r, rotation in enumerate(rot) for a, b in rotation}
    noisy = dict(healthy)
    noisy[(1, "n002", "n007")] = 0.12  # a busy neighbour: 3x slower once
    docs, configs, names = _pair_docs(noisy)
    results = benchplan.pair_results(docs, configs, rot)
    assert len(results) == 12 and all(g["failure"] is None for g in results)
    calls = []
    verdict = benchplan.localize(names, lambda groups: calls.append(groups) or [], results=results)
    assert verdict["bad"] == {} and verdict["rounds"] == 0 and calls == [], verdict  # no follow-up round
    slow = {k: (4.0 if "n007" in k[1:] else v) for k, v in healthy.items()}  # n007's link throttled
    docs, configs, names = _pair_docs(slow)
    verdict = benchplan.localize(names, lambda groups: calls.append(groups) or [],
                                 results=benchplan.pair_results(docs, configs, rot))
    assert list(verdict["bad"]) == ["n007"] and calls == [], verdict
    assert "below the fleet median" in verdict["bad"]["n007"]


def test_a_pair_the_phase_did_not_reach_is_a_failed_group_naming_why():
    rot = benchplan.pair_rotations(["a", "b", "c"])
    docs, configs, _names = _pair_docs({(0, "a", "b"): 0.01, (1, "a", "c"): 0.01, (2, "b", "c"): 0.01},
                                       failed={(1, "c")})
    docs["c"]["ranks"][0]["pairs_error"] = "no progress within the op deadline (10 s) in the pair phase"
    first, second, _third = benchplan.pair_results(docs, configs, rot)
    assert first["failure"] is None and first["busbw_gbps"] > 0
    assert "c rank 2: pair test did not complete (no progress within the op deadline" in second["failure"]
    # no rank ran the phase (an older agent, or the sweep failed): None, the separate rounds run instead
    for d in docs.values():
        d["ranks"][0]["pairs"] = None
    assert benchplan.pair_results(docs, configs, rot) is None

"""The allreduce rule over agent documents built here, the profiles, and the localization planner."""

from __future__ import annotations

import pytest

from preflight import benchplan, common
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


def fake_round(bad, slow=()):
    """run_round for localize(): a group fails when it holds a bad node, is slow with a slow one."""
    calls = []

    def run_round(groups):
        calls.append(groups)
        out = []
        for g in groups:
            if any(n in bad for n in g):
                out.append({"nodes": g, "busbw_gbps": None, "failure": "hung at init"})
            else:
                out.append({"nodes": g, "busbw_gbps": 10.0 if any(n in slow for n in g) else 40.0, "failure": None})
        return out

    return run_round, calls


def test_plan_pairs_covers_every_node_once():
    nodes = ["n%03d" % i for i in range(1, 9)]
    pairs = benchplan.plan_pairs(nodes)
    assert pairs == [["n001", "n005"], ["n002", "n006"], ["n003", "n007"], ["n004", "n008"]]
    odd = benchplan.plan_pairs(nodes[:5])
    assert odd == [["n001", "n003"], ["n002", "n004", "n005"]]
    assert sorted(n for g in odd for n in g) == nodes[:5]
    assert benchplan.plan_pairs(["n001"]) == [["n001"]] and benchplan.plan_pairs([]) == []


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


def test_odd_count_with_the_bad_node_in_the_triple():
    nodes = ["n%03d" % i for i in range(1, 6)]
    run_round, calls = fake_round({"n005"})
    verdict = benchplan.localize(nodes, run_round)
    assert calls[0][-1] == ["n002", "n004", "n005"]
    assert list(verdict["bad"]) == ["n005"] and sorted(verdict["good"]) == ["n001", "n002", "n003", "n004"]
    assert verdict["rounds"] <= benchplan.MAX_ROUNDS


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
    assert list(verdict["bad"]) == ["n007"] and "under 50% of the median group" in verdict["bad"]["n007"]


def test_rule_reports_the_localization_from_cluster_metadata():
    nodes = ["n%03d" % i for i in range(1, 5)]
    run_round, _calls = fake_round({"n002"})
    verdict = benchplan.localize(nodes, run_round)
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo")
    view = cluster(docs, gpus=0, localization={"results": verdict["results"]})
    findings = ar.CHECK.rule(view)
    loc = [f for f in findings if f.message.startswith("localization")]
    assert loc and loc[0].status is Status.FAIL and "exclude n002" in loc[0].message
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

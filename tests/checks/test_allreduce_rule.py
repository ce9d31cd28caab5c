"""The allreduce check's rule over agent documents built here: verdicts, failure wording, what NCCL chose,
and the fleet rounds' verdict folded into the one cluster finding.

The controller package it reads from is tested beside it: tests/test_allreduce_{busbw,nccllog,plan,localize}.py.
"""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from preflight.checks.allreduce import localize, plan
from preflight.checks.allreduce.busbw import busbw_factor
from preflight.checks.allreduce import rule as ar_rule
from preflight.model import NodeInfo, Status
from preflight.transport import bundle

from tests.allreduce_docs import GiB, KiB, MiB, cluster, doc, eight_ranks_on, fake_round, hung_entry, the
from tests.paths import REPO, TESTS
from tests import builders


def test_pass_and_fail_against_expect():
    sizes = [MiB << i for i in range(13)]  # up to 4 GiB
    docs = eight_ranks_on(2, 8, sizes, time_s=0.05)  # 4 GiB in 50 ms: algbw 85.9, busbw 161 GB/s
    ok = ar_rule.rank_findings(cluster(docs, expect={"busbw_gbps": 150}))
    f = the(ok)
    assert f.status is Status.PASS and "busbw 161.06 GB/s" in f.message and "at 4 GiB across 16 ranks on 2 nodes" in f.message
    assert f.expected == "busbw >= 150 GB/s (expect.busbw_gbps)"
    assert len(f.data["curve"]) == 13 and f.data["verdict_bytes"] == 4 * GiB

    bad = the(ar_rule.rank_findings(cluster(eight_ranks_on(2, 8, sizes, time_s=0.05, slow={11: 3.0}), expect={"busbw_gbps": 150})))
    assert bad.status is Status.FAIL and "below 150 GB/s" in bad.message
    assert "slowest rank 11 (n002) at 3.0x the median rank" in bad.message


def test_gpu_verdict_needs_a_size_of_at_least_1_gib():
    """Issue 23 item 4: a sweep that ends below the size that proves bandwidth is not a pass (exit 1)."""
    f = the(ar_rule.rank_findings(cluster(eight_ranks_on(1, 8, [MiB, 512 * MiB]), expect={"busbw_gbps": 1})))
    assert f.status is Status.ERROR and "below 1 GiB" in f.message and f.action == "fix_config"
    assert "add a size of at least 1 GiB to cluster.allreduce.sizes" in f.message


@pytest.mark.parametrize("backend,sizes,cut_at", [("nccl", [MiB, 4 * GiB], 4 * GiB), ("gloo", [KiB, 4 * MiB], 4 * MiB)])
def test_a_sparse_size_list_cut_early_proves_nothing(backend, sizes, cut_at):
    """A cut projected from a size far below the next (a 4096x step) is no bandwidth figure: ERROR, not a
    FAIL of a healthy fleet nor a pass at a latency-bound size."""
    cut = {"cut": {"bytes": cut_at, "took_s": 0.9, "projected_s": 3686.4, "budget_s": 15.0}}
    docs = eight_ranks_on(2, 1, sizes[:1], backend=backend, status={0: cut, 1: cut})
    f = the(ar_rule.rank_findings(cluster(docs, gpus=1 if backend == "nccl" else 0, expect={"busbw_gbps": 0.001})))
    assert f.status is Status.ERROR and f.action == "fix_config", f.message
    assert f.message.startswith("all-reduce bandwidth not proven across 2 ranks on 2 nodes: sweep stopped before ")
    assert "a 4096x step" in f.message and "doubling steps" in f.message
    # the twin: a cut one doubling step ahead is a measurement (a slow link), judged as before
    near = {"cut": dict(cut["cut"], bytes=2 * sizes[0])}
    docs = eight_ranks_on(2, 1, sizes[:1], backend=backend, status={0: near, 1: near})
    f = the(ar_rule.rank_findings(cluster(docs, gpus=1 if backend == "nccl" else 0, expect={"busbw_gbps": 0.001})))
    assert f.status is Status.FAIL and "sweep stopped before" in f.message, f.message  # too slow: judged


def test_cpu_verdict_uses_the_largest_size_and_warns_without_threshold():
    sizes = plan.CPU_SIZES
    docs = [doc(i, [i], sizes, time_s=0.004, world=2, backend="gloo") for i in range(2)]
    f = the(ar_rule.rank_findings(cluster(docs, gpus=0)))
    assert f.status is Status.WARN and "no threshold applies" in f.message and "at 4 MiB" in f.message
    passed = the(ar_rule.rank_findings(cluster(docs, gpus=0, expect={"busbw_gbps": 0.5})))
    assert passed.status is Status.PASS


def test_builtin_profiles_judge_the_rule():
    sizes = [GiB]
    docs = eight_ranks_on(1, 8, sizes, time_s=0.01)  # busbw 187.9 GB/s: below the H100 profile
    f = the(ar_rule.rank_findings(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3")))
    assert f.status is Status.FAIL and "H100 SXM 8-GPU NVLink4 profile" in f.message


def test_wrong_sums_fail():
    status = {3: {"sizes": [{"bytes": KiB, "time_s": 1e-4, "ok": False, "expected": 36.0, "got": 35.0,
                             "mismatches": 4}]}}
    docs = [doc(0, list(range(4)), [KiB], world=8, backend="gloo", status=status),
            doc(1, list(range(4, 8)), [KiB], world=8, backend="gloo")]
    f = the(ar_rule.rank_findings(cluster(docs, gpus=0)))
    assert f.status is Status.FAIL
    assert f.message == "all-reduce returned wrong sums at 1 KiB on rank 3 (n001): expected 36, got 35 (4 elements)"


# ----------------------------------------------------------------------------------------- hangs and errors


def test_hang_names_the_rank_and_node_that_did_not_finish():
    sizes = [KiB, 2 * KiB, 4 * KiB]
    ahead = hung_entry(nbytes=4 * KiB)
    docs = [doc(i, [i], sizes, world=4, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                status={i: dict(ahead, sizes=[{"bytes": b, "time_s": 1e-4, "ok": True} for b in sizes[:2]])})
            for i in range(3)]
    docs.append(doc(3, [3], sizes, world=4, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                    status={3: dict(hung_entry(), sizes=[{"bytes": KiB, "time_s": 1e-4, "ok": True}])}))
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    f = the(findings)
    assert f.status is Status.FAIL
    assert f.message.startswith("all-reduce hung at 2 KiB: rank 3 (n004) did not finish within 20 s")
    assert "(ranks 0-2 (n[001-003]) got past it)" in f.message
    assert the(findings, "n004").status is Status.FAIL
    assert f.data["implicated"] == ["n004"] and [p["bytes"] for p in f.data["curve"]] == [KiB]


def test_everyone_stuck_above_one_frame_hints_at_mtu():
    sizes = [KiB, 2 * KiB]
    docs = [doc(i, [i], sizes, world=2, backend="gloo", deadline={"kind": "op", "limit_s": 20},
                status={i: dict(hung_entry(), sizes=[{"bytes": KiB, "time_s": 1e-4, "ok": True}])}) for i in range(2)]
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    f = the(findings)
    assert f.message.startswith("all-reduce hung at 2 KiB: ranks 0-1 (n[001-002]) did not finish within 20 s")
    assert "sizes up to 1 KiB completed" in f.message and "MTU mismatch" in f.message
    assert "the pair localization below names the node" in f.message
    assert [x for x in findings if x.node] == []  # nobody stands out


def test_init_hang_names_ranks_that_never_reached_the_rendezvous():
    init = hung_entry("init", None, "group")
    docs = [doc(0, [0, 1], [KiB], world=4, backend="gloo", deadline={"kind": "init", "limit_s": 30},
                status={0: init, 1: init}, rendezvous={"addr": "198.19.0.2", "port": 29500, "arrived": [0, 1]}),
            None]
    view = cluster(docs, gpus=0, world_size=4, ranks={"n001": [0, 1], "n002": [2, 3]},
                   unanswered={"n002": "no answer within 150 s (outer deadline)"})
    findings = ar_rule.rank_findings(view)
    f = the(findings)
    assert f.message == ("all-reduce hung at init: ranks 2-3 (n002) never reached the rendezvous at "
                         "198.19.0.2:29500 within 30 s; no result from n002 (ranks 2-3)")
    assert the(findings, "n002").message == "no answer within 150 s (outer deadline)"


def test_init_hang_after_everyone_arrived_points_at_the_interfaces():
    init = hung_entry("init", None, "group")
    docs = [doc(i, [i], [KiB], world=2, backend="gloo", deadline={"kind": "init", "limit_s": 30},
                status={i: init}) for i in range(2)]
    docs[0]["rendezvous"] = {"addr": "10.0.0.1", "port": 29500, "arrived": [0, 1]}
    f = the(ar_rule.rank_findings(cluster(docs, gpus=0)))
    assert "reached the rendezvous but the process group did not form within 30 s" in f.message
    assert "GLOO_SOCKET_IFNAME" in f.message


def test_error_is_led_by_the_rank_that_died():
    dead = {"status": "error", "stage": "size", "bytes": 4 * KiB, "error": "rank process killed by signal 9"}
    peer = {"status": "error", "stage": "size", "bytes": 4 * KiB, "error": "RuntimeError: Connection closed by peer"}
    docs = [doc(0, [0, 1], [KiB], world=4, backend="gloo", status={0: peer, 1: peer}),
            doc(1, [2, 3], [KiB], world=4, backend="gloo", status={2: peer, 3: dead})]
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
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
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    assert the(findings).message.startswith("all-reduce failed at init: rank 2 (n003): ModuleNotFoundError: "
                                            "No module named 'torch'; ranks 0-1 (n[001-002]) stopped too")
    assert [x.node for x in findings if x.node and x.status is Status.FAIL] == ["n003"]


def test_no_results_at_all_is_an_error_and_skip_needs_a_reason():
    view = builders.view({"n001": {}})
    assert the(ar_rule.rank_findings(view)).status is Status.ERROR
    view = builders.view({"n001": {}}, cluster={"allreduce": {"skip": "one node only"}})
    assert the(ar_rule.rank_findings(view)).status is Status.SKIP


def test_agent_error_document_is_a_node_failure():
    docs = [doc(0, [0], [KiB], world=2, backend="gloo"), {"probe_error": "did not finish within 30 s"}]
    names = ["n001", "n002"]
    view = builders.view({n: {"allreduce": d} for n, d in zip(names, docs)},
                         nodes=[NodeInfo(n, n, 0) for n in names],
                         cluster={"allreduce": {"backend": "gloo", "world_size": 2, "nodes": names}})
    findings = ar_rule.rank_findings(view)
    assert the(findings, "n002").message == "bench agent failed: did not finish within 30 s"
    assert the(findings).status is Status.FAIL


def test_a_stall_blames_no_rank_that_only_reported_the_reset():
    reset = {"status": "error", "stage": "size", "bytes": 2 * MiB,
             "error": "RuntimeError: Connection closed by peer [198.19.0.6]:57505. This is typically caused by a remote"}
    stopped = {"status": "timeout", "stage": "size", "bytes": 2 * MiB, "error": "no progress within the op deadline (20 s)"}
    status = {0: reset, 1: reset, 2: reset, 3: stopped}
    docs = eight_ranks_on(4, 1, [MiB], backend="gloo", status=status)
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    (main,) = findings  # no node finding: the ranks that saw the reset did not cause it
    assert main.status is Status.FAIL and main.message.startswith(
        "all-reduce stalled at 2 MiB: rank 3 (n004) made no progress within the 20 s op deadline"), main.message
    assert "ranks 0-2 (n[001-003]) then lost the connection" in main.message



def test_a_node_that_vanished_mid_sweep_is_the_only_one_named():
    """n004's agent sent nothing (the node died mid-sweep); the others report only the lost connection."""
    lost = {"status": "error", "stage": "size", "bytes": 4 * KiB,
            "error": "RuntimeError: Connection closed by peer [198.19.0.6]:57505"}
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo", status={r: lost for r in range(3)})
    docs[3] = None
    view = cluster(docs, gpus=0, world_size=4, ranks={"n%03d" % (i + 1): [i, i] for i in range(4)},
                   unanswered={"n004": "no all-reduce result: connection closed"})
    findings = ar_rule.rank_findings(view)
    assert [f.node for f in findings if f.status is Status.FAIL] == ["n004", None]
    assert the(findings).message == ("all-reduce failed at 4 KiB: ranks 0-2 (n[001-003]) lost the connection to a "
                                     "node that vanished mid-run (RuntimeError: Connection closed by peer "
                                     "[198.19.0.6]:57505); no result from n004 (rank 3)")
    assert localize.localization_plan({n: d for n, d in zip(view.cluster["allreduce"]["nodes"], docs) if d},
                                      view.cluster["allreduce"]) is None  # nothing left to localize
    # the twin: every node answered and one rank died on its own: the same wording as before names it
    died = dict(lost, error="rank process killed by signal 9")
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo", status={0: lost, 1: lost, 2: lost, 3: died})
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    assert [f.node for f in findings if f.status is Status.FAIL] == [None, "n004"]


_OTHER_STORE = {"status": "error", "stage": "init", "step": "store",
                "error": "RuntimeError: the rendezvous store at 198.19.0.3:29500 belongs to another preflight run "
                         "(run 9f2c, not this run's 41aa)"}
_PORT_TAKEN = {"status": "error", "stage": "init", "step": "store",
               "error": "DistNetworkError: The server socket has failed to listen on any local network address. "
                        "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"}


@pytest.mark.parametrize("case,words", [
    ("held", "another preflight run on this machine (pid 4242) is testing n[001-002] right now"),
    ("busy", "port 29500 on n001 is in use by another preflight run (pid 4242, uid 0)"),
    ("stray", "the ranks of n002 reached another preflight run's store at 198.19.0.3:29500"),
    ("taken", "port 29500 on n001 was taken when rank 0's store bound it (EADDRINUSE)"),
])
def test_another_run_holding_the_rendezvous_is_a_retest_never_a_node_failure(case, words):
    meta = {"master": "198.19.0.3:29500"}
    docs = eight_ranks_on(2, 1, [KiB], backend="gloo")
    if case == "held":
        meta["held"] = {"n001": {"pid": 4242, "uid": 0}, "n002": {"pid": 4242, "uid": 0}}
    elif case == "busy":  # the head's agent found the port claimed: no rank started; n002's hit that run's store
        docs[0] = dict(docs[0], ranks=[], busy={"port": 29500, "pid": 4242, "uid": 0},
                       error="another preflight run (pid 4242, uid 0) holds the rendezvous port 29500 on this node")
        docs[1] = doc(1, [1], [KiB], world=2, backend="gloo", status={1: _OTHER_STORE})
    elif case == "stray":
        docs[1] = doc(1, [1], [KiB], world=2, backend="gloo", status={1: _OTHER_STORE})
    else:
        docs = [doc(0, [0], [KiB], world=2, backend="gloo", status={0: _PORT_TAKEN}),
                doc(1, [1], [KiB], world=2, backend="gloo", status={1: hung_entry("init", None, "store")})]
    view = cluster(docs, gpus=0, **meta)
    (f,) = ar_rule.rule(view)
    assert (f.node, f.status, f.action) == (None, Status.ERROR, "retest"), f
    assert f.message.startswith("all-reduce not run: ") and words in f.message, f.message
    names = view.cluster["allreduce"]["nodes"]
    assert localize.localization_plan(dict(zip(names, docs)), view.cluster["allreduce"]) is None


def test_a_rank_that_cannot_reach_its_own_store_still_names_its_node():
    """The twin: a store error that is not another run's store nor a taken port keeps its node verdict."""
    refused = dict(_OTHER_STORE, error="DistNetworkError: failed to connect to 198.19.0.3:29500 (Connection refused)")
    docs = [doc(0, [0], [KiB], world=2, backend="gloo"), doc(1, [1], [KiB], world=2, backend="gloo", status={1: refused})]
    findings = ar_rule.rank_findings(cluster(docs, gpus=0))
    assert [f.node for f in findings if f.status is Status.FAIL] == [None, "n002"]

# ------------------------------------------------------------------------------------ what NCCL chose (rule)


_NCCL_FIXTURES = Path(TESTS) / "fixtures" / "allreduce"


def _nccl_view(logs, env=None, ib_ports=None, gpudirect=None):
    """Two nccl nodes that passed the sweep; node n00k's rank logs are logs[k-1] (fixture file names)."""
    docs = eight_ranks_on(2, 1, [GiB], time_s=0.01)
    for d, name in zip(docs, logs):  # a fixture's name, or a log's text
        d["ranks"][0]["nccl_log"] = name if "\n" in name else (_NCCL_FIXTURES / name).read_text()
        d["ranks"][0]["init_s"] = 5.0
    # rails: the controller's usable_hcas() over ib_hca facts (preflight.checks.allreduce.stage), one ACTIVE 400G port
    rails = {n: ["mlx5_0:1"] if (ib_ports or {}).get(n) else [] for n in ["n001", "n002"]}
    view = cluster(docs, gpus=1, env={"NCCL_SOCKET_IFNAME": "=eth1"} if env is None else env, rails=rails)
    for n in ["n001", "n002"]:
        if gpudirect is not None:
            view.facts[n]["gpudirect"] = gpudirect
    return view


def _node_findings(view, node):
    return [f for f in ar_rule.rule(view) if f.node == node and f.data and "nccl" in f.data]


def test_nccl_socket_fallback_with_an_active_hca_fails_the_node():
    view = _nccl_view(["socket_fallback.log", "socket_fallback.log"], ib_ports={"n001": True})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and "fell back to sockets although mlx5_0:1 is ACTIVE" in f.message, f.message
    assert "NCCL's IB transport found no device" in f.message and '[NCCL: "NET/IB : No device found."]' in f.message
    assert f.action == "fix_config"
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
    assert "through host memory" in f.message and "GPU Direct RDMA Disabled for HCA 0 'mlx5_0'" in f.message
    assert f.action == "fix_config"
    (g,) = _node_findings(view, "n002")
    assert g.status is Status.PASS and "GPUDirect RDMA enabled" in g.message and "P2P/CUMEM" in g.message
    view = _nccl_view(["ib_no_gdr.log", "ib_gdr.log"], env={"NCCL_SOCKET_IFNAME": "=eth1,ib0"})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.PASS and "GPUDirect RDMA not judged: no gpudirect facts" in f.message
    assert f.data["gdr_note"]


def test_nccl_sockets_seen_only_in_channel_lines_are_a_worse_path_where_ib_rails_exist():
    # no "Using network" line (NVIDIA/nccl#1232's excerpt): the transport comes from "via NET/Socket/0"
    view = _nccl_view(["socket_channels_prefixed.log", "socket_channels_prefixed.log"], ib_ports={"n001": True})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and "fell back to sockets although mlx5_0:1 is ACTIVE" in f.message, f.message
    (g,) = _node_findings(view, "n002")  # the twin: a socket-only node with no IB HCA has no better path
    assert g.status is Status.PASS and "NET/Socket" in g.message, g.message


def test_nccl_traffic_over_a_container_veth_fails_though_the_env_file_names_no_interface():
    view = _nccl_view(["veth_link_local_timeout.log", "socket_fallback.log"], env={})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.FAIL and f.action == "fix_config", f.message
    assert "NCCL sent traffic over veth25f2e72: veth25f2e72 is a container/bridge interface and has only an IPv6 " \
        "link-local address (fe80::380d:bfff:fe5b:54d2)" in f.message, f.message
    assert "[NCCL: \"NET/Socket : Using [0]eth1:198.19.0.9<0> [1]veth25f2e72:" in f.message
    assert 'network faults between nodes: "Call to connect returned Connection timed out, retrying"' in f.message
    (g,) = _node_findings(view, "n002")  # the twin: sockets on a routable eth1, no env file: nothing to say
    assert g.status is Status.PASS, g.message


def test_a_link_local_interface_nccl_only_listed_is_a_warning():
    text = (_NCCL_FIXTURES / "veth_link_local_timeout.log").read_text()
    text = "\n".join(line for line in text.replace("NET/Socket/1", "NET/Socket/0").splitlines()
                      if "timed out" not in line) + "\n"
    view = _nccl_view([text, "socket_fallback.log"], env={})
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.WARN and "NCCL listed for its sockets veth25f2e72" in f.message, f.message
    assert f.action == "fix_config"


def test_network_faults_nccl_survived_are_a_warning_and_a_failure_cites_them():
    view = _nccl_view(["socket_error_chain.log", "socket_fallback.log"])
    (f,) = _node_findings(view, "n001")
    assert f.status is Status.WARN and "NET/Socket" in f.message, f.message  # network read from the error chain
    assert 'network faults between nodes: "Net : Call to recv from 198.19.0.7<58355> failed : Broken pipe"' \
        in f.message
    # a run that hung at init: the wording names the NCCL evidence of a network fault
    docs = eight_ranks_on(2, 1, [GiB], status={1: hung_entry("init", None, step="group")})
    docs[1]["ranks"][0]["nccl_log"] = (_NCCL_FIXTURES / "veth_link_local_timeout.log").read_text()
    g = the(ar_rule.rank_findings(cluster(docs, gpus=1)))
    assert g.status is Status.FAIL and "NCCL on n002 reported network faults (\"Call to connect returned " \
        "Connection timed out, retrying\")" in g.message, g.message
    assert g.data["nccl_net_faults"] == {"n002": ["Call to connect returned Connection timed out, retrying"]}


def test_an_unreadable_nccl_log_is_an_error_not_a_pass():
    view = _nccl_view(["warn_only.log", "ib_gdr.log"], env={"NCCL_SOCKET_IFNAME": "ib"})
    (f,) = [x for x in ar_rule.rule(view) if x.node == "n001"]
    assert f.status is Status.ERROR and "no 'NCCL INFO' line" in f.message


def test_sku_profiles_warn_below_the_published_figure_above_the_fail_floor():
    # 8x H100, one node at 340 GB/s busbw: above the 315 GB/s FAIL floor, below 80% of the published 460
    t = GiB / (340e9 / busbw_factor(8))
    docs = eight_ranks_on(1, 8, [GiB], time_s=t)
    f = the(ar_rule.rank_findings(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3")))
    assert f.status is Status.WARN and "below 368 GB/s" in f.message and f.data["warn_gbps"] == 368.0, f.message
    docs = eight_ranks_on(1, 8, [GiB], time_s=GiB / (470e9 / busbw_factor(8)))
    assert the(ar_rule.rank_findings(cluster(docs, gpu_model="NVIDIA H100 80GB HBM3"))).status is Status.PASS


# ------------------------------------------------------------------------- fleet judgement (rounds -> rule)


def test_rule_reports_the_localization_from_cluster_metadata():
    nodes = ["n%03d" % i for i in range(1, 5)]
    run_round, _calls = fake_round({"n002"})
    verdict = localize.localize(nodes, run_round)
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo")
    view = cluster(docs, gpus=0, localization={"results": verdict["results"]})
    findings = ar_rule.rule(view)
    (main,) = [f for f in findings if f.node is None]  # one cluster verdict, the pair test folded in
    assert main.status is Status.FAIL and "pair test: exclude n002" in main.message, main.message
    assert the([f for f in findings if f.message.startswith("pair test")], "n002").status is Status.FAIL


def _node_round(figures, name="loopback", fraction=None, again=None):
    """A node round's results: figures {node: GB/s} alone (pass 0); again {suspect: (GB/s, good node,
    its GB/s)}: the confirmation pass, each suspect timed beside a known-good node."""
    rnd = {"name": name, "what": "two local ranks", "sizes": [4 * MiB],
           "results": [{"nodes": [n], "busbw_gbps": bw, "best_gbps": bw, "failure": None, "pass": 0}
                       for n, bw in figures.items()]}
    for s, (bw, g, gbw) in (again or {}).items():
        rnd["results"] += [{"nodes": [s], "busbw_gbps": bw, "best_gbps": bw, "failure": None, "pass": 1, "beside": g},
                           {"nodes": [g], "busbw_gbps": gbw, "best_gbps": gbw, "failure": None, "pass": 1,
                            "control_for": s}]
    if fraction is not None:
        rnd["slow_fraction"] = fraction
    return rnd


def test_no_threshold_a_healthy_fleet_passes_and_a_slow_node_is_named():
    docs = eight_ranks_on(4, 1, ar_cpu_sizes(), backend="gloo")
    even = {"n%03d" % i: 1.0 + 0.02 * i for i in range(1, 5)}
    view = cluster(docs, gpus=0, node_rounds=[_node_round(even, "nvlink")])
    (main,) = ar_rule.rule(view)
    assert main.status is Status.PASS, main.message
    assert "no absolute threshold set: judged against the fleet" in main.message
    assert "node round nvlink at 4 MiB: every node within 10% of the fleet median" in main.message
    slow = dict(even, n003=0.7)  # 33% below the median of the others
    # alone, once: a suspect, not named (one moment on a shared machine proves nothing)
    (main,) = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[_node_round(slow, "nvlink")]))
    assert main.status is Status.PASS and "n003 slow: busbw 0.70 GB/s" in main.message
    assert "not confirmed (no second measurement)" in main.message, main.message
    # beside a known-good node timed at the same moment, fine: not named, and said so
    fine = _node_round(slow, "nvlink", again={"n003": (1.05, "n004", 1.08)})
    (main,) = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[fine]))
    assert main.status is Status.PASS and "n003 not confirmed: slow: busbw 0.70 GB/s" in main.message, main.message
    # slow again beside it: named
    findings = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[_node_round(slow, "nvlink",
                                                                             again={"n003": (0.6, "n004", 1.08)})]))
    main = the(findings)
    assert main.status is Status.FAIL and "node round nvlink at 4 MiB: n003" in main.message
    n3 = the(findings, "n003")
    assert n3.status is Status.FAIL and "alone (two local ranks): slow: busbw 0.70 GB/s" in n3.message
    assert "confirmed slow: busbw 0.60 GB/s, 44% below n004 measured beside it 1.08 GB/s" in n3.message
    assert [f.node for f in findings if f.status is Status.FAIL] == [None, "n003"]
    # 10-20% below, confirmed: a warning for the node (retest), not a failure
    low = _node_round(dict(even, n003=0.9), "nvlink", again={"n003": (0.93, "n004", 1.08)})
    findings = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[low]))
    assert the(findings).status is Status.WARN and the(findings, "n003").status is Status.WARN
    assert the(findings, "n003").action == "retest" and "low: busbw 0.90 GB/s" in the(findings, "n003").message
    # judged on completion only: a slow figure names nobody, a failure does
    loose = dict(_node_round(slow), by_bandwidth=False)
    assert [f.status for f in ar_rule.rule(cluster(docs, gpus=0, node_rounds=[loose]))] == [Status.PASS]
    broken = dict(loose, results=loose["results"][:2] + [{"nodes": ["n003"], "busbw_gbps": None,
                                                          "failure": "failed at 4 MiB (rank 0: boom)"}])
    named = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[broken]))
    assert [f.node for f in named if f.status is Status.FAIL] == [None, "n003"]


def test_the_gloo_loopback_is_judged_on_completion_only():
    """The CPU loopback stays in the node's kernel (its data address is local), so its figure is the node's
    CPU: a healthy node confirmed "slow" there under CI's two test workers. A slow loopback names nobody (the
    pair test judges bandwidth); its twin, the same figures in a GPU node round (NVLink), still fails the
    node; a loopback that did not complete still fails it."""
    docs = eight_ranks_on(4, 1, ar_cpu_sizes(), backend="gloo")
    slow = {"n001": 1.02, "n002": 1.04, "n003": 0.7, "n004": 1.08}
    again = {"n003": (0.6, "n004", 1.08)}
    findings = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[_node_round(slow, "loopback", again=again)]))
    assert [f.status for f in findings] == [Status.PASS]
    assert "node round loopback at 4 MiB: every node completed alone" in the(findings).message
    findings = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[_node_round(slow, "nvlink", again=again)]))
    assert the(findings, "n003").status is Status.FAIL
    broken = _node_round(slow, "loopback")
    broken["results"][2] = {"nodes": ["n003"], "busbw_gbps": None, "failure": "failed at 4 MiB (rank 0: boom)",
                            "pass": 0}
    assert the(ar_rule.rule(cluster(docs, gpus=0, node_rounds=[broken])), "n003").status is Status.FAIL


def test_a_rank_slowest_at_most_sizes_is_named_a_straggler():
    sizes = [KiB << i for i in range(6)]
    docs = eight_ranks_on(4, 1, sizes, backend="gloo", slow={2: 1.6})
    main = the(ar_rule.rank_findings(cluster(docs, gpus=0)))
    assert "straggler: rank 2 (n003) slowest at 6 of 6 sizes, 1.6x the median rank" in main.message, main.message
    assert main.data["straggler"]["node"] == "n003" and len(main.data["slowest_per_size"]) == 6
    even = eight_ranks_on(4, 1, sizes, backend="gloo", slow={2: 1.1})
    assert "straggler" not in the(ar_rule.rank_findings(cluster(even, gpus=0))).message  # within 20% of the median rank


def test_half_the_fleet_slow_in_a_node_round_is_still_named_by_the_healthy_majority():
    docs = eight_ranks_on(5, 1, ar_cpu_sizes(), backend="gloo")
    figures = {"n001": 10.0, "n002": 10.2, "n003": 9.9, "n004": 4.0, "n005": 4.1}  # 2 of 5 slow
    again = {"n004": (4.2, "n001", 10.1), "n005": (3.9, "n002", 9.8)}
    findings = ar_rule.rule(cluster(docs, gpus=0, node_rounds=[_node_round(figures, "nic", again=again)]))
    assert sorted(f.node for f in findings if f.node and f.status is Status.FAIL) == ["n004", "n005"]


def test_a_failed_run_and_its_localization_print_one_cluster_verdict():
    hung = {"status": "timeout", "stage": "size", "bytes": 2 * KiB, "error": "no progress"}
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo", status={r: hung for r in range(4)})
    groups = [{"nodes": ["n001", "n003"], "busbw_gbps": 0.1, "failure": None},
              {"nodes": ["n002", "n004"], "busbw_gbps": 0.1, "failure": None}]
    view = cluster(docs, gpus=0, localization={"results": groups, "by_bandwidth": False})
    cluster_findings = [f for f in ar_rule.rule(view) if f.node is None]
    assert len(cluster_findings) == 1 and cluster_findings[0].status is Status.FAIL
    assert "pair test: every group passed: no node stands out" in cluster_findings[0].message


def test_a_localization_left_undecided_warns_with_its_retest_action_a_clean_one_adds_none_to_the_runs_own_warn():
    docs = eight_ranks_on(4, 1, [KiB], backend="gloo")
    hung = [{"nodes": ["n001", "n002"], "busbw_gbps": None, "failure": "hung at 1 KiB"},
            {"nodes": ["n003", "n004"], "busbw_gbps": 0.1, "failure": None}]
    (main,) = [f for f in ar_rule.rule(cluster(docs, gpus=0, localization={"results": hung, "by_bandwidth": False}))
               if f.node is None]
    assert main.status is Status.WARN and "could not localize" in main.message, main.message
    assert main.action == "retest"
    clean = [dict(hung[1], nodes=["n001", "n002"]), hung[1]]
    (main,) = [f for f in ar_rule.rule(cluster(docs, gpus=0, localization={"results": clean, "by_bandwidth": False}))
               if f.node is None]
    # the run's own WARN (no threshold on a CPU run) is not the rounds': they add no retest to it
    assert "every group passed" in main.message and main.action is None, (main.action, main.message)


def ar_cpu_sizes():
    return [KiB, 4 * MiB]


# ------------------------------------------------------------------------------------------ import contract


def _imports(path):
    """(module imported, names imported from it) for every import statement in the file."""
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_the_allreduce_folder_imports_one_way():
    """rule.py and stage.py use the folder's library (busbw, judge, localize, nccllog, plan, timeplan, wording);
    the library never imports them back (tests/test_structure.py guards the rest: no other check, no private name)."""
    folder = Path(REPO) / "preflight" / "checks" / "allreduce"
    top = {"preflight.checks.allreduce.rule", "preflight.checks.allreduce.stage"}
    for path in sorted(folder.glob("*.py")):
        if path.name in ("__init__.py", "rule.py", "stage.py"):
            continue
        for module, names in _imports(path):
            back = module in top or (module == "preflight.checks.allreduce" and {"rule", "stage"} & set(names))
            assert not back, "%s imports %s %s: the library must not import the rule or the stage" % (
                path.name, module, names)


def test_the_check_imports_the_controller_package_only_when_its_rule_runs():
    """The check's declaration travels in the node bundle: importing it loads none of the folder's controller
    modules (rule, stage, the all-reduce's planning and judging), and the bundle carries none."""
    code = ("import sys; import preflight.checks.allreduce as ar; "
            "assert not [m for m in sys.modules if m.startswith('preflight.checks.allreduce.')], sorted(sys.modules); "
            "ar.CHECK.name; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(REPO))))
    assert out.stdout.strip() == "ok", out.stderr
    names = zipfile.ZipFile(io.BytesIO(bundle.base_zip())).namelist()
    # the check has no node probe: since main's b6918d3 the bundle leaves its source out too
    assert not [n for n in names if n.startswith("preflight/checks/allreduce/") or "checks/allreduce" in n]

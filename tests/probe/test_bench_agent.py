"""bench_agent on this machine with real torch.distributed (gloo on 127.0.0.1): runs, hangs, deaths, cleanup.

Each "node" is one agent; several agents run at once in threads, as the controller runs them on several
nodes. No mocks: the ranks are real processes that import torch and rendezvous over TCP.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from preflight.checks.allreduce import localize, plan
from preflight.checks.allreduce.nccllog import parse_nccl_log
from preflight.checks.allreduce import rule as allreduce_rule
from preflight.model import NodeInfo, Status
from preflight.probe import bench_agent, portclaim
from tests import builders
from tests.netports import free_port  # a port of this worker's own block

# The ranks import torch; this process never does (it is slow, and the agent must not need it).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")

SMALL = [1024, 2048, 4096, 65536]


def config(port, world, node_rank=0, local=1, offset=None, sizes=SMALL, **deadlines):
    # Generous unless a test is about a deadline: healthy runs end long before, and a loaded CI box
    # (torch's import alone can take 10 s when the CPUs are starved) must not turn into a false timeout.
    dl = {"init_s": 60, "op_s": 30, "total_s": 120, "kill_grace_s": 1, "fail_grace_s": 2}
    dl.update(deadlines)
    return {
        "backend": "gloo",
        "master_addr": "127.0.0.1",
        "master_port": port,
        "world_size": world,
        "node_rank": node_rank,
        "nnodes": 1,
        "local_world_size": local,
        "rank_offset": offset,
        "env": {"GLOO_SOCKET_IFNAME": "lo"},
        "sizes": sizes,
        "warmup": 1,
        "iters": 3,
        "deadlines": dl,
    }


def run_all(*calls):
    """Run bench_agent.run(*args) for every args tuple at once, as the controller does across nodes."""
    results = [None] * len(calls)

    def one(i, args):
        results[i] = bench_agent.run(*args)

    threads = [threading.Thread(target=one, args=(i, args)) for i, args in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def our_ranks(agent_pid=None):
    """PIDs of live processes started by the agent running in `agent_pid` (default: this process)."""
    marker = ("PREFLIGHT_AGENT_PID=%d" % (agent_pid or os.getpid())).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as fh:
                env = fh.read().split(b"\0")
            with open("/proc/%s/stat" % entry) as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env and state != "Z":
            found.append(int(entry))
    return found


def assert_no_leftovers(*docs):
    for doc in docs:
        for r in doc["ranks"]:
            assert r["exit"] is not None, r
            assert not os.path.exists("/proc/%d" % r["pid"]), "rank %d (pid %d) still exists" % (r["rank"], r["pid"])
    assert our_ranks() == []


def rule_over(docs, nodes, backend="gloo"):
    meta = plan.cluster_meta({n: {"backend": backend, "world_size": d["world_size"], "node_rank": d["node_rank"],
                                       "rank_offset": d["ranks"][0]["rank"], "local_world_size": len(d["ranks"]),
                                       "master_addr": "127.0.0.1", "master_port": 1, "deadlines": {}}
                                   for n, d in zip(nodes, docs)})
    infos = [NodeInfo(n, n, 0) for n in nodes]
    view = builders.view({n: {"allreduce": d} for n, d in zip(nodes, docs)}, nodes=infos, cluster={"allreduce": meta})
    return allreduce_rule.rank_findings(view)


def test_two_agents_as_two_nodes_sweep_the_cpu_sizes():
    from preflight.transport.bundle import base_zip

    port = free_port()
    sizes = plan.CPU_SIZES
    started = time.monotonic()
    # node 1 gets its worker from the probe bundle's zip, as on a real node; node 0 through the importer.
    a, b = run_all(
        (config(port, 2, node_rank=0, sizes=sizes),),
        (config(port, 2, node_rank=1, sizes=sizes), base_zip()),
    )
    elapsed = time.monotonic() - started
    for doc, rank in ((a, 0), (b, 1)):
        assert doc["error"] is None and doc["deadline"] is None, doc
        (r,) = doc["ranks"]
        assert (r["rank"], r["status"], r["exit"]) == (rank, "ok", 0), r
        assert [s["bytes"] for s in r["sizes"]] == sizes
        assert all(s["ok"] and s["time_s"] > 0 for s in r["sizes"])
    assert a["rendezvous"]["arrived"] == [0, 1]
    assert "rendezvous" not in b
    assert_no_leftovers(a, b)
    print("two agents, 13 sizes: %.1f s" % elapsed)

    findings = rule_over([a, b], ["n001", "n002"])
    (f,) = findings
    assert f.status is Status.WARN and "no threshold applies" in f.message
    assert [p["bytes"] for p in f.data["curve"]] == sizes
    assert all(p["busbw_gbps"] == pytest.approx(p["algbw_gbps"]) for p in f.data["curve"])  # n=2: factor 1


def test_one_agent_with_two_local_ranks():
    port = free_port()
    (doc,) = run_all((config(port, 2, local=2),))
    assert [(r["rank"], r["local_rank"], r["status"]) for r in doc["ranks"]] == [(0, 0, "ok"), (1, 1, "ok")]
    for r in doc["ranks"]:
        assert [s["bytes"] for s in r["sizes"]] == SMALL and all(s["ok"] for s in r["sizes"])
    assert_no_leftovers(doc)


def test_missing_rank_is_an_init_timeout_within_the_deadline():
    port = free_port()
    (doc,) = run_all((config(port, 3, local=2, init_s=10),))
    assert doc["deadline"] == {"kind": "init", "limit_s": 10.0}  # the init deadline ended it, not total_s (120)
    for r in doc["ranks"]:
        assert (r["status"], r["stage"], r["bytes"]) == ("timeout", "init", None), r
    assert_no_leftovers(doc)
    if {r["step"] for r in doc["ranks"]} != {"group"}:
        pytest.skip("CPU starved: the ranks were still importing torch at the deadline")
    assert doc["rendezvous"]["arrived"] == [0, 1]  # both reached the store; the group never formed

    infos = [NodeInfo("n001", "n001", 0), NodeInfo("n002", "n002", 0)]
    meta = {"backend": "gloo", "world_size": 3, "nodes": ["n001", "n002"], "ranks": {"n001": [0, 1], "n002": [2, 2]},
            "unanswered": {"n002": "no answer within 60 s"}}
    view = builders.view({"n001": {"allreduce": doc}}, nodes=infos, cluster={"allreduce": meta})
    cluster = [f for f in allreduce_rule.rank_findings(view) if f.node is None][0]
    assert cluster.status is Status.FAIL
    assert "hung at init: rank 2 (n002) never reached the rendezvous at 127.0.0.1:%d within 10 s" % port in cluster.message


def test_rank_killed_mid_run_is_reported_as_an_error():
    port = free_port()
    killed = []

    def kill_rank_1(info, event):  # once the sweep starts: the whole sweep outlasts the agent's reaction
        if info["local_rank"] == 1 and event["event"] == "init_done" and not killed:
            os.kill(info["pid"], signal.SIGKILL)
            killed.append(info["pid"])

    sizes = [1024 << i for i in range(12)]
    doc = bench_agent.run(dict(config(port, 2, local=2, sizes=sizes), iters=10), on_event=kill_rank_1)
    r0, r1 = doc["ranks"]
    assert killed == [r1["pid"]]
    assert r1["status"] == "error" and r1["stage"] == "size" and r1["exit"] == -9, r1
    assert "killed by signal 9" in r1["error"] and r1["bytes"] in sizes
    assert r0["status"] in ("error", "aborted"), r0  # gloo notices the dead peer, or the agent stops it
    assert_no_leftovers(doc)

    (f, node_f) = rule_over([doc], ["n001"])
    assert f.status is Status.FAIL and f.message.startswith("all-reduce failed at ")
    assert "rank 1 (n001): rank process killed by signal 9" in f.message
    assert node_f.node == "n001" and node_f.status is Status.FAIL


def test_stalled_rank_trips_the_op_deadline_and_is_killed():
    """A rank that stops answering (SIGSTOP: it ignores SIGTERM) hangs its peer; both are killed."""
    port = free_port()
    stopped = []

    def stop_rank_1(info, event):
        if info["local_rank"] == 1 and event["event"] == "init_done" and not stopped:
            os.kill(info["pid"], signal.SIGSTOP)
            stopped.append(info["pid"])

    sizes = [1024 << i for i in range(12)]
    started = time.monotonic()
    doc = bench_agent.run(dict(config(port, 2, local=2, sizes=sizes, op_s=3), iters=10), on_event=stop_rank_1)
    elapsed = time.monotonic() - started
    assert doc["deadline"] == {"kind": "op", "limit_s": 3.0}
    r0, r1 = doc["ranks"]
    assert r0["status"] == "timeout" and r0["stage"] == "size" and r0["bytes"] in sizes, r0
    assert r1["status"] == "timeout" and r1["exit"] == -9, r1  # SIGTERM stayed pending: SIGKILL did it
    assert_no_leftovers(doc)
    print("stalled run: %.1f s" % elapsed)

    f = rule_over([doc], ["n001"])[0]
    assert f.status is Status.FAIL and "all-reduce hung at " in f.message and "did not finish within 3 s" in f.message


def test_sigterm_to_the_agent_kills_its_ranks():
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "preflight.probe.bench_agent"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    agent.stdin.write(json.dumps(config(port, 3, local=2, init_s=60)).encode())
    agent.stdin.close()
    deadline = time.monotonic() + 20
    while len(our_ranks(agent.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(our_ranks(agent.pid)) == 2
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(15) == 128 + signal.SIGTERM
    agent.stdout.close()
    agent.stderr.close()
    assert our_ranks(agent.pid) == []


def test_bad_config_and_missing_interpreter_still_return_a_document():
    doc = bench_agent.run({"backend": "mpi"})
    assert doc["error"].startswith("invalid config") and doc["ranks"] == []
    doc = bench_agent.run(dict(config(free_port(), 2), world_size=1, rank_offset=1))
    assert "do not fit world_size 1" in doc["error"]
    doc = bench_agent.run(dict(config(free_port(), 1), python="/nonexistent/python3"))
    (r,) = doc["ranks"]
    assert r["status"] == "error" and r["stage"] == "init" and "cannot start /nonexistent/python3" in r["error"]


def test_a_size_over_the_budget_ends_the_sweep_cleanly_on_every_rank():
    port = free_port()
    cfg = dict(config(port, 2, local=2), size_budget_s=1e-9)  # every next size is "too slow"
    (doc,) = run_all((cfg,))
    assert doc["error"] is None and doc["deadline"] is None, doc
    for r in doc["ranks"]:
        assert r["status"] == "ok" and r["exit"] == 0, r
        assert [s["bytes"] for s in r["sizes"]] == SMALL[:1]
        assert r["cut"]["bytes"] == SMALL[1] and r["cut"]["projected_s"] > r["cut"]["budget_s"] == 1e-9
    assert_no_leftovers(doc)
    (f,) = rule_over([doc], ["n001"])
    assert "sweep stopped before 2 KiB" in f.message, f.message


#: a sitecustomize for the ranks: the first all-reduce of 256 float32 (the 1 KiB size's first warm-up
#: iteration) stalls, as a starved CPU stalls a rank (the flake of tests/e2e/test_envfile.py under load)
STALL_ONCE = """
import time
import torch.distributed as dist
_real, _seen = dist.all_reduce, []
def _stalled(tensor, *args, **kwargs):
    if tensor.numel() == 256 and not _seen:
        _seen.append(1)
        time.sleep(1.0)
    return _real(tensor, *args, **kwargs)
dist.all_reduce = _stalled
"""


def test_a_stall_in_a_small_size_does_not_cut_the_sweep(tmp_path):
    """Twin of the cut: a size whose wall time is a stall (1 s in one 1 KiB iteration), not its bytes, is
    projected at its best iteration's pace, so 64 KiB runs (the wall time said 64 s, over the 5 s budget)."""
    site = tmp_path / "stall"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STALL_ONCE)
    cfg = dict(config(free_port(), 2, local=2, sizes=[1024, 65536]), size_budget_s=5.0)
    cfg["env"] = dict(cfg["env"], PYTHONPATH=str(site))
    (doc,) = run_all((cfg,))
    assert doc["error"] is None and doc["deadline"] is None, doc
    for r in doc["ranks"]:
        assert r["status"] == "ok" and r["cut"] is None, r
        assert [s["bytes"] for s in r["sizes"]] == [1024, 65536]
    assert max(s["max_s"] for r in doc["ranks"] for s in r["sizes"][:1]) < 1.0  # the stall was in a warm-up
    assert_no_leftovers(doc)


def test_nccl_debug_lines_are_kept_apart_from_the_error_tail():
    log = ("n001:11:12 [0] NCCL INFO Bootstrap : Using eth1:198.19.0.3<0>\n"
           "NCCL version 2.21.5+cuda12.4\n"
           "n001:11:40 [0] NCCL INFO NET/Socket : Using [0]eth1:198.19.0.3<0>\n"
           "n001:11:40 [0] NCCL INFO Using network Socket\n")
    noise = "Traceback (most recent call last):\nRuntimeError: boom\n"
    rank2 = bench_agent._Rank(1, 1)
    rank2.add_stderr((log + noise).encode()[:33])
    rank2.add_stderr((log + noise).encode()[33:])
    rank2.add_stderr(b"", final=True)
    assert rank2.nccl_log == log.rstrip("\n").split("\n")
    assert rank2.last_stderr_line() == "RuntimeError: boom" and "NCCL" not in rank2.stderr_tail()
    assert parse_nccl_log("\n".join(rank2.nccl_log))["transport"] == "NET/Socket"
    small = bench_agent._Rank(2, 2)
    small.add_stderr((log * 2000).encode(), final=True)
    assert 0 < small.nccl_bytes <= bench_agent.NCCL_LOG_MAX and small.nccl_log[0] == log.split("\n")[0]


def test_pair_rotations_run_in_the_same_processes_after_the_sweep():
    # four "nodes" as four local ranks: the sweep, then every node alone (the gloo loopback: two gloo ranks
    # in each rank's process), then two rotations of disjoint pairs as sub-groups
    port = free_port()
    names = ["n001", "n002", "n003", "n004"]
    rotations = plan.pair_rotations(names)
    configs = {n: {"node_rank": i, "rank_offset": i, "local_world_size": 1, "backend": "gloo"}
               for i, n in enumerate(names)}
    # the loopback at its own iterations (3, the pairs 4) and with no confirmation pass: the rule judges it on
    # completion only, so a second pass would be timed for nothing
    node = plan.node_spec(configs, 3, 0.2)
    assert node == {"kind": "loopback", "nodes": [[0], [1], [2], [3]], "warn": 0.1, "iters": 3, "confirm": False}
    # with the recheck on (bench_worker._recheck): a node the rotations found low is re-measured in-process
    cfg = dict(config(port, 4, local=4), pairs=dict(plan.pair_spec(configs, rotations, 4), recheck=True, warn=0.1),
               node=node)
    (doc,) = run_all((cfg,))
    assert doc["deadline"] is None and doc.get("pairs_deadline") is None, doc
    for r in doc["ranks"]:
        assert r["status"] == "ok" and r["pairs_error"] is None and r["node_error"] is None, r
        assert [s["bytes"] for s in r["sizes"]] == SMALL
        assert [(p["rotation"], p["bytes"], p["ok"]) for p in r["pairs"] if not p.get("recheck")] == [
            (0, SMALL[-1], True), (1, SMALL[-1], True)]
        assert all(p["rotation"] >= 2 and p["ok"] for p in r["pairs"] if p.get("recheck")), r["pairs"]
        assert [(m["pass"], m["node"], m["bytes"], m["ranks"], m["ok"], m["iters"], m["iface"]) for m in r["nodes"]] == [
            (0, r["rank"], SMALL[-1], 2, True, 3, "lo")], r["nodes"]
        assert {p["iters"] for p in r["pairs"] if not p.get("recheck")} == {4}, r["pairs"]
    assert_no_leftovers(doc)
    # each rank's timeline in order, and rank 0, the store's host, ends after every other rank is done
    # (bench_worker._leave): a rank still making its last pair's sub-group never finds the store gone
    for r in doc["ranks"]:
        at = r["at"]
        steps = [at[k] for k in ("imported", "store", "init_done", "pairs_start", "node_done", "pairs_done", "done", "exit")]
        assert steps == sorted(steps), r["at"]
    first = doc["ranks"][0]
    assert first["rank"] == 0 and all(first["at"]["exit"] >= r["at"]["done"] for r in doc["ranks"]), doc["ranks"]
    per_node = {n: dict(doc, ranks=[doc["ranks"][i]]) for i, n in enumerate(names)}
    groups = localize.pair_results(per_node, configs, rotations)
    assert [g["nodes"] for g in groups if not g.get("recheck")] == [
        ["n001", "n003"], ["n002", "n004"], ["n001", "n004"], ["n002", "n003"]]
    assert all(g["failure"] is None and g["busbw_gbps"] > 0 and g["best_gbps"] >= g["busbw_gbps"] for g in groups), groups
    alone = localize.node_results(per_node, configs)
    assert [g["nodes"] for g in alone if g["pass"] == 0] == [[n] for n in names]
    assert all(g["failure"] is None and g["best_gbps"] >= g["busbw_gbps"] > 0 for g in alone), alone


def test_the_node_test_of_gpu_nodes_is_each_nodes_own_ranks_as_a_sub_group():
    """The NVLink test's code path ("local": a node's ranks as a sub-group of the sweep's world), run here
    with gloo: two "nodes" of two ranks each. On GPUs the same sub-group is NCCL over NVLink (unproven
    here: no GPU)."""
    port = free_port()
    configs = {n: {"node_rank": i, "rank_offset": 2 * i, "local_world_size": 2, "backend": "nccl"}
               for i, n in enumerate(["n001", "n002"])}
    node = plan.node_spec(configs, 3, 0.2)
    assert node == {"kind": "local", "nodes": [[0, 1], [2, 3]], "warn": 0.1, "iters": 3}
    assert plan.node_spec(dict(configs, n002=dict(configs["n002"], local_world_size=1)), 3, 0.2) is None
    (doc,) = run_all((dict(config(port, 4, local=4, sizes=SMALL[:1]), node=node),))
    for r in doc["ranks"]:
        assert r["status"] == "ok" and r["node_error"] is None, r
        assert [(m["pass"], m["node"], m["ranks"], m["ok"]) for m in r["nodes"]][:1] == [(0, r["rank"] // 2, 2, True)]
    assert_no_leftovers(doc)
    per_node = {"n001": dict(doc, ranks=doc["ranks"][:2]), "n002": dict(doc, ranks=doc["ranks"][2:])}
    alone = [g for g in localize.node_results(per_node, configs) if g["pass"] == 0]
    assert [g["nodes"] for g in alone] == [["n001"], ["n002"]], alone
    assert all(g["failure"] is None and g["bytes"] == SMALL[0] and g["best_gbps"] is not None for g in alone), alone


def test_a_failing_pair_phase_leaves_the_sweep_standing_and_says_why():
    # a group naming a rank outside the world: torch refuses it on every rank, in the pair phase
    port = free_port()
    (doc,) = run_all((dict(config(port, 2, local=2), pairs={"rotations": [[[0, 7]]], "iters": 3}),))
    for r in doc["ranks"]:
        assert r["status"] == "ok" and [s["bytes"] for s in r["sizes"]] == SMALL, r
        assert r["pairs"] == [] and r["pairs_error"] and r["pairs_error"].startswith("ValueError"), r
    assert doc["deadline"] is None
    assert_no_leftovers(doc)
    per_node = {"n001": dict(doc, ranks=[doc["ranks"][0]]), "n002": dict(doc, ranks=[doc["ranks"][1]])}
    configs = {"n001": {"rank_offset": 0, "local_world_size": 1}, "n002": {"rank_offset": 1, "local_world_size": 1}}
    (group,) = localize.pair_results(per_node, configs, [[["n001", "n002"]]])
    assert "pair test did not complete (ValueError" in group["failure"], group
    # the rule judges the sweep as if there had been no pair phase
    (f,) = rule_over([per_node["n001"], per_node["n002"]], ["n001", "n002"])
    assert f.status is Status.WARN and "no threshold applies" in f.message


def test_task_share_gives_each_srun_task_one_rank_and_merge_joins_them():
    """srun launches one task per rank: task i of node_rank 1 (two ranks a node) runs global rank 2 + i
    under LOCAL_RANK i; merge() gives back one document per node, ranks in order, rank 0's rendezvous."""
    from preflight.probe import bench_agent

    cfg = {"backend": "gloo", "master_addr": "127.0.0.1", "master_port": 1, "world_size": 4, "node_rank": 1,
           "local_world_size": 2, "rank_offset": 2, "sizes": [1024]}
    one = bench_agent.task_share(cfg, 1)
    assert (one["local_world_size"], one["rank_offset"], one["local_rank_offset"]) == (1, 3, 1)
    with pytest.raises(ValueError):
        bench_agent.task_share(cfg, 2)
    docs = [{"node_rank": 0, "ranks": [{"rank": 1}], "deadline": {"kind": "op", "limit_s": 4}, "error": None, "elapsed_s": 3.0},
            {"node_rank": 0, "ranks": [{"rank": 0}], "deadline": None, "error": None, "elapsed_s": 2.0,
             "rendezvous": {"addr": "127.0.0.1", "port": 1, "arrived": [0, 1]}}]
    merged = bench_agent.merge(docs)
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]
    assert merged["deadline"] == {"kind": "op", "limit_s": 4} and merged["elapsed_s"] == 3.0
    assert merged["rendezvous"]["arrived"] == [0, 1]


# ------------------------------------------------------------------------------------------ two runs at once


def test_the_store_host_finds_the_port_claimed_by_another_run_and_starts_no_rank():
    port = free_port()
    other = portclaim.claim(port)  # another run's agent on this node
    try:
        doc = bench_agent.run(config(port, 2))
    finally:
        other.close()
    assert doc["ranks"] == [] and doc["busy"] == {"port": port, "pid": os.getpid(), "uid": os.getuid()}
    assert doc["error"].startswith("another preflight run (pid %d" % os.getpid())
    assert our_ranks() == []
    (f,) = [x for x in rule_over([dict(doc, ranks=[{"rank": 0}])], ["n001"]) if x.node is None]
    assert f.status is Status.ERROR and f.action == "retest" and "in use by another preflight run" in f.message


#: bench_worker.RUN_KEY (importing the worker here would drop this process's sys.path[0], as it does in a rank)
RUN_KEY = "preflight/run_id"


def test_a_rank_at_another_runs_store_stops_there_and_never_joins():
    """Another run's store holds the port (a torch TCPStore whose rank 0 published its run id, in a process of
    its own): this launch's rank 1 reaches it, reads the id and stops at init with the reason, never recording
    an arrival there."""
    port = free_port()
    code = ("import sys, datetime, torch.distributed as dist\n"
            "s = dist.TCPStore('127.0.0.1', %d, 2, True, timeout=datetime.timedelta(seconds=120), wait_for_workers=False)\n"
            "s.set(%r, 'first-run')\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
            "print(sorted(k for k in ['preflight/arrived/1'] if s.check([k])), flush=True)\n") % (port, RUN_KEY)
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "ready", other.stderr.read()
        doc = bench_agent.run(dict(config(port, 2, node_rank=1), run_id="second-run"))
        out, _err = other.communicate("", timeout=60)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    (stray,) = doc["ranks"]
    assert (stray["status"], stray["stage"], stray["step"]) == ("error", "init", "store"), stray
    assert "belongs to another preflight run (run first-run, not this run's second-run)" in stray["error"]
    assert out.strip() == "[]"  # no arrival recorded in the other run's store
    assert_no_leftovers(doc)


def test_a_round_whose_control_shares_the_partner_alternates_them_in_one_launch():
    """Three "nodes" as three local ranks: the suspect pair b+a and its control c+a share a, so the round
    runs them as alternating turns of one launch (localize.interleaved, as stage._Rounds does on 3 nodes);
    every turn completes and each group's turns merge into one figure (localize.merge_turns)."""
    port = free_port()
    names = ["b", "a", "c"]  # the order the round launches them in: the suspect's group first
    configs = {n: {"node_rank": i, "rank_offset": i, "local_world_size": 1, "backend": "gloo"}
               for i, n in enumerate(names)}
    groups = [["b", "a"], ["c", "a"]]
    turns = localize.interleaved(groups)
    (doc,) = run_all((dict(config(port, 3, local=3, sizes=SMALL[-1:]), pairs=plan.pair_spec(configs, turns, 3)),))
    for r in doc["ranks"]:
        assert r["status"] == "ok" and r["pairs_error"] is None, r
    assert_no_leftovers(doc)
    per_node = {n: dict(doc, ranks=[doc["ranks"][i]]) for i, n in enumerate(names)}
    measured = localize.pair_results(per_node, configs, turns)
    assert len(measured) == 2 * localize.ALTERNATIONS and all(g["failure"] is None for g in measured), measured
    merged = localize.merge_turns(groups, measured)
    assert [(g["nodes"], g["turns"], g["failure"]) for g in merged] == [
        (["b", "a"], localize.ALTERNATIONS, None), (["c", "a"], localize.ALTERNATIONS, None)]
    assert all(g["best_gbps"] >= g["busbw_gbps"] > 0 for g in merged), merged
    # each turn's own figure, for the confirmation's rule (localize.overlap): the group's best is one of them
    assert all(len(g["turn_gbps"]) == localize.ALTERNATIONS and max(g["turn_gbps"]) == round(g["best_gbps"], 4)
               for g in merged), merged

"""The simulated-cluster all-reduce tests' shared helpers: an inventory with cluster.allreduce, one preflight run
and its JSON, the healthy verdict's invariants, and the probes of a run in progress (a rank's connections, the
ranks present on every node).

The tests live in several modules (tests/e2e/test_allreduce*.py), one per kind of scenario, so that pytest-xdist's
--dist loadfile spreads them over its workers: each test builds its own simulated cluster, none shares one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from preflight import common
from preflight.checks.allreduce import localize, plan
from preflight.checks.allreduce.busbw import busbw_factor
from tests.paths import REPO

CURVE_KEYS = {"bytes", "time_s", "algbw_gbps", "busbw_gbps", "slowest_rank", "fastest_rank"}
LOW_BUSBW = 0.001  # GB/s (the inventory minimum): any healthy gloo sweep on veth links clears it


#: The simulated nodes share two cores with each other (and with whatever else runs): pairs measured side
#: by side spread by a third or more under load. The rounds run at the default slow_fraction (20%): a node
#: is named only when it is slow beside every partner of the in-process pair rotations
#: (plan.PAIR_ROTATIONS), so one disturbed measurement does not name a healthy node.


def inventory(cluster, allreduce, **kw):
    """cluster.inventory() plus cluster.allreduce (the sim writes unknown keys into defaults)."""
    path = cluster.inventory(**kw)
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    doc["cluster"]["allreduce"] = dict(allreduce)
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


def run_preflight(cluster, inv, *args, timeout=420):
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--json", "-", "--no-progress", *args],
                       cwd=REPO, timeout=timeout)
    wall = time.monotonic() - t0
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), wall


def allreduce_results(doc, status=None):
    return [r for r in doc["results"] if r["check"] == "allreduce" and (status is None or r["status"] == status)]


def report_time(label, wall, section):
    print("\n%s: time to verdict %.1f s (all-reduce phase %s s, %s)" % (
        label, wall, section.get("elapsed_s"), json.dumps(section.get("timings_s"))))


def assert_healthy(doc, n):
    section = doc["allreduce"]
    (main,) = [r for r in allreduce_results(doc) if r["node"] is None]
    assert main["status"] == "pass", main["message"]
    assert main["message"].startswith("all-reduce busbw ") and "across %d ranks on %d nodes" % (n, n) in main["message"]
    assert section["verdict"] == "pass" and section["backend"] == "gloo"
    assert section["world_size"] == n and section["nodes"] == ["n%03d" % i for i in range(1, n + 1)]
    assert [p["bytes"] for p in section["curve"]] == plan.CPU_SIZES
    for point in section["curve"]:
        assert CURVE_KEYS <= set(point), point
        assert point["time_s"] > 0 and point["busbw_gbps"] == pytest.approx(
            point["algbw_gbps"] * busbw_factor(n), abs=2e-4)
        assert 0 <= point["slowest_rank"] < n and 0 <= point["fastest_rank"] < n
    assert section["busbw_gbps"] == section["curve"][-1]["busbw_gbps"] >= LOW_BUSBW
    assert section["threshold_gbps"] == LOW_BUSBW
    env = section["env"]
    assert env["GLOO_SOCKET_IFNAME"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "=eth1", env
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(env)
    assert section["master"] == "198.19.0.3:29500"  # n001's data address: the head hosts rank 0
    loc = section["localization"]
    if n < 3:
        assert loc is None
    else:  # every node judged against the fleet: pairs (and the node tests below) name nobody
        assert loc["exclude"] == [] and loc["by_bandwidth"] and loc["groups"], loc
        assert "pair test: " in main["message"] and "no node stands out" in main["message"], main["message"]
        # the screening rode on the whole-cluster run: every node beside min(3, n - n/2) partners; a node
        # that measured low there (a busy moment on two shared cores) is re-measured beside a known-good
        # partner with a control pair, and cleared ("not confirmed")
        assert loc["in_process_rotations"] == min(plan.PAIR_ROTATIONS, n - n // 2), loc
        assert loc["rounds"] <= localize.max_rounds(n), loc
        # (a node low beside every partner is re-measured once in the same processes: "recheck" groups)
        screening = [g for g in loc["groups"] if g["round"] == 0 and not g.get("recheck")]
        assert len(screening) == (n // 2) * loc["in_process_rotations"], loc
    # every node alone, in the sweep's processes (two gloo ranks through its data-NIC address): each
    # completes, gets its own figure, and nobody is named
    (rnd,) = section["node_rounds"]
    assert rnd["name"] == "loopback" and rnd["named"] == [] and sorted(rnd["nodes"]) == section["nodes"], rnd
    assert all(v and v > 0 for v in rnd["nodes"].values())
    assert not [r for r in allreduce_results(doc) if r["node"] and r["status"] != "pass"]



def assert_plan_was_honest(cluster, inv, doc):
    """The time plan printed before the run (`--plan`) against what ran, phase by phase.

    Asserted: the structure, which load cannot change (the phases the plan lists are the ones that ran;
    the sizes swept, the in-process pair rotations, the rounds within the plan's bound) and the first
    launch and the separate pair rounds within the plan's budgets, the worst case the deadlines allow
    (only a deadline that does not fire could break that, and that is a bug). Only printed: actual against expected seconds, which
    the load of two shared cores moves by 10x (the model assumes a node's own cores)."""
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--plan", "--json", "-"], cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    tp = json.loads(proc.stdout)["allreduce_plan"]
    section, n = doc["allreduce"], len(doc["allreduce"]["nodes"])
    phases = {p["phase"]: p for p in tp["phases"]}
    assert sorted(phases) == ["node tests", "pair rounds", "sweep"], tp["phases"]
    assert tp["sizes"] == [p["bytes"] for p in section["curve"]]  # the whole planned sweep ran, uncut
    # each size ran between the plan's minimum and its cap, and says why it stopped there
    for point in section["curve"]:
        assert tp["iters_min"] <= point["iters"] <= tp["iters"], (point, tp["iters_min"], tp["iters"])
        assert point["stop"] in ("stable", "latency", "cap", "budget") and (point["stop"] == "cap") == (
            point["iters"] == tp["iters"]), point
    print("sweep iterations per size (min %d, cap %d): %s" % (tp["iters_min"], tp["iters"], " ".join(
        "%s:%d/%s" % (common.human_bytes(p["bytes"]), p["iters"], p["stop"]) for p in section["curve"])))
    rnd = section["node_rounds"][0]
    assert rnd["name"] == "loopback"  # the node tests ran in the sweep's processes
    # the iterations and passes the plan counts are the ones that ran: the loopback at the sweep's cap, one
    # pass (judged on completion only); every in-process pair at the pairs' iterations
    assert (rnd["iters"], rnd["passes"]) == ([phases["node tests"]["iters"]], phases["node tests"]["passes"]), rnd
    loc = section["localization"]
    assert loc["in_process_rotations"] == phases["pair rounds"]["rotations"] == len(plan.pair_rotations(section["nodes"]))
    assert phases["pair rounds"]["runs"] == 0
    screened = [g for g in loc["groups"] if not g.get("recheck") and g.get("rotation") is not None]
    assert screened and {g.get("iters") for g in screened} == {phases["pair rounds"]["iters"]}, screened
    assert loc["rounds"] <= tp["rounds"]["planned_max"]
    timings = section["timings_s"]
    # the first launch (sweep, node tests and in-process pairs in the same ranks) and the separate rounds
    actual = {"sweep": timings["run_s"], "pair rounds": sum(timings.get("rounds_s") or [])}
    for name, seconds in actual.items():
        assert 0 <= seconds <= phases[name]["budget_s"], (name, seconds, phases[name])
    actual["node tests"] = timings.get("slowest_node_s")
    for name in ("sweep", "node tests", "pair rounds"):
        print("plan vs actual, %d nodes, %-11s expected %6.1f s  actual %6s s  budget %6.1f s" % (
            n, name, phases[name]["expected_s"], "%.1f" % actual[name] if actual[name] is not None else "-",
            phases[name]["budget_s"]))


def swept(cluster, node, peers):
    """True when the node's rank formed the gloo group: it holds connections to `peers` other ranks
    besides the rendezvous store (before init it has the store's alone)."""
    out = subprocess.run(["ip", "netns", "exec", cluster.node(node).ns, "ss", "-tnpH", "state", "established"],
                         capture_output=True, text=True).stdout
    mesh = [line for line in out.splitlines() if "python" in line and ":29500" not in line]
    return len(mesh) >= peers


def kill_node(cluster, node):
    """The node dies: every process in it (its sshd session, agent and rank) killed at once."""
    for pid, _cmd in cluster.processes(node):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: a sweep that lasts: each size 400 times at 4 MiB and below takes the four simulated ranks tens of seconds
#: (iters_min = iters: a fixed count, no stop once stable, which on a quiet machine ended it in seconds)
LONG_SWEEP = {"init_timeout": 120, "op_timeout": 60, "total_timeout": 240, "iters": 400, "iters_min": 400,
              "sizes": [256 * common.KiB, 512 * common.KiB, common.MiB, 2 * common.MiB, 4 * common.MiB]}



def ranks_everywhere(cluster):
    """True when every node runs a rank (the worker's argv carries its JSON config: a warm rank's, started
    in phase 1, says "warm")."""
    return all(any('"warmup"' in cmd or '"warm": true' in cmd for _pid, cmd in cluster.processes(node))
               for node in cluster.nodes)


"""The all-reduce through srun on a real Slurm (tests/sim/slurm.py): a hang is named and cleaned up.

An MTU black hole on one node's data link (its switch port drops to 1500 while eth1 says 9000): gloo's
ranks, launched by srun one task per node, pass the small size and hang at the large one. The run must
exit 1 with the hang named at its size, the pair rounds must name the node, and afterwards no rank, no
probe and no job step may be left on any node.

The nodes are Slurm node names in an inventory with `transport: slurm` (what `--slurm` builds from an
allocation), so the sweep and its deadlines come from `cluster.allreduce`: two sizes and a short op
deadline keep the whole run to a few rank launches. No timing is asserted (a rank's torch import on two
shared cores takes 2 to 30 s); the test prints its time to verdict.

Both tests use one 3-node Slurm cluster (the `cluster` fixture): the hang test's MTU black hole is healed
(and the nodes checked idle) before the next test, so the second test sees the same fresh cluster it
would get from a boot of its own, without a second munged, slurmctld and three slurmds running beside it.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
import yaml

N = 3
#: 1 KiB to 64 KiB, doubling: 1 KiB fits a 1500-byte frame, the larger sizes need jumbo frames. Doubling
#: steps keep each size within the sweep's budget (a size predicted to overrun half the op deadline is not run).
SIZES = [1024 << i for i in range(7)]
#: Deadlines, not waits: a healthy run ends long before them. The rounds' init deadline is 4x the sweep's
#: slowest torch import capped by init_timeout; with a 60 s cap the node round (two ranks importing torch
#: on each node at once) timed out on a starved 2-core box (load 80-400) and named every node. The cap
#: that matters here is the CPU's, not the test's: init_timeout only bounds a real hang at init.
INIT_TIMEOUT = 180
TOTAL_TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(N)


pytestmark = pytest.mark.usefixtures("slurm_healed")  # every test leaves the shared cluster as it found it


def _inventory(cluster, allreduce):
    path = os.path.join(cluster.root, "slurm-allreduce.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump({"defaults": {"python": "python3", "gpus_per_node": 0},
                        "cluster": {"transport": "slurm", "master_port": 29500, "allreduce": allreduce},
                        "nodes": ["n[001-%03d]" % N]}, fh, sort_keys=False)
    return path


def test_allreduce_hang_through_srun_is_named_and_nothing_is_left(cluster):
    cluster.mtu_blackhole("n003")
    settings = {"sizes": SIZES, "warmup": 1, "iters": 2, "init_timeout": INIT_TIMEOUT, "op_timeout": 4,
                "total_timeout": TOTAL_TIMEOUT, "slow_fraction": 0.6}
    t0 = time.monotonic()
    out = cluster.slurm.preflight(["check", _inventory(cluster, settings), "--only", "allreduce", "--json", "-"],
                                  timeout=600)
    wall = time.monotonic() - t0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 1, (out.returncode, out.stderr[-3000:])
    doc = json.loads(out.stdout)
    section = doc["allreduce"]
    print("\n3 Slurm nodes, MTU black hole on n003: time to verdict %.1f s (all-reduce phase %s s, %s)"
          % (wall, section.get("elapsed_s"), json.dumps(section.get("timings_s"))))

    results = [r for r in doc["results"] if r["check"] == "allreduce"]
    (main,) = [r for r in results if r["node"] is None]
    assert main["status"] == "fail", main
    print(main["message"])
    hung = re.search(r"all-reduce hung at (\d+) KiB: ranks 0-2 \(n\[001-003\]\) did not finish within 4 s",
                     main["message"])
    assert hung, main["message"]
    size = int(hung.group(1)) * 1024
    assert size > SIZES[0]  # the sizes below it passed through the same srun-launched ranks: on the curve
    assert [p["bytes"] for p in section["curve"]] == [s for s in SIZES if s < size], section["curve"]
    assert section["nodes"] == ["n001", "n002", "n003"] and section["world_size"] == N
    assert section["localization"]["exclude"] == ["n003"], section["localization"]
    (named,) = [r for r in results if r["node"] is not None and r["status"] == "fail"]
    assert named["node"] == "n003" and named["message"].startswith("pair test: failed beside known-good"), named

    # nothing preflight started outlives the run: no rank, no bundle, no slurmstepd, no step, no job
    assert cluster.leftover_processes() == {}
    assert cluster.slurm.leftover_steps() == []
    assert not cluster.slurm.run(["squeue", "-h"]).stdout.strip()


def test_one_srun_task_per_rank_and_every_phase_in_one_step(cluster):
    """One srun task per rank (one rank a node on CPU nodes, as training launches one per GPU); phases 1
    and 2 and the whole-cluster sweep share one step (its ranks started in phase 1 and adopted:
    preflight.probe.bench_warm); the partner-free node test (two gloo ranks through each node's data-NIC
    address) rides in the sweep's own processes: no step of its own."""
    settings = {"sizes": [1024, 4096], "warmup": 1, "iters": 2, "init_timeout": INIT_TIMEOUT, "op_timeout": 20,
                "total_timeout": TOTAL_TIMEOUT, "node_round": True}
    out = cluster.slurm.preflight(["check", _inventory(cluster, settings), "--only", "allreduce,mtu", "--json", "-"],
                                  timeout=600)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert out.returncode == 0, [r for r in doc["results"] if r["status"] != "pass"]
    tasks = doc["transport"]["step_tasks"]
    # phase 1 + 2 and the whole-cluster sweep (one rank a node, warmed in phase 1), which also ran every
    # node's loopback test, in one step of one task a node
    # a node that measured low in the sweep (a busy moment on the CI machine's two cores) is re-measured
    # beside a known-good partner: one step of two nodes for each such confirmation round, and no other step
    loc = doc["allreduce"].get("localization") or {}
    confirmations = {g["round"] for g in loc.get("groups") or [] if g.get("round")}
    assert tasks[:1] == [N] and len(tasks) == 1 + len(confirmations) and max(tasks) == N, (tasks, loc)
    assert doc["allreduce"]["timings_s"]["warm_ranks"] == N, doc["allreduce"]["timings_s"]
    (loopback,) = doc["allreduce"].get("node_rounds") or [None]
    assert loopback is not None and loopback["name"] == "loopback", doc["allreduce"]
    assert loopback["named"] == [] and sorted(loopback["nodes"]) == sorted(n.name for n in cluster.nodes), loopback
    assert all(v and v > 0 for v in loopback["nodes"].values()), loopback
    assert cluster.leftover_processes() == {}
    assert cluster.slurm.leftover_steps() == []
    assert not cluster.slurm.run(["squeue", "-h"]).stdout.strip()

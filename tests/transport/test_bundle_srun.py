"""Multi-MB results through a real srun (tests/sim/slurm.py): every run reads every node's result whole.

Each node's kernel log is a few MB of messages that do not compress well, and the xid probe runs with
capture, so each node's result carries the whole log back (the way `preflight check --capture` does on a
node with a long log). srun cuts a task's output line at 1024 bytes; with frames longer than that
(line_max 4000) every frame reaches the controller split into labelled pieces, as srun's lines do when
they outgrow its buffer, and the reader must put them back together: a lost result would be a healthy
node failed ("no output", action isolate).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.transport.test_bundle_framing import kernel_log
from tests.paths import REPO


# Runs in the controller namespace: one allocation, then RUNS phases through SlurmFleet.
RUNS = r'''
import hashlib, json, sys, time
from preflight.slurm import allocation, fleet as slurm
line_max, runs = int(sys.argv[1]), int(sys.argv[2])
slurm.LINE_MAX = line_max
alloc = allocation.allocate(nodelist="n[001-002]")
try:
    fleet = slurm.SlurmFleet(allocation.specs_for(alloc), alloc)
except BaseException:
    alloc.release()
    raise
config = {"mode": "probe", "checks": {"xid": {}}, "probe_timeout_s": 60, "capture": True}
report = {"failures": [], "logs": [], "seconds": []}
try:
    for _ in range(runs):
        started = time.monotonic()
        out = fleet.run({"n001": config, "n002": config}, lambda spec: 120)
        report["seconds"].append(time.monotonic() - started)
        for name, outcome in out.items():
            if outcome.failure is not None:
                report["failures"].append("%s: %s" % (name, outcome.failure))
                continue
            events = outcome.result["capture"]["xid"]["events"]
            text = next(e["stdout"] for e in events if e["kind"] == "run" and e["argv"][0] == "journalctl").rstrip("\n")
            report["logs"].append([name, len(text), hashlib.sha256(text.encode()).hexdigest()])
finally:
    fleet.close()
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    cluster = slurm_cluster(2)
    for node in cluster.nodes:
        path = os.path.join(node.dir, "kernel.log")
        with open(path, "w") as handle:
            handle.write(kernel_log(3_500_000, seed=node.index))
        node.install_executable("journalctl", "#!/bin/sh\nexec cat %s\n" % path)
        os.makedirs(os.path.join(node.sys_dir, "module", "nvidia"), exist_ok=True)  # the driver is loaded
    return cluster


def runs(cluster, line_max, count):
    out = cluster.ctl([sys.executable, "-c", RUNS, str(line_max), str(count)],
                      env=dict(cluster.slurm.env(), PYTHONPATH=REPO), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def expected(cluster):
    import hashlib

    out = {}
    for node in cluster.nodes:
        text = kernel_log(3_500_000, seed=node.index).rstrip("\n")
        out[node.name] = [len(text), hashlib.sha256(text.encode()).hexdigest()]
    return out


@pytest.mark.parametrize("line_max, count", [(900, 10), (4000, 3)])
def test_multi_mb_results_arrive_whole_every_run(cluster, line_max, count):
    """900: the transport's own frame size (lines srun passes whole); 4000: every frame cut by srun."""
    report = runs(cluster, line_max, count)
    assert report["failures"] == []
    want = expected(cluster)
    assert len(report["logs"]) == 2 * count
    for name, length, digest in report["logs"]:
        assert [length, digest] == want[name], name
    print("srun, 2 nodes, 3.5 MB kernel log captured, line_max %d: %d runs, seconds %s"
          % (line_max, count, " ".join("%.1f" % s for s in report["seconds"])))
    assert cluster.slurm.leftover_steps() == []

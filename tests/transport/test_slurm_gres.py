"""GPU nodes whose GPUs Slurm manages (Gres=gpu:N, tests/sim/slurm.py with stand-in devices): the
allocation preflight makes holds the GPUs, and the all-reduce's rank tasks get one GPU each.

A real Slurm refuses a step that asks for GPUs in a job that holds none ("Step requested GRES but job
doesn't have GRES"), and with ConstrainDevices a job that holds none cannot see them: both paths are
taken here against slurmctld/slurmd, not assumed.
"""

from __future__ import annotations

import json
import sys

import pytest
from tests.paths import REPO

# Runs in the controller namespace: allocate as `--slurm --nodelist` does, then one split run (two
# tasks a node, one GPU a task, as a bench run with two GPUs a node asks for).
SPLIT = r'''
import json, sys
from preflight.slurm import allocation, scontrol
from preflight.slurm.fleet import SlurmFleet
alloc = allocation.allocate(nodelist="n[001-002]")
fleet = SlurmFleet(allocation.specs_for(alloc), alloc)
try:
    shown = scontrol.run(["scontrol", "-d", "-o", "show", "job", alloc.job_id]).stdout
    config = {"mode": "probe", "checks": {"ssh": {}}, "tasks": 2, "gpus_per_task": 1}
    out = fleet.run({"n001": config, "n002": config}, lambda spec: 60)
    print(json.dumps({"job_gpus": scontrol.job_gpus(shown), "fleet_saw": alloc.gpus_held(), "gpus": [s.gpus_per_node for s in fleet.specs.values()],
                      "argv": fleet._argv(["n001", "n002"], "x", 2, True), "transport": fleet.describe(),
                      "failures": {n: str(o.failure) for n, o in out.items() if o.failure}}))
finally:
    fleet.close()
'''


@pytest.mark.parametrize("gpus", [2, 0])
def test_allocation_holds_the_gpus_and_each_rank_task_gets_one(slurm_cluster, gpus):
    """gpus=0: Slurm does not manage the GPUs; the same run must not ask for them (Slurm would refuse)."""
    cluster = slurm_cluster(2, slurm_gpus=gpus)
    out = cluster.ctl([sys.executable, "-c", SPLIT], env=dict(cluster.slurm.env(), PYTHONPATH=REPO), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["job_gpus"] == doc["fleet_saw"] == 2 * gpus  # salloc --gres=gpu:2 on each node, or none
    assert doc["gpus"] == [gpus, gpus]  # GPUs a node, from Slurm's Gres
    assert "--ntasks-per-node=2" in doc["argv"]
    assert doc["failures"] == {}, doc  # Slurm took the step: four tasks (one GPU each where it has GPUs)
    assert doc["transport"]["step_tasks"] == [4]
    assert cluster.slurm.leftover_steps() == []
    assert not cluster.slurm.run(["squeue", "-h"]).stdout.strip()


def test_an_allocation_that_holds_none_of_its_gpus_gets_a_note(slurm_cluster):
    """Inside `salloc -N2` without --gpus on Gres=gpu:2 nodes: the run says why the GPU checks may see
    none (one stderr line), and still runs; with the GPUs held it says nothing."""
    cluster = slurm_cluster(2, slurm_gpus=2)
    argv = ["check", "--slurm", "--only", "ssh"]
    bare = cluster.slurm.preflight(argv, prefix=["salloc", "-N2"], timeout=120)
    assert bare.returncode == 0, bare.stderr[-2000:]
    notes = [l for l in bare.stderr.splitlines() if l.startswith("preflight: note: ")]
    assert len(notes) == 1 and "holds none of its nodes' GPUs (Gres gpu:2)" in notes[0], bare.stderr
    held = cluster.slurm.preflight(argv, prefix=["salloc", "-N2", "--gpus-per-node=2"], timeout=120)
    assert held.returncode == 0 and "preflight: note:" not in held.stderr, held.stderr[-2000:]

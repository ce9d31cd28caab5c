"""A burn-in that yields: `--partition burnin --preemptible` on a real Slurm (tests/sim/slurm.py) whose
slurm.conf makes the burn-in partition preemptible by the users' partition (preempt/partition_prio,
PreemptMode=REQUEUE). A user's job onto a node under burn-in displaces preflight's job; preflight reports
both nodes preempted (unavailable: not failed, not drained, not resumed) and leaves nothing behind.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from preflight.slurm import preempt
from tests.actions.test_slurm_ops import _wait
from tests.paths import REPO

#: the site's configuration the README's burn-in section gives: user work preempts the burn-in partition
PREEMPTIBLE = ("PreemptType=preempt/partition_prio\n"
               "PreemptMode=REQUEUE\n"
               "PartitionName=users Nodes=ALL PriorityTier=10 MaxTime=INFINITE State=UP\n"
               "PartitionName=burnin Nodes=ALL PriorityTier=1 PreemptMode=REQUEUE MaxTime=INFINITE State=UP\n")
OLD = "preflight: gpu_compute: repaired, burn-in pending"


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(2, slurm_conf=PREEMPTIBLE)


def _preflight(cluster, extra, tier="burn-in", **kw):
    env = dict(cluster.slurm.env(), PYTHONPATH=REPO)
    argv = [sys.executable, "-m", "preflight", "check", "--slurm", "--nodelist", "n[001-002]", "--no-progress",
            "--tier", tier, "--json", "-"] + extra
    return cluster.ctl_popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO, **kw)


def _running_preflight_job(s):
    return [j.split()[0] for j in s.jobs() if " preflight-" in j and " RUNNING " in j]


def test_a_user_job_preempts_the_burn_in_and_preflight_reports_it_preempted(cluster):
    s = cluster.slurm
    proc = _preflight(cluster, ["--partition", "burnin", "--preemptible"])
    user = None
    try:
        _wait("preflight's burn-in job running", lambda: _running_preflight_job(s) or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        job = _running_preflight_job(s)[0]
        # every phase runs in one kept step (JOB.0): the all-reduce is under way once its ranks are connected
        # to rank 0's store on n001 (the master port), then preempted there
        _wait("the burn-in's all-reduce", lambda: cluster.node_exec("n001", [
            "ss", "-Htn", "state", "established", "( sport = :29500 )"]).stdout.strip() or proc.poll() is not None, 180)
        assert proc.poll() is None, proc.communicate()
        # a user's job onto n001 in the users' partition: Slurm preempts the burn-in to run it
        user = s.run(["salloc", "--no-shell", "-p", "users", "-w", "n001", "-N1", "-t", "5", "--immediate=60"])
        assert "Granted" in user.stdout + user.stderr, user.stderr
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        s.run(["scancel", "-p", "users"])
    record = s.run(["scontrol", "-o", "show", "job", job]).stdout
    fields = preempt.parse_job(record)
    assert preempt.preempted(fields), fields  # what Slurm did, read as preflight reads it
    assert proc.returncode == 0, err  # preempted is neither a failure nor an error
    doc = json.loads(out)
    nodes = {n["name"]: n for n in doc["nodes"]}
    for name in ("n001", "n002"):
        mine = [f for f in doc["results"] if f["node"] == name]
        said = [f["message"] for f in mine if (f.get("data") or {}).get("unavailable")]
        assert said and "Slurm preempted job %s (partition burnin)" % job in said[0], mine
        assert nodes[name]["status"] == "unavailable", nodes[name]
        assert not [f for f in mine if f["status"] in ("fail", "error")], mine
    assert "Traceback" not in err
    assert s.reasons() == {}  # nothing drained, nothing resumed
    _wait("no preflight job or step left", lambda: not [j for j in s.jobs() if "preflight" in j] and not s.leftover_steps())


def test_preemptible_without_a_partition_or_qos_is_a_usage_error(cluster):
    proc = _preflight(cluster, ["--preemptible"])
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--preemptible needs the partition or QOS" in err and "Traceback" not in err


def test_a_burn_in_the_user_job_did_not_touch_passes_in_the_preemptible_partition(cluster):
    """The healthy twin: the same preemptible burn-in with no user job finishes and passes."""
    s = cluster.slurm
    s.wait_idle(["n001", "n002"])
    proc = _preflight(cluster, ["--partition", "burnin", "--preemptible"])
    out, err = proc.communicate(timeout=300)
    doc = json.loads(out)
    assert proc.returncode == 0, err
    assert not [f for f in doc["results"] if (f.get("data") or {}).get("unavailable")]
    passed = {f["node"] for f in doc["results"] if f["check"] == "gpu_compute" and f["status"] == "pass" and f["node"]}
    assert passed == {"n001", "n002"}, doc["results"]
    soaked = [f for f in doc["results"] if f["check"] == "allreduce" and (f.get("data") or {}).get("soak")]
    assert [f["status"] for f in soaked] == ["pass"] and "rounds" in soaked[0]["message"], doc["results"]


def test_resume_with_a_tier_returns_a_node_only_after_that_tier_passed_on_it(cluster):
    """n002, drained by preflight, is rechecked with --resume --tier standard: with the compute check left
    out it is held back (drained again with its old reason, not drained for this); with it, it returns."""
    s = cluster.slurm
    s.wait_idle(["n001"])
    s.drain("n002", OLD)
    try:
        proc = _preflight(cluster, ["--resume", "--skip", "gpu_compute"], tier="standard")
        out, err = proc.communicate(timeout=300)
        held = [f for f in json.loads(out)["results"] if (f.get("data") or {}).get("tier_gate")]
        assert proc.returncode == 1 and [f["node"] for f in held] == ["n002"], err
        assert "n002 not returned to service: --resume --tier standard needs allreduce, gpu_compute" in held[0]["message"]
        assert s.reasons() == {"n002": OLD} and s.reservations() == [], err  # held: its old reason kept
        proc = _preflight(cluster, ["--resume"], tier="standard")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert s.reasons() == {} and s.reservations() == [] and "resume: n002" in err, err
    finally:
        cluster.heal()
        s.settle(90)

"""A burn-in that yields and comes back: the burn-in as a requeueable batch job (`sbatch --requeue` in the
preemptible partition of tests/actions/test_slurm_preempt.py's slurm.conf) running `preflight check --slurm
--preemptible --drain` in its own allocation, on a real Slurm (tests/sim/slurm.py). A user's job onto one of
its nodes during the all-reduce makes Slurm requeue it (SIGTERM to every process of the job, SIGKILL after
KillWait): the first attempt's report says both nodes preempted (unavailable, exit 0), nothing is drained,
nothing of it is left; when the user's job ends, Slurm runs the job again and that attempt passes.

KillWait is Slurm's default (30 s): preflight's report must be written before the SIGKILL. cred_expire=20 s
shortens Slurm's wait before a requeued job may start again (cred_expire + 1 s, 121 s by default), and
sched_interval=5 s the scheduler's pass that starts it then (60 s by default).
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from preflight.slurm import preempt
from tests.actions.test_slurm_ops import _wait
from tests.actions.test_slurm_preempt import PREEMPTIBLE
from tests.paths import REPO

#: the store of the all-reduce's rank 0 listens on the master port on n001 while the ranks are connected
MASTER_PORT = 29500


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(2, slurm_conf=PREEMPTIBLE + "SchedulerParameters=sched_interval=5\n",
                         slurm_options={"kill_wait": 30, "cred_expire": 20})


def _record(s, job):
    return preempt.parse_job(s.run(["scontrol", "-o", "show", "job", job]).stdout)


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _job_processes(s, job):
    """Processes of this cluster's job `job` still alive anywhere (their environment names both)."""
    marks = (("SLURM_CONF=%s" % s.conf).encode(), ("SLURM_JOB_ID=%s" % job).encode())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if all(m in env for m in marks):
            found.append(pid)
    return found


def _in_all_reduce(cluster, log):
    """The run sent its third phase (the all-reduce) and the ranks are connected to rank 0's store."""
    if log().count("next phase on") < 2:
        return False
    ss = cluster.node_exec("n001", ["ss", "-Htn", "state", "established", "( sport = :%d )" % MASTER_PORT])
    return bool(ss.stdout.strip())


def test_a_requeued_burn_in_reports_its_nodes_preempted_then_runs_again_and_passes(cluster, tmp_path):
    s = cluster.slurm
    os.chmod(str(tmp_path), 0o755)
    report = str(tmp_path / "burnin-%s-%d.json")
    cmd = ("exec %s -m preflight check --slurm --tier burn-in --preemptible --drain --debug --no-progress "
           "--json %s/burnin-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.json" % (sys.executable, tmp_path))
    sub = cluster.ctl(["sbatch", "--parsable", "--requeue", "-p", "burnin", "-N", "2", "--exclusive", "-J", "burnin",
                       "-o", str(tmp_path / "job-%j.txt"), "--chdir", REPO, "--wrap", cmd],
                      env=dict(s.env(), PYTHONPATH=REPO), timeout=30)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    log = lambda: _read(str(tmp_path / ("job-%s.txt" % job)))  # noqa: E731
    try:
        _wait("the burn-in job running", lambda: _record(s, job).get("JobState") == "RUNNING", 120)
        _wait("the burn-in's all-reduce", lambda: _in_all_reduce(cluster, log) or _record(s, job).get("JobState") != "RUNNING", 240)
        assert _record(s, job).get("JobState") == "RUNNING", log()
        # a user's job onto n001 in the users' partition: Slurm preempts the burn-in (PreemptMode=REQUEUE)
        user = s.run(["salloc", "--no-shell", "-p", "users", "-w", "n001", "-N1", "-t", "5",
                      "--immediate=120"], timeout=150)
        granted = re.search(r"Granted job allocation (\d+)", user.stderr)
        assert user.returncode == 0 and granted, user.stderr
        fields = _record(s, job)
        assert int(fields["Restarts"]) == 1 and fields["JobState"] in ("PENDING", "REQUEUED"), fields
        first = json.loads(_read(report % (job, 0)) or "null")
        assert first is not None, log()  # written before Slurm's SIGKILL
        assert first["exit_code"] == 0 and first["summary"]["fail"] == first["summary"]["error"] == 0, log()
        nodes = {n["name"]: n["status"] for n in first["nodes"]}
        assert nodes == {"n001": "unavailable", "n002": "unavailable"}, first["nodes"]
        said = [f["message"] for f in first["results"] if (f.get("data") or {}).get("unavailable")]
        assert len(said) == 2 and all("Slurm preempted job %s (partition burnin) at " % job in m and
                                      "requeued it (restart 1)" in m for m in said), said
        assert "Slurm requeues job %s (SIGTERM)" % job in log() and "terminated" not in log() and "Traceback" not in log()
        assert s.reasons() == {}  # --drain drained nothing
        assert _job_processes(s, job) == []  # nothing of the first attempt is left on any node
        # the user's job ends: Slurm runs the burn-in again, and this attempt passes
        s.run(["scancel", granted.group(1)])
        _wait("the rerun to finish", lambda: _record(s, job).get("JobState") in ("COMPLETED", "FAILED"), 240)
        second = json.loads(_read(report % (job, 1)) or "null")
        assert second is not None and second["exit_code"] == 0, log()
        assert not [f for f in second["results"] if (f.get("data") or {}).get("unavailable")]
        passed = {f["node"] for f in second["results"] if f["check"] == "gpu_compute" and f["status"] == "pass"}
        assert passed == {"n001", "n002"}, second["results"]
        assert _record(s, job) == dict(_record(s, job), JobState="COMPLETED", Restarts="1")
        assert s.reasons() == {}
    finally:
        s.run(["scancel", job])
        s.run(["scancel", "-p", "users"])
        s.settle(90)

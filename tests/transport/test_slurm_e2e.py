"""preflight on a real Slurm (tests/sim/slurm.py): srun transport, faults named, drain and resume.

One 8-node cluster for the module (a Slurm start costs seconds); every test heals what it broke.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from tests.paths import PREFLIGHT
from tests.report_schema import assert_valid

N = 8


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(N, docker0=True)


pytestmark = pytest.mark.usefixtures("slurm_healed")  # every test leaves the shared cluster as it found it


def _run(cluster, argv, prefix=(), timeout=120):
    return cluster.slurm.preflight(argv, prefix=prefix, timeout=timeout)


def _json(cluster, argv, prefix=()):
    out = _run(cluster, argv + ["--json", "-"], prefix)
    assert out.stdout.strip(), out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert_valid(doc)  # every report these tests read matches the published schema
    return doc, out


def _verdicts(doc):
    return sorted((r["check"], r["node"] or "", r["status"]) for r in doc["results"])


def _problems(doc):
    return {(r["check"], r["node"]): r["message"] for r in doc["results"] if r["status"] in ("fail", "error")}


def test_slurm_inside_salloc_and_from_outside_match_ssh(cluster):
    cluster.mtu_blackhole("n003")
    skip = ["--skip", "allreduce"]
    # the SSH fan-out needs no Slurm node: it runs beside the Slurm runs (they take the nodes in turn),
    # on its own rendezvous port (the ports check binds it on the head)
    ssh_run = cluster.ctl_popen([PREFLIGHT, "check", cluster.inventory(), "--master-port", "29501"] + skip
                                + ["--no-progress", "--json", "-"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    inside, out = _json(cluster, ["check", "--slurm"] + skip, prefix=["salloc", "-N%d" % N])
    outside, _ = _json(cluster, ["check", "--slurm", "--nodelist", "n[001-%03d]" % N] + skip)
    stdout, stderr = ssh_run.communicate(timeout=120)
    assert stdout.strip(), stderr[-3000:]
    ssh = json.loads(stdout)
    assert _verdicts(inside) == _verdicts(ssh)
    assert _verdicts(outside) == _verdicts(ssh)
    assert ("mtu", "n003") in _problems(inside)
    assert {n for _, n in _problems(inside)} == {"n003"}, _problems(inside)
    assert inside["inventory"].startswith("slurm job ")
    # phase 1 and phase 2 (mtu pings, rendezvous port) ran in one srun step
    assert inside["transport"]["steps"] == outside["transport"]["steps"] == 1
    assert (ssh["transport"]["kind"], ssh["transport"]["connections"]) == ("ssh", N)
    assert sum(ssh["transport"]["bundle"].values()) == N  # each node sent the zip or used its kept copy
    assert cluster.slurm.leftover_steps() == []
    assert not cluster.slurm.run(["squeue", "-h"]).stdout.strip()  # the --nodelist allocation was released


def test_stopped_slurmd_and_hand_drained_node_named_drain_and_resume(cluster):
    s = cluster.slurm
    s.drain("n008", "disk replaced by hand")
    cluster.mtu_blackhole("n003")
    s.stop_slurmd("n005")
    argv = ["check", "--slurm", "--nodelist", "n[001-%03d]" % N, "--skip", "allreduce", "--drain"]

    t0 = time.monotonic()
    doc, out = _json(cluster, argv + ["--max-drain-fraction", "0.3"])
    print("drain run %.1f s" % (time.monotonic() - t0))
    problems = _problems(doc)
    # sbcast runs before the step and could not reach n005: a launch there alone names it, and the step runs
    # without it (not a started step of every node that srun aborts for n005)
    assert "did not take the task launch: Communication connection failure" in problems[("ssh", "n005")]
    assert doc["transport"]["step_tasks"] == [N - 2], doc["transport"]  # n008 unavailable, n005 left out
    # a node drained by hand is unavailable (named with Slurm's state and reason), not this run's failure
    assert ("ssh", "n008") not in problems
    aside = {r["node"]: r["message"] for r in doc["results"] if r.get("data", {}).get("unavailable")}
    assert aside == {"n008": "Slurm reports it IDLE+DRAIN (reason: disk replaced by hand); not checked"}, aside
    assert {n["name"]: n["status"] for n in doc["nodes"]}["n008"] == "unavailable"
    # the fix for a node that did not answer is Slurm's: slurmd, scontrol show node, munge (not sshd, keys)
    said = " ".join(out.stderr.split())  # the console wraps at its width
    assert "fix: check the node's slurmd (systemctl status slurmd; its log), what Slurm says of it (scontrol show node" in said
    assert "munge" in said and "host key" not in said, out.stderr[-3000:]
    assert "(drained by someone else: disk replaced by hand)" in out.stderr
    assert ("mtu", "n003") in problems
    reasons = s.reasons()
    assert set(reasons) == {"n003", "n005", "n008"}, (reasons, out.stderr[-2000:])
    assert reasons["n003"].startswith("preflight: mtu: ") and reasons["n005"].startswith("preflight: ssh: ")
    assert "did not take the task launch" in reasons["n005"]
    assert reasons["n008"] == "disk replaced by hand"

    t0 = time.monotonic()
    cluster.heal()  # MTU fixed, slurmd back
    _settle_restarted(cluster, "n005", reasons["n005"])
    print("heal %.1f s" % (time.monotonic() - t0))
    t0 = time.monotonic()
    doc, out = _json(cluster, ["check", "--slurm", "--nodelist", "n[001-%03d]" % N, "--skip", "allreduce", "--resume"])
    print("resume run %.1f s" % (time.monotonic() - t0))
    assert s.reasons() == {"n008": "disk replaced by hand"}, out.stderr[-2000:]
    assert "resume: n[003,005]" in out.stderr and "drain: scontrol" not in out.stderr, out.stderr[-2000:]
    assert _problems(doc) == {} and out.returncode == 0, out.stderr[-2000:]  # n008 is unavailable, not a failure
    assert not s.run(["scontrol", "show", "reservation"]).stdout.strip().startswith("ReservationName")


def _settle_restarted(cluster, node, reason, timeout=30):
    """The drain run's job stays COMPLETING for ~60 s after the run on the node whose slurmd was killed
    and on the step's first node (its slurmstepd waits on the dead node until slurmctld resends
    TERMINATE_JOB, RPC_RETRY_INTERVAL = 60 s). An operator's DOWN clears that at once: DOWN, RESUME, and
    drain again with its own reason whatever was drained, so the nodes are what --resume must find."""
    s = cluster.slurm
    reasons = s.reasons()
    stuck = [n for n, st in s.states().items() if "comp" in st or n == node]
    for name in stuck:
        s.run(["scontrol", "update", "nodename=%s" % name, "state=down", "reason=test: clear the completing job"])
        s.run(["scontrol", "update", "nodename=%s" % name, "state=resume"])
    s.wait_idle(stuck, timeout)
    for name in stuck:
        if name in reasons:
            s.drain(name, reasons[name])
    assert s.reasons().get(node) == reason


def test_hung_node_is_named_step_cancelled_nothing_left(cluster, tmp_path):
    cluster.hang_commands("n003")
    report = str(tmp_path / "report.json")
    out = _run(cluster, ["check", "--slurm", "--nodelist", "n[002-005]", "--only", "driver,mtu", "--timeout", "15",
                         "--json", report])
    assert out.returncode == 1, out.stderr[-2000:]
    assert "n003" in out.stdout and "timed out" in out.stdout, out.stdout + out.stderr[-3000:]
    with open(report) as fh:
        doc = json.load(fh)
    # phase 1's step was cancelled for n003; phase 2 (the jumbo pings) ran on the others in a step of its own
    assert doc["transport"]["steps"] == 2
    mtu = {r["node"]: r["status"] for r in doc["results"] if r["check"] == "mtu" and r["node"]}
    assert mtu == {"n002": "pass", "n003": "error", "n004": "pass", "n005": "pass"}, doc["results"]
    job = re.search(r"slurm job (\d+)", out.stdout).group(1)
    # Only this run's processes count: an earlier test's step whose node had a dead slurmd keeps its
    # slurmstepd on the step's first node for 60 s (it waits for the dead node's step-complete message).
    left = {node: [p for p in procs if not _other_job_stepd(p[1], job)]
            for node, procs in cluster.leftover_processes(["n002", "n003", "n004", "n005"]).items()}
    assert {n: p for n, p in left.items() if p} == {}
    assert [s for s in cluster.slurm.leftover_steps() if s.startswith(job + ".")] == []


def _other_job_stepd(cmdline, job):
    m = re.match(r"slurmstepd: \[(\d+)\.", cmdline)
    return bool(m) and m.group(1) != job


def test_dry_run_prints_scontrol_and_refuses_a_cluster_wide_failure(cluster):
    cluster.mtu_blackhole("n004")
    cluster.mtu_blackhole("n006")
    argv = ["check", "--slurm", "--nodelist", "n[001-%03d]" % N, "--only", "mtu", "--drain", "--dry-run"]
    out = _run(cluster, argv)
    assert out.returncode == 1
    assert "refused" in out.stdout and "drained nothing" in out.stdout  # 2 faulty ports fail 4 of 8 nodes
    assert "would run" not in out.stdout
    # the same through an inventory that names Slurm nodes (transport: slurm) instead of --slurm
    inv = os.path.join(cluster.root, "slurm-hosts.yaml")
    with open(inv, "w") as fh:
        fh.write("cluster:\n  transport: slurm\nnodes:\n  - n[001-%03d]\n" % N)
    out = _run(cluster, ["check", inv] + argv[4:] + ["--max-drain-fraction", "0.6"])
    assert "slurm" in out.stdout.splitlines()[0] or "hosts.yaml" in out.stdout.splitlines()[0], out.stdout[:300]
    assert "would run: scontrol update nodename=n004 state=drain 'reason=preflight: mtu: " in out.stdout
    assert "nodename=n006" in out.stdout and "nodename=n00" in out.stdout
    assert cluster.slurm.reasons() == {}


def test_partition_and_node_count_from_a_login_node(cluster):
    """--partition P --nodes N: Slurm picks N usable nodes (a drained one is not among them), the run
    checks exactly those, and the allocation is released."""
    from tests.sim.slurm import PARTITION

    cluster.slurm.drain("n001", "fan replaced")
    doc, out = _json(cluster, ["check", "--slurm", "--partition", PARTITION, "--nodes", "3", "--only", "ssh"])
    assert out.returncode == 0, out.stderr[-2000:]
    names = [n["name"] for n in doc["nodes"]]
    assert len(names) == 3 and "n001" not in names, names
    assert doc["transport"]["kind"] == "slurm" and doc["transport"]["steps"] == 1
    assert not cluster.slurm.run(["squeue", "-h"]).stdout.strip()


def test_busy_nodes_are_named_not_waited_for_forever(cluster):
    """preflight takes whole nodes: a node running someone's job is waited for up to --alloc-wait, then
    named with its Slurm state in a one-line error (exit 2), never a bare "Connection timed out"."""
    s = cluster.slurm
    held = s.run(["salloc", "--no-shell", "-N1", "-w", "n002", "-t", "5"])
    job = re.search(r"Granted job allocation (\d+)", held.stderr + held.stdout).group(1)
    try:
        out = _run(cluster, ["check", "--slurm", "--nodelist", "n[001-002]", "--only", "ssh", "--alloc-wait", "2"])
    finally:
        s.run(["scancel", job])
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "n002 busy" in line and "ALLOCATED" in line and "whole nodes" in line, line
    assert "Traceback" not in out.stderr

"""The all-reduce end to end while something else happens: a node that dies mid-sweep (only it named), a second
run while the first holds the rendezvous (from the same controller and from another one: no node blamed).

Shared helpers: tests/e2e/allreduce_sim.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from preflight import common
from tests.e2e.allreduce_sim import (LONG_SWEEP, allreduce_results, inventory, kill_node, report_time, run_preflight,
                                     swept)
from tests.paths import REPO


def test_a_node_that_dies_mid_sweep_is_the_only_one_named(sim_cluster, tmp_path):
    cluster = sim_cluster(4)
    hostfile, report = tmp_path / "hosts.txt", tmp_path / "report.json"
    inv = inventory(cluster, LONG_SWEEP)
    proc = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce", "--no-progress",
                              "--json", str(report), "--hostfile", str(hostfile)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not swept(cluster, "n004", 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep never started"
        time.sleep(0.2)
    time.sleep(1.0)  # into the sweep
    kill_node(cluster, "n004")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and b"Traceback" not in err, err
    doc = json.loads(report.read_text())
    failed = {r["node"]: r for r in allreduce_results(doc) if r["status"] in ("fail", "error")}
    assert sorted(n for n in failed if n) == ["n004"], failed  # the healthy three are not blamed
    assert failed["n004"]["action"] == "isolate" and "no all-reduce result" in failed["n004"]["message"]
    main = failed[None]["message"]
    assert "no result from n004" in main and "vanished" in main, main
    assert hostfile.read_text().split() == ["n001", "n002", "n003"]
    assert cluster.leftover_processes(["n001", "n002", "n003"]) == {}


def test_second_runs_while_one_holds_the_rendezvous_blame_no_node(sim_cluster, tmp_path):
    """A nightly audit (first) and two manual runs while it sweeps: one from the same controller (it sees the
    first's claim on the nodes) and one from another controller, inside n004's namespace (the claim on the
    head's rendezvous port). Each says to retest and fails no node; the first is not disturbed. One first run
    for both: its sweep (the CPU of both cores for 40-80 s here) is the test's main cost."""
    cluster = sim_cluster(4)
    report = tmp_path / "first.json"
    # about 10-20 s a size on two shared cores, so the first run is mid-sweep while both others check (about
    # 15 s each here)
    sweep = [128 * common.KiB, 160 * common.KiB, 192 * common.KiB, 256 * common.KiB]
    first_inv = inventory(cluster, dict(LONG_SWEEP, iters=1000, iters_min=1000, sizes=sweep), path=str(tmp_path / "first.yaml"))
    first = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", first_inv, "--only", "allreduce",
                               "--no-progress", "--json", str(report)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not swept(cluster, "n004", 3):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run's sweep never started"
            time.sleep(0.2)
        second_inv = inventory(cluster, {"init_timeout": 60, "op_timeout": 20}, path=str(tmp_path / "second.yaml"))
        for where in ("same controller", "another controller"):
            assert first.poll() is None, "the first run ended before the %s run: the test needs a longer sweep" % where
            _second_run_is_turned_away(cluster, second_inv, where)
        out, err = first.communicate(timeout=400)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    # the first run was not joined by the others' ranks: every rank completed its sweep (the last size may be
    # cut by its budget on a loaded machine)
    assert first.returncode in (0, 1) and b"Traceback" not in err, err
    section = json.loads(report.read_text())["allreduce"]
    assert section["summary"].startswith("all-reduce busbw ") and "another preflight run" not in section["summary"]
    assert section["curve"] and {p["bytes"] for p in section["curve"]} <= set(sweep), section["summary"]
    assert cluster.leftover_processes() == {}


def _second_run_is_turned_away(cluster, inv, where):
    """A run beside the first, from the controller's namespace or from n004's: rc 1, retest, no node named."""
    if where == "same controller":
        rc, doc, wall = run_preflight(cluster, inv, "--only", "allreduce")
    else:
        t0 = time.monotonic()
        proc = cluster.node_exec("n004", [sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce",
                                          "--json", "-", "--no-progress"], cwd=REPO, timeout=420)
        rc, doc, wall = proc.returncode, json.loads(proc.stdout), time.monotonic() - t0
        assert "Traceback" not in proc.stderr, proc.stderr
    problems = [r for r in doc["results"] if r["status"] in ("fail", "error")]
    assert rc == 1 and problems, (where, doc["results"])
    assert [r for r in problems if r["node"] is not None] == [], (where, problems)  # no node to drain
    assert {r["check"] for r in problems} <= {"ports", "allreduce"} and all(r["action"] == "retest" for r in problems)
    (main,) = [r for r in problems if r["check"] == "allreduce"]
    assert main["message"].startswith("all-reduce not run: ") and "another preflight run" in main["message"], main
    if where == "another controller":  # the head's port claim: the ports check left n001 in, its agent saw it
        assert "port 29500 on n001 is in use by another preflight run (pid " in main["message"], main
    report_time("second run beside a running one (%s)" % where, wall, doc["allreduce"])

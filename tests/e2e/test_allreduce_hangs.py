"""The all-reduce end to end when it hangs or cannot start: an MTU black hole on four and on three simulated
nodes (the hang at a size, the pair rounds that name the node, the hostfile without it), a rank without torch
(named at init, not hung), Ctrl-C during the ranks' start (exit 130, nothing left).

Shared helpers and the deadlines' rationale: tests/e2e/allreduce_sim.py and tests/e2e/test_allreduce.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from preflight.checks.allreduce import plan
from tests.e2e.allreduce_sim import (LOW_BUSBW, allreduce_results, inventory, ranks_everywhere, report_time,
                                     run_preflight)
from tests.paths import REPO


def test_mtu_black_hole_hangs_at_a_size_and_the_pairs_name_the_node(sim_cluster):
    cluster = sim_cluster(4)
    cluster.mtu_blackhole(3)
    deadlines = {"init_timeout": 90, "op_timeout": 6, "total_timeout": 150}
    inv = inventory(cluster, deadlines, expect={"busbw_gbps": LOW_BUSBW})
    rc, doc, wall = run_preflight(cluster, inv, "--only", "allreduce")
    assert rc == 1
    section = doc["allreduce"]
    (main,) = [r for r in allreduce_results(doc, "fail") if r["node"] is None and r["message"].startswith("all-reduce")]
    hung = re.search(r"all-reduce hung at (\d+ [KM]iB): ranks 0-3 \(n\[001-004\]\) did not finish within 6 s",
                     main["message"])
    assert hung, main["message"]
    assert "MTU mismatch" in main["message"], main["message"]
    assert hung.group(1) != "1 KiB"  # the small sizes passed: they are on the curve
    assert section["curve"] and section["curve"][-1]["bytes"] < plan.CPU_SIZES[-1]

    loc = section["localization"]
    assert loc["exclude"] == ["n003"], loc
    assert loc["by_bandwidth"] is False and len(loc["sizes"]) == 1 and loc["rounds"] == 2
    assert loc["deadlines"]["op_s"] <= 6
    (named,) = [r for r in allreduce_results(doc, "fail") if r["node"] == "n003"]
    assert named["message"].startswith("pair test: failed beside known-good"), named
    assert not [r for r in allreduce_results(doc, "fail") if r["node"] not in (None, "n003")]
    assert "pair test: exclude n003: n003 failed beside known-good" in main["message"], main["message"]
    assert len([r for r in allreduce_results(doc) if r["node"] is None]) == 1  # one cluster verdict

    # the deadlines bound it: the first run (init + op + kill grace) and two pair rounds under their own
    first = deadlines["init_timeout"] + deadlines["op_timeout"] + 10
    rounds = 2 * (loc["deadlines"]["init_s"] + loc["deadlines"]["op_s"] + 10)
    report_time("4 nodes, MTU black hole on n003 (bound by deadlines: %d s)" % (first + rounds), wall, section)
    assert cluster.leftover_processes() == {}



def test_three_nodes_an_mtu_black_hole_is_named_and_left_out_of_the_hostfile(sim_cluster, tmp_path):
    cluster = sim_cluster(3)
    cluster.mtu_blackhole(3)
    hostfile = tmp_path / "hosts.txt"
    inv = inventory(cluster, {"init_timeout": 90, "op_timeout": 6, "total_timeout": 150})
    rc, doc, wall = run_preflight(cluster, inv, "--only", "allreduce", "--hostfile", str(hostfile))
    assert rc == 1
    loc = doc["allreduce"]["localization"]
    assert loc["exclude"] == ["n003"] and loc["rounds"] == 2, loc
    assert [g["nodes"] for g in loc["groups"]] == [["n001", "n002"], ["n003", "n001"]]  # never the trio again
    # the first round adopts the sweep's spares; n003, left out of it, lost its process and spares, so the
    # second round, which names it again, ends every kept process first and starts cold (stage._Rounds)
    assert doc["allreduce"]["timings_s"]["rounds_warm_ranks"] == [2, 0], doc["allreduce"]["timings_s"]
    (named,) = [r for r in allreduce_results(doc, "fail") if r["node"] is not None]
    assert named["node"] == "n003" and named["message"].startswith("pair test: failed beside known-good n001")
    main = [r for r in allreduce_results(doc) if r["node"] is None]
    assert len(main) == 1 and "fault is shared" not in main[0]["message"]
    assert hostfile.read_text().split() == ["n001", "n002"]
    report_time("3 nodes, MTU black hole on n003", wall, doc["allreduce"])
    assert cluster.leftover_processes() == {}


def test_a_node_whose_rank_cannot_import_torch_is_named_not_hung(sim_cluster):
    cluster = sim_cluster(4)
    no_torch = "/usr/bin/python3"
    probe = subprocess.run([no_torch, "-c", "import torch"], capture_output=True)
    if not os.path.exists(no_torch) or probe.returncode == 0:
        pytest.skip("needs an interpreter without torch at %s" % no_torch)
    # the other ranks wait for n003 at the rendezvous until the init deadline: that is what this costs
    inv = inventory(cluster, {"init_timeout": 20, "op_timeout": 10}, node_overrides={"n003": {"python": no_torch}})
    rc, doc, wall = run_preflight(cluster, inv, "--only", "allreduce")
    assert rc == 1
    (main,) = [r for r in allreduce_results(doc) if r["node"] is None]
    assert main["status"] == "fail"
    assert main["message"].startswith("all-reduce failed at init: rank 2 (n003): ModuleNotFoundError: "
                                      "No module named 'torch'"), main["message"]
    assert "install torch in the interpreter named by python:" in main["message"]
    assert "hung" not in main["message"]
    (node,) = [r for r in allreduce_results(doc, "fail") if r["node"] is not None]
    assert node["node"] == "n003" and "No module named 'torch'" in node["message"]
    assert doc["allreduce"]["localization"] is None  # the node is named: no pair rounds
    report_time("4 nodes, no torch on n003", wall, doc["allreduce"])
    assert cluster.leftover_processes() == {}



def test_ctrl_c_during_the_all_reduce_exits_130_and_leaves_nothing(sim_cluster):
    cluster = sim_cluster(4)
    inv = inventory(cluster, {"init_timeout": 120, "op_timeout": 20})
    proc = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce", "--no-progress"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while not ranks_everywhere(cluster):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.2)
    time.sleep(1.0)  # into the ranks' import / rendezvous
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    print("\nCtrl-C to exit: %.1f s" % (time.monotonic() - t0))
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err.decode() and "Traceback" not in err.decode(), err
    assert cluster.leftover_processes(timeout=10) == {}


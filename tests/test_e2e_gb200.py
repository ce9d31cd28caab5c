"""GB200 compute trays end to end over SSH (issue 12.4): no NVSwitch PCI function, so fabric_manager judges
the GPUs' NVLink fabric state and the nvidia-imex service instead of skipping the node as PCIe."""

from __future__ import annotations

import json
import os
import sys

from tests.sim import gpu_hw

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_preflight(cluster, inv, *args, timeout=240):
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--json", "-", "--no-progress", *args], cwd=REPO, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_gb200_trays_judged_by_fabric_and_imex(sim_cluster):
    cluster = sim_cluster(2)
    for node, imex in zip(cluster.nodes, ("active", "not_found")):
        gpu_hw.install_gpus(node, "gb200", count=4)
        gpu_hw.install_imex(node, imex)
        gpu_hw.install_nccl(node)
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=4), "--only", "ssh,gpu,fabric_manager")
    fm = {r["node"]: r for r in doc["results"] if r["check"] == "fabric_manager"}
    assert fm["n001"]["status"] == "pass", fm
    assert fm["n001"]["message"].startswith("no NVSwitch PCI function (multi-node NVLink tray): fabric Completed on 4 GPUs")
    assert "nvidia-imex active (running)" in fm["n001"]["message"]
    assert fm["n002"]["status"] == "fail"
    assert fm["n002"]["message"].startswith("nvidia-imex is not installed (LoadState=not-found)")
    gpus = [r for r in doc["results"] if r["check"] == "gpu"]
    assert {r["status"] for r in gpus} == {"pass"}, gpus
    assert rc == 1
    assert cluster.leftover_processes() == {}

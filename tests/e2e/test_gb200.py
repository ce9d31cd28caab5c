"""GB200 compute trays end to end over SSH (issue 12.4): no NVSwitch PCI function, so fabric_manager judges
the GPUs' NVLink fabric state and the nvidia-imex service instead of skipping the node as PCIe."""

from __future__ import annotations

import json
import sys

from tests.sim import gpu_hw
from tests.paths import REPO



def run_preflight(cluster, inv, *args, timeout=240):
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--json", "-", "--no-progress", *args], cwd=REPO, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_gb200_trays_judged_by_fabric_and_imex_and_nvls(sim_cluster):
    cluster = sim_cluster(2)
    for node, imex in zip(cluster.nodes, ("active", "not_found")):
        gpu_hw.install_gpus(node, "gb200", count=4)
        gpu_hw.install_imex(node, imex)
        gpu_hw.install_nccl(node, "2.29.2")
    rc, doc, err = run_preflight(cluster, cluster.inventory(gpus_per_node=4), "--only", "ssh,gpu,fabric_manager,nvls")
    fm = {r["node"]: r for r in doc["results"] if r["check"] == "fabric_manager"}
    assert fm["n001"]["status"] == "pass", fm
    assert fm["n001"]["message"].startswith("no NVSwitch PCI function (multi-node NVLink tray): fabric Completed on 4 GPUs")
    assert "nvidia-imex active (running)" in fm["n001"]["message"]
    assert fm["n002"]["status"] == "fail"
    assert fm["n002"]["message"].startswith("nvidia-imex is not installed (LoadState=not-found)")
    # NVLS across the rack's trays needs IMEX: with NCCL 2.29 the tray without it would fail NCCL's init (a config
    # warning naming NCCL_NVLS_ENABLE=0; the drain-worthy fault is fabric_manager's), the other tray can use NVLS
    nvls = {r["node"]: r for r in doc["results"] if r["check"] == "nvls"}
    assert nvls["n001"]["status"] == "pass", nvls
    assert nvls["n001"]["message"].startswith("NVLS prerequisites met on 4 GPUs: multi-node NVLink fabric")
    assert "NCCL 2.29.2 uses it" in nvls["n001"]["message"]
    assert (nvls["n002"]["status"], nvls["n002"]["action"]) == ("warn", "fix_config"), nvls
    assert "nvidia-imex not installed; NCCL 2.29.2 fails the communicator's init" in nvls["n002"]["message"]
    gpus = [r for r in doc["results"] if r["check"] == "gpu"]
    assert {r["status"] for r in gpus} == {"pass"}, gpus
    assert rc == 1
    assert cluster.leftover_processes() == {}

"""The env file end to end through the Slurm transport: `preflight check` over srun proves it and writes a Slurm
hostfile, then srun (one task per node) sources it and runs torchrun's gloo all-reduce.

Its own module (the SSH cases are in test_envfile.py) so that pytest-xdist's --dist loadfile runs it beside them.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

import yaml

from tests.e2e.test_envfile import WORKER, exports
from tests.paths import REPO


SRUN_LAUNCH = '''\
#!/bin/bash
# srun runs this once per node: torchrun starts one gloo rank there, with the env preflight verified
set -euo pipefail
source {env}
exec python3 -m torch.distributed.run --nnodes="$SLURM_NNODES" --node_rank="$SLURM_NODEID" --nproc_per_node=1 \\
    --log-dir={logs} --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" {worker}
'''


def test_env_file_from_a_slurm_run_drives_torchrun_under_srun(slurm_cluster, tmp_path):
    """The same file through the Slurm transport: `preflight check` over srun proves it, then a batch-style
    launch (srun, one task per node of the hostfile) sources it and runs torchrun's all-reduce."""
    cluster = slurm_cluster(3)
    inv = os.path.join(cluster.root, "slurm-env.yaml")
    with open(inv, "w") as fh:
        yaml.safe_dump({"defaults": {"python": "python3", "gpus_per_node": 0},
                        "cluster": {"transport": "slurm", "master_port": 29500,
                                    "allreduce": {"sizes": [1024, 65536], "warmup": 1, "iters": 2}},
                        "nodes": ["n[001-003]"]}, fh, sort_keys=False)
    env_path, hosts = tmp_path / "nccl.env", tmp_path / "hosts"
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--env-file", str(env_path), "--hostfile", str(hosts),
                        "--hostfile-format", "slurm", "--no-progress"], cwd=REPO, env=cluster.slurm.env(), timeout=300)
    assert "Traceback" not in proc.stderr + proc.stdout and proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    text, env = exports(env_path)
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["MASTER_ADDR"] == cluster.node("n001").data_ip and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert "# proven: the all-reduce test ran with exactly these variables on n[001-003]" in text
    with open(hosts) as fh:
        nodelist = fh.read().strip()
    assert nodelist == "n[001-003]"

    worker, launch = tmp_path / "worker.py", tmp_path / "launch.sh"
    worker.write_text(WORKER)
    launch.write_text(SRUN_LAUNCH.format(env=shlex.quote(str(env_path)), worker=shlex.quote(str(worker)),
                                         logs=shlex.quote(str(tmp_path / "torchrun-logs"))))
    run = cluster.slurm.run(["srun", "-N3", "--ntasks-per-node=1", "--nodelist=" + nodelist, "bash", str(launch)], timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in results) == [0, 1, 2], run.stdout
    assert all(r["sum"] == 6.0 and r["world"] == 3 for r in results), results
    assert all(r["env"]["GLOO_SOCKET_IFNAME"] == "eth1" and r["env"]["MASTER_ADDR"] == env["MASTER_ADDR"] for r in results)
    print("\nsrun launch: 3 ranks under torchrun, all-reduce sum 6 on every rank")
    assert cluster.leftover_processes() == {}
    assert cluster.slurm.leftover_steps() == []

"""The env file and the hostfile end to end on simulated nodes (docker0 everywhere, management and data
networks, one node down): the file names the data interface and the head's data address, the all-reduce
ran with exactly it, a launch script that sources it runs torchrun (static rendezvous at the file's
MASTER_ADDR:MASTER_PORT) and a gloo all-reduce across the nodes of the hostfile over real ssh, and a node whose data interface has a hostile name never leads to code running
when the file is sourced. The same file through Slurm: test_envfile_slurm.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import yaml
from tests.paths import REPO

HOSTILE = "e$(id>p)"  # a valid Linux interface name: 8 characters, no '/', ':' or whitespace

WORKER = '''\
import datetime, json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "world": world, "sum": t.item(),
                  "env": {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")}}))
dist.destroy_process_group()
'''

LAUNCH = '''\
#!/bin/bash
# launch.sh NODE_RANK NNODES: torchrun starts one gloo rank on this node, with the env preflight verified
set -euo pipefail
source {env}
exec python3 -m torch.distributed.run --nnodes="$2" --node_rank="$1" --nproc_per_node=1 --log-dir={logs} \\
    --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" {worker}
'''


def preflight(cluster, *args, timeout=300):
    """Run the preflight CLI in the controller namespace; (rc, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", *args, "--no-progress"], cwd=REPO, timeout=timeout)
    elapsed = time.monotonic() - t0
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr + proc.stdout
    return proc.returncode, proc.stdout, proc.stderr, elapsed


def exports(path):
    """(the file's text, {key: value}) for both line shapes: `export K='v'` and `K=${K:-'v'}; export K`."""
    with open(path) as fh:
        text = fh.read()
    plain = re.findall(r"^export ([A-Z_]+)='([^'\n]*)'$", text, re.M)
    default = re.findall(r"^([A-Z_]+)=\$\{\1:-'([^'\n]*)'\}; export \1$", text, re.M)
    return text, dict(plain + default)


def torch_version():
    import torch

    return torch.__version__


def small_allreduce(inv):
    """Keep the all-reduce short on a 2-core machine: a few sizes, few iterations."""
    with open(inv) as fh:
        doc = yaml.safe_load(fh)
    doc["cluster"]["allreduce"] = {"sizes": [1024, 65536, 1048576], "warmup": 1, "iters": 2}
    with open(inv, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return inv


def source_quietly(path, cwd):
    """Source the file in bash and sh from cwd: (stdout+stderr of each, files created in cwd)."""
    out = []
    for shell in ("bash", "sh"):
        proc = subprocess.run([shell, "-c", '. "$0"', str(path)], cwd=str(cwd), capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc
        out.append(proc.stdout + proc.stderr)
    return out, sorted(os.listdir(str(cwd)))


def test_env_file_hostfile_and_a_launch_that_sources_it(sim_cluster, tmp_path):
    cluster = sim_cluster(4, docker0=True)
    cluster.stop_sshd(4)
    inv = small_allreduce(cluster.inventory())
    n001 = cluster.node("n001")
    out = {}

    # the fast path, the checks without the all-reduce, and the full check: same cluster, side by side
    fast = tmp_path / "fast.env"
    rc, _, err, out["env"] = preflight(cluster, "env", inv, "--env-file", fast)
    assert rc == 1, err  # n004 is down
    env_path, hosts = tmp_path / "nccl.env", tmp_path / "hosts"
    rc, _, err, out["check --skip allreduce"] = preflight(
        cluster, "check", inv, "--skip", "allreduce", "--env-file", tmp_path / "skip.env", "--hostfile", hosts, "--hostfile-format", "slurm"
    )
    assert rc == 1, err
    with open(hosts) as fh:
        assert fh.read() == "n[001-003]\n"
    report = tmp_path / "report.json"
    rc, _, err, out["check (full)"] = preflight(
        cluster, "check", inv, "--env-file", env_path, "--hostfile", hosts, "--json", report
    )
    assert rc == 1, err
    print("\nwall time, one run each, 4 simulated nodes (n004 down), 2 cores (all-reduce: 3 sizes):")
    for what, seconds in out.items():
        print("  preflight %-24s %6.1f s" % (what, seconds))

    text, env = exports(env_path)
    print(text)
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["MASTER_ADDR"] == n001.data_ip and env["MASTER_PORT"] == "29500"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_DEBUG"] == "WARN"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # torch >= 2.2 on the nodes: its own safe default
    assert "MASTER_ADDR=${MASTER_ADDR:-'%s'}; export MASTER_ADDR" % n001.data_ip in text  # a launcher's own value wins
    assert "# on the nodes: NCCL not found, torch %s (driver check)" % torch_version() in text
    assert "docker0" not in text.split("\n\n", 1)[1] and "eth0" not in text
    assert "# nodes: n[001-003] (3 of 4)" in text and "# left out: n004 (unreachable: ssh)" in text
    assert "# checks that failed or errored: ssh (n004)" in text
    assert "# proven: the all-reduce test ran with exactly these variables on n[001-003]" in text
    # the fast path and the check without the all-reduce derive the same variables
    assert exports(fast)[1] == exports(tmp_path / "skip.env")[1] == env
    assert "# not yet proven by the all-reduce test" in exports(fast)[0]
    assert subprocess.run(["bash", "-n", str(env_path)], capture_output=True).returncode == 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert source_quietly(env_path, cwd) == (["", ""], [])

    # the all-reduce ran with exactly the file's variables (MASTER_* are the agent's rendezvous, the same values)
    with open(report) as fh:
        allreduce = json.load(fh)["allreduce"]
    assert allreduce["env"] == {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    assert allreduce["master"] == "%s:%s" % (env["MASTER_ADDR"], env["MASTER_PORT"])
    assert allreduce["nodes"] == ["n001", "n002", "n003"] and allreduce["backend"] == "gloo"

    with open(hosts) as fh:
        assert fh.read() == "n001\nn002\nn003\n"
    rc, _, err, _ = preflight(cluster, "check", inv, "--skip", "allreduce", "--hostfile", hosts, "--hostfile-format", "deepspeed")
    assert rc == 1, err
    with open(hosts) as fh:
        assert fh.read() == "n001 slots=1\nn002 slots=1\nn003 slots=1\n"  # gpus_per_node 0: one CPU rank each

    # a launch script as users write it: source the env file, start one rank per hostfile line over ssh
    worker, launch = tmp_path / "worker.py", tmp_path / "launch.sh"
    worker.write_text(WORKER)
    launch.write_text(LAUNCH.format(env=shlex.quote(str(env_path)), worker=shlex.quote(str(worker)),
                                    logs=shlex.quote(str(tmp_path / "torchrun-logs"))))  # not /tmp/torchelastic_*
    with open(hosts) as fh:
        nodes = [line.split()[0] for line in fh if line.strip()]
    procs = [
        cluster.ctl_popen(
            cluster.ssh_argv(node) + ["--", "bash %s %d %d" % (shlex.quote(str(launch)), rank, len(nodes))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank, node in enumerate(nodes)
    ]
    results = []
    for node, proc in zip(nodes, procs):
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, (node, stderr[-2000:])
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    want = float(sum(range(1, len(nodes) + 1)))
    assert sorted(r["rank"] for r in results) == list(range(len(nodes)))
    assert all(r["sum"] == want and r["world"] == 3 for r in results), results
    assert all(r["env"] == {"MASTER_ADDR": n001.data_ip, "MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": "eth1"} for r in results)
    print("launch: %d ranks on %s, all-reduce sum %g on every rank" % (len(results), ",".join(nodes), want))
    assert cluster.leftover_processes() == {}


def test_hostile_interface_name_never_runs_when_sourced(sim_cluster, tmp_path):
    cluster = sim_cluster(3, docker0=True)
    ns = cluster.node("n002").ns
    for argv in (["link", "set", "eth1", "down"], ["link", "set", "eth1", "name", HOSTILE], ["link", "set", HOSTILE, "up"]):
        subprocess.run(["ip", "-n", ns] + argv, check=True, capture_output=True)
    names = json.loads(cluster.node_exec("n002", ["ip", "-j", "link", "show"]).stdout)
    assert HOSTILE in [link["ifname"] for link in names]  # the kernel took the name
    control = tmp_path / "control"
    control.mkdir()
    subprocess.run(["sh", "-c", "echo %s >/dev/null" % HOSTILE], cwd=str(control), check=True)
    assert os.listdir(str(control)) == ["p"]  # unquoted, the name runs `id`
    inv = cluster.inventory()

    env_path, hosts, report = tmp_path / "nccl.env", tmp_path / "hosts", tmp_path / "report.json"
    rc, _, err, _ = preflight(cluster, "check", inv, "--skip", "allreduce", "--env-file", env_path, "--hostfile", hosts, "--json", report)
    assert rc == 1, err
    with open(report) as fh:
        doc = json.load(fh)
    refused = [r for r in doc["results"] if r["status"] == "fail" and "refused" in r["message"]]
    assert [(r["check"], r["node"]) for r in refused] == [("nic", "n002")], doc["results"]
    assert repr(HOSTILE) in refused[0]["message"], refused[0]["message"]
    print(refused[0]["message"])

    text, env = exports(env_path)
    assert HOSTILE not in text and "id>p" not in text and "$(" not in text
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["MASTER_ADDR"] == cluster.node("n001").data_ip
    assert "# left out: n002 (failed: nic)" in text
    with open(hosts) as fh:
        assert fh.read() == "n001\nn003\n"

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    output, files = source_quietly(env_path, cwd)
    assert output == ["", ""] and files == []
    # on the node itself, through its login shell, as a launch script would
    remote = cluster.ssh("n002", "cd %s && . %s && echo ok" % (shlex.quote(str(cwd)), shlex.quote(str(env_path))))
    assert remote.returncode == 0 and remote.stdout == "ok\n" and remote.stderr == "", remote
    assert os.listdir(str(cwd)) == []

    # the fast path refuses it the same way
    rc, _, err, _ = preflight(cluster, "env", inv, "--env-file", env_path)
    assert rc == 1, err
    assert exports(env_path)[1] == env and HOSTILE not in exports(env_path)[0]
    assert cluster.leftover_processes() == {}

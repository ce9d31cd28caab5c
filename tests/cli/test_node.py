"""`preflight node` (Slurm HealthCheckProgram / Prolog): this machine alone, log lines, exit code.

Run inside a simulated node's namespace, with the node's hardware presented the way real hardware is
(its bin/ first on PATH: nvidia-smi, systemctl, ldconfig; its sysfs root through PREFLIGHT_SYSFS_ROOT),
and its own hostname (a UTS namespace), as slurmd would run it there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from preflight.cli import node as nodecheck
from preflight.errors import UsageError
from preflight.model import Finding, Status
from tests.report_schema import assert_valid
from tests.sim import gpu_hw
from tests.builders import node_argv


def _node_argv(cluster, node, *args, gpus=8):
    """(argv, env) of `preflight node` as slurmd would run it inside the node (tests.builders.node_argv)."""
    return node_argv(cluster, node, *(["--gpus-per-node", str(gpus)] if gpus is not None else []), *args)


def _node_run(cluster, node, *args, gpus=8):
    argv, env = _node_argv(cluster, node, *args, gpus=gpus)
    t0 = time.monotonic()
    out = cluster.node_exec(node, argv, env=env, timeout=120)
    return out, time.monotonic() - t0


def _hgx(node):
    gpu_hw.install_gpus(node, "h100", count=8)
    gpu_hw.install_nvswitches(node)
    gpu_hw.install_fabric_manager(node, active=True)
    gpu_hw.install_nccl(node)


def test_healthy_node_exits_0_and_one_fault_exits_1_with_one_line(sim_cluster):
    cluster = sim_cluster(1)
    node = cluster.node("n001")
    _hgx(node)
    out, wall = _node_run(cluster, node)
    print("healthy node: rc %d, %.2f s wall\n%s%s" % (out.returncode, wall, out.stdout, out.stderr))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("preflight: node n001 ok: 0 fail, 0 error"), lines
    assert "Traceback" not in out.stderr and "\x1b[" not in out.stdout  # plain text: no colours

    gpu_hw.install_gpus(node, "h100", count=8, faults={3: "ecc"})
    out, wall = _node_run(cluster, node, "--json", "-")
    print("ECC fault: rc %d, %.2f s wall\n%s" % (out.returncode, wall, out.stderr))
    assert out.returncode == 1, out.stderr
    problems = [l for l in out.stderr.splitlines() if not l.startswith("preflight: node ")]
    assert len(problems) == 1, out.stderr
    assert problems[0].startswith("preflight: FAIL gpu: ") and "GPU 3" in problems[0] and "ECC" in problems[0], problems
    doc = json.loads(out.stdout)
    assert_valid(doc)
    assert doc["exit_code"] == 1 and doc["nodes"][0]["name"] == "n001" and doc["nodes"][0]["status"] == "fail"
    assert "mtu" not in doc["checks"] and "allreduce" not in doc["checks"] and "ports" not in doc["checks"]

    out, _ = _node_run(cluster, node, "--skip", "gpu,fabric_manager")  # the operator's choice is honoured
    assert out.returncode == 0, out.stdout


def test_inventory_expectations_judge_the_node_alone(sim_cluster, tmp_path):
    """HealthCheckProgram with the fleet's inventory: a node alone has no majority to drift from, so the
    inventory's cluster.expect is what names a driver the fleet moved away from; the GPU count comes
    from the node's own entry."""
    cluster = sim_cluster(1)
    node = cluster.node("n001")
    _hgx(node)  # driver 550.54.15
    inv = tmp_path / "hosts.yaml"
    inv.write_text("defaults:\n  gpus_per_node: 4\ncluster:\n  expect:\n    driver_version: \"560.35.03\"\n"
                   "nodes:\n  - host: n001\n    gpus_per_node: 8\n  - n002\n")
    out, wall = _node_run(cluster, node, "--inventory", str(inv), gpus=None)
    print("driver moved: rc %d, %.2f s wall\n%s" % (out.returncode, wall, out.stdout))
    assert out.returncode == 1, out.stdout + out.stderr
    problems = [l for l in out.stdout.splitlines() if not l.startswith("preflight: node ")]
    assert len(problems) == 1 and problems[0].startswith("preflight: FAIL driver: "), out.stdout
    assert "550.54.15" in problems[0] and "560.35.03" in problems[0], problems
    assert "8 GPUs from %s (n001)" % inv in out.stdout, out.stdout  # its entry, not defaults' 4

    inv.write_text(inv.read_text().replace("560.35.03", "550.54.15"))
    out, _ = _node_run(cluster, node, "--inventory", str(inv), gpus=None)
    assert out.returncode == 0, out.stdout + out.stderr

    inv.write_text("cluster:\n  expect:\n    driver_versoin: 1\nnodes: [n001]\n")
    out, _ = _node_run(cluster, node, "--inventory", str(inv))
    assert out.returncode == 2 and out.stdout == "", out.stdout
    (err,) = out.stderr.strip().splitlines()
    assert str(inv) in err and ":3" in err and "driver_versoin" in err, err


def test_node_selection_refuses_cross_node_checks():
    assert "mtu" not in nodecheck.node_checks() and "allreduce" not in nodecheck.node_checks()
    assert {"ssh", "gpu", "driver"} <= set(nodecheck.node_checks())
    with pytest.raises(UsageError, match="needs a partner node"):
        nodecheck.select(["mtu"], [])
    with pytest.raises(UsageError, match="unknown check"):
        nodecheck.select(["gpus"], [])
    assert "ports" not in nodecheck.select(None, ["ports", "allreduce"])
    assert nodecheck.select(["gpu"], []) == ["ssh", "gpu"]


def test_log_line_is_one_plain_line():
    f = Finding("ib_hca", "n001", Status.FAIL, "mlx5_1 port 1: state DOWN\n(link)", expected="ACTIVE")
    assert nodecheck.line(f) == "preflight: FAIL ib_hca: mlx5_1 port 1: state DOWN (link) (expected ACTIVE)"


def test_usage_errors_exit_2():
    from preflight.cli import main

    assert main(["node", "--only", "allreduce"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["node", "--bogus"])
    assert exc.value.code == 2


def _hung_smi(node, tmp_path):
    """Replace the node's nvidia-smi with a wrapper that forks a sleeping child and hangs; returns its pid file."""
    from tests.probe.test_probe_commands import WRAPPER

    pids = tmp_path / "nvidia-smi.pids"
    smi = os.path.join(node.bin_dir, "nvidia-smi")
    with open(smi, "w") as handle:
        handle.write(WRAPPER.format(pids=pids, then="exec sleep 300"))
    os.chmod(smi, 0o755)
    return pids


def test_a_hung_tool_leaves_no_process_after_the_node_check(sim_cluster, tmp_path, reaper):
    """A `nvidia-smi` wrapper that forks a sleeping child and hangs: `preflight node` reports the driver
    probe as overrunning (not a healthy node), and once it has exited no process of the wrapper's group
    remains (as a HealthCheckProgram run every few minutes, they would pile up)."""
    from tests.probe.test_probe_commands import gone, group_members, read_pids

    cluster = sim_cluster(1)
    node = cluster.node("n001")
    _hgx(node)
    pids = _hung_smi(node, tmp_path)
    out, _ = _node_run(cluster, node, "--only", "driver", "--timeout", "8")
    leader, child, pgid = read_pids(pids)
    reaper.extend([leader, child])
    assert gone([leader, child]) == [] and group_members(pgid) == []
    assert out.returncode == 1, out.stdout + out.stderr
    if "timed out: no answer within" not in out.stdout:  # unless so loaded that the transport's deadline came first
        assert "preflight: ERROR driver: probe failed: did not finish within 6 s (killed with its children: " \
               "nvidia-smi -q -x)" in out.stdout, out.stdout


def test_a_node_check_killed_mid_command_leaves_no_process(sim_cluster, tmp_path, reaper):
    """slurmd gives up on its HealthCheckProgram and SIGKILLs it while the hung wrapper runs: the probe process
    sees its controller's pipe close and kills the wrapper's group before it dies."""
    from tests.probe.test_probe_commands import gone, group_members, read_pids

    cluster = sim_cluster(1)
    node = cluster.node("n001")
    _hgx(node)
    pids = _hung_smi(node, tmp_path)
    argv, env = _node_argv(cluster, node, "--only", "driver", "--timeout", "120")
    proc = subprocess.Popen(["ip", "netns", "exec", node.ns] + argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    reaper.append(proc.pid)
    try:
        leader, child, pgid = read_pids(pids, wait_s=60.0)
        reaper.extend([leader, child])
    finally:
        proc.kill()  # `ip netns exec`, unshare and sh exec: this pid is preflight's
        proc.wait()
    assert gone([leader, child], wait_s=30.0) == [] and group_members(pgid) == []

"""limits: the probe on this machine, and the stack and /dev/shm rules with their healthy-but-unusual twins."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

from preflight.checks.limits import probe as limits_probe
from preflight.checks.limits import rule as limits_rule
from preflight.model import Status
from preflight.probe.context import NodeContext
from tests.builders import view
from tests.paths import REPO

MiB = 1 << 20
GiB = 1 << 30


def _facts(stack=8 * MiB, total=32 * GiB, free=None, channels=(), shm_error=None):
    shm = {"path": "/dev/shm", "error": shm_error} if shm_error else {
        "path": "/dev/shm", "total_bytes": total, "free_bytes": total if free is None else free}
    return {"stack": {"soft": stack, "hard": None}, "shm": shm, "imex_channels": list(channels)}


def _driver(*versions):
    return {"nccl_python": None, "nccl_system": [{"soname": "libnccl.so.2", "path": "/usr/lib/x", "version": v} for v in versions]}


def _judge(facts, gpus=8, driver=None):
    node = {"limits": facts}
    if driver is not None:
        node["driver"] = driver
    return limits_rule.rule(view({"n001": node}, gpus=gpus))


def test_probe_reads_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_HOST_ROOT", str(tmp_path))
    (tmp_path / "dev" / "nvidia-caps-imex-channels").mkdir(parents=True)
    (tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel0").write_text("")
    facts = limits_probe.probe(NodeContext())
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    assert facts["stack"]["soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert facts["shm"]["total_bytes"] > 0 and facts["imex_channels"] == ["channel0"]


def test_healthy_gpu_node_passes_and_says_what_it_read():
    out = _judge(_facts())
    assert [f.status for f in out] == [Status.PASS]
    assert out[0].message == "n001: stack 8 MiB; /dev/shm 32 GiB free of 32 GiB (>= 147.1 MiB for 8 GPUs)"


def test_unlimited_stack_on_mnnvl_fails_with_old_or_unknown_nccl():
    for driver in (None, _driver("2.27.6")):
        out = _judge(_facts(stack=None, channels=["channel0"]), driver=driver)
        assert [(f.status, f.action) for f in out] == [(Status.FAIL, "fix_config")]
        assert "unlimited on a multi-node NVLink node (IMEX channel0" in out[0].message
        assert "NVIDIA/nccl#2186" in out[0].message and out[0].actual == "unlimited"
    assert "NCCL 2.27.6" in _judge(_facts(stack=None, channels=["channel0"]), driver=_driver("2.27.6"))[0].message


def test_unlimited_stack_twins_pass_without_mnnvl_or_with_a_guarded_nccl():
    out = _judge(_facts(stack=None))
    assert [f.status for f in out] == [Status.PASS] and "harmless without multi-node NVLink" in out[0].message
    out = _judge(_facts(stack=None, channels=["channel0"]), driver=_driver("2.30.4"))
    assert [f.status for f in out] == [Status.PASS] and "NCCL 2.30.4 replaces it with 8 MiB" in out[0].message


def test_docker_default_shm_fails_for_8_gpus():
    out = _judge(_facts(total=64 * MiB))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "fix_config")]
    assert "/dev/shm is 64 MiB, too small for NCCL's shared-memory segments of 8 GPUs" in out[0].message
    assert out[0].expected.startswith(">= 147.1 MiB (8 GPUs x 2 channels x 9.2 MiB")


def test_small_but_sufficient_container_shm_passes():
    out = _judge(_facts(total=256 * MiB), gpus=2)
    assert [f.status for f in out] == [Status.PASS] and ">= 36.8 MiB for 2 GPUs" in out[0].message
    # one GPU: no local peer, Docker's 64 MiB is fine
    assert [f.status for f in _judge(_facts(total=64 * MiB), gpus=1)] == [Status.PASS]


def test_shm_full_of_leftovers_fails_naming_the_space_held():
    out = _judge(_facts(total=1 * GiB, free=16 * MiB))
    assert [f.status for f in out] == [Status.FAIL]
    assert "16 MiB free of 1 GiB: 1008 MiB held (leftover nccl-* segments" in out[0].message


def test_no_shm_fails():
    out = _judge(_facts(shm_error="No such file or directory"))
    assert [f.status for f in out] == [Status.FAIL] and "/dev/shm is not usable" in out[0].message


def test_cpu_only_nodes_skip_and_missing_facts_error():
    cpu = view({"c1": {"limits": _facts(stack=None, total=64 * MiB)}}, gpus=0)
    assert [f.status for f in limits_rule.rule(cpu)] == [Status.SKIP]
    assert [f.status for f in limits_rule.rule(view({"n001": {}}))] == [Status.ERROR]


def test_preflight_node_under_an_unlimited_stack_on_an_mnnvl_node(tmp_path):
    """End to end through the CLI: `ulimit -s unlimited` really set, an IMEX channel on the host root."""
    (tmp_path / "dev" / "nvidia-caps-imex-channels").mkdir(parents=True)
    (tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel0").write_text("")
    env = dict(os.environ, PYTHONPATH=REPO, PREFLIGHT_HOST_ROOT=str(tmp_path))
    cmd = "ulimit -s unlimited; exec %s -m preflight node --only limits --gpus-per-node 8" % sys.executable
    proc = subprocess.run(["bash", "-c", cmd], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "preflight: FAIL limits:" in proc.stdout and "stack size limit (ulimit -s) is unlimited" in proc.stdout

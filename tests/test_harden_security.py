"""No inventory value or report name ever reaches ClusterShell's group upcalls (a shell on the controller).

Each test points ClusterShell at a groups.conf (through CLUSTERSHELL_CFGDIR, which ClusterShell's
Defaults.config_paths() searches with the highest precedence) whose upcalls `touch` a marker file, runs
the real CLI, and asserts the marker was never created.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.paths import REPO



@pytest.fixture
def trap(tmp_path):
    """(env for the CLI, marker path): any group resolution runs `touch marker`."""
    marker = tmp_path / "MARKER"
    cfg = tmp_path / "cs"
    cfg.mkdir()
    (cfg / "groups.conf").write_text(
        "[Main]\ndefault: evil\n[evil]\nmap: touch %s\nlist: touch %s\nall: touch %s\n" % (marker, marker, marker)
    )
    env = dict(os.environ, CLUSTERSHELL_CFGDIR=str(cfg), HOME=str(tmp_path))
    return env, marker


def cli(env, *args):
    return subprocess.run([sys.executable, "-m", "preflight", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)


def test_trap_is_armed(trap):
    """The trap works: ClusterShell's default resolver does run the upcall (so the tests below can fail)."""
    env, marker = trap
    subprocess.run([sys.executable, "-c", "from ClusterShell.NodeSet import NodeSet; list(NodeSet('@x'))"],
                   env=env, stderr=subprocess.DEVNULL, timeout=60)
    assert marker.exists()


@pytest.mark.parametrize("host", ["gpu-[1-2],@pwn", "@pwn", "gpu-1,@pwn", "fe80::1%,@pwn", "fe80::1%$(touch x)",
                                  "gpu-[1-2]!@pwn", "gpu-[1-2]&gpu-1"])
def test_group_syntax_in_a_host_is_refused_and_never_resolved(trap, tmp_path, host):
    env, marker = trap
    inv = tmp_path / "hosts.yaml"
    inv.write_text("nodes:\n  - host: %s\n" % json.dumps(host))
    proc = cli(env, "check", str(inv), "--only", "ssh", "--no-progress")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "%s:2:" % inv in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_scope_ids_allow_only_plain_characters():
    from preflight.inventory import valid_host

    assert valid_host("fe80::1%eth0") and valid_host("fe80::1%enp1s0f0.100")
    for bad in ("fe80::1%eth0 x", "fe80::1%$(id)", "fe80::1%a,@b", "fe80::1%a\nb", "fe80::1%"):
        assert not valid_host(bad), bad


def _report(names):
    return {"preflight_version": "0", "started_at": "2026-01-01T00:00:00Z", "inventory": "x", "inventory_sha256": "1",
            "checks": ["ssh"], "nodes": [{"name": n, "host": n, "gpus": 0, "head": False, "status": "fail"} for n in names],
            "results": [{"check": "ssh", "node": n, "status": "fail", "message": "down"} for n in names],
            "summary": {}, "allreduce": None, "exit_code": 1}


def test_diff_never_resolves_groups_in_report_names(trap, tmp_path):
    env, marker = trap
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_report(["a1"])))
    new.write_text(json.dumps(_report(["a1", "b@pwn", "c,@pwn", "@pwn"])))
    proc = cli(env, "diff", str(old), str(new))
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_every_fold_in_preflight_is_group_free(trap):
    """report, diff, envfile and hostfile folds with hostile names, in a process the trap is armed in."""
    env, marker = trap
    code = (
        "from preflight.output import report, diff, hostfile\nfrom preflight.derived import envvars\n"
        "names = ['n1', 'x@pwn', '@pwn', 'y,@pwn']\n"
        "for f in (report.fold, envvars.fold_names, diff.fold):\n"
        "    f(names)\n"
        "try:\n"
        "    hostfile.render_hostfile([(n, 1) for n in names], 'slurm')\n"
        "except ValueError:\n"
        "    pass\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()

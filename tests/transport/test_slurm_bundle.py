"""The probe bundle reaches Slurm nodes once per run (sbcast), over a real Slurm (tests/sim/slurm.py).

Each simulated slurmd has its own /dev/shm (a directory of the node's mounted there in the slurmd's
mount namespace, as a real node has its own tmpfs), so what sbcast writes, what a test plants and what a
run leaves are per node, and the tests look at them in that directory. The runs are the real CLI,
`preflight check --slurm --nodelist ... --only ssh --debug`: the ssh check is the bare transport.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import time
import zipfile

import pytest

from tests.report_schema import assert_valid

N = 3
NODES = "n[001-003]"


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(N)


@pytest.fixture(autouse=True)
def clean_shm(cluster):
    """Every test starts with empty /dev/shm on every node (what the test before it left is its own)."""
    for node in cluster.nodes:
        _wipe(cluster.slurm.shm(node))
    yield
    cluster.slurm.wait_idle([n.name for n in cluster.nodes], 60)


def _wipe(folder):
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))


def _run(cluster, env=None):
    out = cluster.slurm.preflight(["check", "--slurm", "--nodelist", NODES, "--only", "ssh", "--debug", "--json", "-"],
                                  env=env)
    assert out.stdout.strip(), out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert_valid(doc)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["status"] for r in doc["results"]] == ["pass"] * N, doc["results"]
    assert cluster.slurm.leftover_steps() == []
    return doc, out.stderr


def _bundles(cluster, node):
    """{name: stat} of the bundle files in the node's /dev/shm."""
    folder = cluster.slurm.shm(node)
    return {name: os.lstat(os.path.join(folder, name)) for name in os.listdir(folder) if "-bundle-" in name}


def _the_bundle(cluster):
    """(name, bytes) of the one bundle the first node holds; its name carries its SHA-256."""
    found = _bundles(cluster, "n001")
    assert len(found) == 1, found
    name = next(iter(found))
    with open(os.path.join(cluster.slurm.shm("n001"), name), "rb") as fh:
        blob = fh.read()
    assert name == "preflight-%d-bundle-%s.zip" % (os.getuid(), hashlib.sha256(blob).hexdigest())
    return name, blob


def _evil_zip(marker):
    """A bundle whose runner would leave `marker` behind if it were ever imported."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("preflight/__init__.py", "")
        zf.writestr("preflight/probe/__init__.py", "")
        zf.writestr("preflight/probe/runner.py", "open(%r, 'w').write('ran')\ndef main(c, b):\n    return {}\n" % marker)
    return buf.getvalue()


def test_sbcast_once_then_reused_by_the_next_run(cluster):
    doc, err = _run(cluster)
    assert doc["transport"]["bundle"] == "sbcast" and doc["transport"]["bundle_on_stdin"] == []
    assert "bundle broadcast with sbcast as /dev/shm/preflight-" in err and "(0 of 3 nodes had it already)" in err
    name, blob = _the_bundle(cluster)
    first = {}
    for node in cluster.nodes:
        found = _bundles(cluster, node)
        assert list(found) == [name], (node.name, found)  # each node its own copy, nothing else
        st = found[name]
        assert st.st_uid == os.getuid() and not st.st_mode & 0o022
        first[node.name] = (st.st_ino, st.st_mtime_ns)
    # the second run: every node has this version; sbcast writes nothing, the same files are used
    doc, err = _run(cluster)
    assert doc["transport"]["bundle"] == "sbcast" and doc["transport"]["bundle_on_stdin"] == []
    assert "(3 of 3 nodes had it already)" in err
    for node in cluster.nodes:
        st = _bundles(cluster, node)[name]
        assert (st.st_ino, st.st_mtime_ns) == first[node.name], node.name


def test_planted_tampered_and_symlinked_files_are_refused_never_run(cluster, tmp_path):
    _run(cluster)
    name, blob = _the_bundle(cluster)
    for node in cluster.nodes:
        _wipe(cluster.slurm.shm(node))
    marker = os.path.join(cluster.root, "evil-ran")
    evil = _evil_zip(marker)
    n1, n2, n3 = (os.path.join(cluster.slurm.shm(n), name) for n in ("n001", "n002", "n003"))
    # n001: the right bytes, but another user's file (sbcast cannot replace it: O_EXCL, sticky dir)
    with open(n1, "wb") as fh:
        fh.write(blob)
    os.chown(n1, 65534, 65534)
    # n002: a symlink to a file of ours with the right name's content elsewhere
    target = os.path.join(cluster.root, "target.zip")
    with open(target, "wb") as fh:
        fh.write(blob)
    os.symlink(target, n2)
    # n003: our own file, but other bytes (tampered, or cut short by an interrupted sbcast)
    with open(n3, "wb") as fh:
        fh.write(evil)
    doc, err = _run(cluster)  # every node still checked: the refused ones got the bundle on stdin
    assert doc["transport"]["bundle"] == "sbcast"
    assert doc["transport"]["bundle_on_stdin"] == ["n001", "n002", "n003"]
    assert "n001 refused the broadcast probe bundle" in err and "owned by uid 65534, not %d" % os.getuid() in err
    assert "n002 refused the broadcast probe bundle" in err and "a symbolic link" in err
    assert "n003 refused the broadcast probe bundle" in err and "SHA-256 %s, expected %s (removed)" % (
        hashlib.sha256(evil).hexdigest()[:16], hashlib.sha256(blob).hexdigest()[:16]) in err
    assert not os.path.exists(marker)  # the wrong bytes were never imported
    assert os.stat(n1).st_uid == 65534 and os.path.islink(n2)  # someone else's: left alone
    assert not os.path.exists(n3)  # ours and wrong: removed, so the next sbcast can write it
    _run(cluster)
    with open(n3, "rb") as fh:
        assert fh.read() == blob


def test_stdin_fallback_when_sbcast_is_unavailable(cluster, tmp_path):
    bin_dir = tmp_path / "bin"  # the Slurm client without sbcast, first on PATH
    bin_dir.mkdir()
    for tool in ("srun", "salloc", "scontrol", "squeue", "scancel", "sinfo"):
        os.symlink("/usr/bin/" + tool, bin_dir / tool)
    env = dict(cluster.slurm.env(), PATH="%s:%s" % (bin_dir, "/usr/local/sbin:/usr/sbin:/sbin"))
    doc, err = _run(cluster, env)
    assert doc["transport"]["bundle"] == "stdin"
    assert "bundle on stdin to every node: sbcast not found on PATH" in err
    assert all(_bundles(cluster, node) == {} for node in cluster.nodes)


def test_without_sbcast_a_stopped_slurmd_is_named_from_the_launch_and_the_step_runs_again_without_it(cluster, tmp_path):
    """Where sbcast cannot tell (not installed here), srun's launch fails on n002 ("Communication connection
    failure"), which aborts the whole step: n002 FAILs and the step runs again on the other two."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "salloc", "scontrol", "squeue", "scancel", "sinfo"):
        os.symlink("/usr/bin/" + tool, bin_dir / tool)
    env = dict(cluster.slurm.env(), PATH="%s:%s" % (bin_dir, "/usr/local/sbin:/usr/sbin:/sbin"))
    cluster.slurm.stop_slurmd("n002")
    try:
        out = cluster.slurm.preflight(["check", "--slurm", "--nodelist", NODES, "--only", "ssh", "--json", "-"],
                                      env=env)
    finally:
        cluster.heal()
        _settle(cluster)
    doc = json.loads(out.stdout)
    ssh = {r["node"]: r for r in doc["results"]}
    assert ssh["n002"]["status"] == "fail" and "did not take the task launch: Communication connection failure" in \
        ssh["n002"]["message"], ssh["n002"]
    assert ssh["n001"]["status"] == ssh["n003"]["status"] == "pass"
    assert doc["transport"]["step_tasks"] == [3, 2], doc["transport"]


def _settle(cluster):
    """The aborted step's job stays COMPLETING on the node whose slurmd was dead and on the step's first node
    until slurmctld resends TERMINATE_JOB (60 s): an operator's DOWN then RESUME clears it at once."""
    s = cluster.slurm
    stuck = [n for n, st in s.states().items() if "comp" in st or "down" in st or "*" in st or n == "n002"]
    for name in stuck:
        s.run(["scontrol", "update", "nodename=%s" % name, "state=down", "reason=test: clear the completing job"])
        s.run(["scontrol", "update", "nodename=%s" % name, "state=resume"])
    s.wait_idle([n.name for n in cluster.nodes], 60)


def test_an_interrupted_run_leaves_only_the_bundle_which_the_next_run_reuses(cluster):
    """n003's python hangs; the run is interrupted while its step waits: the step and the job end, each
    node holds this version's bundle and nothing else of preflight's, and the next run sends nothing."""
    cluster.hang_commands("n003")
    try:
        proc = cluster.slurm.preflight(["check", "--slurm", "--nodelist", NODES, "--only", "ssh", "--timeout", "90"],
                                       popen=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        until = time.monotonic() + 60
        while not all(_bundles(cluster, n) for n in cluster.nodes) or not cluster.slurm.leftover_steps():
            assert proc.poll() is None and time.monotonic() < until, "no sbcast and step before the interrupt"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    finally:
        cluster.heal()
    until = time.monotonic() + 60
    while cluster.slurm.leftover_steps() or cluster.slurm.jobs():
        assert time.monotonic() < until, (cluster.slurm.leftover_steps(), cluster.slurm.jobs())
        time.sleep(0.2)
    name, _ = _the_bundle(cluster)
    assert all(list(_bundles(cluster, n)) == [name] for n in cluster.nodes)
    doc, err = _run(cluster)
    assert "(3 of 3 nodes had it already)" in err


def test_the_next_run_clears_what_an_interrupted_one_left(cluster):
    _run(cluster)
    name, blob = _the_bundle(cluster)
    uid = os.getuid()
    old = "preflight-%d-bundle-%s.zip" % (uid, "0" * 64)  # an older version, left by a run that was killed
    others = "preflight-65534-bundle-%s.zip" % ("0" * 64)  # another user's: not ours to remove
    for node in cluster.nodes:
        folder = cluster.slurm.shm(node)
        with open(os.path.join(folder, old), "wb") as fh:
            fh.write(b"old")
        with open(os.path.join(folder, others), "wb") as fh:
            fh.write(b"theirs")
        os.chown(os.path.join(folder, others), 65534, 65534)
    _run(cluster)
    for node in cluster.nodes:  # one version of ours per node: this run's
        assert sorted(_bundles(cluster, node)) == sorted([name, others]), node.name

"""The probe bundle kept on SSH nodes between runs (`?SHA256 LENGTH`, preflight.transport.bundle).

The bootstrap runs as on a node, in a mount namespace of its own whose /dev/shm is a test folder (mode
1777, as a real /dev/shm): what it finds there, what it asks for, what it saves, and what it refuses.
Then end to end over real sshd: the first run sends the zip, the second sends none.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time

import pytest

from preflight.transport import bundle
from tests.paths import REPO

PROBE = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 20, "deadline_s": 60}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root and unshare(1) for a private /dev/shm")


@pytest.fixture
def shm(tmp_path):
    folder = tmp_path / "shm"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def kept_name(uid: int = 0) -> str:
    return bundle.file_name(uid, bundle.digest())


def node(shm, send=None, read_only=False, timeout=60.0):
    """Run the bootstrap with `shm` on its /dev/shm; send `send` (default: the zip) when it asks.
    (lines it printed without the result frame, result or None, exit code, what was sent)"""
    mount = 'mount --bind "$1" /dev/shm' + (" && mount -o remount,ro,bind /dev/shm" if read_only else "")
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount + ' && shift && exec "$@"',
            "node", str(shm), sys.executable, "-c", bundle.BOOTSTRAP]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    reader = bundle.ResultReader()
    sent = b""
    out = b""
    try:
        proc.stdin.write(bundle.stdin_payload(PROBE, ask=True))
        proc.stdin.flush()
        end = time.monotonic() + timeout
        while not reader.has_result() and time.monotonic() < end:
            # the fd itself, not a buffered readline: two lines that arrive together must both be seen
            if not select.select([proc.stdout], [], [], 0.5)[0]:
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            reader.feed(data)
            out += data
            if reader.wants_bundle is not None and not sent:
                sent = bundle.base_zip() if send is None else send
                proc.stdin.write(sent)
                proc.stdin.flush()
        rc = proc.wait(timeout=30)  # stdin stays open until then: its EOF would make the watchdog kill it
        lines = [line for line in out.decode().splitlines() if not line.startswith(("preflight-result", "preflight-part"))]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
    return lines, reader.result, rc, sent


def asked(lines):
    return [line for line in lines if line.startswith("preflight-bundle-send ")]


def test_the_first_run_saves_the_zip_the_second_uses_it_and_is_sent_nothing(shm):
    lines, result, rc, sent = node(shm)
    path = shm / kept_name()
    assert asked(lines) == ["preflight-bundle-send /dev/shm/%s: No such file or directory" % kept_name()]
    assert rc == 0 and "ssh" in result["facts"] and sent == bundle.base_zip()
    assert path.read_bytes() == bundle.base_zip() and path.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(shm)) == [kept_name()]  # no temporary file left
    lines, result, rc, sent = node(shm)
    assert asked(lines) == [] and sent == b"" and rc == 0 and "ssh" in result["facts"]


def test_a_symlink_planted_at_the_name_is_not_followed_and_is_replaced(shm, tmp_path):
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me")
    os.symlink(precious, shm / kept_name())
    lines, result, rc, _ = node(shm)
    assert asked(lines) == ["preflight-bundle-send /dev/shm/%s: a symbolic link" % kept_name()]
    assert rc == 0 and "ssh" in result["facts"]
    assert precious.read_bytes() == b"keep me"  # never opened through the link, never written
    assert not (shm / kept_name()).is_symlink() and (shm / kept_name()).read_bytes() == bundle.base_zip()


def test_a_copy_with_a_wrong_digest_is_removed_and_written_whole(shm):
    (shm / kept_name()).write_bytes(bundle.base_zip()[:1000])  # an interrupted write
    (shm / kept_name()).chmod(0o600)
    lines, result, rc, _ = node(shm)
    (line,) = asked(lines)
    assert "SHA-256 " in line and "expected %s (removed)" % bundle.digest()[:16] in line
    assert rc == 0 and result is not None
    assert (shm / kept_name()).read_bytes() == bundle.base_zip()


def test_a_copy_others_could_have_written_is_not_used(shm):
    (shm / kept_name()).write_bytes(bundle.base_zip())
    (shm / kept_name()).chmod(0o666)
    lines, result, rc, _ = node(shm)
    assert asked(lines) == ["preflight-bundle-send /dev/shm/%s: writable by group or others (mode 666)" % kept_name()]
    assert rc == 0 and result is not None
    assert (shm / kept_name()).stat().st_mode & 0o777 == 0o600  # replaced by our own


def test_a_copy_owned_by_another_user_is_not_used(shm):
    (shm / kept_name()).write_bytes(bundle.base_zip())
    (shm / kept_name()).chmod(0o644)
    os.chown(shm / kept_name(), 12345, 12345)
    lines, result, rc, _ = node(shm)
    assert asked(lines) == ["preflight-bundle-send /dev/shm/%s: owned by uid 12345, not 0" % kept_name()]
    assert rc == 0 and result is not None


def test_a_read_only_dev_shm_runs_from_memory_and_says_why_it_kept_nothing(shm):
    lines, result, rc, _ = node(shm, read_only=True)
    assert asked(lines) and rc == 0 and "ssh" in result["facts"]
    assert "preflight-bundle-unsaved /dev/shm/%s: Read-only file system" % kept_name() in lines
    assert os.listdir(shm) == []


def test_a_zip_damaged_on_the_way_is_refused_and_never_run(shm):
    damaged = bytearray(bundle.base_zip())
    damaged[len(damaged) // 2] ^= 0xFF
    lines, result, rc, _ = node(shm, send=bytes(damaged))
    assert rc == 3 and result is None
    assert any(line.startswith("preflight-bundle-refused stdin: %d bytes with SHA-256 " % len(damaged)) for line in lines)
    assert os.listdir(shm) == []  # nothing saved


def test_the_users_older_versions_are_removed_other_users_files_stay(shm):
    older = shm / bundle.file_name(0, "0" * 64)
    older.write_bytes(b"an older preflight's bundle")
    theirs = shm / bundle.file_name(12345, "1" * 64)
    theirs.write_bytes(b"another user's")
    os.chown(theirs, 12345, 12345)
    lines, result, rc, _ = node(shm)
    assert rc == 0 and result is not None
    assert sorted(os.listdir(shm)) == sorted([kept_name(), theirs.name])


def test_the_reader_takes_the_ask_and_unsaved_lines_anywhere_in_a_line():
    reader = bundle.ResultReader()
    reader.feed(b"motd textpreflight-bundle-send /dev/shm/x: No such file or directory\n")
    reader.feed(b"preflight-bundle-unsaved /dev/shm/x: No space left on device\n")
    assert reader.wants_bundle == "/dev/shm/x: No such file or directory"
    assert reader.unsaved == "/dev/shm/x: No space left on device"
    assert not reader.has_result()


# --- end to end over sshd ------------------------------------------------------------------------------


def test_over_ssh_the_second_run_sends_no_bundle(sim_cluster):
    cluster = sim_cluster(2)
    inv = cluster.inventory()

    def run():
        proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh", "--json", "-",
                            "--no-progress"], cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)["transport"]

    assert run()["bundle"] == {"sent": 2, "kept": 0}
    for n in cluster.nodes:  # each node its own copy, in its own /dev/shm
        kept = os.path.join(n.shm_dir, kept_name())
        with open(kept, "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == bundle.digest()
    assert run()["bundle"] == {"sent": 0, "kept": 2}
    os.unlink(os.path.join(cluster.nodes[1].shm_dir, kept_name()))  # rebooted: /dev/shm is empty again
    assert run()["bundle"] == {"sent": 1, "kept": 1}
    assert cluster.leftover_processes() == {}

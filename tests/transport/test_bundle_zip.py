"""The bootstrap reads the bundle's zip itself (preflight.transport.bootstrap, _Zip), not through zipfile: the
same entries as zipfile gives, stored or deflated, and a damaged entry or a truncated archive refused with a
named error, never run. The real bootstrap, fed as the transports feed it (a bundle on stdin)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import zipfile

import pytest

from preflight.transport import bundle

CONFIG = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 60, "deadline_s": 60}


def run_bootstrap(blob: bytes):
    """(rc, stdout, stderr) of `python3 -S -c BOOTSTRAP` fed CONFIG and `blob` as the bundle."""
    payload = json.dumps(CONFIG).encode() + b"\n" + str(len(blob)).encode() + b"\n" + blob
    # stdin stays open until the process has exited: its EOF before a result would be the controller gone (the
    # bootstrap's watchdog kills its group)
    proc = subprocess.Popen(bundle.bootstrap_argv(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        out, err = proc.stdout.read(), proc.stderr.read()
        rc = proc.wait(timeout=120)
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return rc, out.decode(errors="replace"), err.decode(errors="replace")


def restored(compression: int, bytecode: bool = True) -> bytes:
    """The bundle's entries written again by zipfile with `compression` (without bytecode/: the sources only, as
    a node whose Python has another magic number runs them)."""
    src = zipfile.ZipFile(io.BytesIO(bundle.base_zip()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as out:
        for name in src.namelist():
            if bytecode or not name.startswith("bytecode/"):
                out.writestr(name, src.read(name))
    return buf.getvalue()


def result_of(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("preflight-result "))
    return bundle.parse_output(line.encode() + b"\n")["result"]


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED], ids=["deflated", "stored"])
@pytest.mark.parametrize("bytecode", [True, False], ids=["bytecode", "sources"])
def test_the_bundle_runs_from_either_kind_of_entry(compression, bytecode):
    rc, out, err = run_bootstrap(restored(compression, bytecode))
    assert rc == 0, err
    assert set(result_of(out)["facts"]) == {"ssh"}, out


def test_a_damaged_entry_is_refused_by_its_crc_and_nothing_runs():
    blob = bytearray(restored(zipfile.ZIP_STORED, bytecode=False))
    # preflight/probe/runner.py's source (after its local header's name), stored and compiled on the node:
    # unchecked, the damage would be a SyntaxError, or worse, code that runs
    at = blob.index(b"def main(", blob.index(b"preflight/probe/runner.py"))
    blob[at:at + 3] = b"DEF"
    rc, out, err = run_bootstrap(bytes(blob))
    assert rc != 0 and "preflight-result" not in out, out
    assert "CRC mismatch" in err and "preflight/probe/runner.py" in err, err[-2000:]


def test_a_truncated_bundle_is_refused_with_its_size():
    blob = bundle.base_zip()
    rc, out, err = run_bootstrap(blob[:-100])
    assert rc != 0 and "preflight-result" not in out, out
    assert "bundle: no zip end record (%d bytes)" % (len(blob) - 100) in err, err[-2000:]

"""Framed results (bundle.py's output format): what a node printed is read back whole, or found damaged.

The node output here is the real bootstrap's, running the real xid probe with capture on a multi-MB kernel
log (journalctl on PATH), so the result is a few MB of JSON. Then the stream is damaged the ways srun and
shells damage it: lines split (srun cuts lines past its 1024-byte buffer and labels each piece), lines
joined, lines repeated, foreign lines in between, bytes lost or changed. Whatever is repairable gives the
same document; the rest is named as damage, never a wrong document and never a crash.
"""

from __future__ import annotations

import base64
import os
import random
import signal
import subprocess
import sys

import pytest

from preflight.transport import bundle


def kernel_log(size: int, seed: int = 7) -> str:
    """A journalctl -k -o short-monotonic text of about `size` bytes whose messages do not compress (random base64)."""
    rng = random.Random(seed)
    lines, total, ts = [], 0, 1.0
    while total < size:
        ts += rng.random()
        line = "[%12.6f] node07 kernel: usb 1-1: serial %s\n" % (ts, base64.b64encode(rng.getrandbits(576).to_bytes(72, "little")).decode())
        lines.append(line)
        total += len(line)
    return "".join(lines)


def node_stdout(tmp_path, size: int, line_max=None) -> tuple:
    """(stdout of the real bootstrap, the kernel log it captured) on a node with the NVIDIA driver loaded."""
    text = kernel_log(size)
    (tmp_path / "klog").write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "journalctl").write_text("#!/bin/sh\nexec cat %s\n" % (tmp_path / "klog"))
    os.chmod(str(bindir / "journalctl"), 0o755)
    config = {"mode": "probe", "checks": {"xid": {}}, "probe_timeout_s": 60, "deadline_s": 120, "capture": True}
    if line_max:
        config["line_max"] = line_max
    (tmp_path / "sys" / "module" / "nvidia").mkdir(parents=True, exist_ok=True)  # the driver is loaded
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), PREFLIGHT_SYSFS_ROOT=str(tmp_path / "sys"))
    # its own session, and stdin open until the output ends: the bootstrap's watchdog kills its whole
    # process group when stdin closes
    proc = subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        proc.stdin.write(bundle.stdin_payload(config))
        proc.stdin.flush()
        stdout = proc.stdout.read()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return stdout, text


def captured_log(result: dict) -> str:
    events = result["capture"]["xid"]["events"]
    return next(e["stdout"] for e in events if e["kind"] == "run" and e["argv"][0] == "journalctl")


def read(stream: bytes, seed: int = 1) -> bundle.ResultReader:
    """Fed in random chunks, as reads from a socket or pipe come."""
    rng = random.Random(seed)
    reader = bundle.ResultReader()
    at = 0
    while at < len(stream):
        step = rng.choice((1, 7, 900, 4096, 65536))
        reader.feed(stream[at:at + step])
        at += step
    return reader


@pytest.fixture(scope="module")
def framed(tmp_path_factory):
    """A 3 MB result cut into 900-character frames (the Slurm transport's line_max)."""
    return node_stdout(tmp_path_factory.mktemp("framed"), 3_000_000, line_max=900)


def lines_of(stream: bytes) -> list:
    return stream.split(b"\n")[:-1]


def test_a_multi_mb_result_reads_back_whole_in_any_chunks(framed):
    stream, text = framed
    frames = [l for l in lines_of(stream) if l.startswith(b"preflight-part ")]
    assert len(frames) > 100 and all(len(l) < 1024 for l in lines_of(stream))  # srun's line limit holds
    for seed in (1, 2):
        reader = read(stream, seed)
        assert reader.has_result() and reader.damage is None
        assert captured_log(reader.result) == text.rstrip("\n") or captured_log(reader.result) == text
    assert bundle.parse_output(stream)["result"] == reader.result


def test_one_line_over_ssh_reads_back_whole(tmp_path):
    stream, text = node_stdout(tmp_path, 1_000_000)
    assert sum(1 for l in lines_of(stream) if b"preflight-result " in l) == 1
    assert not any(b"preflight-part " in l for l in lines_of(stream))
    reader = read(stream)
    assert reader.damage is None and captured_log(reader.result).startswith(text[:1000])


def split_like_srun(stream: bytes, every: int, label: bytes = b"") -> bytes:
    """Every line longer than `every` bytes cut into pieces of `every` bytes, one line each (srun's cut)."""
    out = []
    for line in lines_of(stream):
        out.extend(line[i:i + every] for i in range(0, max(1, len(line)), every))
    return b"".join(label + l + b"\n" for l in out)


def test_split_lines_are_put_back_together(framed):
    stream, text = framed
    for every in (1024, 300, 64):  # srun cuts at 1024 bytes; a frame header (< 64) is never cut
        reader = read(split_like_srun(stream, every))
        assert reader.damage is None and reader.has_result(), every
        assert captured_log(reader.result).startswith(text[:1000])


def test_joined_repeated_and_foreign_lines_are_tolerated(framed):
    stream, _ = framed
    lines = lines_of(stream)
    rng = random.Random(3)
    out = []
    for i, line in enumerate(lines):
        if line.startswith(b"preflight-part ") and rng.random() < 0.05:
            out.append(line)  # repeated: the second copy replaces the first, same text
        if line.startswith(b"preflight-part ") and rng.random() < 0.05 and out and out[-1].startswith(b"preflight-part "):
            out[-1] += line  # joined to the line before (its newline lost)
            continue
        if rng.random() < 0.01:
            out.append(b"srun: Job step 12.0 is still running (a line that is not ours)")
        out.append(line)
    reader = read(b"\n".join(out) + b"\n")
    assert reader.damage is None
    assert reader.result == bundle.parse_output(stream)["result"]


def test_lost_or_changed_frames_are_named_never_a_wrong_document(framed):
    stream, _ = framed
    lines = lines_of(stream)
    parts = [i for i, l in enumerate(lines) if l.startswith(b"preflight-part ")]
    lost = b"\n".join(l for i, l in enumerate(lines) if i != parts[40]) + b"\n"
    reader = read(lost)
    run = reader.finish(0, 0.0, 0.0)
    assert run.result is None and "lost in transit: 40 of" in run.damage

    changed = list(lines)
    victim = changed[parts[7]]
    changed[parts[7]] = victim[:-5] + (b"A" if victim[-5:-4] != b"A" else b"B") + victim[-4:]
    reader = read(b"\n".join(changed) + b"\n")
    assert reader.has_result() and reader.result is None and "CRC32" in reader.damage

    cut = stream[: len(stream) - 200]  # the connection dropped inside the last frame
    run = read(cut).finish(None, 0.0, 0.0)
    assert run.result is None and not read(cut).has_result()


def test_plain_document_line_and_protocol_lines_anywhere():
    out = b"motdpreflight-pid 12\nWelcomepreflight-clock 5.5\npreflight-result {\"facts\": {\"ssh\": {}}}\n"
    reader = read(out)
    assert (reader.pid, reader.clock, reader.result) == (12, 5.5, {"facts": {"ssh": {}}})

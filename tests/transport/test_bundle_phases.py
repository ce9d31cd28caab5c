"""One node process for every phase (the Slurm transport's single step): the bootstrap runs a config
that says `more`, then waits on stdin for the next phase's config, picks its own entry of a broadcast
by SLURMD_NODENAME, and exits at once when it is not named (or when stdin closes)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from preflight.transport import bundle

PROBE = {"mode": "probe", "checks": {"ssh": {}}, "probe_timeout_s": 20, "deadline_s": 60}


def start(node: str) -> subprocess.Popen:
    # its own session: the bootstrap's watchdog kills its whole process group when stdin closes
    return subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=dict(os.environ, SLURMD_NODENAME=node))


def next_result(proc: subprocess.Popen, timeout: float = 60.0) -> dict:
    """The next result the process prints. Read from the fd, not with a buffered readline after select():
    two lines that arrive together (the clock line and a quick result) would leave the second in Python's
    buffer, where select() never sees it."""
    end = time.monotonic() + timeout
    reader = bundle.ResultReader()
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        data = os.read(proc.stdout.fileno(), 65536)
        assert data, "the bootstrap exited before its result: %s" % proc.stderr.read().decode()[-2000:]
        reader.feed(data)
        if reader.has_result():
            assert reader.result is not None, reader.damage
            return reader.result
    raise AssertionError("no result within %g s" % timeout)


def test_broadcast_config_shares_one_entry_per_distinct_config():
    by_node = {"n001": dict(PROBE), "n002": dict(PROBE), "n003": dict(PROBE, probe_timeout_s=5)}
    doc = bundle.broadcast_config(by_node)
    assert sorted(map(tuple, (g[0] for g in doc["groups"]))) == [("n001", "n002"), ("n003",)]
    assert {n: c for names, c in doc["groups"] for n in names} == by_node


def test_two_phases_in_one_process_then_exit_when_not_named():
    proc = start("n002")
    try:
        first = bundle.broadcast_config({"n001": PROBE, "n002": dict(PROBE, more=True)})
        proc.stdin.write(bundle.stdin_payload(first))
        proc.stdin.flush()
        one = next_result(proc)
        assert "ssh" in one["facts"] and "probe_error" not in one["facts"]["ssh"]
        # phase 2: a config line only, no zip (the modules are loaded); n002 runs it and stops there
        second = bundle.broadcast_config({"n002": dict(PROBE, checks={"ssh": {}, "gpu": {}})})
        proc.stdin.write(json.dumps(second).encode() + b"\n")
        proc.stdin.flush()
        two = next_result(proc)
        assert set(two["facts"]) == {"ssh", "gpu"}
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_waiting_process_exits_0_on_an_empty_broadcast_and_dies_on_eof():
    waiting = start("n001")
    dropped = start("n001")
    try:
        for proc in (waiting, dropped):
            proc.stdin.write(bundle.stdin_payload(bundle.broadcast_config({"n001": dict(PROBE, more=True)})))
            proc.stdin.flush()
            next_result(proc)
        waiting.stdin.write(b'{"groups":[]}\n')  # what SlurmFleet sends when no next phase comes
        waiting.stdin.flush()
        assert waiting.wait(timeout=10) == 0
        dropped.stdin.close()  # the controller went away: the watchdog kills the process group
        assert dropped.wait(timeout=10) in (-9, 137)  # SIGKILL of its own group, or _exit(137)
    finally:
        for proc in (waiting, dropped):
            proc.kill()
            proc.wait()


def test_a_long_broadcast_travels_deflated_and_each_node_still_picks_its_own():
    """Phase 2's configs differ per node (ping targets): 64 of them would be 33 KB to every node."""
    by_node = {"n%03d" % i: dict(PROBE, checks={"ssh": {}}, peer="198.18.0.%d" % i, more=(i == 7))
               for i in range(1, 65)}
    doc = bundle.broadcast_config(by_node)
    plain = len(json.dumps({"groups": [[[n], c] for n, c in by_node.items()]}))
    assert set(doc) == {"z"} and len(doc["z"]) < plain / 4, (len(doc["z"]), plain)
    proc = start("n007")
    try:
        proc.stdin.write(bundle.stdin_payload(doc))
        proc.stdin.flush()
        assert "ssh" in next_result(proc)["facts"]  # n007's config (it says more: it waits)
        proc.stdin.write(json.dumps(bundle.broadcast_config({"n%03d" % i: PROBE for i in range(1, 200) if i != 7})).encode() + b"\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == 0  # not named in the next broadcast: exits
    finally:
        proc.kill()
        proc.wait()

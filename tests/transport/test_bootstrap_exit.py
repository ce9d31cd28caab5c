"""The node process ends when its run does, also when the run raises: SIGTERM during the all-reduce (the
bench agent stops its ranks, then raises SystemExit 143) ends the bootstrap with 143 at once, whatever its
deadline timer says. Slurm sends that SIGTERM to every task of a job it preempts; the process used to wait
for the timer thread (here 600 s), keeping its srun and the preflight waiting on it alive until Slurm's
KillWait SIGKILL, which took preflight's report with it (tests/actions/test_slurm_requeue.py)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import time

import pytest

from preflight.transport import bundle
from tests.probe.test_bench_agent import config, free_port, our_ranks
from tests.transport.test_bundle_phases import start

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the bench needs torch")


def test_sigterm_during_the_all_reduce_ends_the_node_process_with_143_and_no_rank_left():
    proc = start("n001")
    try:
        # three ranks, two of them here: they wait at the rendezvous for a third that never comes
        run = {"mode": "bench", "bench": config(free_port(), 3, local=2, init_s=300), "deadline_s": 600}
        proc.stdin.write(bundle.stdin_payload(run))
        proc.stdin.flush()
        until = time.monotonic() + 120
        while len(our_ranks(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < until:
            time.sleep(0.2)
        assert len(our_ranks(proc.pid)) == 2, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no ranks"
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=90)  # the agent's kill grace is 1 s; the deadline timer would be 600 s
        except subprocess.TimeoutExpired:
            raise AssertionError("the node process outlived its run (waiting for its deadline timer)") from None
        assert code == 128 + signal.SIGTERM, proc.stderr.read().decode()[-2000:]
        assert b"Fatal Python error" not in proc.stderr.read()
        assert our_ranks(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()

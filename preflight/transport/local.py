"""Run the probe bundle on this machine as a local process: LocalSession, the contract's Session for `local: true`.

The same wire protocol as over SSH (bundle.py), in a process group of its own that a deadline or Ctrl-C kills.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Optional

from preflight.inventory import NodeSpec
from preflight.transport import bundle
from preflight.transport.contract import NodeFailure, RunResult, Session

log = logging.getLogger(__name__)


class LocalSession(Session):
    """Runs the bundle on this machine with the same protocol, in its own process group."""

    #: how long a process whose result arrived may take to exit (a thread stuck in an uninterruptible
    #: driver call keeps it alive: its result counts, then its group is killed), as over SSH
    DRAIN_S = 2.0

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self._proc: Optional[subprocess.Popen] = None

    def open(self) -> None:
        return None

    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:
        started = time.monotonic()
        python = self.spec.python or sys.executable
        payload = bundle.stdin_payload(dict(config, deadline_s=deadline_s + 5))  # before the process starts
        sent_at = time.time()
        try:
            proc = subprocess.Popen(
                bundle.bootstrap_argv(python),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise NodeFailure("protocol", "cannot start %s: %s" % (python, exc.strerror)) from None
        self._proc = proc
        run = bundle.ResultReader()
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(payload)
        proc.stdin.flush()
        streams = {proc.stdout.fileno(): run.feed, proc.stderr.fileno(): run.err.extend}
        end = started + deadline_s
        result_at: Optional[float] = None
        try:
            while streams:
                if result_at is None and run.has_result():  # answered: from here it has DRAIN_S to exit
                    result_at = time.monotonic()
                    end = min(end, result_at + self.DRAIN_S)
                remaining = end - time.monotonic()
                if remaining <= 0 and result_at is not None:
                    log.warning("result received, but process %d has not exited %g s later (a thread stuck in "
                                "the kernel?); killing its process group", proc.pid, self.DRAIN_S)
                    self._killpg(proc, wait_s=self.DRAIN_S)
                    return run.finish(proc.poll(), sent_at, started)
                if remaining <= 0:
                    self._killpg(proc)
                    raise NodeFailure("timeout", "timed out: no answer within %g s; killed the process group" % deadline_s)
                ready, _, _ = select.select(list(streams), [], [], min(remaining, 1.0))
                for fd in ready:
                    data = os.read(fd, 65536)
                    if data:
                        streams[fd](data)
                    else:
                        del streams[fd]
            rc = proc.wait(max(0.1, end - time.monotonic())) if result_at is not None else proc.wait()
        except subprocess.TimeoutExpired:  # its output closed, yet it does not exit: its result counts
            self._killpg(proc, wait_s=self.DRAIN_S)
            rc = proc.poll()
        finally:
            self._proc = None
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        return run.finish(rc, sent_at, started)

    @staticmethod
    def _killpg(proc: subprocess.Popen, wait_s: Optional[float] = None) -> None:
        """SIGKILL the process group; wait for the process (at most wait_s: one stuck in the kernel never ends)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            log.warning("process %d did not end %g s after SIGKILL (stuck in the kernel); left to the kernel", proc.pid, wait_s)

    def cancel(self) -> None:
        proc = self._proc
        if proc is not None:
            self._killpg(proc)

    def close(self) -> None:
        return None

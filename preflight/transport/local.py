"""Run the probe bundle on this machine as a local process: LocalSession, the contract's Session for `local: true`.

The same wire protocol as over SSH (bundle.py), in a process group of its own that a deadline or Ctrl-C kills.
"""

from __future__ import annotations

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


class LocalSession(Session):
    """Runs the bundle on this machine with the same protocol, in its own process group."""

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
                [python, "-c", bundle.BOOTSTRAP],
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
        try:
            while streams:
                remaining = end - time.monotonic()
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
            rc = proc.wait()
        finally:
            self._proc = None
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        return run.finish(rc, sent_at, started)

    @staticmethod
    def _killpg(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait()

    def cancel(self) -> None:
        proc = self._proc
        if proc is not None:
            self._killpg(proc)

    def close(self) -> None:
        return None

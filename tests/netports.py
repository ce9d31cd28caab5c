"""TCP ports for tests that run a listener (a rendezvous store, the ports check's, Prometheus and its node exporter)
in this machine's own network namespace, where the pytest-xdist workers run side by side.

`bind(("127.0.0.1", 0))` then close hands out a port from the kernel's ephemeral range, which every worker's
tests draw from at once: two workers were handed the same number, and the second agent found the first one's
claim on it ("preflight ... holds the rendezvous port N": the bench returned no ranks, a test failed under the
suite's load with nothing wrong in the product). Here each worker draws from a block of its own, below the
ephemeral range (ip_local_port_range), which the kernel never hands out by itself: no other worker and no
outgoing connection takes a port from it. A port still bound here (a listener, a TIME_WAIT) is skipped.
"""

from __future__ import annotations

import itertools
import os
import socket

#: the first block's first port, and each worker's block size (gw0 BASE.., gw1 BASE+BLOCK.., ...)
BASE = 21000
BLOCK = 500
_next = itertools.count()


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gwN; unset without xdist
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free on 127.0.0.1 now, that no other worker of this test run is handed."""
    low = BASE + _worker_index() * BLOCK
    if low + BLOCK > _ephemeral_low():  # no room below the ephemeral range (a machine that moved it): the kernel's
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(BLOCK):
        port = low + next(_next) % BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT is skipped too
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in %d..%d" % (low, low + BLOCK - 1))

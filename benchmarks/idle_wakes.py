#!/usr/bin/env python3
"""What an idle SSH connection costs the controller: one reader thread per connection, woken by its
socket's timeout while nothing arrives, as paramiko's Transport thread is (Packetizer.read_all catches
socket.timeout and loops; the timeout is Transport._active_check_timeout, 0.1 s).

N socket pairs, one thread per pair blocked in recv() with the given timeout, for T seconds; prints the
process's CPU (getrusage) and the CPU per wake, at paramiko's 0.1 s and at preflight's
transport.ssh.READER_WAKE_S, side by side:

    python3 benchmarks/idle_wakes.py                 # 256 connections, 10 s each
    python3 benchmarks/idle_wakes.py --nodes 1000 --seconds 5

No root, no network: socketpair() only. A model of paramiko's loop (its wake also checks the handshake
deadline and keepalive: real wakes cost a little more), not a run of it.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def idle(nodes: int, seconds: float, timeout: float) -> float:
    """CPU seconds `nodes` idle reader threads with this recv timeout use in `seconds`."""
    stop = threading.Event()

    def reader(sock: socket.socket) -> None:
        sock.settimeout(timeout)
        while not stop.is_set():
            try:
                sock.recv(16)
            except socket.timeout:
                pass

    pairs = [socket.socketpair() for _ in range(nodes)]
    threads = [threading.Thread(target=reader, args=(a,), daemon=True) for a, _ in pairs]
    before = resource.getrusage(resource.RUSAGE_SELF)
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    after = resource.getrusage(resource.RUSAGE_SELF)
    for a, b in pairs:
        a.close()
        b.close()
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    from preflight.transport.ssh import READER_WAKE_S

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    print("idle connections: %d, %.0f s each, load %.1f" % (args.nodes, args.seconds, os.getloadavg()[0]))
    print("| reader wake | CPU s | CPU s per second of run | us per wake | ms per node per 10 s |")
    print("|---|---|---|---|---|")
    for timeout in (0.1, READER_WAKE_S):
        cpu = idle(args.nodes, args.seconds, timeout)
        wakes = args.nodes * args.seconds / timeout
        print("| %.1f s | %.2f | %.3f | %.1f | %.2f |" % (
            timeout, cpu, cpu / args.seconds, 1e6 * cpu / wakes, 1e3 * cpu / args.nodes * 10 / args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Controller CPU of one SSH session, step by step: what each node costs the controller over SSH.

Starts a small simulated cluster (tests/sim: one real sshd per node) and, in this process (inside the
controller's network namespace), drives preflight's own SSHSession through one node's whole life,
sequentially, many times: open (fabric's objects, TCP, key exchange, host key check, public-key
auth), run the bundle for phase 1 (`--only ssh`'s probe; new channel, bundle sent) keeping
the process, run phase 2 on the kept process (one config line), close. Each step's CPU is the
process's CPU (time.process_time: every thread, paramiko's reader thread included) over the step; the
nodes' CPU is not counted. Medians over the sessions, in ms.

    sudo python3 benchmarks/ssh_session_cost.py                        # 4 nodes, 40 sessions
    sudo python3 benchmarks/ssh_session_cost.py --sessions 80 --cipher aes128-ctr --cipher aes128-gcm@openssh.com
    sudo python3 benchmarks/ssh_session_cost.py --tree /tmp/pf-base        # another checkout's preflight

--cipher (repeatable) offers that cipher first (in place of transport.ssh.PREFERRED_CIPHERS, paramiko's
own order after it), interleaved session by session, to compare their CPU on the same box at the same
time. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

STEPS = ("open", "phase1", "phase2", "close")
DEFAULT_PREFERRED = ()  # preflight's own order, read at start
NEGOTIATED: Dict[Optional[str], str] = {}  # the cipher each variant's connections got


def one_session(spec, config1, config2, cipher: Optional[str]) -> Dict[str, float]:
    from preflight.transport import ssh

    cpu: Dict[str, float] = {}
    t = time.process_time()

    def lap(step: str) -> None:
        nonlocal t
        now = time.process_time()
        cpu[step] = (now - t) * 1000.0
        t = now

    _prefer(cipher)
    session = ssh.SSHSession(spec)
    session.open()
    lap("open")
    NEGOTIATED[cipher] = session.conn.transport.local_cipher
    run = session.run_bundle(config1, 30.0, then=True)
    assert run.result is not None, run.stderr
    lap("phase1")
    run = session.run_bundle(config2, 30.0)
    assert run.result is not None, run.stderr
    lap("phase2")
    session.close()
    lap("close")
    return cpu


def _prefer(cipher: Optional[str]) -> None:
    """Offer `cipher` first (before paramiko's own order) on the connections opened from now on."""
    from preflight.transport import ssh

    ssh.PREFERRED_CIPHERS = (cipher,) if cipher else DEFAULT_PREFERRED


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--sessions", type=int, default=40, help="sessions per variant (default 40)")
    p.add_argument("--cipher", action="append", default=[], help="compare ciphers offered first (repeatable)")
    p.add_argument("--tree", metavar="DIR", help="time the preflight package of another checkout (say the tree "
                   "before a change; run the two alternately: one process holds one preflight)")
    args = p.parse_args(argv)
    if args.tree:
        sys.path.insert(0, os.path.abspath(args.tree))
    if os.geteuid() != 0:
        p.error("needs root (network namespaces)")
    from preflight import inventory
    from tests.sim.cluster import SimCluster

    from preflight.transport import ssh

    global DEFAULT_PREFERRED
    DEFAULT_PREFERRED = getattr(ssh, "PREFERRED_CIPHERS", ())  # () in a tree before it: paramiko's order
    variants = args.cipher or [None]
    rows: Dict[Optional[str], List[Dict[str, float]]] = {v: [] for v in variants}
    with SimCluster(args.nodes) as cluster:
        inv = inventory.load(cluster.inventory())
        specs = inv.nodes
        node = {"gpus_per_node": 0, "data_interface": None}
        config1 = {"mode": "probe", "checks": {"ssh": {"node": node}}, "probe_timeout_s": 28.0}
        config2 = dict(config1)
        with cluster.in_ctl():
            for i in range(2):  # warm-up: imports, the bundle's first build, page cache
                one_session(specs[i % len(specs)], config1, config2, None)
            for i in range(args.sessions):
                for v in variants:
                    rows[v].append(one_session(specs[i % len(specs)], config1, config2, v))
    import preflight

    print("controller CPU per SSH session, ms (median of %d; load %.1f; %s)" % (
        args.sessions, os.getloadavg()[0], os.path.dirname(os.path.dirname(preflight.__file__))))
    print("| offered first | negotiated | %s | total |" % " | ".join(STEPS))
    print("|---" * (len(STEPS) + 3) + "|")
    for v, sessions in rows.items():
        med = [statistics.median(s[k] for s in sessions) for k in STEPS]
        total = statistics.median(sum(s.values()) for s in sessions)
        print("| %s | %s | %s | %.2f |" % (v or "default", NEGOTIATED.get(v), " | ".join("%.2f" % m for m in med), total))
    return 0


if __name__ == "__main__":
    sys.exit(main())

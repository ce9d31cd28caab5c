#!/usr/bin/env python3
"""What the second catalogue costs: the node checks' time before and after, side by side in one run.

One SimCluster (network namespaces, a real sshd per node; every node given two simulated NDR HCAs, so
ib_errors really reads its counters twice, 1 s apart, and a shared path for storage), then, interleaved
--repeat times from the controller namespace:

    before   preflight check INV --only ssh,gpu,driver,fabric_manager,nic,ib_hca,mtu,ports
    after    preflight check INV --skip allreduce      (the same plus every newer node check)

Reported: the median wall time of the whole command and the engine's phase 1 / phase 2 times from the
JSON report, with the after/before ratio. The nodes share this machine's cores: read the ratio.

    sudo python3 benchmarks/node_checks_cost.py --nodes 32 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.sim import ib_hw  # noqa: E402
from tests.sim.cluster import SimCluster  # noqa: E402

BEFORE = "ssh,gpu,driver,fabric_manager,nic,ib_hca,mtu,ports"


def run(cluster, inv, args):
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--no-progress", "--json", "-"] + args,
                       timeout=600)
    wall = time.monotonic() - t0
    doc = json.loads(proc.stdout)
    phases = doc.get("phase_times_s") or {}
    return wall, phases.get("phase1_s", 0.0), phases.get("phase2_s", 0.0), sorted({r["check"] for r in doc["results"]})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with SimCluster(a.nodes) as cluster:
        shared = os.path.join(cluster.root, "shared")
        os.makedirs(shared)
        for node in cluster.nodes:
            ib_hw.install_hcas(node, [{}, {}])
        inv = cluster.inventory(shared_paths=[shared])
        rows = {"before": [], "after": []}
        checks = {}
        run(cluster, inv, ["--only", BEFORE])  # warm-up
        for _ in range(a.repeat):
            for name, args in (("before", ["--only", BEFORE]), ("after", ["--skip", "allreduce"])):
                wall, p1, p2, checks[name] = run(cluster, inv, args)
                rows[name].append((wall, p1, p2))
    load = os.getloadavg()[0]
    print("node checks at %d nodes, median of %d interleaved runs (1-min load %.1f)" % (a.nodes, a.repeat, load))
    print("| run | checks | wall s | phase 1 s | phase 2 s |")
    print("|---|---|---|---|---|")
    med = {}
    for name in ("before", "after"):
        med[name] = [statistics.median(x[i] for x in rows[name]) for i in range(3)]
        print("| %s | %s | %.2f | %.2f | %.2f |" % (name, ", ".join(checks[name]), *med[name]))
    print("after/before: wall %.2f×, phase 1 %.2f×, phase 2 %.2f×" % tuple(
        med["after"][i] / med["before"][i] if med["before"][i] else float("nan") for i in range(3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Start-up cost of a preflight command: median CPU (user+sys, from os.wait4) and wall of
`python3 -m preflight ARGS` over N runs, several trees interleaved in the same rounds.

    python3 benchmarks/startup_cpu.py 11 "node --only ssh" /tmp/pf-base .      # a copy of main against this tree
    python3 benchmarks/startup_cpu.py 7 "--help" .

Each tree runs with PYTHONPATH=<tree>. Byte-compile the trees first (`python3 -m compileall -q DIR/preflight`)
to measure what a pip install runs; without .pyc files every run also compiles the modules it imports.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def main() -> int:
    if len(sys.argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    runs, args, trees = int(sys.argv[1]), sys.argv[2].split(), [os.path.abspath(t) for t in sys.argv[3:]]
    cpu = {t: [] for t in trees}
    wall = {t: [] for t in trees}
    for _ in range(runs):
        for tree in trees:
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "preflight"] + args, cwd=tree, env=dict(os.environ, PYTHONPATH=tree),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, _, usage = os.wait4(proc.pid, 0)
            cpu[tree].append(1000 * (usage.ru_utime + usage.ru_stime))
            wall[tree].append(1000 * (time.monotonic() - t0))
    for tree in trees:
        print("%-30s %-20s CPU %4.0f ms  wall %5.0f ms  (median of %d)" % (
            tree, " ".join(args), statistics.median(cpu[tree]), statistics.median(wall[tree]), runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

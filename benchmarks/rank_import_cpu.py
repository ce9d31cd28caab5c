#!/usr/bin/env python3
"""CPU and threads of a rank's torch import: `import torch` as is against bench_worker._import_torch (numpy kept
out, issue 38), each in a fresh interpreter, alternating, on this machine's torch.

    python3 benchmarks/rank_import_cpu.py                 # 12 runs each
    python3 benchmarks/rank_import_cpu.py --runs 30 --backend gloo
    python3 benchmarks/rank_import_cpu.py --runs 16 --before /tmp/base     # a tree's rank beside this one's
    python3 benchmarks/rank_import_cpu.py --runs 2 --concurrent 64 --at-once 2   # 64 ranks on one host's cores

Each run: `python3 -c CODE` imports torch and torch.distributed (plain) or runs this checkout's
preflight/probe/bench_worker.py's _import_torch (rank), prints its thread count right after, and exits with
os._exit (as a rank ends: the interpreter's teardown is not the import). --before TREE adds a third variant,
that tree's bench_worker.py's _import_torch ("before"), and prints rank / before. The CPU is the child's user + system
time (getrusage of the reaped child). Printed: median, mean and min of each, the rank's median over plain's, and
the threads (numpy's OpenBLAS starts its pool at load: one thread per CPU up to its build's limit, so this
figure grows with the machine's cores). --concurrent N starts N copies of each variant at once, as N ranks
sharing this machine's cores import (the simulator's nodes at scale), and prints each variant's wall to the
last exit and its CPU-s per import; --at-once K adds "rank@K": the rank's import, N copies again, but started
so that no more than K run at a time (a new one as one exits): what imports outnumbering the cores cost over
imports that do not. Needs torch; numpy installed is what the rank's guard is for (without
it both variants import the same).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "preflight", "probe", "bench_worker.py")

THREADS = "open('/proc/self/status').read().split('Threads:')[1].split()[0]"
PLAIN = "import os, sys\nimport torch, torch.distributed\nsys.stderr.write('THREADS %%s\\n' %% %s)\nos._exit(0)\n" % THREADS
RANK = (
    "import importlib.util, os, sys\n"
    "spec = importlib.util.spec_from_file_location('w', %r)\n"
    "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
    "w._take_stdout()\n"
    "w._import_torch(%r, 0)\n"
    "sys.stderr.write('THREADS %%s\\n' %% %s)\nos._exit(0)\n"
)


def batch(code: str, n: int, at_once: int) -> tuple:
    """n copies of code, no more than at_once running at a time (the next started as one exits): (seconds to
    the last exit, CPU-s per copy, threads of one). Each copy's stderr goes to a file of its own. One run of a
    variant is batch(code, 1, 1)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    running, finished = {}, []
    for i in range(n + at_once):
        while running and (len(running) >= at_once or i >= n):
            pid, status = os.wait()  # whichever copy ends first
            proc, err = running.pop(pid)
            proc.returncode = os.waitstatus_to_exitcode(status)
            finished.append((proc, err))
        if i < n:
            err = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err)
            running[proc.pid] = (proc, err)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    texts = []
    for proc, err in finished:
        err.seek(0)
        texts.append(err.read())
        err.close()
        if proc.returncode != 0:
            raise SystemExit("rank_import_cpu: a run failed: %s" % texts[-1].strip()[-400:])
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu / n, int(texts[0].split("THREADS ")[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12, help="runs of each variant (default 12)")
    ap.add_argument("--backend", default="gloo", help="the rank's backend (nccl makes a CUDA context: a GPU node)")
    ap.add_argument("--before", metavar="TREE", help="also run this tree's rank import (a checkout or git archive)")
    ap.add_argument("--concurrent", type=int, default=1, metavar="N", help="start N copies of each variant at once")
    ap.add_argument("--at-once", type=int, metavar="K", help="with --concurrent: add rank@K, the rank's N imports K at a time")
    args = ap.parse_args()
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("rank_import_cpu: torch is not installed here")
    variants = {"plain": PLAIN, "rank": RANK % (WORKER, args.backend, THREADS)}
    if args.before:
        worker = os.path.join(os.path.abspath(args.before), "preflight", "probe", "bench_worker.py")
        if not os.path.isfile(worker):
            raise SystemExit("rank_import_cpu: --before %s holds no preflight/probe/bench_worker.py" % args.before)
        variants["before"] = RANK % (worker, args.backend, THREADS)
    at_once = {k: args.concurrent for k in variants}
    if args.at_once and args.concurrent > 1:
        name = "rank@%d" % args.at_once
        variants[name], at_once[name] = variants["rank"], args.at_once
    cpu = {k: [] for k in variants}
    walls = {k: [] for k in variants}
    threads = {k: set() for k in variants}
    for i in range(args.runs):
        order = list(variants) if i % 2 == 0 else list(reversed(list(variants)))  # each variant first and last alike
        for name in order:
            wall, seconds, count = batch(variants[name], args.concurrent, at_once[name])
            if args.concurrent > 1:
                walls[name].append(wall)
            cpu[name].append(seconds)
            threads[name].add(count)
    print("numpy installed here: %s; CPUs: %d; load %.1f; %d runs each, alternating%s" % (
        importlib.util.find_spec("numpy") is not None, os.cpu_count() or 0, os.getloadavg()[0], args.runs,
        "; %d at once" % args.concurrent if args.concurrent > 1 else ""))
    for name, values in cpu.items():
        print("%-7s CPU-s median %.3f  mean %.3f  min %.3f  threads after import %s%s" % (
            name, statistics.median(values), statistics.mean(values), min(values), sorted(threads[name]),
            "  wall to the last median %.1f s (%s)" % (statistics.median(walls[name]), ", ".join("%.1f" % w for w in walls[name]))
            if walls[name] else ""))
    print("rank / plain (medians): %.3f" % (statistics.median(cpu["rank"]) / statistics.median(cpu["plain"])))
    if args.before:
        print("rank / before (medians): %.3f" % (statistics.median(cpu["rank"]) / statistics.median(cpu["before"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Could the CPU path name a slow node? One simulated node's ranks under a CPU quota, the others not,
N runs: how often the slow node's fp32 GEMM is more than 10% below the others' median, and how often a
healthy node's is (issue 36: "one node slowed by a real mechanism (a cgroup cpu.max quota)").

    python3 benchmarks/compute_cpu_quota.py [--runs 10] [--quota 0.5]

Three agents (gloo over 127.0.0.1) run at once with the standard tier's compute phase; the third
agent's thread joins a cgroup (v2 cpu.max, or v1 cpu.cfs_quota_us) before it starts its rank, so the
rank process (forked from that thread) inherits the quota. Needs root and a writable cgroup cpu
controller; the cgroup is removed at the end. gpu_compute judges CPU nodes on completion only: this
script shows whether a rate judgement would be reliable on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from compute_tier import _config, _free_port  # noqa: E402
from preflight.checks.allreduce import tiers  # noqa: E402
from preflight.probe import bench_agent  # noqa: E402


def make_cgroup(quota):
    """A cgroup limited to `quota` CPUs; (path, file a thread id is written to)."""
    v2 = "/sys/fs/cgroup/preflight-quota-bench"
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        os.makedirs(v2, exist_ok=True)
        with open(os.path.join(v2, "cpu.max"), "w") as fh:
            fh.write("%d 100000" % int(quota * 100000))
        return v2, "cgroup.threads"
    v1 = "/sys/fs/cgroup/cpu/preflight-quota-bench"
    os.makedirs(v1, exist_ok=True)
    with open(os.path.join(v1, "cpu.cfs_period_us"), "w") as fh:
        fh.write("100000")
    with open(os.path.join(v1, "cpu.cfs_quota_us"), "w") as fh:
        fh.write(str(int(quota * 100000)))
    return v1, "tasks"


def one_run(spec, cgroup):
    port = _free_port()
    docs = [None] * 3

    def agent(i):
        if i == 2:
            with open(os.path.join(cgroup[0], cgroup[1]), "w") as fh:
                fh.write(str(threading.get_native_id()))
        docs[i] = bench_agent.run(_config(port, 3, i, spec))

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [d["ranks"][0]["compute"]["gemm"]["fp32"] for d in docs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--quota", type=float, default=0.5, help="CPUs the slow node's ranks may use")
    args = ap.parse_args()
    spec = tiers.compute_spec("standard", "gloo")
    cgroup = make_cgroup(args.quota)
    named_slow = named_healthy = 0
    try:
        for run in range(args.runs):
            figs = one_run(spec, cgroup)
            best = [max(g["passes"]) for g in figs]
            low = [b < 0.9 * statistics.median(best) for b in best]
            named_slow += low[2]
            named_healthy += low[0] + low[1]
            print("run %d: TFLOPS (better pass) %s; below 90%% of the median: %s" % (
                run + 1, ", ".join("%.4f" % b for b in best), low))
    finally:
        os.rmdir(cgroup[0])
    print("quota %.2f CPU on node 3: named in %d of %d runs; a healthy node named %d of %d times" % (
        args.quota, named_slow, args.runs, named_healthy, 2 * args.runs))


if __name__ == "__main__":
    main()

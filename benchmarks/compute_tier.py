"""What the standard tier costs: its added wall time at 2 and 4 simulated nodes, the harness's overhead
beside torch run directly, and the modelled cost at 1,024 GPUs (issue 36, "Measure").

    python3 benchmarks/compute_tier.py                 # 2 and 4 nodes, 1 repeat each
    python3 benchmarks/compute_tier.py --nodes 2 --repeats 3 --json -

Simulated nodes: one preflight.probe.bench_agent per node on this machine (gloo over 127.0.0.1, real
rank processes that import torch), all at once, as the controller runs them; each measured with and
without the standard tier's compute phase (tiers.SPECS[("standard", "gloo")]), side by side in one run.
The added time is the difference of the two wall times (noisy on a shared machine: repeat and read the
spread). GEMM and copy: the ranks' own figures beside the same fp32 GEMM and copy timed here with torch
directly, one thread (the agent gives each rank OMP_NUM_THREADS=1). 1,024 GPUs: the all-reduce time plan
for 128 x 8 H100 (timeplan) plus tiers.compute_s("standard", "nccl"): the phase runs on every GPU at
once, so it adds one GPU's time whatever the node count. No GPU figure here is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from preflight.checks.allreduce import tiers, timeplan  # noqa: E402
from preflight.probe import bench_agent  # noqa: E402


def _config(port, world, rank, compute):
    cfg = {"backend": "gloo", "master_addr": "127.0.0.1", "master_port": port, "world_size": world,
           "node_rank": rank, "nnodes": world, "local_world_size": 1, "env": {"GLOO_SOCKET_IFNAME": "lo"},
           "sizes": [1024 << i for i in range(13)], "warmup": 2, "iters": 5,
           "deadlines": {"init_s": 120, "op_s": 60, "total_s": 400, "kill_grace_s": 2, "fail_grace_s": 5}}
    if compute:
        cfg["compute"] = compute
    return cfg


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(n, compute):
    """Wall seconds of one launch across n agents at once, and their documents."""
    port = _free_port()
    docs = [None] * n

    def one(i):
        docs[i] = bench_agent.run(_config(port, n, i, compute))

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    bad = [r for d in docs for r in d["ranks"] if r["status"] != "ok" or (compute and not r.get("compute"))]
    if bad:
        raise SystemExit("a rank failed: %s" % json.dumps(bad[0])[:500])
    return wall, docs


def direct(spec):
    """The same fp32 GEMM and copy, timed with torch directly in this process (one thread)."""
    import torch

    torch.set_num_threads(1)
    n = spec["gemm_n"]
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < spec["seconds"]:
        torch.matmul(a, b)
        iters += 1
    gemm = 2.0 * n ** 3 * iters / (time.perf_counter() - t0) / 1e12
    src = torch.ones(spec["copy_bytes"] // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return {"gemm_tflops": round(gemm, 4), "copy_gbps": round(2.0 * spec["copy_bytes"] / statistics.median(times) / 1e9, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    spec = tiers.compute_spec("standard", "gloo")
    out = {"spec": spec, "modelled_added_s": tiers.compute_s("standard", "gloo"), "nodes": {}}
    for n in args.nodes:
        quick, standard, ranks = [], [], []
        for _ in range(args.repeats):  # side by side: quick then standard, each repeat
            quick.append(run_nodes(n, None)[0])
            wall, docs = run_nodes(n, spec)
            standard.append(wall)
            ranks += [r["compute"] for d in docs for r in d["ranks"]]
        added = [s - q for q, s in zip(quick, standard)]
        phase = [c["wall_s"] for c in ranks]
        out["nodes"][n] = {"quick_s": quick, "standard_s": standard, "added_s": added, "phase_s": phase,
                           "rank_gemm_tflops": [c["gemm"]["fp32"]["tflops"] for c in ranks],
                           "rank_copy_gbps": [c["copy"]["gbps"] for c in ranks]}
        print("%d nodes: whole run quick %s s, standard %s s, difference %s s; the compute phase itself "
              "(slowest rank) %.1f s (modelled %.1f s)" % (n, _fmt(quick), _fmt(standard), _fmt(added), max(phase),
                                                          out["modelled_added_s"]))
    # the harness's overhead: one rank alone (a 1-rank world) beside torch run directly, back to back
    for _ in range(args.repeats):
        one = run_nodes(1, spec)[1][0]["ranks"][0]["compute"]
        mine = direct(spec)
        out.setdefault("overhead", []).append({"rank": {"gemm_tflops": one["gemm"]["fp32"]["tflops"],
                                                        "copy_gbps": one["copy"]["gbps"]}, "direct": mine})
        print("one rank alone vs torch directly: fp32 GEMM n=%d %.4f vs %.4f TFLOPS (ratio %.2f); copy %d MiB "
              "%.2f vs %.2f GB/s (ratio %.2f)" % (
                  spec["gemm_n"], one["gemm"]["fp32"]["tflops"], mine["gemm_tflops"],
                  one["gemm"]["fp32"]["tflops"] / mine["gemm_tflops"], spec["copy_bytes"] >> 20,
                  one["copy"]["gbps"], mine["copy_gbps"], one["copy"]["gbps"] / mine["copy_gbps"]))
    tp = timeplan.time_plan([8] * 128, {}, {"ib_hcas": 8, "ib_rate_gbps": 400}, gpu_model="NVIDIA H100 80GB HBM3")
    added = tiers.compute_s("standard", "nccl")
    out["model_1024_gpus"] = {"quick_s": tp["expected_s"], "standard_added_s": added,
                              "standard_s": round(tp["expected_s"] + added, 1)}
    print("1,024 GPUs (model, 128 x 8 H100): quick %.1f s, standard +%.1f s = %.1f s (one GPU's compute phase; "
          "all run at once)" % (tp["expected_s"], added, tp["expected_s"] + added))
    if args.json:
        text = json.dumps(out, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text)


def _fmt(vals):
    return "/".join("%.1f" % v for v in vals)


if __name__ == "__main__":
    main()

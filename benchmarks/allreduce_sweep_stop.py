"""The sweep's stop rule against fixed iterations: wall time and busbw spread, side by side in one run.

    python3 benchmarks/allreduce_sweep_stop.py                  # 2 and 4 local gloo ranks, 5 repeats
    python3 benchmarks/allreduce_sweep_stop.py --ranks 4 --repeats 9

Runs the real bench agent and worker (preflight.probe.bench_agent, gloo on 127.0.0.1, the CPU sweep 1 KiB -
4 MiB) with each variant in turn, alternating so load drifts hit every variant alike:

  fixed     iters 5, no iters_min: every size 5 timed iterations (the sweep before the stop rule)
  stop      iters 5, iters_min 3 (the defaults): a size stops at 3 once stable, else at the cap
  stop-20   iters 20, iters_min 3: the same rule with room to reach stability

Prints per variant: the sweep's wall time (from the last rank's init_done to the last rank's last size
event, median over repeats), the timed iterations per size and why they stopped, the verdict size's busbw
(median, and its spread over repeats: (max - min) / median), and the stop rule's own cost: how many
2-element MAX all-reduces (one per decision) the sweep ran, at the 1 KiB size's per-iteration time each.
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from preflight.checks.allreduce import plan  # noqa: E402
from preflight.checks.allreduce.busbw import curve  # noqa: E402
from preflight.probe import bench_agent  # noqa: E402

VARIANTS = [("fixed", {"iters": 5}), ("stop", {"iters": 5, "iters_min": 3}), ("stop-20", {"iters": 20, "iters_min": 3})]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(ranks, extra):
    cfg = dict({"backend": "gloo", "master_addr": "127.0.0.1", "master_port": free_port(), "world_size": ranks,
                "node_rank": 0, "nnodes": 1, "local_world_size": ranks, "env": {"GLOO_SOCKET_IFNAME": "lo"},
                "sizes": plan.CPU_SIZES, "warmup": 2,
                "deadlines": {"init_s": 120, "op_s": 30, "total_s": 300, "kill_grace_s": 2, "fail_grace_s": 3}},
               **extra)
    marks = collections.defaultdict(dict)  # rank: {"init_done": t, "size": t of its last size}

    def mark(info, event):
        if event.get("event") in ("init_done", "size"):
            marks[info["rank"]][event["event"]] = float(event["t"])

    doc = bench_agent.run(cfg, on_event=mark)
    bad = [r for r in doc["ranks"] if r["status"] != "ok"]
    if doc.get("error") or bad:
        raise SystemExit("run failed: %s %s" % (doc.get("error"), bad))
    points = curve({"n": doc}, ranks)
    # the sweep: from the last rank's init_done to the last rank's last size (the ranks' own clocks)
    sweep_s = max(m["size"] for m in marks.values()) - max(m["init_done"] for m in marks.values())
    return sweep_s, points


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, action="append", help="local gloo ranks (repeatable; default 2 and 4)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("load average at start: %s" % open("/proc/loadavg").read().strip())
    for ranks in args.ranks or [2, 4]:
        got = collections.defaultdict(list)
        for _i in range(args.repeats):
            for label, extra in VARIANTS:
                got[label].append(one(ranks, extra))
        print("\n%d ranks, %d repeats, sizes %d (1 KiB - 4 MiB), load %s" % (
            ranks, args.repeats, len(plan.CPU_SIZES), open("/proc/loadavg").read().split()[0]))
        print("  %-8s %9s %14s %11s %9s %10s  %s" % ("variant", "sweep s", "busbw@4MiB GB/s", "spread", "decisions",
                                                 "their cost", "stops (over all sizes and repeats)"))
        for label, extra in VARIANTS:
            runs = got[label]
            walls = [w for w, _p in runs]
            verdict = [p[-1]["busbw_gbps"] for _w, p in runs]
            med = statistics.median(verdict)
            stops = collections.Counter(pt.get("stop", "?") for _w, p in runs for pt in p)
            iters = collections.Counter(pt.get("iters") for _w, p in runs for pt in p)
            least, cap = extra.get("iters_min", extra["iters"]), extra["iters"]
            # decisions at iters_min, then every DECIDE_EVERY (2) below the cap: a stop is the last one
            decisions = sum((pt["iters"] - least) // 2 + 1 if pt.get("stop") != "cap" else -(-(cap - least) // 2)
                            for _w, p in runs for pt in p if least < cap) / len(runs)
            cost = decisions * statistics.median(p[0]["time_s"] for _w, p in runs)
            print("  %-8s %9.3f %14.3f %10.1f%% %9.1f %9.4fs  %s; iterations %s" % (
                label, statistics.median(walls), med, 100.0 * (max(verdict) - min(verdict)) / med, decisions, cost,
                dict(stops), dict(sorted(iters.items()))))


if __name__ == "__main__":
    main()

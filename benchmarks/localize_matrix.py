"""Does the all-reduce localization name the throttled node, and only it? The matrix of issue 23 on the
simulator (tests/sim: real sshd per node in network namespaces, gloo ranks over veth links).

    sudo .venv/bin/python benchmarks/localize_matrix.py                     # everything below
    sudo .venv/bin/python benchmarks/localize_matrix.py --part throttled --sizes 3,4
    sudo .venv/bin/python benchmarks/localize_matrix.py --part healthy --healthy 50
    sudo .venv/bin/python benchmarks/localize_matrix.py --part phases --sizes 4,8,16

Parts:
  throttled  one node's data link throttled (tc tbf on its eth1, as tests/sim/faults.py throttle()) at the
             first, middle and last position of 3, 4, 8 and 16 nodes: is it named, and nobody else?
  two        two throttled nodes on 8: both named?
  healthy    N runs of `check --only allreduce` on one healthy 4-node cluster: how many runs name a node
             (a false name), how many needed a confirmation round
  phases     healthy runs at 4, 8, 16 nodes: wall time of each phase (the agents' own timings: sweep,
             node tests and in-process pairs; the separate rounds as the controller timed them)

Every line prints the load average: the simulated nodes share this machine's CPUs with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.sim.cluster import SimCluster  # noqa: E402

SETTINGS = {"init_timeout": 180, "op_timeout": 10}


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def write_inventory(cluster, **allreduce) -> str:
    path = cluster.inventory(expect={})
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    doc["cluster"]["allreduce"] = dict(SETTINGS, **allreduce)
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


def check(cluster, inv):
    """One `preflight check --only allreduce`: (wall s, exit, {fail: [...], warn: [...]}, section)."""
    out = os.path.join(cluster.root, "report.json")
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce", "--no-progress",
                        "--json", out], cwd=REPO, timeout=1200)
    wall = time.monotonic() - t0
    with open(out) as fh:
        doc = json.load(fh)
    named = {"fail": [], "warn": []}
    for r in doc["results"]:
        if r["check"] == "allreduce" and r["node"] and r["status"] in named:
            named[r["status"]].append(r["node"])
    return wall, proc.returncode, named, doc.get("allreduce") or {}


def positions(n):
    return {"first": 1, "middle": (n + 1) // 2, "last": n}


def part_throttled(sizes, rate, record):
    for n in sizes:
        for where, idx in positions(n).items():
            with SimCluster(n, prefix="locmx") as cluster:
                cluster.throttle(idx, rate=rate)
                wall, rc, named, section = check(cluster, write_inventory(cluster))
                want = "n%03d" % idx
                ok = named["fail"] == [want] and not named["warn"]
                loc = section.get("localization") or {}
                line = "throttled %2d nodes %-6s %s: named fail=%s warn=%s rounds=%s exit=%d %s  %.1f s  load %s" % (
                    n, where, want, named["fail"], named["warn"], loc.get("rounds"), rc, "OK" if ok else "WRONG",
                    wall, load())
                print(line, flush=True)
                record.append({"part": "throttled", "nodes": n, "where": where, "throttled": [want], "named": named,
                               "ok": ok, "rounds": loc.get("rounds"), "wall_s": round(wall, 1), "load": load(),
                               "timings_s": section.get("timings_s"), "localization": loc})


def part_two(rate, record):
    with SimCluster(8, prefix="locmx") as cluster:
        cluster.throttle(3, rate=rate)
        cluster.throttle(6, rate=rate)
        wall, rc, named, section = check(cluster, write_inventory(cluster))
        ok = sorted(named["fail"]) == ["n003", "n006"] and not named["warn"]
        loc = section.get("localization") or {}
        print("two throttled on 8 (n003, n006): named fail=%s warn=%s rounds=%s exit=%d %s  %.1f s  load %s" % (
            named["fail"], named["warn"], loc.get("rounds"), rc, "OK" if ok else "WRONG", wall, load()), flush=True)
        record.append({"part": "two", "nodes": 8, "throttled": ["n003", "n006"], "named": named, "ok": ok,
                       "rounds": loc.get("rounds"), "wall_s": round(wall, 1), "load": load()})


def part_healthy(runs, budget_s, record):
    false_names = confirmations = done = 0
    started = time.monotonic()
    with SimCluster(4, prefix="locmx") as cluster:
        inv = write_inventory(cluster)
        for i in range(runs):
            if budget_s and time.monotonic() - started > budget_s:
                print("healthy: stopped after %d runs (--budget %d s)" % (done, budget_s), flush=True)
                break
            wall, rc, named, section = check(cluster, inv)
            loc = section.get("localization") or {}
            rounds = loc.get("rounds") or 0
            done += 1
            false_names += bool(named["fail"] or named["warn"])
            confirmations += rounds > 0
            not_confirmed = [g for g in (section.get("node_rounds") or []) if g.get("named")]
            print("healthy 4 nodes run %2d: named fail=%s warn=%s rounds=%d exit=%d  %.1f s  load %s%s" % (
                i + 1, named["fail"], named["warn"], rounds, rc, wall, load(),
                "  node test named %s" % not_confirmed if not_confirmed else ""), flush=True)
            record.append({"part": "healthy", "run": i + 1, "named": named, "rounds": rounds, "exit": rc,
                           "wall_s": round(wall, 1), "load": load()})
    print("healthy 4 nodes: %d runs, %d with a false name, %d needed a confirmation round" % (
        done, false_names, confirmations), flush=True)


def part_phases(sizes, record):
    for n in sizes:
        with SimCluster(n, prefix="locmx") as cluster:
            wall, rc, named, section = check(cluster, write_inventory(cluster))
            t = section.get("timings_s") or {}
            rounds = t.get("rounds_s") or []
            pairs = (t.get("slowest_pairs_s") or 0) - (t.get("slowest_node_s") or 0)
            print("phases %2d nodes: time to verdict %.1f s; launch+init %.1f s, sweep %.2f s, node tests %.2f s, "
                  "screening pairs %.2f s (in-process), %d pair rounds %.1f s; named %s; load %s" % (
                      n, wall, t.get("slowest_init_s") or 0, t.get("slowest_sweep_s") or 0,
                      t.get("slowest_node_s") or 0, pairs, len(rounds), sum(rounds), named, load()), flush=True)
            record.append({"part": "phases", "nodes": n, "wall_s": round(wall, 1), "timings_s": t,
                           "named": named, "load": load()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", action="append", choices=["throttled", "two", "healthy", "phases"])
    ap.add_argument("--sizes", default="3,4,8,16", help="node counts (throttled; phases uses 4,8,16 of them)")
    ap.add_argument("--healthy", type=int, default=50, help="healthy 4-node runs")
    ap.add_argument("--budget", type=int, default=0, help="stop the healthy runs after this many seconds")
    ap.add_argument("--rate", default="8mbit", help="the throttled link's rate (tc tbf)")
    ap.add_argument("--json", help="write every run's record here")
    args = ap.parse_args()
    parts = args.part or ["throttled", "two", "healthy", "phases"]
    sizes = [int(x) for x in args.sizes.split(",")]
    record = []
    print("load average at start: %s" % open("/proc/loadavg").read().strip(), flush=True)
    try:
        if "throttled" in parts:
            part_throttled(sizes, args.rate, record)
        if "two" in parts:
            part_two(args.rate, record)
        if "healthy" in parts:
            part_healthy(args.healthy, args.budget, record)
        if "phases" in parts:
            part_phases([n for n in sizes if n >= 4], record)
    finally:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()

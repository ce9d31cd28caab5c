"""The history at fleet scale: N nodes x R nightly runs in the SQLite database, side by side with the
JSON-directory history (one report file per run) on the same reports.

    python3 benchmarks/history_scale.py                      # 1,000 nodes x 365 runs (SQLite), JSON side on 60
    python3 benchmarks/history_scale.py --nodes 200 --runs 30 --json-runs 30

Goals (issue 35): a run written in < 1 s, a node's timeline in < 100 ms, fleet-wide lemons and flap
counts in < 2 s, the database < 2 GB. The JSON side answers the same questions the only way it can
(every file read); when --json-runs is smaller than --runs its read figures and size are scaled
linearly to --runs and printed as such. Each report has 21 findings per node and 8 GPUs per node, and
about 1% of nodes failing a night (Xids on GPUs, flapping IB ports, lemon boards moved between nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from preflight.history import queries  # noqa: E402
from preflight.history.db import History  # noqa: E402
from preflight.output import history as json_history  # noqa: E402
from tests import history_fleet as fleet  # noqa: E402


def night(day: int, nodes: list, rng: random.Random) -> dict:
    """One night's report: ~1% of nodes failing, a few faults that recur on the same parts."""
    faults, failed = [], {}
    for node in rng.sample(nodes, max(1, len(nodes) // 100)):
        kind = rng.random()
        if kind < 0.4:
            faults.append(fleet.flaky(node))
        elif kind < 0.7:
            faults.append(fleet.xid(node, rng.randrange(8)))
        elif kind < 0.85:
            faults.append(fleet.undecided(node))
        else:
            failed[node] = rng.randrange(8)
    if day % 7 == 3:  # a lemon: the same board failing every week in whatever node holds it
        failed[nodes[(day // 7) % len(nodes)]] = 0
    return fleet.report(day, nodes, faults, failed, moved={fleet.serial(nodes[0], 0): nodes[(day // 7) % len(nodes)]})


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def json_answers(directory: str, node: str) -> tuple:
    """The timeline, flap counts and failed boards from the JSON directory: every file read."""
    t0 = time.perf_counter()
    timeline = []
    for run in json_history.list_runs(directory):
        doc = json_history.load(run.path)
        timeline.append([r for r in doc["results"] if r.get("node") == node])
    t_timeline = time.perf_counter() - t0
    t0 = time.perf_counter()
    series, boards = {}, {}
    for run in json_history.list_runs(directory):
        doc = json_history.load(run.path)
        for n in doc["nodes"]:
            series.setdefault(n["name"], []).append(n["status"] == "fail")
        for n, entry in doc["hardware"].items():
            for g in entry["gpus"]:
                if g["failed"]:
                    boards.setdefault(g["serial"], set()).add(n)
    flips = {n: sum(a != b for a, b in zip(s[-30:], s[-29:])) for n, s in series.items()}
    return t_timeline, time.perf_counter() - t0, len(timeline), len(flips), len(boards)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=365)
    ap.add_argument("--json-runs", type=int, default=60, help="runs written to the JSON directory (default 60)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="history-scale-")
    rng = random.Random(35)
    nodes = fleet.node_names(args.nodes)
    db_path, json_dir = os.path.join(work, "history.sqlite"), os.path.join(work, "json")
    sql_times, json_times, sql_cpu, gen = [], [], [], 0.0
    try:
        with History(db_path) as h:
            for day in range(args.runs):
                t0 = time.perf_counter()
                doc = night(day, nodes, rng)
                t1, c1 = time.perf_counter(), time.process_time()
                h.record(doc)
                t2 = time.perf_counter()
                sql_cpu.append(time.process_time() - c1)
                gen += t1 - t0
                sql_times.append(t2 - t1)
                if day < args.json_runs:
                    json_history.record(doc, json_dir)
                    json_times.append(time.perf_counter() - t2)
                if day % 30 == 29:
                    print("  %d runs: last write %.3f s (SQLite) %s" % (day + 1, sql_times[-1], "" if day >= args.json_runs
                          else "%.3f s (JSON)" % json_times[-1]), flush=True)
            findings = h.conn.execute("SELECT count(*) FROM findings").fetchone()[0]
            probe = nodes[len(nodes) // 2]
            t0 = time.perf_counter()
            line = queries.timeline(h, probe)
            t_timeline = time.perf_counter() - t0
            t0, c0 = time.perf_counter(), time.process_time()
            lemons = queries.lemons(h)
            flapping = queries.flapping(h)
            t_fleet, c_fleet = time.perf_counter() - t0, time.process_time() - c0
            t0 = time.perf_counter()
            repeats = queries.repeat_faults(h)
            rates = queries.failure_rates(h, 30)
            found = queries.incidents(h)
            t_rest = time.perf_counter() - t0
            h.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db_size = du(db_path)
        j_timeline, j_fleet, _, _, _ = json_answers(json_dir, probe)
        j_size = du(json_dir)
        scale = args.runs / float(args.json_runs)
        print()
        print("%d nodes x %d nightly runs: %d findings, %d nodes in the timeline's node, %d lemons, %d flapping, "
              "%d repeat faults, %d checks rated, %d incidents" % (
                  args.nodes, args.runs, findings, len(line), len(lemons), len(flapping), len(repeats), len(rates),
                  found["fleet"]["incidents"]))
        print("report generation (not counted): %.3f s per run" % (gen / args.runs))
        print()
        note = "" if scale == 1 else " (JSON: %d runs measured, x%.2f to %d runs)" % (args.json_runs, scale, args.runs)
        print("%-44s %14s %14s   goal" % ("", "SQLite", "JSON dir" + ("*" if scale != 1 else "")))
        print("%-44s %12.3f s %12.3f s   < 1 s" % ("write one run (median)", statistics.median(sql_times), statistics.median(json_times)))
        print("%-44s %12.3f s %12.3f s" % ("write one run (slowest)", max(sql_times), max(json_times)))
        print("%-44s %12.3f s %14s" % ("write one run, CPU of this process (median)", statistics.median(sql_cpu), "-"))
        print("%-44s %11.1f ms %11.1f ms   < 100 ms" % ("a node's timeline", 1000 * t_timeline, 1000 * j_timeline * scale))
        print("%-44s %12.3f s %12.3f s   < 2 s" % ("fleet-wide lemons and flap counts", t_fleet, j_fleet * scale))
        print("%-44s %12.3f s %14s" % ("  the same, CPU of this process", c_fleet, "-"))
        print("%-44s %12.3f s %14s" % ("repeat faults, rates (last 30 runs), incidents", t_rest, "-"))
        print("%-44s %10.1f MB %10.1f MB   < 2 GB" % ("on disk", db_size / 1e6, j_size * scale / 1e6))
        if note:
            print("*%s" % note.strip())
        print(json.dumps({"nodes": args.nodes, "runs": args.runs, "json_runs": args.json_runs,
                          "sqlite": {"write_median_s": statistics.median(sql_times), "write_max_s": max(sql_times),
                                     "write_cpu_median_s": statistics.median(sql_cpu),
                                     "timeline_s": t_timeline, "lemons_flaps_s": t_fleet, "lemons_flaps_cpu_s": c_fleet,
                                     "bytes": db_size},
                          "json": {"write_median_s": statistics.median(json_times), "timeline_s": j_timeline * scale,
                                   "lemons_flaps_s": j_fleet * scale, "bytes": j_size * scale}}))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time to verdict of the all-reduce check on N simulated CPU nodes: two builds side by side, one cluster.

    sudo .venv/bin/python benchmarks/allreduce_rounds.py --before /tmp/before   # 8 nodes, 2 repeats
    sudo .venv/bin/python benchmarks/allreduce_rounds.py --before /tmp/before --throttle 3

--before names a directory (repeat it as LABEL=DIR to compare several builds) holding another build's `preflight` package with its checks at
preflight/checks (e.g. `git archive main preflight checks | tar -x -C DIR && mv DIR/checks
DIR/preflight/checks`); it runs as the controller through PYTHONPATH, and ships its own bench worker to
the nodes in its bundle. "after" is this checkout. Both run `preflight check --only allreduce` on the
same nodes, alternating, and the script prints each wall time, the verdict line and the ratio.
--throttle N slows node N's data link (tc tbf, 8 Mbit/s) first.

Besides the wall time it prints, per build, the median of the all-reduce's own time (timings_s.total_s), of
each localization round (timings_s.rounds_s, by position) and the node(s) named, then after/before ratios:
the figures for warm rounds (issue 38, docs/allreduce.md: rounds_warm_ranks counts the adopted
ranks per round, on builds that have it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.sim.cluster import SimCluster  # noqa: E402


def run(cluster, inv, pythonpath, cwd):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = "/tmp/allreduce_rounds_%d.json" % os.getpid()
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce", "--no-progress",
                        "--json", out], cwd=cwd, env=env, timeout=900)
    wall = time.monotonic() - t0
    with open(out) as fh:
        doc = json.load(fh)
    os.unlink(out)
    verdicts = [(r["status"], r["node"], r["message"][:160]) for r in doc["results"] if r["check"] == "allreduce"]
    loc = (doc.get("allreduce") or {}).get("localization") or {}
    if loc.get("rounds"):  # why a round ran: every group measured, by round (recheck: the screening's own)
        verdicts.append(("groups", None, " ".join("r%d%s%s:%s=%s" % (
            g.get("round", 0), "R" if g.get("recheck") else "", "C" if g.get("control") else "", "+".join(g["nodes"]),
            g.get("best_gbps", g.get("busbw_gbps"))) for g in loc.get("groups") or [])))
    return wall, proc.returncode, verdicts, (doc.get("allreduce") or {}).get("timings_s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, action="append",
                    help="DIR or LABEL=DIR (repeatable): another build to run beside this checkout")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--throttle", type=int)
    args = ap.parse_args()
    with SimCluster(args.nodes, prefix="arrounds") as cluster:
        if args.throttle:
            cluster.throttle(args.throttle)
        inv = cluster.inventory()
        builds = []
        for spec in args.before:
            label, _eq, path = spec.rpartition("=")
            builds.append((label or ("before" if len(args.before) == 1 else path), path, "/tmp"))
        builds.append(("after", None, REPO))
        times = {label: [] for label, _p, _c in builds}
        stages = {label: [] for label, _p, _c in builds}
        named = {label: set() for label, _p, _c in builds}
        print("load average at start: %s" % open("/proc/loadavg").read().strip())
        for i in range(args.repeats):
            for label, path, cwd in builds:
                wall, rc, verdicts, timings = run(cluster, inv, path, cwd)
                times[label].append(wall)
                stages[label].append(timings or {})
                named[label].update(v[1] for v in verdicts if v[1] and v[0] == "fail")
                print("%-6s #%d  %.1f s  exit %d  load %s  %s" % (
                    label, i + 1, wall, rc, open("/proc/loadavg").read().split()[0], json.dumps(timings)))
                for v in verdicts:
                    print("         %s %s %s" % v)
        a = statistics.median(times["after"])
        for label, _p, _c in builds[:-1]:
            b = statistics.median(times[label])
            print("median time to verdict on %d nodes: %s %.1f s, after %.1f s (after/%s %.2f)" % (
                args.nodes, label, b, a, label, a / b))
            for line in compare_stages(stages[label], stages["after"], label):
                print(line)
            print("named: %s %s, after %s" % (label, sorted(named[label]), sorted(named["after"])))
            print("runs that paid a localization round: %s %d/%d, after %d/%d" % (
                label, sum(1 for t in stages[label] if t.get("rounds_s")), len(stages[label]),
                sum(1 for t in stages["after"] if t.get("rounds_s")), len(stages["after"])))


def compare_stages(before, after, label):
    """The all-reduce's own time and each round's, median over the repeats, before and after, with ratios."""
    def med(rows, pick):
        values = [v for v in (pick(r) for r in rows) if v is not None]
        return statistics.median(values) if values else None

    picks = [("all-reduce total_s", lambda t: t.get("total_s")), ("first run run_s", lambda t: t.get("run_s"))]
    for i in range(max([len(t.get("rounds_s") or []) for t in before + after] or [0])):
        picks.append(("round %d" % (i + 1), lambda t, i=i: (t.get("rounds_s") or [None] * (i + 1))[i]
                      if len(t.get("rounds_s") or []) > i else None))
    picks.append(("rounds, sum", lambda t: sum(t.get("rounds_s") or []) or None))
    for name, pick in picks:
        b, a = med(before, pick), med(after, pick)
        ratio = "%.2f" % (a / b) if a is not None and b else "-"
        yield "  %-20s %s %s s, after %s s (after/%s %s)" % (
            name, label, "-" if b is None else "%.1f" % b, "-" if a is None else "%.1f" % a, label, ratio)
    warm = [t.get("rounds_warm_ranks") for t in after if t.get("rounds_warm_ranks") is not None]
    if warm:
        yield "  ranks adopted from spares per round (after): %s" % warm


if __name__ == "__main__":
    main()

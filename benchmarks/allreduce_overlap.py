"""Where the all-reduce's time to a go/no-go goes, phase by phase: two builds side by side on one cluster.

    sudo python3 benchmarks/allreduce_overlap.py --before /tmp/ovl/before --nodes 4,16 --repeats 2
    sudo python3 benchmarks/allreduce_overlap.py --before /tmp/ovl/before --transport slurm --nodes 4,16

--before DIR is another checkout (e.g. `git worktree add --detach /tmp/ovl/before 6910cf4`); "after" is this
one. Both run `preflight check --only allreduce` (its closure: ssh, nic, ib_hca, ports, driver, then the
all-reduce) on the same simulated CPU nodes, alternating, and the script prints per run: wall, the engine's
phases (phase 1, phase 2, the all-reduce stage), and inside the stage the slowest rank's torch import and
init (import + store + process group, counted from the rank's launch, or for a rank warmed during phase 1
from its go), its sweep, and the verdict; then the medians and after/before per phase. The nodes share
this machine's cores with the controller: read the ratios, not the seconds.
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

COLUMNS = ("wall", "phase1_s", "phase2_s", "allreduce_s", "slowest_import_s", "slowest_init_s", "slowest_sweep_s")


def run(cluster, inv, tree):
    """One `preflight check --only allreduce` with the package of `tree`: {column: seconds}, verdicts."""
    env = dict(os.environ, PYTHONPATH=tree)
    out = "/tmp/allreduce_overlap_%d.json" % os.getpid()
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "allreduce", "--no-progress",
                        "--json", out], cwd=tree, env=env, timeout=900)
    row = {"wall": time.monotonic() - t0}
    with open(out) as fh:
        doc = json.load(fh)
    os.unlink(out)
    row.update(doc.get("phase_times_s") or {})
    timings = (doc.get("allreduce") or {}).get("timings_s") or {}
    row.update({k: v for k, v in timings.items() if k in COLUMNS})
    verdicts = sorted({(r["status"], r["node"] or "-") for r in doc["results"] if r["check"] == "allreduce"})
    return row, proc.returncode, verdicts


def cell(v):
    return "%.2f" % v if isinstance(v, (int, float)) else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="another checkout's root (its preflight package runs)")
    ap.add_argument("--nodes", default="4,16", help="comma-separated cluster sizes")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--transport", choices=("ssh", "slurm"), default="ssh")
    args = ap.parse_args()
    builds = [("before", os.path.abspath(args.before)), ("after", REPO)]
    for n in [int(x) for x in args.nodes.split(",")]:
        with _cluster(n, args.transport) as (cluster, inv):
            rows = {label: [] for label, _t in builds}
            print("== %d nodes (%s), load average %s" % (n, args.transport, open("/proc/loadavg").read().strip()))
            print("%-7s %3s " % ("build", "#") + " ".join("%16s" % c for c in COLUMNS) + "  exit verdicts")
            for i in range(args.repeats):
                for label, tree in (builds if i % 2 == 0 else builds[::-1]):
                    row, rc, verdicts = run(cluster, inv, tree)
                    rows[label].append(row)
                    print("%-7s %3d " % (label, i + 1) + " ".join("%16s" % cell(row.get(c)) for c in COLUMNS)
                          + "  %d %s  load %s" % (rc, " ".join("%s:%s" % v for v in verdicts),
                                                  open("/proc/loadavg").read().split()[0]))
            med = {label: {c: _median([r.get(c) for r in rs]) for c in COLUMNS} for label, rs in rows.items()}
            for label in ("before", "after"):
                print("%-7s med " % label + " ".join("%16s" % cell(med[label][c]) for c in COLUMNS))
            print("%-11s " % "after/before" + " ".join(
                "%16s" % (("%.2f" % (med["after"][c] / med["before"][c])) if med["after"][c] and med["before"][c]
                          else "-") for c in COLUMNS))
            print("%-11s " % "saved s" + " ".join(
                "%16s" % (("%.2f" % (med["before"][c] - med["after"][c])) if med["after"][c] is not None
                          and med["before"][c] is not None else "-") for c in COLUMNS))


def _median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


class _cluster:
    """The simulated cluster and its inventory (SSH, or `transport: slurm` over its slurmds), torn down on exit."""

    def __init__(self, n, transport):
        self.n, self.transport = n, transport
        self.cluster = SimCluster(n, prefix="arovl", slurm=transport == "slurm")

    def __enter__(self):
        cluster = self.cluster.__enter__()
        if self.transport != "slurm":
            return cluster, cluster.inventory()
        import yaml

        path = os.path.join(cluster.root, "slurm-overlap.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump({"defaults": {"python": "python3", "gpus_per_node": 0},
                            "cluster": {"transport": "slurm", "master_port": 29500},
                            "nodes": ["n[001-%03d]" % self.n]}, fh, sort_keys=False)
        os.environ.update(cluster.slurm.env())
        return cluster, path

    def __exit__(self, *exc):
        self.cluster.__exit__(*exc)


if __name__ == "__main__":
    main()

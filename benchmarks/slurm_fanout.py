#!/usr/bin/env python3
"""preflight through Slurm against the SSH fan-out and against Slurm's own floor, on the same nodes.

For each cluster size a SimCluster with a real Slurm (tests/sim/slurm.py: slurmctld in the controller
namespace, one slurmd per node namespace, munge) is built, and three commands run from the controller
namespace against the same nodes, interleaved, several times:

    floor      srun -N<n> -w n[001-<n>] python3 -c pass          allocation + one step, nothing else
    slurm      preflight check --slurm --nodelist n[001-<n>] --skip allreduce --no-progress --json OUT
    ssh        preflight check INV --skip allreduce --no-progress --json OUT     (the SSH fan-out)

Both preflight runs make the same checks (phase 1 and phase 2: mtu pings and the rendezvous port).
`preflight --slurm --nodelist` makes its own allocation (salloc), runs one srun step per phase and
releases it, as `srun -N<n>` makes one allocation and one step: the floor is what Slurm itself costs
for a single no-op step across the nodes. Wall time of each command is measured around the process;
between runs the nodes are waited idle (not counted), so no run pays for the previous one's job.
Every run must reach every node (exit 0, no failed node), else the script exits 1. Besides wall time,
each run's CPU seconds on the whole machine are taken from /proc/stat (controller, srun, slurmd and
slurmstepd, sshd, every node's probe): on a real cluster each node spends its share on its own cores,
so the CPU figure is what tells transport cost from the 2-core simulation's queueing. The controller's
CPU (the command's own process tree from getrusage: preflight with its srun or its SSH connections, or
srun alone) is what grows on the one machine that drives the run.

The controller's network traffic (bytes sent and received on the controller namespace's interfaces:
preflight, srun, sbcast and slurmctld) and the peak RSS of the preflight process (VmHWM sampled every
0.1 s) are recorded too. `--variant LABEL=DIR` adds a row `slurm-LABEL` running another preflight tree
(e.g. main before a change: `git archive main preflight | tar -x -C DIR`) interleaved with the others;
every preflight runs as `python -m preflight` with PYTHONPATH set to its tree (this checkout for `slurm`
and `ssh`), never an installed copy.

The simulated nodes, their slurmd/sshd and the controller share this machine's cores: the 1-minute
load average before each run is recorded. Read ratios from the same run, not absolute times.

    sudo .venv/bin/python benchmarks/slurm_fanout.py --nodes 8,32 --repeats 3
    sudo .venv/bin/python benchmarks/slurm_fanout.py --nodes 64 --repeats 3 --json slurm.json
    sudo .venv/bin/python benchmarks/slurm_fanout.py --nodes 64,256 --modes floor,slurm --variant before=/tmp/pf-main

Exit status: 0 when every run reached every node, 1 otherwise, 2 on bad usage.
Needs root (network namespaces), iproute2, OpenSSH, slurmctld/slurmd/slurm-client/munge.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import subprocess
import tempfile
import threading
import time
from typing import Any, Dict, List, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

MODES = ("floor", "slurm", "ssh")
VARIANTS: Dict[str, str] = {}  # slurm-LABEL -> the preflight tree it runs (--variant)
EXTRA: List[str] = []  # options every preflight run gets (--timeout)


def load1() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def machine_cpu_s() -> float:
    """CPU seconds this machine has spent so far (user, nice, system, irq, softirq: every core, every
    process: the controller, srun, slurmd/slurmstepd, sshd and every node's probe)."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()
    return sum(int(x) for x in fields[1:4] + fields[6:8]) / os.sysconf("SC_CLK_TCK")


def net_bytes(cluster: Any) -> Tuple[int, int]:
    """(sent, received) bytes so far on the controller namespace's interfaces (lo left out)."""
    out = cluster.ctl(["ip", "-j", "-s", "link", "show"])
    sent = received = 0
    for link in json.loads(out.stdout):
        if link.get("ifname") != "lo":
            sent += link["stats64"]["tx"]["bytes"]
            received += link["stats64"]["rx"]["bytes"]
    return sent, received


def hwm_mib(pid: int) -> float:
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _ok_report(path: str, n: int) -> str:
    """'' when the JSON report has n nodes and none failed or errored, else why not."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        return "no report: %s" % exc
    bad = [node["name"] for node in doc["nodes"] if node["status"] in ("fail", "error")]
    if len(doc["nodes"]) != n or bad:
        causes: Dict[str, int] = {}
        for r in doc["results"]:
            if r["status"] in ("fail", "error") and not r["message"].startswith(("not checked", "not tested")):
                key = "%s: %s" % (r["check"], r["message"].replace(r["node"] or "", "NODE")[:160])
                causes[key] = causes.get(key, 0) + 1
        return "%d nodes in the report, failed: %s; causes: %s" % (
            len(doc["nodes"]), ",".join(bad[:10]) or "-", " | ".join("%d x %s" % (c, k) for k, c in sorted(causes.items(), key=lambda kv: -kv[1])[:4]))
    return ""


def run_one(cluster: Any, mode: str, n: int, inv: str, out_dir: str) -> Dict[str, Any]:
    from preflight.common import fold

    nodes = fold([node.name for node in cluster.nodes])
    report = os.path.join(out_dir, "%s-%d.json" % (mode, n))
    env = cluster.slurm.env()
    if mode == "floor":
        argv = ["srun", "-N%d" % n, "-w", nodes, "python3", "-c", "pass"]
    else:
        env["PYTHONPATH"] = VARIANTS.get(mode, REPO)
        argv = [sys.executable, "-m", "preflight", "check"] + (["--slurm", "--nodelist", nodes] if mode != "ssh" else [inv]) + [
            "--skip", "allreduce", "--no-progress", "--json", report] + EXTRA
    load = load1()
    net0 = net_bytes(cluster)
    c0, t0, r0 = machine_cpu_s(), time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # cwd: not this checkout (python -m puts the working directory first on sys.path, before PYTHONPATH)
    proc = cluster.ctl_popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out_dir)
    hwm, out_err = 0.0, ["", ""]
    reader = threading.Thread(target=lambda: out_err.__setitem__(slice(0, 2), proc.communicate(timeout=900)), daemon=True)
    reader.start()
    while reader.is_alive():
        hwm = max(hwm, hwm_mib(proc.pid))
        reader.join(0.1)
    wall, cpu, r1 = time.monotonic() - t0, machine_cpu_s() - c0, resource.getrusage(resource.RUSAGE_CHILDREN)
    net1 = net_bytes(cluster)
    # the command's own process tree (preflight and its srun, or srun alone): the controller's CPU
    ctl_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    why = ""
    said = [line for line in (out_err[1] or "").splitlines() if "warning" in line or "refused" in line]
    if said:
        print("    %s said: %s" % (mode, " | ".join(said[:3])[:600]), flush=True)
    if proc.returncode != 0:
        why = "rc %s: %s" % (proc.returncode, (out_err[1] or out_err[0] or "").strip()[-300:])
    phases: Dict[str, float] = {}
    if mode != "floor" and (not why or proc.returncode == 1):
        why = _ok_report(report, n)
        with open(report) as fh:
            doc = json.load(fh)
        phases = dict(doc.get("phase_times_s") or {}, engine_s=doc.get("duration_s"))
        if (doc.get("transport") or {}).get("steps") is not None:
            phases["srun_steps"] = doc["transport"]["steps"]
            phases["bundle_on_stdin"] = len(doc["transport"].get("bundle_on_stdin") or ())
    cluster.slurm.wait_idle([node.name for node in cluster.nodes], 120)  # not counted
    return {"mode": mode, "nodes": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 2), "ctl_cpu_s": round(ctl_cpu, 2),
            "ctl_ms_per_node": round(1000 * ctl_cpu / n, 1), "ctl_tx_mb": round((net1[0] - net0[0]) / 1e6, 2),
            "ctl_rx_mb": round((net1[1] - net0[1]) / 1e6, 2), "peak_rss_mib": round(hwm, 1), "load1": load,
            "ok": not why, "why": why, "phases": phases}


def bench(n: int, repeats: int, modes: Sequence[str]) -> List[Dict[str, Any]]:
    from tests.sim.cluster import SimCluster

    rows: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    with SimCluster(n, slurm=True) as cluster, tempfile.TemporaryDirectory() as out_dir:
        try:
            from benchmarks.fanout import pin_neighbours

            pin_neighbours(cluster, mesh=True)  # slurmd forwards launches node to node (TreeWidth)
        except ImportError:
            pass
        print("# %d nodes: cluster up in %.1f s (load %.1f)" % (n, time.monotonic() - t0, load1()), flush=True)
        inv = cluster.inventory(command_timeout=120)
        run_one(cluster, "floor", n, inv, out_dir)  # warm-up (page cache, munge, first job), not counted
        for r in range(repeats):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # the order rotates each round
                row = run_one(cluster, mode, n, inv, out_dir)
                row["repeat"] = r
                rows.append(row)
                print("  %-12s run %d: %6.2f s  cpu %6.2f s  controller cpu %5.2f s (%.1f ms/node)  tx %.2f MB rx %.2f MB  "
                      "rss %.0f MiB  load %5.1f  %s  %s" % (
                    mode, r + 1, row["wall_s"], row["cpu_s"], row["ctl_cpu_s"], row["ctl_ms_per_node"], row["ctl_tx_mb"],
                    row["ctl_rx_mb"], row["peak_rss_mib"], row["load1"], "ok" if row["ok"] else "FAILED " + row["why"],
                    " ".join("%s=%.2f" % kv for kv in sorted(row["phases"].items()) if kv[1] is not None)), flush=True)
    return rows


def summarise(rows: List[Dict[str, Any]]) -> List[str]:
    """One line per cluster size and mode: medians, and ratios to the floor taken in the same run."""
    lines = ["nodes  mode          wall s  x floor  cpu s  x floor  ctl cpu s  ms/node  ctl tx MB  ctl rx MB  peak RSS MiB  load1  (medians)"]
    for n in sorted({r["nodes"] for r in rows}):
        modes = [m for m in dict.fromkeys(r["mode"] for r in rows if r["nodes"] == n)]

        def med(mode: str, key: str) -> float:
            return statistics.median([r[key] for r in rows if r["nodes"] == n and r["mode"] == mode])

        floor = {k: med("floor", k) for k in ("wall_s", "cpu_s")} if "floor" in modes else None
        for mode in modes:
            wall, cpu = med(mode, "wall_s"), med(mode, "cpu_s")
            lines.append("%5d  %-12s %7.2f  %6s  %6.1f  %6s  %9.2f  %7.1f  %9.2f  %9.2f  %12.0f  %5.1f" % (
                n, mode, wall, "%.2fx" % (wall / floor["wall_s"]) if floor else "-", cpu,
                "%.2fx" % (cpu / floor["cpu_s"]) if floor and floor["cpu_s"] else "-", med(mode, "ctl_cpu_s"),
                med(mode, "ctl_ms_per_node"), med(mode, "ctl_tx_mb"), med(mode, "ctl_rx_mb"), med(mode, "peak_rss_mib"),
                med(mode, "load1")))
    lines += _model(rows)
    return lines


def _model(rows: List[Dict[str, Any]]) -> List[str]:
    """The real-cluster model: on a cluster each node runs its probe on its own cores, so preflight costs the
    floor at N nodes plus what it adds to the floor where the nodes do not queue for these 2 cores: the smallest
    size measured, if 4 nodes or fewer (run `--nodes 2,64,...`). One line per size and preflight mode."""
    def med(n: int, mode: str) -> float:
        return statistics.median([r["wall_s"] for r in rows if r["nodes"] == n and r["mode"] == mode])

    have = {(r["nodes"], r["mode"]) for r in rows}
    small = min((r["nodes"] for r in rows), default=0)
    if not small or small > 4 or (small, "floor") not in have:
        return []
    lines = ["modelled real-cluster wall = floor(N) + (preflight - floor) at %d nodes, where they do not queue "
             "for the cores:" % small]
    for mode in [m for m in dict.fromkeys(r["mode"] for r in rows) if m != "floor" and (small, m) in have]:
        add = med(small, mode) - med(small, "floor")
        for n in sorted({r["nodes"] for r in rows if r["nodes"] > small and (r["nodes"], "floor") in have}):
            floor = med(n, "floor")
            lines.append("%5d  %-12s floor %.2f s + %.2f s = %.2f s  (%.2fx floor)" % (
                n, mode, floor, add, floor + add, (floor + add) / floor))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="8,32", help="comma-separated cluster sizes (default 8,32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="which of floor,slurm,ssh to run (default all)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=DIR",
                        help="also run the preflight tree in DIR through Slurm, as row slurm-LABEL (repeatable)")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="preflight --timeout (per node; from 256 nodes on 2 cores phase 1 alone takes ~100 s)")
    parser.add_argument("--json", metavar="PATH", help="write every run's row here")
    args = parser.parse_args()
    if args.timeout:
        EXTRA.extend(["--timeout", "%g" % args.timeout])
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error("--nodes: comma-separated integers, e.g. 8,32,64")
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        parser.error("--nodes and --repeats must be positive")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error("--modes: a comma-separated subset of %s" % ",".join(MODES))
    for spec in args.variant:
        label, _, folder = spec.partition("=")
        if not label or not os.path.isdir(os.path.join(folder, "preflight")):
            parser.error("--variant %s: LABEL=DIR, DIR holding a preflight package" % spec)
        VARIANTS["slurm-" + label] = os.path.abspath(folder)
        modes.append("slurm-" + label)
    from tests.sim import slurm

    missing = slurm.available()
    if missing:
        print("slurm_fanout: %s" % missing, file=sys.stderr)
        return 2
    rows: List[Dict[str, Any]] = []
    for n in sizes:
        rows += bench(n, args.repeats, modes)
    print("\n".join(summarise(rows)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "rows": rows}, fh, indent=2)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

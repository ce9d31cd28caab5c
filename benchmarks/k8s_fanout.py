#!/usr/bin/env python3
"""preflight through Kubernetes (kubectl exec into agent pods) against the SSH fan-out, on the same nodes.

For each cluster size one SimCluster is built (a real sshd per node namespace) and the API-server double
(tests/sim/kubeapi.py) is started on 127.0.0.1 with the agent DaemonSet applied; its pods' execs run in
the same node namespaces. Two commands run against the same nodes, interleaved, several times:

    k8s   preflight check --k8s --selector sim/pool=gpu --skip allreduce --no-progress --json OUT
    ssh   preflight check INV --skip allreduce --no-progress --json OUT     (from the controller namespace)

Both make the same checks (phase 1, then phase 2: mtu pings and the rendezvous port). Wall time is taken
around the process; "controller CPU" is the command's own process tree (os.wait4's rusage: preflight with
its kubectl processes, or with its SSH connections), the figure that grows on the one machine driving
the run, given also per node. "machine CPU" is every core's CPU from /proc/stat over the run: it also holds
the API-server double (this script's threads) and sshd, and every node's probe, so it mixes what a real
cluster spreads over its nodes and its control plane. Every run must reach every node (exit 0), else the
script exits 1. The simulated nodes share this machine's cores: the 1-minute load average before each run
is recorded. Read ratios from the same run, not absolute times.

    sudo python3 benchmarks/k8s_fanout.py --nodes 8,32 --repeats 3

Exit status: 0 when every run reached every node, 1 otherwise, 2 on bad usage.
Needs root (network namespaces), iproute2, OpenSSH and kubectl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

MODES = ("k8s", "ssh")


def _load() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def _cpu_s() -> float:
    with open("/proc/stat") as fh:
        fields = fh.readline().split()
    return sum(int(x) for x in fields[1:4] + fields[6:8]) / os.sysconf("SC_CLK_TCK")


def run_one(cluster: Any, api: Any, mode: str, n: int, inv: str, out_dir: str) -> Dict[str, Any]:
    report = os.path.join(out_dir, "%s-%d.json" % (mode, n))
    common = ["--skip", "allreduce", "--no-progress", "--json", report]
    env = api.env()
    env["PYTHONPATH"] = REPO
    if mode == "k8s":
        argv = [sys.executable, "-m", "preflight", "check", "--k8s", "--selector", "sim/pool=gpu"] + common
    else:
        argv = ["ip", "netns", "exec", cluster.ctl_ns, sys.executable, "-m", "preflight", "check", inv] + common
    load = _load()
    c0, t0 = _cpu_s(), time.monotonic()
    with open(os.path.join(out_dir, "out"), "w+b") as out_fh:  # a file, not a pipe: nothing to drain while waiting
        proc = subprocess.Popen(argv, env=env, stdout=out_fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # the rusage of preflight and every child it reaped (kubectl, ssh)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_fh.seek(0)
        said = out_fh.read().decode("utf-8", "replace")
    wall, cpu = time.monotonic() - t0, _cpu_s() - c0
    ctl_cpu = usage.ru_utime + usage.ru_stime
    why = ""
    if proc.returncode != 0:
        why = "rc %d: %s" % (proc.returncode, said.strip()[-300:])
    phases: Dict[str, Any] = {}
    if not why:
        with open(report) as fh:
            doc = json.load(fh)
        bad = [node["name"] for node in doc["nodes"] if node["status"] in ("fail", "error")]
        if len(doc["nodes"]) != n or bad:
            why = "%d nodes in the report, failed: %s" % (len(doc["nodes"]), ",".join(bad) or "-")
        phases = dict(doc.get("phase_times_s") or {}, engine_s=doc.get("duration_s"))
    return {"mode": mode, "nodes": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 2), "ctl_cpu_s": round(ctl_cpu, 2),
            "load1": load, "ok": not why, "why": why, "phases": phases}


def bench(n: int, repeats: int) -> List[Dict[str, Any]]:
    from preflight.k8s import manifest
    from tests.sim.cluster import SimCluster
    from tests.sim.kubeapi import KubeAPI

    rows: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    with SimCluster(n) as cluster, tempfile.TemporaryDirectory() as out_dir:
        api = KubeAPI(cluster).start()
        try:
            env = api.env()
            subprocess.run(["kubectl", "apply", "-f", "-"], input=manifest.dump(manifest.agent_objects()).encode(),
                           env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
            print("# %d nodes: cluster and API double up in %.1f s (load %.1f)" % (n, time.monotonic() - t0, _load()), flush=True)
            inv = cluster.inventory(command_timeout=120)
            run_one(cluster, api, "k8s", n, inv, out_dir)  # warm-up (page cache, kubectl's discovery cache)
            for r in range(repeats):
                for mode in MODES:
                    row = run_one(cluster, api, mode, n, inv, out_dir)
                    row["repeat"] = r
                    rows.append(row)
                    print("  %-4s run %d: %6.2f s  machine cpu %6.2f s  controller cpu %5.2f s (%.3f s/node)  load %5.1f  %s  %s" % (
                        mode, r + 1, row["wall_s"], row["cpu_s"], row["ctl_cpu_s"], row["ctl_cpu_s"] / n, row["load1"],
                        "ok" if row["ok"] else "FAILED " + row["why"],
                        " ".join("%s=%.2f" % kv for kv in sorted(row["phases"].items()) if kv[1] is not None)), flush=True)
        finally:
            api.stop()
    return rows


def summarise(rows: List[Dict[str, Any]]) -> List[str]:
    lines = ["nodes  k8s s   ssh s   k8s/ssh   machine cpu-s k8s/ssh   controller cpu-s k8s/ssh   per node k8s/ssh   load1 (median)"]
    for n in sorted({r["nodes"] for r in rows}):
        def med(key: str, mode: str) -> float:
            return statistics.median([r[key] for r in rows if r["nodes"] == n and r["mode"] == mode])
        load = statistics.median([r["load1"] for r in rows if r["nodes"] == n])
        lines.append("%5d  %6.2f  %6.2f  %7.2fx   %8.1f/%5.1f          %6.2f/%5.2f          %.3f/%.3f        %5.1f" % (
            n, med("wall_s", "k8s"), med("wall_s", "ssh"), med("wall_s", "k8s") / med("wall_s", "ssh"),
            med("cpu_s", "k8s"), med("cpu_s", "ssh"), med("ctl_cpu_s", "k8s"), med("ctl_cpu_s", "ssh"),
            med("ctl_cpu_s", "k8s") / n, med("ctl_cpu_s", "ssh") / n, load))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="8,32", help="comma-separated cluster sizes (default 8,32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="write every run's row here")
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error("--nodes: comma-separated integers, e.g. 8,32")
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        parser.error("--nodes and --repeats must be positive")
    rows: List[Dict[str, Any]] = []
    for n in sizes:
        rows += bench(n, args.repeats)
    print("\n".join(summarise(rows)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpus": os.cpu_count(), "rows": rows}, fh, indent=2)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Time to a go/no-go: a healthy `preflight check` (every check, the all-reduce included) on simulated clusters,
two preflight trees side by side, per phase, over SSH and Slurm (issue 38).

    sudo python3 benchmarks/time_to_verdict.py                                   # 4 and 16 nodes, ssh + slurm
    sudo python3 benchmarks/time_to_verdict.py --nodes 4,16,64 --repeats 2 --json ttv.json
    sudo python3 benchmarks/time_to_verdict.py --before /tmp/pf-main --after . --transports slurm

--before DIR / --after DIR: each a directory holding a `preflight` package (a git checkout or worktree, or
`git archive REV preflight | tar -x -C DIR`). The default --before is commit 6910cf4 of this repository
(extracted into a temporary directory with git archive), the default --after this checkout. Each tree runs as
the controller through PYTHONPATH (`python3 -m preflight`, the working directory a scratch folder) and ships
its own probe bundle and bench worker to the nodes.

For each size, one simulated cluster (tests/sim: one network namespace, sshd and slurmd per node, a real
slurmctld; the all-reduce runs with gloo on CPU, one rank per node), then per repeat each tree once, in
alternating order, on the same nodes:
    ssh    preflight check INVENTORY --no-progress --json OUT
    slurm  preflight check --slurm --nodelist n[001-N] --no-progress --json OUT
           (with raised deadlines: preflight check SLURM_INVENTORY ..., `transport: slurm`, the same nodes)
Columns (seconds, from the run's JSON report; medians over the repeats):
    wall       the whole command, as the job owner waits for it
    nodes      node checks: phase_times_s phase1_s + phase2_s (probes, the ports/mtu cross-node tests)
    launch     the all-reduce's launch, torch import and rendezvous: allreduce.timings_s run_s minus the
               slowest rank's sweep (and node/pair tests riding on it)
    sweep      the slowest rank's sweep, node and pair tests in the first launch
    rounds     the all-reduce after its first launch (localization rounds, collection, judging)
    other      everything else: Python start, inventory, allocation, writing the outputs
A verdict other than a healthy pass (exit 0), or two trees disagreeing on any (check, node, status) of the
checks both report (a check only one tree has is listed, not compared), is printed as such and makes the exit
status 1. From 32 nodes both trees get the same raised all-reduce deadlines (cluster.allreduce init_timeout,
total_timeout; --init-timeout), printed with the size: every node's torch import shares this machine's cores.
--cpu samples every process's CPU from /proc (20 times a second) during each run and prints the machine's busy
CPU-seconds beside the run's wall, by kind: ranks (the bench worker's python), probes (the phase-1/2 bundle's
python), controller, sshd, slurm (slurmd, slurmstepd), this benchmark (its sampling), other. A process that
starts and ends between two samples is missed (the machine figure, from /proc/stat, is not). On this simulator
a run is CPU-bound once its wall is about busy / cores. The sampling itself takes about 0.1 CPU-s a second of
wall (its line "this benchmark"), from both trees alike: take wall ratios from runs without --cpu.
--timeline prints each run's first launch step by step (allreduce.timings_s.timeline: the agents' start, the
ranks' imported/store/init_done/pairs_start/done/exit, the agents' return, seconds from the bench call). Absolute times on a shared 2-core machine say how busy it was: read the
ratios (after / before, same cluster, same minute) and the load average printed with each run. A run during
which the machine's page cache was dropped (drop_caches written from outside) or 100 MiB or more of files were
read back from disk is marked "!! page cache under this run" (the /proc/vmstat deltas, also in --json as
page_cache): torch's files re-read cost that run CPU its twin did not pay.
Needs root, iproute2, OpenSSH, slurmctld/slurmd/munge (see benchmarks/README.md) and torch on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.slurm_fanout import machine_cpu_s  # noqa: E402

BASE_REV = "6910cf4"
#: from this many nodes both trees get raised all-reduce deadlines (--init-timeout auto)
AUTO_FROM_NODES = 32
AUTO_INIT_S_PER_NODE = 5.0
DEFAULT_TOTAL_S = 300  # bench_agent.DEFAULT_DEADLINES total_s, added above the raised init deadline
PHASES = ("wall", "nodes", "launch", "sweep", "rounds", "other")


def extract(rev: str, into: str) -> str:
    """This repository's preflight package at rev, extracted under into (git archive); returns the tree."""
    tree = os.path.join(into, "before-%s" % rev)
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "preflight"], stdout=subprocess.PIPE)
    if archive.returncode != 0:
        raise SystemExit("time_to_verdict: cannot extract %s from %s (not a git checkout holding it): give "
                         "--before DIR" % (rev, REPO))
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def compiled(tree: str) -> str:
    """tree, its preflight package byte-compiled (as an installed package is): with PYTHONDONTWRITEBYTECODE
    set, a tree without __pycache__ compiles every module on every run (seconds of the controller's CPU on
    a busy machine), which would be measured as that tree's time."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "preflight")], check=False)
    return tree


def phases(doc: Dict[str, Any], wall: float) -> Dict[str, Optional[float]]:
    """The run's phases (seconds) from its JSON report; None where the tree's report does not say."""
    times = doc.get("phase_times_s") or {}
    ar = doc.get("allreduce") or {}
    timings = ar.get("timings_s") or {}
    out: Dict[str, Optional[float]] = {"wall": wall}
    out["nodes"] = times.get("phase1_s", 0.0) + times.get("phase2_s", 0.0) if "phase1_s" in times else None
    run_s = timings.get("run_s")
    ran = [timings.get(k) for k in ("slowest_sweep_s", "slowest_pairs_s", "slowest_node_s")]
    sweep = max([v for v in ran if v is not None], default=None)  # pairs_s and node_s include what ran before
    out["sweep"] = sweep
    out["launch"] = run_s - sweep if run_s is not None and sweep is not None else None
    total_ar = times.get("allreduce_s")
    out["rounds"] = total_ar - run_s if total_ar is not None and run_s is not None else None
    out["other"] = wall - sum(v for v in times.values() if isinstance(v, (int, float)))
    return out


def verdicts(doc: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    """Every (check, node, status) of the report, sorted: what two trees must agree on."""
    return sorted((r["check"], r.get("node") or "-", r["status"]) for r in doc.get("results") or [])


#: the kernel's ARP table (net.ipv4.neigh.default, gc_thresh1..3): one table for every network namespace
NEIGH = "/proc/sys/net/ipv4/neigh/default/gc_thresh%d"


@contextlib.contextmanager
def arp_room(n: int):
    """Room in the kernel's one ARP table for n simulated nodes' full mesh, restored on the way out. Every
    namespace's dynamic entries share it: the all-reduce's gloo ranks connect every rank to every other
    (n * (n - 1) entries on the data network, 4,032 at 64 nodes), past gc_thresh3 (1,024 by default), and
    the kernel then refuses new entries ("neighbour: arp_cache: neighbor table overflow!" in dmesg): pings
    fail with ENOBUFS and gloo's connectFullMesh with "No route to host", at random, in both trees."""
    need = 2 * n * (n + 2)  # the data and the management networks, with the controller and some room
    try:
        old = {}
        for i in (1, 2, 3):
            with open(NEIGH % i) as fh:
                old[i] = int(fh.read())
    except (OSError, ValueError):
        old = {}
    if not old or old[3] >= need:
        yield
        return
    for i, value in ((1, need // 4), (2, need // 2), (3, need)):
        with open(NEIGH % i, "w") as fh:
            fh.write(str(max(value, old[i])))
    print("%d nodes: the ARP table's gc_thresh3 raised from %d to %d for the run (restored after)" % (n, old[3], need),
          flush=True)
    try:
        yield
    finally:
        for i, value in old.items():
            with open(NEIGH % i, "w") as fh:
                fh.write(str(value))


def deadlines_for(n: int, init_timeout: Optional[str]) -> Dict[str, float]:
    """The cluster.allreduce deadlines both trees get at n nodes ({}: their defaults). auto: from 32 nodes,
    AUTO_INIT_S_PER_NODE a node (every node's torch import shares this machine's 2 cores: 64 imports miss
    the default 60 s init deadline in both trees), the total deadline as much above its default."""
    if init_timeout in (None, "auto"):
        if n < AUTO_FROM_NODES:
            return {}
        init = float(AUTO_INIT_S_PER_NODE * n)
    else:
        init = float(init_timeout)
    return {"init_timeout": init, "total_timeout": init + DEFAULT_TOTAL_S}


def inventories(cluster: Any, allreduce: Dict[str, float], scratch: str) -> Dict[str, Optional[str]]:
    """{transport: the inventory its runs use}: SSH a hosts.yaml; Slurm none (`--slurm --nodelist`) unless
    deadlines are raised, then one with `transport: slurm` and the same cluster.allreduce (both honour it)."""
    import yaml

    from preflight.common import fold

    ssh = cluster.inventory(command_timeout=120)
    if not allreduce:
        return {"ssh": ssh, "slurm": None}
    with open(ssh) as fh:
        doc = yaml.safe_load(fh)
    doc["cluster"]["allreduce"] = dict(allreduce)
    with open(ssh, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    slurm = os.path.join(scratch, "slurm-%d.yaml" % len(cluster.nodes))
    with open(slurm, "w") as fh:
        yaml.safe_dump({"defaults": {"python": "python3", "gpus_per_node": 0},
                        "cluster": {"transport": "slurm", "master_port": 29500, "allreduce": dict(allreduce)},
                        "nodes": [fold([n.name for n in cluster.nodes])]}, fh, sort_keys=False)
    return {"ssh": ssh, "slurm": slurm}


#: --cpu: what a process is, from its command line (the first kind whose marker it holds)
KINDS = (("ranks", '"backend": '), ("controller", "-m preflight check"), ("probes", "python3 -S -c"),
         ("probes", "python3 -c"), ("sshd", "sshd"), ("slurm", "slurmd"), ("slurm", "slurmstepd"))


def kind_of(cmdline: str) -> str:
    """The --cpu kind of a process's command line (NULs as spaces): one of KINDS' names, else "other"."""
    for name, marker in KINDS:
        if marker in cmdline:
            return name
    return "other"


#: kinds a process keeps once seen (python does not exec another program); the others are read again each sample
SETTLED = ("ranks", "controller", "probes", "this benchmark")


def _cmdline(pid: str) -> str:
    with open("/proc/%s/cmdline" % pid, "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")


class CpuSampler:
    """Every process's CPU over a run, from /proc, by kind (kind_of); busy: the machine's (machine_cpu_s).
    A process seen at the first sample counts from there (what it had used before the run is not the run's)."""

    def __init__(self, period_s: float = 0.05):
        self.period_s = period_s
        self.hz = os.sysconf("SC_CLK_TCK")
        self.seen: Dict[Tuple[str, str], List[Any]] = {}  # (pid, start time): [kind, first ticks, last ticks]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, first: bool) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % pid) as fh:
                    stat = fh.read()
                fields = stat[stat.rindex(")") + 2:].split()
                ticks, key = int(fields[11]) + int(fields[12]), (pid, fields[19])
                if key not in self.seen:
                    kind = "this benchmark" if int(pid) == os.getpid() else kind_of(_cmdline(pid))  # the sampler's own
                    self.seen[key] = [kind, ticks if first else 0, ticks]
                else:
                    self.seen[key][2] = ticks
                    if self.seen[key][0] not in SETTLED:  # a fork of slurmstepd or sshd may exec a python yet
                        line = _cmdline(pid)
                        if line:  # empty once it is a zombie: its kind stands
                            self.seen[key][0] = kind_of(line)
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listdir and the read: its last sample stands

    def _run(self) -> None:
        first = True
        while not self.stop.is_set():
            self._sample(first)
            first = False
            self.stop.wait(self.period_s)

    def __enter__(self) -> "CpuSampler":
        self.busy0 = machine_cpu_s()
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        self.busy = machine_cpu_s() - self.busy0

    def by_kind(self) -> Dict[str, float]:
        out: Dict[str, float] = {"busy": round(self.busy, 1)}
        for kind, first, last in self.seen.values():
            out[kind] = out.get(kind, 0.0) + (last - first) / float(self.hz)
        return {k: round(v, 1) for k, v in out.items()}


#: /proc/vmstat counters that say the page cache went away under a run: drop_pagecache counts writes to
#: /proc/sys/vm/drop_caches (on these machines a host agent's: nothing in the project writes it),
#: workingset_refault_file the file pages read back after being evicted, pgmajfault the faults that waited
#: for the disk. A run that read torch's libraries back from disk costs more CPU than its twin.
VMSTAT = ("drop_pagecache", "workingset_refault_file", "pgmajfault")
#: file pages read back that make a run worth a note: 100 MiB in this machine's pages (25,600 of 4 KiB; torch's
#: own files are ~600 MB)
REFAULT_NOTE_PAGES = 100 * 2**20 // os.sysconf("SC_PAGE_SIZE")


def vmstat(path: str = "/proc/vmstat") -> Dict[str, int]:
    """VMSTAT's counters now ({} where /proc/vmstat cannot be read; a counter the kernel lacks is left out)."""
    out: Dict[str, int] = {}
    try:
        with open(path) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name in VMSTAT:
                    out[name] = int(value)
    except (OSError, ValueError):
        return {}
    return out


def page_cache_note(before: Dict[str, int], after: Dict[str, int]) -> Optional[str]:
    """A line for a run during which the page cache was dropped or much of it read back, else None."""
    delta = {k: after[k] - before[k] for k in VMSTAT if k in before and k in after}
    if delta.get("drop_pagecache", 0) <= 0 and delta.get("workingset_refault_file", 0) < REFAULT_NOTE_PAGES:
        return None
    return ("page cache under this run: %s; its CPU and wall are not comparable with its twin's" % ", ".join(
        "%s +%d" % (k, delta[k]) for k in VMSTAT if k in delta))


def run_tree(cluster: Any, transport: str, tree: str, inv: Optional[str], scratch: str,
             cpu: bool = False) -> Dict[str, Any]:
    """One `preflight check` by tree over transport (inv: its inventory, None for `--slurm --nodelist`);
    its phases, exit status and verdicts."""
    from preflight.common import fold

    report = os.path.join(scratch, "report-%d.json" % time.monotonic_ns())
    env = dict(os.environ, PYTHONPATH=tree)
    argv = [sys.executable, "-m", "preflight", "check"]
    if transport == "slurm":
        env.update(cluster.slurm.env())
    if inv is None:
        argv += ["--slurm", "--nodelist", fold([n.name for n in cluster.nodes])]
    else:
        argv += [inv]
    argv += ["--no-progress", "--json", report]
    load = os.getloadavg()[0]
    sampler = CpuSampler() if cpu else contextlib.nullcontext()
    cache0 = vmstat()
    with sampler:
        t0 = time.monotonic()
        proc = cluster.ctl(argv, env=env, cwd=scratch, timeout=1800)
        wall = time.monotonic() - t0
    row: Dict[str, Any] = {"rc": proc.returncode, "load1": round(load, 1)}
    note = page_cache_note(cache0, vmstat())
    if note:
        row["page_cache"] = note
    if cpu:
        row["cpu_s"] = sampler.by_kind()
    try:
        with open(report) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        row["error"] = "no report (%s): %s" % (exc, (proc.stderr or proc.stdout or "").strip()[-400:])
        return row
    finally:
        if os.path.exists(report):
            os.unlink(report)
    row["phases"] = phases(doc, wall)
    row["allreduce_timings"] = (doc.get("allreduce") or {}).get("timings_s")  # the ranks' import/init, warm
    loc = (doc.get("allreduce") or {}).get("localization")
    if loc:  # why a healthy run ran rounds, and what they decided
        row["localization"] = {k: loc.get(k) for k in ("why", "rounds", "in_process_rotations", "exclude", "groups")}
    row["verdicts"] = verdicts(doc)
    bad = [v for v in row["verdicts"] if v[2] in ("fail", "error", "warn")]
    if proc.returncode != 0 or bad:
        not_pass = [r for r in doc.get("results") or [] if r["status"] in ("fail", "error", "warn")]
        said = [" ".join(str(r.get("message", "")).split())[:300] for r in not_pass][:2]
        row["error"] = "not a healthy pass: exit %d, %s; %s" % (proc.returncode, bad[:6], " | ".join(said))
        # the JSON keeps what each such result said (a healthy run's WARN must be explainable afterwards)
        row["not_pass"] = [{k: r.get(k) for k in ("check", "node", "status", "message", "expected", "actual", "action")}
                           for r in not_pass[:20]]
    return row


def disagreements(results: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """Where the runs' verdicts differ, over the checks every run reported (a check one tree lacks, such as
    a new check's SKIP rows, is not a disagreement): one line naming each run by its tree."""
    runs = [("%s#%d" % (label, i + 1), {tuple(v) for v in r["verdicts"]})
            for label in ("before", "after") for i, r in enumerate(results.get(label) or []) if "verdicts" in r]
    if len(runs) < 2:
        return []
    shared = set.intersection(*({v[0] for v in verdicts} for _, verdicts in runs))
    runs = [(name, {v for v in verdicts if v[0] in shared}) for name, verdicts in runs]
    common = set.intersection(*(verdicts for _, verdicts in runs))
    if all(verdicts == common for _, verdicts in runs):
        return []
    # what differs, not the first rows of each
    return ["the trees' verdicts differ (over the checks both have): %s" % " vs ".join(
        "%s %s" % (name, sorted(verdicts - common)[:12]) for name, verdicts in runs)]


def only_in_one(results: Dict[str, List[Dict[str, Any]]]) -> Dict[str, List[str]]:
    """{tree: the checks only its runs report} (not compared)."""
    checks = {label: {v[0] for r in rows if "verdicts" in r for v in r["verdicts"]} for label, rows in results.items()}
    return {label: sorted(mine - set.union(set(), *(c for other, c in checks.items() if other != label)))
            for label, mine in checks.items()}


def print_timeline(row: Dict[str, Any]) -> None:
    """The run's first launch, step by step: [earliest, latest] over the ranks, seconds from the bench call."""
    timings = row.get("allreduce_timings") or {}
    steps = timings.get("timeline") or {}
    if steps:
        print("      run_s %s: %s" % (timings.get("run_s"), "  ".join(
            "%s %.2f..%.2f" % (step, span[0], span[1]) for step, span in steps.items())), flush=True)


def median_phases(rows: List[Dict[str, Any]]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for key in PHASES:
        values = [r["phases"][key] for r in rows if "phases" in r and r["phases"].get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def fmt(value: Optional[float]) -> str:
    return "%7.1f" % value if value is not None else "      –"


def report(n: int, transport: str, results: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Print one size/transport block: each tree's median phases and after/before; returns it as data."""
    med = {label: median_phases(rows) for label, rows in results.items()}
    print("\n%d nodes over %s (median of %d; load %s)" % (
        n, transport, len(results["after"]), "/".join(str(r["load1"]) for rows in results.values() for r in rows)))
    print("%-8s" % "" + "".join("%8s" % p for p in PHASES))
    for label in ("before", "after"):
        print("%-8s" % label + "".join(" " + fmt(med[label][p]) for p in PHASES))
    # a phase under 0.1 s (no localization rounds on a healthy run) has no meaningful ratio
    ratio = {p: (med["after"][p] / med["before"][p]) if med["after"][p] is not None and (med["before"][p] or 0) >= 0.1
             else None for p in PHASES}
    print("%-8s" % "after/b" + "".join("%8s" % ("%.2f" % ratio[p] if ratio[p] is not None else "–") for p in PHASES))
    errors = ["%s: %s" % (label, r["error"]) for label, rows in results.items() for r in rows if "error" in r]
    errors += disagreements(results)
    for label, names in only_in_one(results).items():
        if names:
            print("  (only %s reports %s: not compared)" % (label, ", ".join(names)))
    for e in errors:
        print("  !! " + e[:600])
    return {"nodes": n, "transport": transport, "median": med, "ratio": ratio, "errors": errors,
            "runs": {label: [{k: v for k, v in r.items() if k != "verdicts"} for r in rows]
                     for label, rows in results.items()}}


def bench_size(n: int, args: argparse.Namespace, trees: Dict[str, str], scratch: str) -> List[Dict[str, Any]]:
    from tests.sim.cluster import SimCluster

    blocks = []
    allreduce = deadlines_for(n, args.init_timeout)
    if allreduce:
        print("%d nodes: both trees run with cluster.allreduce %s (raised: the default 60 s init deadline is "
              "shorter than %d torch imports on this machine's cores)" % (
                  n, " ".join("%s=%g" % kv for kv in sorted(allreduce.items())), n), flush=True)
    with arp_room(n), SimCluster(n, slurm="slurm" in args.transports) as cluster:
        invs = inventories(cluster, allreduce, scratch)
        for transport in args.transports:
            inv = invs[transport]
            results: Dict[str, List[Dict[str, Any]]] = {"before": [], "after": []}
            order = ["before", "after"]
            for i in range(args.repeats + 1):  # the first round warms caches and is not counted
                for label in order:
                    row = run_tree(cluster, transport, trees[label], inv, scratch, cpu=args.cpu)
                    if i > 0 or args.repeats == 0:
                        results[label].append(row)
                    print("  %s %-6s %-6s #%d%s exit %s load %s %s" % (
                        transport, label, "" if i else "(warm)", i, "", row["rc"], row["load1"],
                        " ".join("%s=%s" % (k, fmt(v).strip()) for k, v in (row.get("phases") or {}).items())),
                        flush=True)
                    if row.get("page_cache"):
                        print("      !! %s" % row["page_cache"], flush=True)
                    if args.timeline:
                        print_timeline(row)
                    if "cpu_s" in row:
                        print("      cpu_s over %.1f s wall (%d cores): %s" % (
                            row["phases"]["wall"] if "phases" in row else float("nan"), os.cpu_count() or 0,
                            "  ".join("%s %s" % kv for kv in sorted(row["cpu_s"].items(), key=lambda kv: -kv[1]))),
                            flush=True)
                    if transport == "slurm":
                        cluster.slurm.wait_idle([node.name for node in cluster.nodes], 120)
                order.reverse()
            block = report(n, transport, results)
            block["allreduce_settings"] = allreduce
            blocks.append(block)
    return blocks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="DIR", help="the tree to compare against (default: %s of this repository, "
                    "extracted with git archive)" % BASE_REV)
    ap.add_argument("--after", metavar="DIR", default=REPO, help="the tree under test (default: this checkout)")
    ap.add_argument("--nodes", default="4,16", help="comma-separated cluster sizes (default 4,16; 64 takes minutes)")
    ap.add_argument("--transports", default="ssh,slurm", help="comma-separated: ssh, slurm (default both)")
    ap.add_argument("--repeats", type=int, default=1, help="counted runs per tree after one warm-up (default 1)")
    ap.add_argument("--init-timeout", metavar="S|auto", default="auto",
                    help="cluster.allreduce init_timeout (and total_timeout S + %d) for both trees; auto: from %d "
                         "nodes %g s a node, below that the trees' defaults" % (DEFAULT_TOTAL_S, AUTO_FROM_NODES,
                                                                              AUTO_INIT_S_PER_NODE))
    ap.add_argument("--timeline", action="store_true",
                    help="print each run's all-reduce timeline (allreduce.timings_s.timeline, trees that have it)")
    ap.add_argument("--cpu", action="store_true",
                    help="sample every process's CPU during each run and print it by kind (see above)")
    ap.add_argument("--json", metavar="PATH", help="also write every run and the medians as JSON")
    args = ap.parse_args(argv)
    args.transports = [t for t in args.transports.split(",") if t]
    if set(args.transports) - {"ssh", "slurm"}:
        ap.error("--transports takes ssh and/or slurm")
    try:
        sizes = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        ap.error("--nodes takes comma-separated integers, e.g. 4,16,64")
    for label in ("before", "after"):
        tree = getattr(args, label)
        if tree and not os.path.isfile(os.path.join(tree, "preflight", "__init__.py")):
            ap.error("--%s %s: no preflight package there (want DIR/preflight/__init__.py)" % (label, tree))
    if os.geteuid() != 0:
        ap.error("needs root: the simulated nodes are network namespaces")
    scratch = tempfile.mkdtemp(prefix="ttv-")
    try:
        trees = {"before": compiled(os.path.abspath(args.before) if args.before else extract(BASE_REV, scratch)),
                 "after": compiled(os.path.abspath(args.after))}
        print("before: %s\nafter:  %s\n(both byte-compiled)" % (trees["before"], trees["after"]))
        blocks = []
        for n in sizes:
            blocks += bench_size(n, args, trees, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(blocks, fh, indent=1)
    return 1 if any(b["errors"] for b in blocks) else 0


if __name__ == "__main__":
    sys.exit(main())

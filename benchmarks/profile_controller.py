#!/usr/bin/env python3
"""Where the controller spends its CPU: `preflight check` on N simulated nodes, profiled in every thread.

Default: cProfile in *every* thread (the fan-out runs in a thread pool, plus one paramiko transport
thread per node), each with time.thread_time as its clock, so what is counted is CPU that thread
really used, even on a machine the simulated nodes (and anything else) keep busy. Profiling overhead
inflates the totals; read the shares. --pyspy instead samples with `py-spy record --gil` (only the
thread holding the GIL: where Python time goes), with no instrumentation overhead.

The report groups the time by area (key exchange, known_hosts, fabric config, bundle, report, …) and
by function (self and inclusive, with call counts), and gives the controller's peak thread count and RSS.

    sudo python3 benchmarks/profile_controller.py --nodes 256            # all node checks
    sudo python3 benchmarks/profile_controller.py --nodes 256 --only ssh --json prof.json

Needs root (network namespaces). py-spy: `pip install py-spy` (a standalone binary; looked up on PATH,
then in /tmp/ansible-venv/bin). Exit 1 when preflight did not reach every node.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import fanout  # noqa: E402  (same directory)

#: (area, regular expression over one frame "function (file:line)"): the first area matched, from the leaf up.
AREAS: List[Tuple[str, str]] = [
    ("known_hosts load/parse (paramiko.hostkeys)", r"hostkeys\.py|preflight/transport/known_hosts\.py"),
    ("fabric/invoke Config clone & load", r"(fabric|invoke)/config\.py|preflight/transport/ssh_config\.py"),
    ("probe bundle build, payload, result reader", r"preflight/transport/bundle\.py:\d+\)$|zipfile"),  # noqa: E501
    ("report rendering (rich)", r"rich/|preflight/output/"),
    ("JSON encode/decode", r"json/"),
    ("key exchange / host key / auth crypto", r"paramiko/(kex_|ed25519key|ecdsakey|rsakey|pkey|auth_handler|primes|dsskey)"),
    ("SSH packet I/O (paramiko packet/transport/channel)",
     r"paramiko/(packet|transport|channel|buffered_pipe|message|util|common|pipe|sftp)"),
    ("paramiko client/connect", r"paramiko/client\.py"),
    ("fabric Connection setup", r"fabric/connection\.py"),
    ("inventory load (yaml)", r"yaml/|preflight/inventory\.py"),
    ("rules / judge", r"preflight/checks/|preflight/engine\.py:\d+\)$|preflight/model\.py"),
    ("gather / transport loop", r"preflight/transport/(fleet|ssh|local|bundle)\.py"),
    ("threading / futures", r"threading\.py|concurrent/futures"),
    ("imports", r"<frozen importlib|importlib/"),
]


#: Runs `preflight` (argv after the output path) with one cProfile.Profile(time.thread_time) per thread.
THREAD_PROFILER = r"""
import cProfile, marshal, sys, threading, time
out = sys.argv[1]
sys.argv = sys.argv[2:]
profiles, lock = [], threading.Lock()
_start = threading.Thread.start
def start(self):
    # wraps the instance's own run: a subclass that overrides run() (paramiko's Transport, the reader
    # thread of every connection: key exchange, packet decryption) is profiled too
    inner = self.run
    def run():
        prof = cProfile.Profile(time.thread_time)
        with lock:
            profiles.append(prof)
        prof.enable()
        try:
            inner()
        finally:
            prof.disable()
    self.run = run
    _start(self)
threading.Thread.start = start
main = cProfile.Profile(time.thread_time)
code = compile(open(sys.argv[0]).read(), sys.argv[0], "exec")
main.enable()
try:
    exec(code, {"__name__": "__main__", "__file__": sys.argv[0]})
except SystemExit as exc:
    rc = exc.code
else:
    rc = 0
finally:
    main.disable()
merged = {}
for prof in [main] + profiles:
    prof.snapshot_stats()  # reads the counters; never disables another thread's profiler
    for key, (cc, nc, tt, ct, callers) in prof.stats.items():
        if key in merged:
            a = merged[key]
            calls = dict(a[4])
            for k, v in callers.items():
                calls[k] = tuple(x + y for x, y in zip(calls[k], v)) if k in calls else v
            merged[key] = (a[0] + cc, a[1] + nc, a[2] + tt, a[3] + ct, calls)
        else:
            merged[key] = (cc, nc, tt, ct, dict(callers))
with open(out, "wb") as fh:
    marshal.dump(merged, fh)
sys.exit(rc)
"""


#: Functions whose call counts and inclusive CPU are worth watching at scale.
WATCH = [
    ("preflight/transport/bundle.py", "base_zip"), ("preflight/transport/bundle.py", "stdin_payload"),
    ("paramiko/hostkeys.py", "load"), ("paramiko/hostkeys.py", "check"), ("paramiko/hostkeys.py", "lookup"),
    ("preflight/transport/ssh_config.py", "fabric_config"), ("invoke/config.py", "clone"),
    ("preflight/transport/ssh.py", "_connection"), ("preflight/transport/ssh.py", "open"),
    ("paramiko/transport.py", "_negotiate_keys"), ("paramiko/client.py", "connect"),
    ("paramiko/auth_handler.py", "_parse_userauth_info_request"), ("paramiko/pkey.py", "from_private_key_file"),
    ("paramiko/client.py", "_auth"), ("preflight/transport/ssh.py", "run_bundle"), ("preflight/transport/bundle.py", "feed"),
    ("preflight/transport/bundle.py", "parse_output"), ("preflight/engine.py", "judge"), ("preflight/output/report.py", "render"),
    ("preflight/output/report.py", "to_json"), ("preflight/inventory.py", "load"),
]


def _frame(key: Tuple[str, int, str]) -> str:
    return "%s (%s:%d)" % (key[2], key[0], key[1])


def pstats_rows(path: str, top: int) -> Dict[str, Any]:
    """Areas, watched functions, self and inclusive tables from a merged per-thread profile (pstats format).

    A function's self time goes to the first area found walking up from it through its heaviest callers;
    a builtin's (zlib, select, hashing…) is first split over its callers in proportion.
    """
    import pstats

    st = pstats.Stats(path)
    stats = st.stats
    total = sum(v[2] for v in stats.values())
    pct = lambda t: round(100.0 * t / total, 1) if total else 0.0  # noqa: E731
    memo: Dict[Any, str] = {}

    def area_of(key: Any, depth: int = 0) -> str:
        if key in memo:
            return memo[key]
        frame = _frame(key)
        hit = next((name for name, rx in AREAS if re.search(rx, frame)), None)
        if hit is None and depth < 15 and key in stats and stats[key][4]:
            callers = stats[key][4]
            heaviest = max(callers, key=lambda k: callers[k][3] if isinstance(callers[k], tuple) else 0)
            hit = area_of(heaviest, depth + 1)
        memo[key] = hit or "other"
        return memo[key]

    areas: Dict[str, float] = collections.Counter()
    for key, (_, _, tt, _, callers) in stats.items():
        if key[0] == "~" and callers:  # builtin: charge each caller its share
            shares = {k: (v[2] if isinstance(v, tuple) else 0.0) for k, v in callers.items()}
            whole = sum(shares.values()) or 1.0
            for caller, part in shares.items():
                areas[area_of(caller)] += tt * part / whole
        else:
            areas[area_of(key)] += tt
    watched = []
    for suffix, name in WATCH:
        for key, v in stats.items():
            if key[2] == name and key[0].endswith(suffix):
                watched.append((_short(_frame(key)), round(v[3], 3), pct(v[3]), v[1]))
    self_rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    incl_rows = sorted(stats.items(), key=lambda kv: -kv[1][3])[:top]
    return {
        "cpu_s": round(total, 2),
        "areas": [(a, round(t, 2), pct(t)) for a, t in sorted(areas.items(), key=lambda kv: -kv[1])],
        "watched": watched,
        "self": [(_short(_frame(k)), round(v[2], 3), pct(v[2]), v[1]) for k, v in self_rows],
        "inclusive": [(_short(_frame(k)), round(v[3], 3), pct(v[3]), v[1]) for k, v in incl_rows],
    }


def find_pyspy() -> Optional[str]:
    for candidate in (shutil.which("py-spy"), "/tmp/ansible-venv/bin/py-spy"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_collapsed(path: str) -> List[Tuple[List[str], int]]:
    stacks = []
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _short(frame: str) -> str:
    """'func (/long/path/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py)'."""
    m = re.match(r"^(.*) \((.*?):\d+\)$", frame)
    if not m:
        return frame
    func, path = m.groups()
    for marker in ("site-packages/", "/lib/python3.11/", "/work/main/", "<"):
        if marker in path:
            path = path.split(marker, 1)[1] if marker != "<" else path
            break
    return "%s (%s)" % (func, path)


def summarise(stacks: List[Tuple[List[str], int]], top: int) -> Dict[str, Any]:
    total = sum(c for _, c in stacks)
    self_t: Dict[str, int] = collections.Counter()
    incl: Dict[str, int] = collections.Counter()
    areas: Dict[str, int] = collections.Counter()
    by_thread: Dict[str, int] = collections.Counter()
    for frames, count in stacks:
        # py-spy --threads puts "process ..." and "thread (0x..)" first
        body = [f for f in frames if not f.startswith(("process ", "thread "))]
        thread = next((f for f in frames if f.startswith("thread ")), "?")
        by_thread["main" if "MainThread" in thread else "other"] += count
        if not body:
            continue
        self_t[_short(body[-1])] += count
        for f in set(_short(f) for f in body):
            incl[f] += count
        area = "other"
        for frame in reversed(body):
            hit = next((name for name, rx in AREAS if re.search(rx, frame)), None)
            if hit:
                area = hit
                break
        areas[area] += count
    pct = lambda c: round(100.0 * c / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "areas": [(a, c, pct(c)) for a, c in areas.most_common()],
        "self": [(f, c, pct(c)) for f, c in self_t.most_common(top)],
        "inclusive": [(f, c, pct(c)) for f, c in incl.most_common(top)],
        "threads": dict(by_thread),
    }


def watch_threads(stop: threading.Event, out: Dict[str, int]) -> None:
    """Peak thread count and RSS of the preflight process (found via py-spy's child), every 0.2 s."""
    while not stop.is_set():
        for pid in _preflight_pids():
            try:
                with open("/proc/%d/status" % pid) as fh:
                    status = dict(line.split(":", 1) for line in fh if ":" in line)
                out["threads"] = max(out.get("threads", 0), int(status["Threads"]))
                out["rss_kib"] = max(out.get("rss_kib", 0), int(status["VmRSS"].split()[0]))
            except (OSError, KeyError, ValueError):
                pass
        stop.wait(0.2)


def _preflight_pids() -> List[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if b"check" in argv and b"--no-progress" in argv and b"record" not in argv and argv[0] != b"ip":
                pids.append(int(entry))
    return pids


def print_table(title: str, rows: List[Tuple], unit: str = "samples") -> None:
    print("\n%s\n" % title)
    calls = any(len(r) > 3 for r in rows)
    print("| %% | %s |%s where |\n|---|---|%s---|" % (unit, " calls |" if calls else "", "---|" if calls else ""))
    for row in rows:
        name, amount, pct = row[:3]
        extra = " %d |" % row[3] if calls else ""
        print("| %.1f | %s |%s `%s` |" % (pct, amount, extra, name.replace("|", "/")))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--only", help="preflight --only (default: all node checks)")
    p.add_argument("--parallel", type=int, default=64)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100, with --pyspy)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--pyspy", action="store_true", help="sample with py-spy --gil instead of per-thread cProfile")
    p.add_argument("--script", metavar="PATH", help="a Python script that runs preflight's CLI (default: the installed "
                   "console script), e.g. a patched copy's runner")
    p.add_argument("--json", metavar="PATH", help="write the summaries here")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("needs root (network namespaces)")
    pyspy = find_pyspy() if args.pyspy else None
    if args.pyspy and not pyspy:
        p.error("py-spy not found (pip install py-spy)")
    selection = ["--only", args.only] if args.only else fanout.check_selection()
    work = tempfile.mkdtemp(prefix="pf-profile-")
    try:
        result = profile(args, pyspy, selection, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None:
        return 1
    run = result["run"]
    print("preflight check on %d nodes %s, -j %d, profiled by %s" % (
        args.nodes, " ".join(selection), args.parallel, "py-spy --gil" if pyspy else "cProfile per thread (thread CPU time)"))
    print("  wall %.2f s, engine %.2f s, phases %s, peak threads %s, peak RSS %.0f MiB (under the profiler)" % (
        run["wall_s"], run["engine_s"], run["phase_times_s"], run["peak_threads"], run["peak_rss_mib"]))
    cpu = result["cpu"]
    if not pyspy:
        print("\nprofiled thread CPU: %.1f s (profiling overhead included; compare shares)" % cpu["cpu_s"])
        print_table("CPU by area", cpu["areas"], unit="CPU s")
        print_table("Watched functions (inclusive CPU, calls)", cpu["watched"], unit="CPU s")
        print_table("CPU, self time by function (top %d)" % args.top, cpu["self"], unit="CPU s")
        print_table("CPU, inclusive by function (top %d)" % args.top, cpu["inclusive"], unit="CPU s")
    else:
        print("\nsamples holding the GIL: %d at %d Hz = %.1f s; main thread %s, other threads %s" % (
            cpu["samples"], args.rate, cpu["samples"] / float(args.rate), cpu["threads"].get("main", 0),
            cpu["threads"].get("other", 0)))
        print_table("GIL time by area (leaf-most matching frame)", cpu["areas"])
        print_table("GIL time, self by function (top %d)" % args.top, cpu["self"])
        print_table("GIL time, inclusive by function (top %d)" % args.top, cpu["inclusive"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


def profile(args: argparse.Namespace, pyspy: Optional[str], selection: List[str], work: str) -> Optional[Dict[str, Any]]:
    """One warm-up run, then one profiled run on a fresh simulated cluster; None when a node was missed."""
    from tests.sim.cluster import SimCluster

    with SimCluster(args.nodes, start_timeout=max(60.0, 0.5 * args.nodes)) as cluster:
        fanout.pin_neighbours(cluster)
        inv = cluster.inventory(path=os.path.join(work, "hosts.yaml"))
        report = os.path.join(work, "report.json")
        script = args.script
        if not script:
            script = os.path.join(work, "run_preflight.py")
            with open(script, "w") as fh:
                fh.write("import sys\nfrom preflight.cli import main\nsys.exit(main())\n")
        cmd = [sys.executable, script, "check", inv, "--no-progress", "--json", report, "-j", str(args.parallel)]
        cmd += selection
        warm = cluster.ctl(cmd)  # unprofiled: page cache and sshd warm, like the benchmark's warm-up round
        if warm.returncode not in (0, 1):
            print(warm.stderr[-2000:])
            return None
        if pyspy:
            out = os.path.join(work, "pyspy.txt")
            wrapped = [pyspy, "record", "--gil", "--threads", "--format", "raw", "-r", str(args.rate), "-o", out, "--"] + cmd
        else:
            out = os.path.join(work, "threads.prof")
            wrapped = [sys.executable, "-c", THREAD_PROFILER, out] + cmd[1:]
        peak: Dict[str, int] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=watch_threads, args=(stop, peak), daemon=True)
        watcher.start()
        t0 = time.monotonic()
        proc = cluster.ctl(wrapped)
        wall = time.monotonic() - t0
        stop.set()
        watcher.join()
    if proc.returncode not in (0, 1) or not os.path.exists(report):
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        return None
    with open(report) as fh:
        doc = json.load(fh)
    ssh_pass = sum(1 for r in doc["results"] if r["check"] == "ssh" and r["status"] == "pass")
    if ssh_pass != args.nodes:
        print("preflight reached %d of %d nodes" % (ssh_pass, args.nodes))
        return None
    return {
        "nodes": args.nodes, "selection": selection,
        "run": {"wall_s": round(wall, 2), "engine_s": doc["duration_s"], "phase_times_s": doc["phase_times_s"],
                "peak_threads": peak.get("threads"), "peak_rss_mib": round(peak.get("rss_kib", 0) / 1024.0, 1),
                "summary": doc["summary"]},
        "cpu": summarise(parse_collapsed(out), args.top) if pyspy else pstats_rows(out, args.top),
    }


if __name__ == "__main__":
    sys.exit(main())

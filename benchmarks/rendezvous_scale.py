#!/usr/bin/env python3
"""Rendezvous at scale: connect and barrier time of N real torch TCPStore clients against one store, by N.

    python3 benchmarks/rendezvous_scale.py                               # 64..1024 ranks, every variant
    sudo python3 benchmarks/rendezvous_scale.py --ranks 256,1024 --repeat 5 --json rdv.json
    python3 benchmarks/rendezvous_scale.py --variants libuv,late --late 3

What is real: torch.distributed.TCPStore (the store the all-reduce's rank 0 hosts, bench_worker.py) and its
clients, the kernel's TCP stack, listen backlog and SYN retransmission. What is simulated: the 1,024 ranks
are threads (TCPStore's constructor and calls release the GIL) spread over --procs client processes on this
host, one socket each, over loopback: no network latency, no packet loss, every client on one machine
instead of 128. Under root the store and its clients run in a network namespace of their own, whose
net.core.somaxconn is set per variant (the kernel caps every listen backlog, the store's included, at it).

Each trial, for every rank at once (a shared start time): connect (the TCPStore constructor), the worker's
steps (rank 0 publishes the run id; every other rank reads it and records its arrival), then a store barrier
(add a counter; the last arrival sets a key every other rank waits for: the shape of torch's store-based
barrier and of NCCL's unique-id broadcast). Printed per N and variant, median over --repeat trials:
  connect    the slowest rank's connect, from the start time (p50 beside it)
  barrier    from the last connect to the last rank released from the barrier
  total      start to the last release; x64 = total / (N/64 x total at 64 ranks): 1.0 is linear growth
Variants:
  libuv      torch's default server (use_libuv=True), what preflight starts; somaxconn 4096 (kernels >= 5.4)
  legacy     use_libuv=False
  old-kernel libuv with somaxconn 128 (the default before Linux 5.4: RHEL 8's 4.18, Ubuntu 18.04's 4.15)
  late       the store starts --late seconds after the clients (the head's rank 0 still importing torch):
             connect is then counted from the store's start, the clients' retry backoff
  same-time  the store and the clients start at the same instant (every rank's import done, as when the
             import overlaps the node checks): the clients refused first wait out torch's retry backoff
  *-poll     before its TCPStore, each client polls the port with a plain connect every 50 ms until the store
             listens (what bench_worker does since issue 38), so its TCPStore connects at the first try
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid

VARIANTS = ("libuv", "legacy", "old-kernel", "late", "late-poll", "same-time", "same-time-poll")

#: One client process: a pool of threads, each one rank with its own TCPStore client, driven by lines on stdin.
CLIENT = r'''
import datetime, json, socket, sys, threading, time
import torch.distributed as dist
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    timeout = datetime.timedelta(seconds=cmd["timeout_s"])
    out, lock, go = [], threading.Lock(), threading.Event()
    def rank(r):
        rec = {"rank": r}
        try:
            go.wait()
            while cmd["poll_s"]:  # preflight's bench_worker._wait_for_store: connect only once the store listens
                try:
                    socket.create_connection((cmd["host"], cmd["port"]), timeout=5).close()
                    break
                except OSError:
                    time.sleep(cmd["poll_s"])
            store = dist.TCPStore(cmd["host"], cmd["port"], cmd["world"], False, timeout=timeout)
            rec["connect"] = time.time()
            if r:  # bench_worker._check_run: every other rank reads the run id rank 0 set
                store.get("preflight/run_id")
            store.set("preflight/arrived/%d" % r, "host")
            if store.add("bench/barrier", 1) == cmd["world"] - 1:  # every rank but 0 (the store's host)
                store.set("bench/barrier/done", "1")
            store.wait(["bench/barrier/done"])
            rec["released"] = time.time()
        except Exception as exc:
            rec["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
        with lock:
            out.append(rec)
    threads = [threading.Thread(target=rank, args=(r,)) for r in cmd["ranks"]]
    for t in threads:
        t.start()
    time.sleep(max(0.0, cmd["go"] - time.time()))
    go.set()
    for t in threads:
        t.join()
    print(json.dumps({"done": out}), flush=True)
'''

#: The store's host: rank 0's TCPStore server and client in one, as bench_worker creates it.
SERVER = r'''
import datetime, json, sys, time
import torch.distributed as dist
print(json.dumps({"ready": True}), flush=True)
stores = []
for line in sys.stdin:
    cmd = json.loads(line)
    del stores[:]
    while time.time() < cmd["go"] + cmd["late_s"]:
        time.sleep(0.005)
    store = dist.TCPStore(cmd["host"], cmd["port"], cmd["world"], True, use_libuv=cmd["libuv"],
                          timeout=datetime.timedelta(seconds=cmd["timeout_s"]), wait_for_workers=False)
    up = time.time()
    store.set("preflight/run_id", "run")
    stores.append(store)
    print(json.dumps({"up": up}), flush=True)
'''


class Helper:
    """A long-lived python3 process (client pool or store host) driven by JSON lines."""

    def __init__(self, source, prefix):
        env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")  # c10d's per-socket warnings would flood the table
        self.proc = subprocess.Popen(prefix + [sys.executable, "-c", source], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ready(self):
        """Waits for its torch import (helpers start together: each imports torch at the same time)."""
        self.read()
        return self

    def send(self, cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("a helper process exited (rc %s)" % self.proc.poll())
        return json.loads(line)

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Namespace:
    """A network namespace of its own (root), loopback up, whose somaxconn each variant sets; else none."""

    def __init__(self, use):
        self.name = None
        if use and os.geteuid() == 0:
            self.name = "pf-rdv-%s" % uuid.uuid4().hex[:8]
            subprocess.run(["ip", "netns", "add", self.name], check=True)
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
            # ip netns exec bind-mounts this over /etc/resolv.conf: no name server, so torch's getnameinfo of
            # each client fails at once instead of waiting on a server the namespace cannot reach
            self.etc = os.path.join("/etc/netns", self.name)
            os.makedirs(self.etc)
            with open(os.path.join(self.etc, "resolv.conf"), "w") as f:
                f.write("# preflight rendezvous_scale: no name server in this namespace\n")

    def prefix(self):
        return ["ip", "netns", "exec", self.name] if self.name else []

    def somaxconn(self, value):
        if self.name:
            subprocess.run(self.prefix() + ["sysctl", "-qw", "net.core.somaxconn=%d" % value], check=True)
            return value
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())

    def close(self):
        if self.name:
            subprocess.run(["ip", "netns", "del", self.name], check=False)
            shutil.rmtree(self.etc, ignore_errors=True)


def free_port():
    """A port free on this host now (outside a namespace of our own, other programs hold ports)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def trial(server, clients, n, variant, port, args):
    """One rendezvous of n ranks; returns the figures (seconds) or the errors seen."""
    go = time.time() + 1.0
    # the store is up before the clients' start time, except in 'late' (else every trial would measure some
    # clients' retry after a refused connect: the store and they would start at the same instant)
    late = {"late": args.late, "late-poll": args.late, "same-time": 0.0, "same-time-poll": 0.0}.get(variant, -0.3)
    common = {"host": "127.0.0.1", "port": port, "world": n, "go": go, "timeout_s": args.timeout}
    server.send(dict(common, libuv=variant != "legacy", late_s=late))
    ranks = list(range(1, n))  # rank 0 is the store's host (its own client is in the server process)
    for i, c in enumerate(clients):
        c.send(dict(common, ranks=ranks[i::len(clients)], poll_s=0.05 if variant.endswith("-poll") else 0))
    up = server.read()["up"]
    recs = [r for c in clients for r in c.read()["done"]]
    errors = [r["error"] for r in recs if "error" in r]
    if errors:
        return {"errors": len(errors), "first_error": errors[0]}
    start = up if late > 0 else go
    connects = sorted(r["connect"] - start for r in recs)
    last_connect = max(r["connect"] for r in recs)
    last_release = max(r["released"] for r in recs)
    return {"connect_p50": connects[len(connects) // 2], "connect_max": connects[-1],
            "barrier": last_release - last_connect, "total": last_release - start}


def run_variant(ns, helpers, variant, sizes, args, port_base):
    """Every size's trials for one variant; the store host and client pool are shared by all variants."""
    server, clients = helpers
    somax = ns.somaxconn(128 if variant == "old-kernel" else args.somaxconn)
    rows = []
    for i, n in enumerate(sizes):
        runs = []
        for k in range(args.repeat):
            port = port_base + i * args.repeat + k if ns.name else free_port()
            runs.append(trial(server, clients, n, variant, port, args))
            sys.stderr.write("%s %d ranks: %s\n" % (variant, n, runs[-1]))
        bad = [r for r in runs if "errors" in r]
        if bad:
            rows.append({"variant": variant, "ranks": n, "somaxconn": somax, "errors": bad[0]})
            continue
        row = {"variant": variant, "ranks": n, "somaxconn": somax, "repeat": args.repeat}
        for key in ("connect_p50", "connect_max", "barrier", "total"):
            row[key] = round(statistics.median(r[key] for r in runs), 4)
            row[key + "_max"] = round(max(r[key] for r in runs), 4)
        rows.append(row)
    return rows


def report(rows, sizes):
    print("%-10s %6s %9s %14s %14s %10s %10s %6s" % (
        "variant", "ranks", "somaxconn", "connect max", "(p50)", "barrier", "total", "x64"))
    first = {}
    for row in rows:
        if "errors" in row:
            print("%-10s %6d %9d  %d ranks failed: %s" % (row["variant"], row["ranks"], row["somaxconn"],
                                                         row["errors"]["errors"], row["errors"]["first_error"]))
            continue
        base = first.setdefault(row["variant"], (row["ranks"], row["total"]))
        growth = row["total"] / (base[1] * row["ranks"] / base[0]) if base[1] > 0 else float("nan")
        print("%-10s %6d %9d %9.3f s (%5.2f) %11.3f s %8.3f s %8.3f s %6.2f" % (
            row["variant"], row["ranks"], row["somaxconn"], row["connect_max"], row["connect_max_max"],
            row["connect_p50"], row["barrier"], row["total"], growth))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,128,256,512,1024", help="comma-separated rank counts")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--repeat", type=int, default=3, help="trials per point (median printed, max in brackets)")
    ap.add_argument("--procs", type=int, default=8, help="client processes the ranks are spread over")
    ap.add_argument("--late", type=float, default=2.0, help="seconds the store starts late in the 'late' variant")
    ap.add_argument("--somaxconn", type=int, default=4096, help="the namespace's somaxconn outside 'old-kernel'")
    ap.add_argument("--timeout", type=float, default=60.0, help="every store operation's timeout, seconds")
    ap.add_argument("--no-netns", action="store_true", help="stay in this namespace (no root needed)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.ranks.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error("unknown variant %s (known: %s)" % (", ".join(unknown), ", ".join(VARIANTS)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the helpers and the namespace go too
    ns = Namespace(not args.no_netns)
    if ns.name is None and "old-kernel" in variants:
        print("not root or --no-netns: somaxconn cannot be set; the old-kernel variant is left out")
        variants.remove("old-kernel")
    rows = []
    helpers = None
    try:
        helpers = (Helper(SERVER, ns.prefix()), [Helper(CLIENT, ns.prefix()) for _ in range(args.procs)])
        for helper in [helpers[0]] + helpers[1]:
            helper.ready()
        for j, variant in enumerate(variants):
            # below the ephemeral range (32768-60999): a client's own port never takes a later trial's
            rows += run_variant(ns, helpers, variant, sizes, args, 10000 + 1000 * j)
    finally:
        for helper in ([helpers[0]] + helpers[1]) if helpers else []:
            helper.close()
        ns.close()
    print("N ranks (threads over %d processes, loopback%s), median of %d; load average %s" % (
        args.procs, ", own netns" if ns.name else "", args.repeat, " ".join("%.1f" % x for x in os.getloadavg())))
    report(rows, sizes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

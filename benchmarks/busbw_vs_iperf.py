#!/usr/bin/env python3
"""All-reduce bus bandwidth against iperf3 on the same simulated nodes, the same data addresses, one run.

For each cluster size N (default 2 and 4) a SimCluster is built (network namespaces, a real sshd per
node, data network 198.19.0.0/16 at MTU 9000 over veth pairs and a bridge), then, interleaved:

    all-reduce   preflight check INV --only allreduce: gloo, one rank per node, on the data addresses
                 the nic check chose, sizes 1 KiB .. --max-mib (the product sweep ends at 4 MiB; the
                 verdict is taken there); reported: busbw at 4 MiB and at the largest size (the plateau)
    iperf3 link  `iperf3 -s` in node i+1's namespace, `iperf3 -c <its data ip> -B <node i's data ip>
                 -t T -J` from node i's, for each ring link i -> i+1 (the pairs the ring all-reduce sends
                 over; with 2 nodes both directions of the one pair), one at a time; reported: the median
                 link, receiver side
    iperf3 ring  the same N links all at once (as the ring all-reduce drives them); reported: the
                 slowest link

The three are repeated --repeat times, interleaved, on the same cluster; the table shows the median of
the repeats and, for the ratios, their range over the repeats (the cores are shared: spread is real).

Units: busbw in GB/s (1e9 bytes/s, nccl-tests' definition: algbw * 2(n-1)/n, which is comparable to
one link's unidirectional bandwidth whatever n); iperf3's bits_per_second / 8e9 is GB/s too. The ratio
is busbw / iperf3 in those same units.

Wall-clock throughput on two shared cores swings with whatever else runs (the 1-min load is printed).
A second table divides the bytes moved over the links by the CPU seconds spent moving them: iperf3's
sender + receiver cpu_utilization_percent times the test's duration, and for the all-reduce the ranks'
own CPU time per all-reduce (cpu_s, which the worker measures around each timed gloo all_reduce): per
all-reduce 2(n-1)*S bytes cross the links (= busbw * time * n) for n * cpu_s CPU seconds. That figure
hardly depends on load: it says how much CPU a byte costs in gloo versus in a bare TCP stream.

What the ratio means here: nothing about hardware. A veth "link" is a memory copy inside one kernel,
so iperf3 measures how fast one core copies through the TCP stack (typically several GB/s per stream).
gloo's ring all-reduce on CPU does that copy plus a reduction pass over every byte, in 2(n-1) chunked
steps, through Python-free but single-threaded C++ per rank, with every rank's sends, receives and
sums competing for the same two shared cores (and with N ranks on 2 cores, N/2 ranks per core): it is
CPU-bound, so busbw sits far below iperf3 and falls as N grows, while iperf3 ring (N streams at once)
also falls with N because the same cores are shared. On real nodes the same comparison is meaningful:
NCCL over RDMA should reach 70-95% of line rate, and a busbw far below what iperf3 (or ib_write_bw)
gets on the same pair points at the collective's configuration (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GDR),
not the wire. The figures here show the method end to end and the order of magnitude of the gap a
CPU/gloo test has by construction, which is why preflight sets no built-in busbw floor for gloo.

    sudo python3 benchmarks/busbw_vs_iperf.py                 # 2 and 4 nodes, 3 repeats
    sudo python3 benchmarks/busbw_vs_iperf.py --nodes 2,4,8 --seconds 5 --repeat 5 --json out.json

Needs root (network namespaces), iproute2, OpenSSH, iperf3, and torch in this interpreter (the ranks
run with it). Exit status 0 when every measurement completed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from preflight.common import KiB, MiB, human_bytes  # noqa: E402 (after the sys.path line above)

IPERF_PORT = 5201


def run_allreduce(cluster, max_mib: int, timeout: float) -> Dict[str, Any]:
    """preflight's all-reduce on every node of the cluster; the report's allreduce section."""
    import yaml

    sizes = [KiB << i for i in range(64) if (KiB << i) <= max_mib * MiB]
    path = cluster.inventory(expect={"busbw_gbps": 0.001})
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    doc["cluster"]["allreduce"] = {"sizes": sizes, "init_timeout": 180, "op_timeout": 60, "total_timeout": 400}
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    out = os.path.join(cluster.root, "allreduce.json")
    t0 = time.monotonic()
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", path, "--only", "allreduce", "--no-progress",
                        "--json", out], cwd=REPO, timeout=timeout)
    wall = time.monotonic() - t0
    try:
        with open(out) as fh:
            section = json.load(fh)["allreduce"] or {}
    except (OSError, ValueError):
        section = {}
    if proc.returncode != 0 or section.get("verdict") != "pass":
        raise RuntimeError("all-reduce did not pass (rc %s): %s" % (proc.returncode, section.get("summary")
                                                                      or proc.stderr.strip()[-500:]))
    curve = section["curve"]
    at4 = next(p for p in curve if p["bytes"] == 4 * MiB)
    last = curve[-1]
    # bytes over all links per all-reduce, 2(n-1)*S = busbw * time * n, over the ranks' CPU, cpu_s * n
    per_cpu = last["busbw_gbps"] * last["time_s"] / last["cpu_s"] if last.get("cpu_s") else None
    return {"busbw_4mib": at4["busbw_gbps"], "busbw_max_size": last["busbw_gbps"], "max_bytes": last["bytes"],
            "gb_per_cpu_s": per_cpu, "world_size": section["world_size"], "wall_s": round(wall, 1), "curve": curve}


def _wait_listening(cluster, node, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.node_exec(node, ["ss", "-Hltn", "sport = :%d" % port]).stdout
        if out.strip():
            return
        time.sleep(0.05)
    raise RuntimeError("iperf3 server on %s did not listen within %g s" % (node.name, timeout))


def _start_server(cluster, node) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", node.ns, "iperf3", "-s", "-1", "-B", node.data_ip,
                             "-p", str(IPERF_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_listening(cluster, node, IPERF_PORT)
    return proc


def _client_argv(src, dst, seconds: float) -> List[str]:
    return ["ip", "netns", "exec", src.ns, "iperf3", "-c", dst.data_ip, "-B", src.data_ip, "-p", str(IPERF_PORT),
            "-t", str(seconds), "-J"]


def _parse(report: str) -> Dict[str, float]:
    """An iperf3 -J report: receiver-side GB/s (bits/s / 8e9), and GB moved per CPU-second of sender plus
    receiver (cpu_utilization_percent is each process's CPU time over the test's wall time)."""
    doc = json.loads(report)
    if doc.get("error"):
        raise RuntimeError("iperf3: %s" % doc["error"])
    end = doc["end"]
    received = end["sum_received"]
    cpu = end["cpu_utilization_percent"]
    cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100.0 * received["seconds"]
    return {"gbps": received["bits_per_second"] / 8e9, "gb_per_cpu_s": received["bytes"] / 1e9 / cpu_s if cpu_s else 0.0}


def run_iperf(cluster, seconds: float) -> Dict[str, Any]:
    """iperf3 over each ring link (node i -> node i+1 on the data addresses): one at a time, then all at once."""
    nodes = list(cluster.nodes)
    links = [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]  # 2 nodes: both directions
    single: List[Dict[str, float]] = []
    for src, dst in links:
        server = _start_server(cluster, dst)
        try:
            proc = subprocess.run(_client_argv(src, dst, seconds), capture_output=True, text=True,
                                  timeout=seconds + 30)
            single.append(_parse(proc.stdout))
        finally:
            _stop(server)
    servers = [_start_server(cluster, dst) for _src, dst in links]
    clients = []
    try:
        clients = [subprocess.Popen(_client_argv(src, dst, seconds), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for src, dst in links]
        ring = [_parse(c.communicate(timeout=seconds + 30)[0]) for c in clients]
    finally:
        for proc in clients + servers:
            _stop(proc)
    return {"links": ["%s->%s" % (s.name, d.name) for s, d in links],
            "single": [x["gbps"] for x in single], "ring": [x["gbps"] for x in ring],
            "single_median": statistics.median(x["gbps"] for x in single), "ring_min": min(x["gbps"] for x in ring),
            "gb_per_cpu_s": statistics.median(x["gb_per_cpu_s"] for x in single)}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        pass


def measure(n: int, seconds: float, max_mib: int, timeout: float, repeat: int) -> Dict[str, Any]:
    """repeat x (all-reduce, iperf3 per link, iperf3 ring) on one cluster of n nodes."""
    from tests.sim.cluster import SimCluster

    runs = []
    with SimCluster(n) as cluster:
        for _ in range(repeat):
            load = os.getloadavg()[0]
            ar = run_allreduce(cluster, max_mib, timeout)
            ip = run_iperf(cluster, seconds)
            runs.append({"load_1m": round(load, 1), "allreduce": ar, "iperf3": ip})
    return {"nodes": n, "runs": runs}


def _median(row: Dict[str, Any], part: str, key: str) -> float:
    return statistics.median(r[part][key] for r in row["runs"])


def _ratios(row: Dict[str, Any], key: str, ref: str) -> List[float]:
    return sorted(r["allreduce"][key] / r["iperf3"][ref] for r in row["runs"])


def table(rows: List[Dict[str, Any]]) -> List[str]:
    """Markdown table: medians of the repeats; ratios as median [min-max] over the repeats."""
    head = ("nodes", "busbw 4 MiB", "busbw %s" % human_bytes(rows[0]["runs"][0]["allreduce"]["max_bytes"]),
            "iperf3 1 link", "iperf3 ring (min link)", "busbw 4 MiB / 1 link", "busbw max / 1 link",
            "busbw max / ring")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        single, ring = _median(r, "iperf3", "single_median"), _median(r, "iperf3", "ring_min")
        cells = ["%d" % r["nodes"], "%.3f GB/s" % _median(r, "allreduce", "busbw_4mib"),
                 "%.3f GB/s" % _median(r, "allreduce", "busbw_max_size"),
                 "%.2f GB/s (%.1f Gb/s)" % (single, single * 8), "%.2f GB/s (%.1f Gb/s)" % (ring, ring * 8)]
        for key, ref in (("busbw_4mib", "single_median"), ("busbw_max_size", "single_median"),
                         ("busbw_max_size", "ring_min")):
            values = _ratios(r, key, ref)
            cells.append("%.3f [%.3f-%.3f]" % (statistics.median(values), values[0], values[-1]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def cpu_table(rows: List[Dict[str, Any]]) -> List[str]:
    """Markdown table: bytes moved over the links per CPU-second (load-independent), medians of the repeats."""
    head = ("nodes", "all-reduce GB per CPU-s (%s)" % human_bytes(rows[0]["runs"][0]["allreduce"]["max_bytes"]),
            "iperf3 GB per CPU-s (1 link)", "ratio [range]")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        if any(x["allreduce"]["gb_per_cpu_s"] is None for x in r["runs"]):
            continue
        values = _ratios(r, "gb_per_cpu_s", "gb_per_cpu_s")
        lines.append("| %d | %.2f | %.2f | %.3f [%.3f-%.3f] |" % (
            r["nodes"], _median(r, "allreduce", "gb_per_cpu_s"), _median(r, "iperf3", "gb_per_cpu_s"),
            statistics.median(values), values[0], values[-1]))
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4", help="comma-separated cluster sizes (default 2,4)")
    parser.add_argument("--seconds", type=float, default=3.0, help="iperf3 -t per test (default 3)")
    parser.add_argument("--max-mib", type=int, default=64, help="largest all-reduce size in MiB (default 64)")
    parser.add_argument("--timeout", type=float, default=900.0, help="limit for one preflight run (default 900 s)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repeats per size (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw figures as JSON")
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error("--nodes takes integers, e.g. 2,4")
    if os.geteuid() != 0:
        sys.stderr.write("busbw_vs_iperf: needs root (network namespaces)\n")
        return 1
    rows, failed = [], False
    for n in sizes:
        try:
            rows.append(measure(n, args.seconds, args.max_mib, args.timeout, max(1, args.repeat)))
        except Exception as exc:  # one size failing still reports the others
            sys.stderr.write("busbw_vs_iperf: %d nodes: %s\n" % (n, exc))
            failed = True
    if not rows:
        return 1
    print("all-reduce (preflight, gloo, 1 rank/node) vs iperf3 (1 TCP stream per link), %d CPU cores, "
          "%d repeats, 1-min load at the start of each repeat: %s" % (
              os.cpu_count(), len(rows[0]["runs"]),
              "; ".join("%d nodes %s" % (r["nodes"], " ".join("%g" % x["load_1m"] for x in r["runs"])) for r in rows)))
    print("\n".join(table(rows)))
    print()
    print("\n".join(cpu_table(rows)))
    for r in rows:
        for k, run in enumerate(r["runs"], 1):
            i, a = run["iperf3"], run["allreduce"]
            print("  %d nodes #%d: busbw 4 MiB %.3f, max %.3f GB/s (preflight run %.0f s); iperf3 per link %s, "
                  "all at once %s GB/s" % (r["nodes"], k, a["busbw_4mib"], a["busbw_max_size"], a["wall_s"],
                                           " ".join("%.2f" % x for x in i["single"]),
                                           " ".join("%.2f" % x for x in i["ring"])))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""preflight through a simulated Slurm of up to 1,000 nodes, with three injected faults (not for the CI suite).

One SimCluster with a real Slurm (tests/sim/slurm.py) of N nodes, the knobs below applied, then:

    fault 1  MTU black hole on one node (jumbo frames dropped on its data link: the mtu check)
    fault 2  slurmd killed on one node, just before the run (Slurm still shows it IDLE: the launch fails)
    fault 3  the rendezvous port (29500) held on the head node by another program (the ports check)
    run      preflight check --slurm --nodelist n[...] --skip allreduce (or --only CHECKS) --json OUT --timeout T

and it checks the verdict: exactly those three nodes not passing, each for its own check (mtu FAIL on
the black-holed node; ssh FAIL, or Slurm's own "unavailable" if slurmctld noticed first, on the node
without slurmd; ports FAIL on the head naming the holder's pid), and every other node passing. It prints
wall time, whole-machine CPU, the controller's CPU (preflight and its srun/sbcast: getrusage of the
command), controller traffic (bytes on the controller namespace's interfaces, slurmctld included), and
peak RSS of the preflight process (VmHWM sampled every 0.1 s), of slurmctld, and of the slurmds.

Knobs (see benchmarks/README.md, "1,000 simulated Slurm nodes"):
  --pin mesh|ctl|none   permanent ARP entries: every node pair on the management network (mesh: what
                        slurmd's tree forwarding and sbcast need), or controller <-> nodes only
  --tree-width W        slurm.conf TreeWidth (default: Slurm's 50)
  --message-timeout S   slurm.conf MessageTimeout (default 60: a loaded 2-core box answers late)
  --floor               also time `srun -N<n-1> python3 -c pass` (the healthy nodes) before the run

    sudo python3 benchmarks/slurm_scale.py --nodes 256
    sudo python3 benchmarks/slurm_scale.py --nodes 1000 --json scale-1000.json

Exit 0 when the verdict is right, 1 when not, 2 on bad usage or a simulator that would not start.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.slurm_fanout import machine_cpu_s, hwm_mib, load1, net_bytes  # noqa: E402

PORT = 29500
#: the run is interrupted when the machine's available memory falls below this (the simulated nodes
#: share its RAM: the kernel's OOM killer would pick any process, also one outside the benchmark)
MEM_FLOOR_MIB = 1536


def _rss_mib(pids: List[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total / 1024.0


def _mem_available_mib() -> float:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:")) / 1024.0


def softnet_dropped() -> int:
    """Packets the kernel dropped for a full input backlog, all CPUs (/proc/net/softnet_stat, 2nd column, hex)."""
    with open("/proc/net/softnet_stat") as fh:
        return sum(int(line.split()[1], 16) for line in fh if line.strip())


def oom_kills() -> int:
    """Processes the kernel's OOM killer (global or a memory cgroup's) has killed since boot (/proc/vmstat)."""
    with open("/proc/vmstat") as fh:
        return next((int(line.split()[1]) for line in fh if line.startswith("oom_kill ")), 0)


def pin_head_data(cluster: Any) -> None:
    """Permanent ARP entries between the head (first node) and every node on the data network: the
    ports check has every node connect to the head's data address. Dynamic entries of every namespace
    share the kernel's one ARP table, whose gc_thresh3 (1024 here) would be passed at ~500 nodes
    ("neighbour table overflow": connections fail at random)."""
    import json as _json

    def mac(ns: str) -> str:
        out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", "eth1"], capture_output=True, text=True, check=True)
        return _json.loads(out.stdout)[0]["address"]

    import concurrent.futures

    head, rest = cluster.nodes[0], cluster.nodes[1:]
    head_mac = mac(head.ns)
    entry = "neigh replace %s lladdr %s dev eth1 nud permanent"

    def one(node: Any) -> str:
        subprocess.run(["ip", "-n", node.ns, "neigh", "replace", head.data_ip, "lladdr", head_mac, "dev", "eth1",
                        "nud", "permanent"], check=True)
        return entry % (node.data_ip, mac(node.ns))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        lines = list(pool.map(one, rest))
    subprocess.run(["ip", "-n", head.ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)


def _slurmd_pids(cluster: Any) -> List[int]:
    """The slurmd processes (ip netns exec / unshare / sh exec into slurmd: one pid each)."""
    return [p.pid for p in cluster.slurm.slurmd.values() if p.poll() is None]


def _ctld_pid(cluster: Any) -> int:
    return cluster.slurm.ctld.pid


def timed(cluster: Any, argv: List[str], env: Dict[str, str], timeout: float,
          mem_floor_mib: float = MEM_FLOOR_MIB) -> Dict[str, Any]:
    """Run argv in the controller namespace: wall, whole-machine CPU, its own CPU, traffic, peak RSS."""
    load, mem0 = load1(), _mem_available_mib()
    net0, c0, t0 = net_bytes(cluster), machine_cpu_s(), time.monotonic()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = cluster.ctl_popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    out: List[str] = ["", ""]
    reader = threading.Thread(target=lambda: out.__setitem__(slice(0, 2), proc.communicate(timeout=timeout)), daemon=True)
    reader.start()
    hwm, ctld_hwm, mem_low, stopped = 0.0, 0.0, _mem_available_mib(), False
    while reader.is_alive():
        hwm = max(hwm, hwm_mib(proc.pid))
        ctld_hwm = max(ctld_hwm, _rss_mib([_ctld_pid(cluster)]))
        mem_low = min(mem_low, _mem_available_mib())
        if mem_low < mem_floor_mib and not stopped and proc.poll() is None:  # before the OOM killer picks a victim
            print("memory: %d MiB available, stopping the run (SIGINT)" % mem_low, flush=True)
            proc.send_signal(2)
            stopped = True
        reader.join(0.1)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, cpu, net1 = time.monotonic() - t0, machine_cpu_s() - c0, net_bytes(cluster)
    return {"rc": proc.returncode, "stdout": out[0], "stderr": out[1], "wall_s": round(wall, 2), "cpu_s": round(cpu, 1),
            "ctl_cpu_s": round((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), 2),
            "ctl_tx_mb": round((net1[0] - net0[0]) / 1e6, 2), "ctl_rx_mb": round((net1[1] - net0[1]) / 1e6, 2),
            "peak_rss_mib": round(hwm, 1), "slurmctld_rss_mib": round(ctld_hwm, 1), "load1": load,
            "mem_available_before_mib": round(mem0), "mem_available_low_mib": round(mem_low)}


def _consequence(r: Dict[str, Any]) -> bool:
    """A finding that repeats another's cause (preflight.output.report.is_consequence, on the JSON)."""
    return r["status"] == "error" and r["message"].startswith(("not tested:", "not checked"))


def verdict(doc: Dict[str, Any], mtu_node: str, down_node: str, head: str, faults: bool = True) -> List[str]:
    """What is wrong with the report against the three faults ([] when it is right): the root causes
    (FAIL, or ERROR that is not a consequence of another finding) are exactly the three faults (none with
    faults=False)."""
    wrong: List[str] = []
    status = {n["name"]: n["status"] for n in doc["nodes"]}
    causes = {(r["check"], r["node"]): r for r in doc["results"]
              if r["status"] in ("fail", "error") and not _consequence(r)}
    def healthy(exclude: tuple) -> List[str]:  # false FAILs (unsafe to act on) apart from errors to retest
        said = []
        for level, what in (("fail", "false failures"), ("error", "errors (not tested, retest)")):
            nodes = sorted({node for (_, node), r in causes.items() if r["status"] == level and node not in exclude}, key=str)
            if nodes:
                said.append("%s on %s" % (what, nodes[:20]))
        return said

    if not faults:
        return healthy(())
    if ("mtu", mtu_node) not in causes:
        wrong.append("no mtu failure on %s" % mtu_node)
    if ("ssh", down_node) not in causes and status.get(down_node) != "unavailable":
        wrong.append("%s (slurmd down) neither failed nor unavailable: %s" % (down_node, status.get(down_node)))
    ports = causes.get(("ports", head))
    if ports is None or "port %d is held by pid" % PORT not in ports["message"]:
        wrong.append("no ports failure naming the holder on %s" % head)
    return wrong + healthy((mtu_node, down_node, head))


def _pids_of(root: str, programs: tuple) -> list:
    """PIDs of the named programs whose command line or environment (SLURM_CONF) names the simulator's
    Slurm folder."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().split(b"\0")
            if not argv or os.path.basename(argv[0].decode(errors="replace")) not in programs:
                continue
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if root.encode() in b" ".join(argv) or root.encode() in env:
            out.append(int(pid))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--pin", choices=("mesh", "ctl", "none"), default="mesh")
    parser.add_argument("--tree-width", type=int, default=None)
    parser.add_argument("--message-timeout", type=int, default=60)
    parser.add_argument("--timeout", type=int, default=900, help="preflight --timeout (per node, s)")
    parser.add_argument("--ctld-nice", type=int, default=0, metavar="N",
                        help="renice slurmctld and munged by N (e.g. -15) once Slurm is up: on this simulator every "
                             "node shares the controller's cores, and a starved slurmctld times out srun (a real "
                             "slurmctld has its own host)")
    parser.add_argument("--only", metavar="CHECKS", default=None,
                        help="preflight --only CHECKS (e.g. ssh,mtu,ports: the checks that name the three faults; "
                             "every node's probe then costs less of the simulator's shared CPU and memory)")
    parser.add_argument("--mem-floor-mib", type=int, default=MEM_FLOOR_MIB,
                        help="stop the run (SIGINT) when MemAvailable falls below this (default %d), before the "
                             "kernel's OOM killer picks a victim" % MEM_FLOOR_MIB)
    parser.add_argument("--netdev-backlog", type=int, default=0, metavar="N",
                        help="set net.core.netdev_max_backlog (host-wide, restored at the end) to N for the run: "
                             "1,000 nodes pinging at once overflow the default 1000 packets per CPU, and the mtu "
                             "check's pings are lost in this kernel, not on a link (/proc/net/softnet_stat)")
    parser.add_argument("--link-local", choices=("on", "off"), default=None,
                        help="IPv6 link-local addresses on the nodes' interfaces (default: on up to 256 nodes, off "
                             "past that). On: every node's IPv6 start-up multicast is copied by the one software "
                             "bridge to every port; at 1,000 nodes the kernel drops ~100,000 frames a second "
                             "(/proc/net/softnet_stat) and the mtu check's pings with them")
    parser.add_argument("--tree", metavar="DIR", help="run the preflight package in DIR (e.g. a patched copy: git archive "
                        "HEAD preflight | tar -x -C DIR) instead of this checkout's")
    parser.add_argument("--proctrack", choices=("linuxproc", "pgid"), default=None,
                        help="slurm.conf ProctrackType (default: linuxproc up to 256 nodes, pgid past that). linuxproc "
                             "walks /proc, which on this simulator holds all the nodes' processes: at 1,000 nodes "
                             "each slurmstepd reads ~3,000 entries when a step ends (hundreds of tasks in D state)")
    parser.add_argument("--no-faults", action="store_true",
                        help="inject no fault (a healthy cluster: every node must pass; for the cost against --floor)")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if args.nodes < 4:
        parser.error("--nodes: at least 4")
    backlog = "/proc/sys/net/core/netdev_max_backlog"
    saved = open(backlog).read().strip() if args.netdev_backlog else None
    if args.netdev_backlog:
        with open(backlog, "w") as fh:
            fh.write(str(args.netdev_backlog))
    try:
        return _main(args)
    finally:
        if saved is not None:
            with open(backlog, "w") as fh:
                fh.write(saved)


def _main(args: argparse.Namespace) -> int:
    from preflight.common import fold
    from tests.sim import slurm
    from tests.sim.cluster import SimCluster

    missing = slurm.available()
    if missing:
        print("slurm_scale: %s" % missing, file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # slurmctld, srun and preflight inherit it
    n = args.nodes
    row: Dict[str, Any] = {"nodes": n, "only": args.only, "pin": args.pin, "tree_width": args.tree_width, "message_timeout": args.message_timeout,
                           "nofile": hard}
    t0 = time.monotonic()
    # no sshd on the nodes: this run goes through Slurm only, and 1,000 sshd cost ~2 GB of the 24
    link_local = args.link_local == "on" if args.link_local else n <= 256
    row["link_local"] = link_local
    with SimCluster(n, start_timeout=900, sshd=False, link_local=link_local) as cluster, tempfile.TemporaryDirectory() as out_dir:
        cluster.start()
        row["sshd_cluster_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        if args.pin != "none":
            from benchmarks.fanout import pin_neighbours

            pin_neighbours(cluster, mesh=args.pin == "mesh")
            pin_head_data(cluster)
        row["pin_s"] = round(time.monotonic() - t1, 1)
        t2 = time.monotonic()
        proctrack = args.proctrack or ("linuxproc" if n <= 256 else "pgid")
        row["proctrack"] = proctrack
        cluster.slurm = slurm.SimSlurm(cluster, message_timeout=args.message_timeout, tree_width=args.tree_width,
                                       proctrack=proctrack)
        cluster.slurm.start(timeout=900)
        row["slurm_start_s"] = round(time.monotonic() - t2, 1)
        if args.ctld_nice:
            row["ctld_nice"] = args.ctld_nice
            for pid in _pids_of(cluster.slurm.dir, ("slurmctld", "munged")):
                os.setpriority(os.PRIO_PROCESS, pid, args.ctld_nice)
        row["slurmd_rss_mib_total"] = round(_rss_mib(_slurmd_pids(cluster)), 0)
        row["slurmctld_rss_idle_mib"] = round(_rss_mib([_ctld_pid(cluster)]), 1)
        print("# %d nodes: sshd cluster %.0f s, pin %s %.0f s, slurm %.0f s; slurmd RSS %.0f MiB in all, slurmctld %.0f MiB; load %.1f"
              % (n, row["sshd_cluster_s"], args.pin, row["pin_s"], row["slurm_start_s"], row["slurmd_rss_mib_total"],
                 row["slurmctld_rss_idle_mib"], load1()), flush=True)
        names = [node.name for node in cluster.nodes]
        head, mtu_node, down_node = names[0], names[n // 2], names[(3 * n) // 4]
        env = cluster.slurm.env()
        env["PYTHONPATH"] = os.path.abspath(args.tree) if args.tree else REPO
        if args.floor:
            healthy = [x for x in names if args.no_faults or x != down_node]
            floor = timed(cluster, ["srun", "-N%d" % len(healthy), "-w", fold(healthy), "python3", "-c", "pass"], env, 900)
            row["floor"] = {k: v for k, v in floor.items() if k not in ("stdout", "stderr")}
            print("floor: rc %s  %s" % (floor["rc"], row["floor"]), flush=True)
            cluster.slurm.wait_idle(names, 300)
        if not args.no_faults:
            cluster.mtu_blackhole(mtu_node)
            cluster.hold_port(head, PORT)
            cluster.slurm.stop_slurmd(down_node)
        report = os.path.join(out_dir, "report.json")
        drops_before, ooms_before = softnet_dropped(), oom_kills()
        run = timed(cluster, [sys.executable, "-m", "preflight", "check", "--slurm", "--nodelist", fold(names),
                              *(["--only", args.only] if args.only else ["--skip", "allreduce"]),
                              "--timeout", str(args.timeout), "--no-progress", "--debug",
                              "--json", report], env, 3 * args.timeout, args.mem_floor_mib)
        row["run"] = {k: v for k, v in run.items() if k not in ("stdout", "stderr")}
        row["run"]["kernel_dropped_packets"] = softnet_dropped() - drops_before
        row["run"]["oom_kills"] = oom_kills() - ooms_before  # a task "Killed" with none of these: not the OOM killer
        debug = [line for line in run["stderr"].splitlines() if "bundle" in line or "step " in line][:12]
        print("\n".join(debug))
        try:
            with open(report) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            print("no report (rc %s): %s\n%s" % (run["rc"], exc, run["stderr"][-3000:]))
            print("run: %s" % json.dumps(row["run"]))
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(dict(row, stderr_tail=run["stderr"][-6000:]), fh, indent=2)
            return 1
        row["transport"] = doc.get("transport")
        row["phase_times_s"] = doc.get("phase_times_s")
        wrong = verdict(doc, mtu_node, down_node, head, not args.no_faults)
        row["wrong"] = wrong
        blamed = sorted({r["node"] for r in doc["results"] if r["status"] == "fail" and r["node"] not in (
            mtu_node, down_node, head)})[:3]
        for node in blamed:  # what the node's slurmd said of a false failure (why a task was killed)
            said = [line for line in cluster.slurm.logs(node).splitlines() if "error" in line.lower()][-6:]
            row.setdefault("slurmd_said", {})[node] = said
            print("  slurmd on %s said: %s" % (node, " / ".join(said) or "(no error)"))
        echoes: Dict[str, List[str]] = {}
        for r in doc["results"]:
            if _consequence(r):
                echoes.setdefault("%s %s: %s" % (r["status"].upper(), r["check"], r["message"] if r["node"] not in (
                    down_node,) else "not checked (node unreachable)"), []).append(r["node"])
            elif r["status"] in ("fail", "error") or (r["node"] == down_node and r["status"] != "pass"):
                text = r["message"] if len(r["message"]) <= 460 else r["message"][:200] + " ... " + r["message"][-250:]
                print("  %s %s %s: %s" % (r["status"].upper(), r["check"], r["node"], text))
        for what, where in echoes.items():
            print("  consequence on %d nodes (%s): %s" % (len(where), fold([w for w in where if w]) or "-", what[:160]))
        # paths whose first ping got no reply and whose second did (the mtu check's confirmation)
        row["mtu_second_try"] = sum(1 for r in doc["results"] if r["check"] == "mtu" and r["status"] == "pass"
                                    and "second, slower try" in r["message"])
        row["node_status"] = {s: sum(1 for x in doc["nodes"] if x["status"] == s) for s in ("pass", "warn", "fail", "unavailable")}
        print("node status: %s; mtu paths passed on the second try: %d" % (row["node_status"], row["mtu_second_try"]))
        print("run: rc %s  %s" % (run["rc"], json.dumps(row["run"])))
        print("transport: %s  phases: %s" % (json.dumps(row["transport"])[:300], row["phase_times_s"]))
        print("verdict: %s" % (("right (no fault injected, every node passed)" if args.no_faults else
                                "right (3 faults named, no false failure on the other %d)" % (n - 3))
                               if not wrong else "; ".join(wrong)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(row, fh, indent=2)
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())

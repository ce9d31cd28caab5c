#!/usr/bin/env python3
"""Fan-out speed and scale: preflight's node checks against pdsh and Ansible on the same simulated nodes.

For each cluster size a SimCluster (network namespaces, one real sshd per node) is built, and every
tool runs from the controller namespace against the same nodes, interleaved, several times:

    preflight       preflight check INV --no-progress --json OUT --skip allreduce   (all node checks)
    preflight-ssh   preflight check INV --no-progress --json OUT --only ssh         (bare fan-out cost)
    pdsh            pdsh -R ssh -f 64 -w <mgmt ips> 'python3 -c pass && echo ok'
    ansible         ansible all -i INV -m shell -a 'python3 -c pass' -f 64         (pipelining on)

Every tool verifies host keys against the cluster's known_hosts and logs in as root with the cluster
key. Each run is wrapped in /usr/bin/time: wall, user+sys CPU and peak RSS of the tool's process tree
(for pdsh and ansible that includes their ssh clients). The simulated nodes' sshd, shell and python run
on the same cores, so their CPU is reported too (the children's CPU reaped by each node's sshd
listener), as is the 1-minute load average before each run. The median of the repeats is reported,
with its ratio to pdsh from the same run; read ratios, not absolute times.

ARP is pinned (permanent neighbour entries controller <-> nodes and between ring neighbours on the data
network, see pin_neighbours): on one Linux bridge with 256 ports the broadcast storm of a cold fan-out
overflows the kernel's input backlog and random nodes fail with "no route to host".

    sudo python3 benchmarks/fanout.py                      # 8 and 32 nodes, 3 repeats
    sudo python3 benchmarks/fanout.py --nodes 128,256 --json results.json
    sudo python3 benchmarks/fanout.py --nodes 128 --sweep-size 128 --sweep-parallel 16,32,64,128
    sudo python3 benchmarks/fanout.py --nodes 32 --hardware hgx --tools preflight,base --variant "base=..."   # HGX nodes
    sudo python3 benchmarks/fanout.py --nodes 256 --tools pdsh,base,patched \
        --variant "base=python3 /tmp/pf-base/run_preflight.py" --variant "patched=python3 /tmp/pf-exp/run_preflight.py"

A --variant is another preflight build (say a patched copy) timed in the same run; its runner script
only has to put the copy first on sys.path and call preflight.cli.main().

Exit status: 0 when every run of every tool reached every node, 1 when one did not, 2 on bad usage.
Needs root (network namespaces), iproute2, OpenSSH (sshd + ssh), pdsh; Ansible is looked up on PATH,
then in /tmp/ansible-venv (`python3 -m venv /tmp/ansible-venv && /tmp/ansible-venv/bin/pip install
ansible-core`), and its rows are skipped with a note when it is not found (--tools to choose).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

TOOLS = ("preflight", "preflight-ssh", "pdsh", "ansible")
TIME_FORMAT = "%M %e %U %S"  # peak RSS KiB, wall s, user s, sys s
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ToolFailed(Exception):
    """A tool did not reach every node (or did not run at all)."""


# --- what runs -----------------------------------------------------------------------------------


def preflight_argv() -> List[str]:
    """The installed console script next to this interpreter (not a pyenv shim), else `python -m preflight`."""
    script = os.path.join(os.path.dirname(sys.executable), "preflight")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "preflight"]


def find_ansible(given: Optional[str]) -> Optional[str]:
    for candidate in (given, shutil.which("ansible"), "/tmp/ansible-venv/bin/ansible"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def check_selection() -> List[str]:
    """preflight's selection for "all node checks": --skip every check without a node probe (the bench)."""
    from preflight import checks

    return ["--skip", ",".join(n for n, c in checks.catalogue().items() if c.probe is None)]


def bundle_size() -> Dict[str, int]:
    """The probe bundle each node is sent: zip bytes, files, and the uncompressed size."""
    import zipfile
    from io import BytesIO

    from preflight.transport import bundle

    blob = bundle.base_zip()
    infos = zipfile.ZipFile(BytesIO(blob)).infolist()
    return {"bytes": len(blob), "files": len(infos), "uncompressed_bytes": sum(i.file_size for i in infos)}


def ansible_inventory(cluster: Any, path: str) -> str:
    lines = ["[nodes]"]
    for node in cluster.nodes:
        lines.append("%s ansible_host=%s" % (node.name, node.mgmt_ip))
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        "ansible_ssh_private_key_file=%s" % cluster.identity_file,
        "ansible_python_interpreter=python3",  # the node's bin/python3, first on the session PATH
    ]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def _ip(argv: List[str]) -> str:
    return subprocess.run(["ip"] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True).stdout


def pin_neighbours(cluster: Any, mesh: bool = False) -> None:
    """Permanent ARP entries controller <-> nodes, and node <-> ring neighbours on the data network;
    with mesh, also every node <-> every other node on the management network (Slurm: slurmd forwards a
    step launch to other slurmds along its tree, TreeWidth wide, so nodes talk to each other).

    On one Linux bridge with hundreds of ports, a 256-way fan-out starts with 256 broadcast ARP
    requests, each copied to every port: the kernel's per-CPU backlog (net.core.netdev_max_backlog,
    1000 by default) overflows, replies are lost and a random node fails with "no route to host"
    after ARP's 3 s. Real switches do not drop like that, so the benchmark takes ARP out of the way.
    """
    import concurrent.futures

    def mac(ns: str) -> str:
        return json.loads(_ip(["-n", ns, "-j", "link", "show", "eth0"]))[0]["address"]

    nodes = cluster.nodes
    entry = "neigh replace %s lladdr %s dev %s nud permanent"

    def batch(ns: str, lines: List[str]) -> None:
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ctl_mac = mac(cluster.ctl_ns)
        macs = list(pool.map(mac, [node.ns for node in nodes]))
        data = list(pool.map(lambda node: json.loads(_ip(["-n", node.ns, "-j", "link", "show", "eth1"]))[0]["address"], nodes))
        batch(cluster.ctl_ns, [entry % (node.mgmt_ip, m, "eth0") for node, m in zip(nodes, macs)])
        jobs = []
        for i, node in enumerate(nodes):
            lines = [entry % (cluster.ctl_mgmt_ip, ctl_mac, "eth0")]
            # the mtu check pings ring neighbours (inventory order) over the data network
            for j in {(i + 1) % len(nodes), (i - 1) % len(nodes)} - {i}:
                lines.append(entry % (nodes[j].data_ip, data[j], "eth1"))
            if mesh:
                lines.extend(entry % (other.mgmt_ip, m, "eth0") for other, m in zip(nodes, macs) if other is not node)
            jobs.append((node.ns, lines))
        list(pool.map(lambda job: batch(*job), jobs))


def nodes_cpu_s(cluster: Any) -> float:
    """CPU seconds the nodes' SSH sessions used (sshd, shell, python), as reaped by each node's sshd listener.

    Children's times (cutime + cstime in /proc/PID/stat) of every listener: exact for the simulated
    nodes, and blind to whatever else runs on the machine.
    """
    total = 0
    for node in cluster.nodes:
        try:
            with open("/proc/%d/stat" % node.sshd.pid) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[13]) + int(fields[14])
        except (OSError, AttributeError, IndexError):
            pass
    return total / float(CLK_TCK)


def softnet_drops() -> int:
    """Packets the kernel dropped from its per-CPU input backlogs so far (/proc/net/softnet_stat)."""
    with open("/proc/net/softnet_stat") as fh:
        return sum(int(line.split()[1], 16) for line in fh)


def ssh_options(cluster: Any) -> str:
    return (
        "-F /dev/null -i %s -o UserKnownHostsFile=%s -o GlobalKnownHostsFile=/dev/null "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10" % (cluster.identity_file, cluster.known_hosts)
    )


class Runner:
    """Builds and runs each tool's command in the controller namespace, and checks what it did.

    variants: {name: argv prefix} of other preflight builds (a patched copy) timed as tools
    `name` (all node checks) and `name-ssh`, next to the installed one.
    """

    def __init__(self, cluster: Any, work: str, parallel: int, ansible: Optional[str], selection: List[str],
                 variants: Optional[Dict[str, List[str]]] = None, gpus_per_node: int = 0,
                 connect_timeout: float = 5) -> None:
        self.c = cluster
        self.variants = variants or {}
        self.work = work
        self.parallel = parallel
        self.ansible = ansible
        self.selection = selection
        self.inv = cluster.inventory(path=os.path.join(work, "hosts.yaml"), gpus_per_node=gpus_per_node,
                                     connect_timeout=connect_timeout, command_timeout=max(30, 2 * connect_timeout))
        self.ansible_inv = ansible_inventory(cluster, os.path.join(work, "ansible.ini"))
        self.n = len(cluster.nodes)
        self.time_bin = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
        self.seq = 0

    # commands ---------------------------------------------------------------------------------
    def command(self, tool: str, parallel: Optional[int] = None) -> Dict[str, Any]:
        self.seq += 1
        out = os.path.join(self.work, "%s-%d.json" % (tool, self.seq))
        env = dict(os.environ)
        j = parallel or self.parallel
        base = tool[:-4] if tool.endswith("-ssh") else tool
        if base == "preflight" or base in self.variants:
            sel = ["--only", "ssh"] if tool.endswith("-ssh") else self.selection
            prefix = preflight_argv() if base == "preflight" else self.variants[base]
            argv = prefix + ["check", self.inv, "--no-progress", "--json", out, "-j", str(j)] + sel
        elif tool == "pdsh":
            env["PDSH_SSH_ARGS"] = ssh_options(self.c) + " -a -x -l%u %h"
            env["PDSH_SSH_ARGS_APPEND"] = ""
            hosts = ",".join(node.mgmt_ip for node in self.c.nodes)
            argv = ["pdsh", "-S", "-R", "ssh", "-f", str(j), "-l", "root", "-w", hosts, "python3 -c pass && echo ok"]
        elif tool == "ansible":
            if not self.ansible:
                raise ToolFailed("ansible not found")
            home = os.path.join(self.work, "ansible-home")
            env.update(
                ANSIBLE_HOME=home,
                ANSIBLE_LOCAL_TEMP=os.path.join(home, "tmp"),
                ANSIBLE_HOST_KEY_CHECKING="True",
                # no ControlMaster: no ssh master outlives a run, so no run reuses another's connections
                ANSIBLE_SSH_ARGS=ssh_options(self.c) + " -o ControlMaster=no",
                ANSIBLE_PIPELINING="True",
                ANSIBLE_FORKS=str(j),
                ANSIBLE_NOCOLOR="1",
                ANSIBLE_LOAD_CALLBACK_PLUGINS="0",
                ANSIBLE_DEPRECATION_WARNINGS="False",
                ANSIBLE_PYTHON_INTERPRETER="python3",
            )
            env.pop("ANSIBLE_CONFIG", None)
            argv = [self.ansible, "all", "-i", self.ansible_inv, "-m", "shell", "-a", "python3 -c pass", "-f", str(j), "-o"]
        else:
            raise ValueError(tool)
        return {"argv": argv, "env": env, "out": out}

    # one measured run -------------------------------------------------------------------------
    def measure(self, tool: str, parallel: Optional[int] = None) -> Dict[str, Any]:
        cmd = self.command(tool, parallel)
        timefile = os.path.join(self.work, "time-%d.txt" % self.seq)
        argv = cmd["argv"]
        if self.time_bin:
            argv = [self.time_bin, "-f", TIME_FORMAT, "-o", timefile] + argv
        else:  # a dedicated child whose RUSAGE_CHILDREN is exactly the tool's process tree
            wrapper = (
                "import resource,subprocess,sys,time\n"
                "t=time.monotonic();rc=subprocess.call(sys.argv[2:]);w=time.monotonic()-t\n"
                "r=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                "open(sys.argv[1],'w').write('%d %.3f %.3f %.3f\\n'%(r.ru_maxrss,w,r.ru_utime,r.ru_stime))\n"
                "sys.exit(rc)\n"
            )
            argv = [sys.executable, "-c", wrapper, timefile] + argv
        load = os.getloadavg()[0]
        box0, drops0, nodes0 = box_cpu_s(), softnet_drops(), nodes_cpu_s(self.c)
        t0 = time.monotonic()
        proc = self.c.ctl(argv, env=cmd["env"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=1800)
        wall = time.monotonic() - t0
        box = box_cpu_s() - box0
        time.sleep(0.3)  # let the nodes' sshd reap the sessions the tool just closed
        node_cpu = nodes_cpu_s(self.c) - nodes0
        rss_kib, _, user, system = parse_time(timefile, proc.stderr)
        row = {
            "nodes": self.n, "tool": tool, "parallel": parallel or self.parallel, "rc": proc.returncode,
            "wall_s": round(wall, 3), "cpu_s": round(user + system, 3), "user_s": user, "sys_s": system,
            "peak_rss_mib": round(rss_kib / 1024.0, 1), "box_cpu_s": round(box, 2),
            "node_cpu_s": round(node_cpu, 2), "softnet_drops": softnet_drops() - drops0, "load1": round(load, 1),
        }
        self.verify(tool, proc, cmd["out"], row)
        return row

    def verify(self, tool: str, proc: subprocess.CompletedProcess, out: str, row: Dict[str, Any]) -> None:
        """Raise ToolFailed unless the run reached every node; note preflight's own timings."""
        tail = (proc.stderr or proc.stdout or "").strip()[-800:]
        if tool not in ("pdsh", "ansible"):
            if proc.returncode not in (0, 1) or not os.path.exists(out):
                raise ToolFailed("%s exited %s: %s" % (tool, proc.returncode, tail))
            with open(out) as fh:
                doc = json.load(fh)
            ssh_pass = {r["node"] for r in doc["results"] if r["check"] == "ssh" and r["status"] == "pass"}
            if len(ssh_pass) != self.n:
                bad = [r for r in doc["results"] if r["check"] == "ssh" and r["status"] != "pass"][:3]
                raise ToolFailed("%s reached %d of %d nodes: %s" % (tool, len(ssh_pass), self.n, bad))
            row["engine_s"] = doc.get("duration_s")
            row["phase_times_s"] = doc.get("phase_times_s")
            row["summary"] = doc.get("summary")
            row["checks"] = doc.get("checks")
            problems = [r for r in doc["results"] if r["status"] in ("fail", "error")]
            if problems:  # kept for the record: on simulated nodes every check should pass or skip
                row["problems"] = [{k: r.get(k) for k in ("check", "node", "status", "message")} for r in problems[:5]]
                log("  note: %s had %d fail/error findings, e.g. %s" % (tool, len(problems), row["problems"][0]))
            os.unlink(out)
        elif tool == "pdsh":
            ok = sum(1 for line in proc.stdout.splitlines() if line.rstrip().endswith(": ok"))
            if proc.returncode != 0 or ok != self.n:
                raise ToolFailed("pdsh exited %s with %d of %d ok: %s" % (proc.returncode, ok, self.n, tail))
        elif tool == "ansible":
            ok = sum(1 for line in proc.stdout.splitlines() if "| CHANGED | rc=0" in line)
            if proc.returncode != 0 or ok != self.n:
                raise ToolFailed("ansible exited %s with %d of %d ok: %s" % (proc.returncode, ok, self.n, tail))


def parse_time(path: str, stderr: str) -> List[float]:
    try:
        with open(path) as fh:
            fields = fh.read().strip().splitlines()[-1].split()
        return [float(f) for f in fields[:4]]
    except (OSError, IndexError, ValueError):
        raise ToolFailed("no resource figures (%s): %s" % (path, (stderr or "").strip()[-300:])) from None


def box_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every namespace), from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # minus idle and iowait
    return busy / float(CLK_TCK)


# --- the benchmark -------------------------------------------------------------------------------


def bench_size(n: int, args: argparse.Namespace, tools: List[str], selection: List[str], ansible: Optional[str],
               variants: Dict[str, List[str]]) -> Dict[str, Any]:
    from tests.sim.cluster import SimCluster

    work = tempfile.mkdtemp(prefix="pf-fanout-%d-" % n)
    result: Dict[str, Any] = {"nodes": n, "runs": [], "sweep": []}
    try:
        t0 = time.monotonic()
        with SimCluster(n, start_timeout=args.start_timeout or max(60.0, 0.5 * n)) as cluster:
            result["cluster_start_s"] = round(time.monotonic() - t0, 2)
            pin_neighbours(cluster)
            log("%d nodes: cluster up in %.1f s" % (n, result["cluster_start_s"]))
            if args.hardware == "hgx":
                present_hgx(cluster)
            runner = Runner(cluster, work, args.parallel, ansible, selection, variants,
                            gpus_per_node=8 if args.hardware == "hgx" else 0, connect_timeout=args.connect_timeout)
            for _ in range(args.warmup):
                for tool in tools:
                    runner.measure(tool)
            for rep in range(args.repeat):
                order = tools[rep % len(tools):] + tools[: rep % len(tools)]  # rotate: no tool always goes first
                for tool in order:
                    row = runner.measure(tool)
                    row["repeat"] = rep
                    result["runs"].append(row)
                    log("  %-14s %7.2f s  cpu %6.2f s  rss %6.1f MiB" % (tool, row["wall_s"], row["cpu_s"], row["peak_rss_mib"]))
            if args.sweep_size == n:
                for rep in range(args.repeat):
                    for j in args.sweep_parallel:
                        row = runner.measure("preflight", parallel=j)
                        row["repeat"] = rep
                        result["sweep"].append(row)
                        log("  preflight -j %-4d %6.2f s  cpu %6.2f s" % (j, row["wall_s"], row["cpu_s"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def present_hgx(cluster: Any) -> None:
    """Every node an HGX H100 through the simulator's real interfaces (tests.sim.pci_hw.install_hgx_h100)."""
    from tests.sim import pci_hw

    for node in cluster.nodes:
        pci_hw.install_hgx_h100(node)


def summarise(runs: List[Dict[str, Any]], key: str = "tool") -> List[Dict[str, Any]]:
    groups: Dict[Any, List[Dict[str, Any]]] = {}
    for row in runs:
        groups.setdefault((row["nodes"], row[key]), []).append(row)
    rows = []
    for (n, k), group in groups.items():
        med = lambda f: statistics.median(r[f] for r in group)  # noqa: E731
        row = {
            "nodes": n, key: k, "repeats": len(group), "wall_s": round(med("wall_s"), 3),
            "wall_min_s": min(r["wall_s"] for r in group), "wall_max_s": max(r["wall_s"] for r in group),
            "cpu_s": round(med("cpu_s"), 3), "peak_rss_mib": max(r["peak_rss_mib"] for r in group),
            "box_cpu_s": round(med("box_cpu_s"), 2), "node_cpu_s": round(med("node_cpu_s"), 2),
            "load1": round(med("load1"), 1),
        }
        if all(r.get("engine_s") is not None for r in group):
            row["engine_s"] = round(statistics.median(r["engine_s"] for r in group), 3)
            for phase in ("phase1_s", "phase2_s"):
                if all(phase in (r.get("phase_times_s") or {}) for r in group):
                    row[phase] = round(statistics.median(r["phase_times_s"][phase] for r in group), 3)
        if key != "tool":
            row["tool"] = group[0]["tool"]
        rows.append(row)
    for row in rows:
        base = [r for r in rows if r["nodes"] == row["nodes"] and r.get("tool") == "pdsh" and key == "tool"]
        if base:
            row["ratio_to_pdsh"] = round(row["wall_s"] / base[0]["wall_s"], 2)
    return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    head = ("| nodes | tool | median wall s (min–max) | × pdsh | CPU s | CPU ms/node | wall ms/node "
            "| peak RSS MiB | nodes' CPU s | engine s (phase 1 / 2) | load |")
    lines = [head, "|" + "---|" * 11]
    order = {t: i for i, t in enumerate(TOOLS)}
    order.update(pdsh=90, ansible=91)
    for r in sorted(rows, key=lambda r: (r["nodes"], order.get(r["tool"], 50), r["tool"])):
        lines.append("| %d | %s | %.2f (%.2f–%.2f) | %s | %.2f | %.1f | %.1f | %.0f | %.1f | %s | %.1f |" % (
            r["nodes"], r["tool"], r["wall_s"], r["wall_min_s"], r["wall_max_s"],
            "%.2f" % r["ratio_to_pdsh"] if "ratio_to_pdsh" in r else "–",
            r["cpu_s"], 1000.0 * r["cpu_s"] / r["nodes"], 1000.0 * r["wall_s"] / r["nodes"],
            r["peak_rss_mib"], r["node_cpu_s"], engine_cell(r), r["load1"]))
    return "\n".join(lines)


def engine_cell(r: Dict[str, Any]) -> str:
    """preflight's own engine time (connect + gather + rules, from its JSON report), with its phases."""
    if "engine_s" not in r:
        return "–"
    phases = " / ".join("%.2f" % r[p] for p in ("phase1_s", "phase2_s") if p in r)
    return "%.2f (%s)" % (r["engine_s"], phases) if phases else "%.2f" % r["engine_s"]


def sweep_markdown(rows: List[Dict[str, Any]]) -> str:
    lines = ["| nodes | --parallel | median wall s (min–max) | CPU s | peak RSS MiB | nodes' CPU s | load |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["parallel"]):
        lines.append("| %d | %d | %.2f (%.2f–%.2f) | %.2f | %.0f | %.1f | %.1f |" % (
            r["nodes"], r["parallel"], r["wall_s"], r["wall_min_s"], r["wall_max_s"], r["cpu_s"], r["peak_rss_mib"],
            r["node_cpu_s"], r["load1"]))
    return "\n".join(lines)


def machine() -> Dict[str, Any]:
    def version(argv: List[str]) -> str:
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
            return (p.stdout.strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired):
            return "not found"

    model = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "?")
    except OSError:
        pass
    import preflight

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(), "preflight": preflight.__version__,
        "openssh": version(["ssh", "-V"]), "pdsh": version(["pdsh", "-V"]),
    }


def log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _ints(text: str) -> List[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=_ints, default=[8, 32], help="cluster sizes, comma-separated (default 8,32)")
    p.add_argument("--repeat", type=int, default=3, help="measured runs per tool and size (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds per size first (default 1)")
    p.add_argument("--parallel", type=int, default=64, help="fan-out width for every tool (default 64)")
    p.add_argument("--tools", default=",".join(TOOLS), help="subset of %s (and --variant names)" % ",".join(TOOLS))
    p.add_argument("--sweep-size", type=int, help="also time preflight at several --parallel on this size (one of --nodes)")
    p.add_argument("--sweep-parallel", type=_ints, default=[16, 32, 64, 128])
    p.add_argument("--start-timeout", type=float, help="SimCluster start timeout (default max(60, 0.5 s × nodes))")
    p.add_argument("--ansible", help="path of the ansible executable")
    p.add_argument("--connect-timeout", type=float, default=5,
                   help="every node's connect_timeout in preflight's inventory (default 5 s; a box loaded by other "
                        "jobs may need 30: a node that misses it fails the run). command_timeout: twice it, 30 s at least")
    p.add_argument("--hardware", choices=("cpu", "hgx"), default="cpu",
                   help="cpu: CPU-only nodes (default); hgx: every node a simulated HGX H100 (8 GPUs, 2 HCAs)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=COMMAND",
                   help="also time another preflight build, e.g. patched='python3 /tmp/pf-exp/run_preflight.py' "
                        "(tools NAME and NAME-ssh; repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write every run and the summary here")
    args = p.parse_args(argv)
    variants: Dict[str, List[str]] = {}
    for spec in args.variant:
        name, sep, command = spec.partition("=")
        if not sep or not name or name in TOOLS or name.endswith("-ssh") or not shlex.split(command):
            p.error("--variant wants NAME=COMMAND with a new NAME, got %r" % spec)
        variants[name] = shlex.split(command)
    known = list(TOOLS) + [t for name in variants for t in (name, name + "-ssh")]
    tools = [t for t in args.tools.split(",") if t]
    unknown = [t for t in tools if t not in known]
    if unknown or args.repeat < 1:
        p.error("unknown tools %s (choose from %s)" % (unknown, ",".join(known)) if unknown else "--repeat must be at least 1")
    for name in variants:  # not named in --tools: timed next to the installed preflight's rows
        if name not in tools and name + "-ssh" not in tools:
            for own, alias in (("preflight", name), ("preflight-ssh", name + "-ssh")):
                if own in tools:
                    tools.insert(tools.index(own) + 1, alias)
    if os.geteuid() != 0:
        p.error("needs root (network namespaces)")
    if args.sweep_size and args.sweep_size not in args.nodes:
        p.error("--sweep-size must be one of --nodes")
    notes: List[str] = []
    ansible = find_ansible(args.ansible)
    if "ansible" in tools and not ansible:
        notes.append("ansible not found: its rows are left out (see the docstring to install it)")
        tools.remove("ansible")
    if "pdsh" in tools and not shutil.which("pdsh"):
        p.error("pdsh not found (apt-get install pdsh)")
    selection = check_selection()
    size = bundle_size()
    info = machine()
    if ansible:
        info["ansible"] = subprocess.run([ansible, "--version"], stdout=subprocess.PIPE, text=True).stdout.splitlines()[0]
    for note in notes:
        log("note: " + note)

    results: List[Dict[str, Any]] = []
    failed: Optional[str] = None
    for n in args.nodes:
        try:
            results.append(bench_size(n, args, tools, selection, ansible, variants))
        except ToolFailed as exc:
            failed = "%d nodes: %s" % (n, exc)
            log("FAILED: " + failed)
            break
    runs = [r for res in results for r in res["runs"]]
    sweep = [r for res in results for r in res["sweep"]]
    summary = summarise(runs)
    sweep_summary = summarise(sweep, key="parallel") if sweep else []
    print("preflight fan-out benchmark · %s · %d CPUs (%s) · python %s · %s" % (
        info["date"], info["cpus"], info["cpu_model"], info["python"], info["openssh"]))
    print("median of %d runs, tools interleaved; -f/-j %d. CPU s: the tool's process tree (/usr/bin/time); "
          "nodes' CPU s: the simulated nodes' sshd+shell+python for that run; load: 1-min load average "
          "before the run (the nodes share this machine's cores)\n" % (args.repeat, args.parallel))
    print(markdown(summary))
    print("\nprobe bundle (this tree): %d bytes zipped, %d files, %d bytes unzipped" % (
        size["bytes"], size["files"], size["uncompressed_bytes"]))
    if sweep_summary:
        print("\npreflight (all node checks) by --parallel\n")
        print(sweep_markdown(sweep_summary))
    for res in results:
        print("\ncluster of %d nodes started in %.1f s" % (res["nodes"], res["cluster_start_s"]), end="")
    print()
    for note in notes:
        print("note: " + note)
    if args.json:
        doc = {"machine": info, "args": vars(args), "notes": notes, "failed": failed, "bundle": size,
               "summary": summary, "parallel_sweep": sweep_summary, "runs": runs + sweep,
               "clusters": [{k: v for k, v in res.items() if k in ("nodes", "cluster_start_s")} for res in results]}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    if failed:
        print("FAILED: " + failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

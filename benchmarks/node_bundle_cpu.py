#!/usr/bin/env python3
"""CPU of one node's phase-1 bundle run (what each Slurm task or SSH session runs), several trees side by side.

    python3 benchmarks/node_bundle_cpu.py --runs 11 /work/wt/base6910 .         # before / after
    python3 benchmarks/node_bundle_cpu.py --profile /tmp/p1.prof .               # cProfile, every thread

For each tree: `preflight node` is run once in-process with that tree first on sys.path, and the stdin payload its
local transport sends the bundle for phase 1 (the config line, then the zipped bundle) is kept. Then, rounds
interleaved, each tree's payload is replayed into `python3 [FLAGS] -c BOOTSTRAP` (that tree's bootstrap and flags,
-S from issue 38's last cut on; its own session:
the bootstrap kills its process group on EOF) and the CPU of the whole process tree (getrusage of the reaped
children: python, ip, sh, ldconfig, ...) and the wall are taken; beside them the floor, `python3 -c pass`.
Printed: median CPU, its ratio to the floor's and the difference; beside them `python3 -S -c pass` (no site: what
the interpreter costs without this machine's site-packages .pth files, which the floor and every tree pay alike). This machine's checks (no GPU here: the gpu
probes find no driver) stand for a simulated node's; the Slurm simulator's nodes have none either.
--pci-functions N: the runs read a sysfs root (PREFLIGHT_SYSFS_ROOT) that is this machine's /sys but for a PCI bus of N
functions (8 GPUs, 4 NVSwitches, 8 ConnectX HCAs, the rest bridges: vendor and class files), for the probes that
walk the bus as on a GPU node (a GB200 tray's lspci lists 87 functions: leptonai/gpud testdata lspci.gb200).
--profile PATH: one run under cProfile, every thread's profile merged (threading.Thread._bootstrap_inner wrapped), written
to PATH and its top functions printed by cumulative time.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time

CAPTURE = r'''
import sys
tree, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
from preflight.transport import bundle
real = bundle.stdin_payload
def keep(config, *a, **k):
    payload = real(config, *a, **k)
    if '"ssh"' in payload.split(b"\n", 1)[0].decode():  # phase 1: the config naming the ssh probe
        with open(out, "wb") as fh:
            fh.write(payload)
    return payload
bundle.stdin_payload = keep
from preflight.cli import main
sys.argv = ["preflight", "node", "--only", "ssh,gpu,driver,nic,ib_hca"] if "--short" in sys.argv else ["preflight", "node"]
main()
'''

PROFILED = (
    "import cProfile,os,sys,threading,time\npr=cProfile.Profile(time.thread_time);_e=os._exit;_P=[]\n_r=threading.Thread._bootstrap_inner\n"
    "def _run(self):\n p=cProfile.Profile(time.thread_time);_P.append(p);p.enable()\n try:_r(self)\n finally:p.disable()\n"
    "threading.Thread._bootstrap_inner=_run\n"
    "def _d(o):\n import pstats;pr.create_stats();s=pstats.Stats(pr)\n for p in _P:\n  p.create_stats();s.add(p)\n"
    " s.dump_stats(o)\n"
    "def _x(c):\n pr.disable();_d(%r);_e(c)\n"
    "os._exit=_x\npr.enable()\ntry:\n exec(compile(%r,'<bootstrap>','exec'),{'__name__':'__main__'})\n"
    "finally:\n pr.disable();_d(%r)\n")


def pci_root(scratch: str, count: int) -> str:
    """A sysfs root: /sys's entries linked, but bus/pci/devices holding `count` synthetic functions."""
    root = os.path.join(scratch, "sys")
    os.makedirs(os.path.join(root, "bus", "pci", "devices"))
    for name in os.listdir("/sys"):
        if name not in ("bus", "devices"):
            os.symlink(os.path.join("/sys", name), os.path.join(root, name))
    for name in os.listdir("/sys/bus"):
        if name != "pci":
            os.symlink(os.path.join("/sys/bus", name), os.path.join(root, "bus", name))
    kinds = [("0x10de", "0x030200")] * 8 + [("0x10de", "0x068000")] * 4 + [("0x15b3", "0x020700")] * 8
    for i in range(count):
        vendor, klass = kinds[i] if i < len(kinds) else ("0x8086", "0x060400")
        bdf = "0000:%02x:00.0" % (i + 1)
        real = os.path.join(root, "devices", "pci0000:00", bdf)
        os.makedirs(real)
        for attr, text in (("vendor", vendor), ("class", klass)):
            with open(os.path.join(real, attr), "w") as fh:
                fh.write(text + "\n")
        os.symlink(os.path.join("..", "..", "..", "devices", "pci0000:00", bdf), os.path.join(root, "bus", "pci", "devices", bdf))
    return root


def bootstrap(tree: str) -> list:
    """The tree's bootstrap command line after the interpreter: its FLAGS (none before -S) and `-c BOOTSTRAP` (read
    from its file: two trees' modules cannot share one process)."""
    ns: dict = {}
    with open(os.path.join(tree, "preflight", "transport", "bootstrap.py")) as fh:
        exec(compile(fh.read(), "bootstrap.py", "exec"), ns)
    return list(ns.get("FLAGS", ())) + ["-c", ns["BOOTSTRAP"]]


def capture(tree: str, scratch: str) -> bytes:
    out = os.path.join(scratch, "payload-%d" % abs(hash(tree)))
    subprocess.run([sys.executable, "-c", CAPTURE, tree, out], cwd=scratch, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, start_new_session=True)
    with open(out, "rb") as fh:
        return fh.read()


def once(argv, payload: bytes, env=None):
    """(CPU ms of the whole process tree, wall ms) of one run fed payload; stdin closed after the result."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd="/", start_new_session=True, env=env)
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        out = b""
        while True:  # until the result's lines stop coming: from there an EOF is the controller done with it
            seen = b"preflight-result" in out and out.endswith(b"\n")
            if not select.select([proc.stdout], [], [], 0.5 if seen else 120)[0]:
                break
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
        proc.stdin.close()
    except BrokenPipeError:  # the floor reads no stdin
        pass
    proc.stdout.read()
    proc.wait()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime), 1000 * (time.monotonic() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", help="directories holding a preflight package")
    ap.add_argument("--runs", type=int, default=9, help="interleaved rounds (median printed)")
    ap.add_argument("--profile", metavar="PATH", help="profile one run of the first tree instead")
    ap.add_argument("--top", type=int, default=40, help="functions printed from the profile")
    ap.add_argument("--pci-functions", type=int, metavar="N", help="a PCI bus of N functions (see above)")
    args = ap.parse_args(argv)
    trees = [os.path.abspath(t) for t in args.trees]
    with tempfile.TemporaryDirectory() as scratch:
        payloads = {t: capture(t, scratch) for t in trees}
        env = dict(os.environ, PREFLIGHT_SYSFS_ROOT=pci_root(scratch, args.pci_functions)) if args.pci_functions else None
        return measure(args, trees, payloads, env)


def measure(args, trees, payloads, env) -> int:
    """Profile one run, or time the interleaved rounds and print the table."""
    if args.profile:
        tree = trees[0]
        flags, text = bootstrap(tree)[:-2], bootstrap(tree)[-1]
        cpu, wall = once([sys.executable] + flags + ["-c", PROFILED % (args.profile, text, args.profile)], payloads[tree], env)
        import pstats

        print("profiled run: CPU %.0f ms, wall %.0f ms (cProfile's overhead included)" % (cpu, wall))
        stats = pstats.Stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
        return 0
    rows = ["floor", "nosite"] + trees
    cpu = {t: [] for t in rows}
    wall = {t: [] for t in rows}
    for _ in range(args.runs):
        for row, flags in (("floor", []), ("nosite", ["-S"])):
            c, w = once([sys.executable] + flags + ["-c", "pass"], b"")
            cpu[row].append(c)
            wall[row].append(w)
        for t in trees:
            c, w = once([sys.executable] + bootstrap(t), payloads[t], env)
            cpu[t].append(c)
            wall[t].append(w)
    floor = statistics.median(cpu["floor"])
    print("phase-1 bundle run on this machine%s, median of %d interleaved rounds; load average %s" % (
        " (a PCI bus of %d functions)" % args.pci_functions if args.pci_functions else "", args.runs,
        " ".join("%.1f" % x for x in os.getloadavg())))
    names = {"floor": "python3 -c pass (floor)", "nosite": "python3 -S -c pass (no site)"}
    for t in rows:
        c = statistics.median(cpu[t])
        paired = statistics.median(a - b for a, b in zip(cpu[t], cpu["floor"]))  # each round's own floor
        print("%-40s CPU %5.0f ms  %.2fx floor  %+5.0f ms (paired %+5.0f)   wall %5.0f ms" % (
            names.get(t, t), c, c / floor, c - floor, paired, statistics.median(wall[t])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which tests import torch, and how often: a pytest run with every open of libtorch_cpu.so (one per torch
import) traced to its test.

    sudo python3 benchmarks/suite_torch_imports.py                      # the whole suite
    sudo python3 benchmarks/suite_torch_imports.py -- tests/probe -n 3  # any pytest arguments after --

On CI's 2 cores the suite is CPU-bound and a rank's torch import is its largest single cost (2.2-2.7 CPU-s
each here), so this is where the suite's time goes. Linux fanotify (root) reports each open with the opener's
pid; the test is read from the process's PYTEST_CURRENT_TEST (ranks started by the test process itself), else
from its network namespace: a plugin records the test that started each simulated cluster (tests/sim), whose
nodes' namespaces carry its prefix. Prints the imports per module and per test, then the machine's CPU seconds
over the run and what that many imports cost at this machine's measured import CPU.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLUGIN = '''
import os


def pytest_configure(config):
    from tests.sim import cluster

    start = cluster.SimCluster.start

    def logged(self, *args, **kwargs):
        with open(os.environ["SUITE_IMPORTS_PREFIXES"], "a") as fh:
            fh.write("%s\\t%s\\n" % (self.prefix, os.environ.get("PYTEST_CURRENT_TEST", "?")))
        return start(self, *args, **kwargs)

    cluster.SimCluster.start = logged
'''


def libtorch() -> str:
    out = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                          "print(u.find_spec('torch').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return os.path.join(out, "lib", "libtorch_cpu.so")


def watch(path: str, events: list, stop: threading.Event) -> None:
    """Append (pid, cluster prefix or None, test or None) for each open of path until stop is set."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    fd = libc.fanotify_init(0x4, os.O_RDONLY)  # FAN_CLASS_NOTIF | FAN_NONBLOCK
    if fd < 0 or libc.fanotify_mark(fd, 1, 0x20, -100, path.encode()) != 0:  # FAN_MARK_ADD, FAN_OPEN
        raise SystemExit("fanotify: %s (run as root)" % os.strerror(ctypes.get_errno()))
    while not stop.is_set():
        try:
            buf = os.read(fd, 8192)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        at = 0
        while at < len(buf):
            length, _v, _r, _m, _mask, efd, pid = struct.unpack_from("IBBHQii", buf, at)
            at += length
            if efd >= 0:
                os.close(efd)
            events.append((pid,) + _whose(pid))


def _whose(pid: int):
    """(the simulated cluster prefix of the opener's namespace or None, its PYTEST_CURRENT_TEST's test or None),
    read while the opener runs: a namespace's inode is reused once it is gone."""
    try:
        ns = os.stat("/proc/%d/ns/net" % pid).st_ino
    except OSError:
        return None, None
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
    except OSError:
        env = {}
    test = env.get(b"PYTEST_CURRENT_TEST")
    return netns_prefix(ns), _test_name(test.decode(errors="replace")) if test else None


def _test_name(current: str) -> str:
    return current.rsplit(" (", 1)[0]  # PYTEST_CURRENT_TEST ends in " (setup)", " (call)" or " (teardown)"


def netns_prefix(inode: int):
    """The simulated cluster prefix of the named namespace with this inode ({prefix}-nNNN), or None."""
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else ():
        try:
            if os.stat("/run/netns/" + name).st_ino == inode:
                return name.rsplit("-", 1)[0]
        except OSError:
            pass
    return None


def busy_cpu_s() -> float:
    with open("/proc/stat") as fh:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fh.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def import_cpu_s(runs: int = 5) -> float:
    """The median CPU seconds of `import torch, torch.distributed` inside one process, here and now."""
    code = "import time; t = time.process_time(); import torch, torch.distributed; print(time.process_time() - t)"
    took = sorted(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout) for _ in range(runs))
    return took[runs // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=25, help="tests listed (default 25)")
    ap.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the whole suite)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-imports-") as tmp:
        return report(args, tmp)


def report(args: argparse.Namespace, tmp: str) -> int:
    """Run pytest with the plugin (written into tmp) under the watch, then print the counts."""
    with open(os.path.join(tmp, "suite_imports_plugin.py"), "w") as fh:
        fh.write(PLUGIN)
    prefixes_log = os.path.join(tmp, "prefixes.tsv")
    events, stop = [], threading.Event()
    watcher = threading.Thread(target=watch, args=(libtorch(), events, stop), daemon=True)
    watcher.start()
    env = dict(os.environ, SUITE_IMPORTS_PREFIXES=prefixes_log,
               PYTHONPATH=os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p))
    cpu0, t0 = busy_cpu_s(), time.monotonic()
    rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_imports_plugin", "-p", "no:cacheprovider"]
                        + args.pytest_args, cwd=REPO, env=env).returncode
    cpu, wall = busy_cpu_s() - cpu0, time.monotonic() - t0
    stop.set()
    watcher.join(2)
    events = list(events)  # a snapshot: should the watcher outlive join's 2 s, import_cpu_s() opens the library too
    test_of = {}
    if os.path.exists(prefixes_log):
        with open(prefixes_log) as fh:
            test_of = {prefix: _test_name(test) for prefix, test in
                       (line.rstrip("\n").split("\t", 1) for line in fh if "\t" in line)}
    per_test = collections.Counter()
    for _pid, prefix, test in events:
        per_test[test or test_of.get(prefix or "", "(not traced)")] += 1
    per_module = collections.Counter()
    for test, n in per_test.items():
        per_module[test.split("::")[0]] += n
    each = import_cpu_s()
    print("\ntorch imports: %d in %.0f s (pytest exit %d)" % (len(events), wall, rc))
    # at most: a rank stopped mid-import (a warm rank or spare nobody adopted) paid only part of it
    print("machine CPU over the run: %.0f CPU-s; %d imports at %.2f CPU-s each (measured now, in-process): at most "
          "%.0f CPU-s (%.0f%%)" % (cpu, len(events), each, len(events) * each, 100.0 * len(events) * each / max(cpu, 1e-9)))
    print("\nper module:")
    for module, n in per_module.most_common():
        print("  %4d  %s" % (n, module))
    print("\nper test (top %d):" % args.top)
    for test, n in per_test.most_common(args.top):
        print("  %4d  %s" % (n, test))
    return rc


if __name__ == "__main__":
    sys.exit(main())

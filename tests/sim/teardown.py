"""Removing what the simulator built: every process in its namespaces, the namespaces, stale clusters.

teardown() is what SimCluster.stop() runs; cleanup_stale() removes what crashed test sessions left
(a cluster whose owner process is gone), leaving concurrently running sessions' clusters alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

from .base import BASE_DIR, PREFIX_BASE, SimError, ip_batch
from .netns import cmdline, list_netns, netns_id, pids_by_netns

_NS_RE = re.compile(r"^(%s\w*)-(sw|ctl|n\d+)$" % PREFIX_BASE)


def proc_starttime(pid: int) -> Optional[str]:
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _kill_namespace_processes(ids: List[Tuple[int, int]], rounds: int = 100) -> None:
    """SIGKILL everything inside the namespaces until nothing is left (children may fork meanwhile)."""
    for _ in range(rounds):
        pids = [pid for found in pids_by_netns(ids).values() for pid in found]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    raise SimError("processes still alive in simulated namespaces: %s" % pids[:10])


def teardown(names: Sequence[str], popens: Sequence[subprocess.Popen]) -> None:
    ids = []
    present = set(list_netns())
    for name in names:
        if name in present:
            try:
                ids.append(netns_id(name))
            except OSError:
                pass
    for proc in popens:  # our own children first (sshd, listeners, ctl commands): kill and reap
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
    try:
        _kill_namespace_processes(ids)
    finally:
        for proc in popens:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        doomed = [name for name in names if name in present]
        if doomed:
            ip_batch(["netns del %s" % name for name in doomed], force=True)


def cleanup_stale(prefix: str = PREFIX_BASE) -> List[str]:
    """Remove namespaces, processes and directories left by crashed runs; returns the namespaces removed.

    A cluster is stale when its owner process (recorded in BASE_DIR/<prefix>.owner.json) is gone, so
    clusters of concurrently running test sessions are left alone.
    """
    groups: Dict[str, List[str]] = {}
    for name in list_netns():
        m = _NS_RE.match(name)
        if m and m.group(1).startswith(prefix):
            groups.setdefault(m.group(1), []).append(name)
    owners = {}
    if os.path.isdir(BASE_DIR):
        for entry in os.listdir(BASE_DIR):
            if entry.endswith(".owner.json") and entry.startswith(prefix):
                owners[entry[: -len(".owner.json")]] = os.path.join(BASE_DIR, entry)
    removed: List[str] = []
    for cprefix in sorted(set(groups) | set(owners)):
        info = {}
        if cprefix in owners:
            try:
                with open(owners[cprefix]) as fh:
                    info = json.load(fh)
            except (OSError, ValueError):
                info = {}
        pid = info.get("pid")
        if pid and proc_starttime(pid) is not None and proc_starttime(pid) == info.get("start"):
            continue  # owner alive: a live cluster
        root = info.get("root") or os.path.join(BASE_DIR, cprefix)
        # processes whose namespace name is already gone are still found by their command line
        strays = [int(p) for p in os.listdir("/proc") if p.isdigit() and (root + "/") in cmdline(int(p))]
        for stray in strays:
            try:
                os.kill(stray, signal.SIGKILL)
            except ProcessLookupError:
                pass
        names = groups.get(cprefix, [])
        teardown(names, [])
        removed.extend(names)
        if root.startswith(BASE_DIR + "/"):
            shutil.rmtree(root, ignore_errors=True)
        if cprefix in owners:
            try:
                os.unlink(owners[cprefix])
            except OSError:
                pass
    return removed

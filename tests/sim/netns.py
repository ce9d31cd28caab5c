"""Network-namespace helpers: run the current thread inside a named namespace, find its processes.

`in_netns(name)` moves only the calling thread (setns(2) with CLONE_NEWNET) and moves it back on
exit, so in-process code (paramiko, plain sockets) can reach simulated nodes from the controller
namespace. Sockets keep the namespace they were created in; threads started inside the block
inherit it. Linux only; needs CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import subprocess
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"

_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "setns(CLONE_NEWNET): %s" % os.strerror(err))


def netns_path(name: str) -> str:
    """The nsfs file for a namespace name as `ip netns` creates it (or an absolute path as given)."""
    return name if name.startswith("/") else os.path.join(NETNS_RUN_DIR, name)


@contextlib.contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with the current thread in network namespace `name`; restore the original after."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(original)


def netns_id(name: str) -> Tuple[int, int]:
    """(st_dev, st_ino) identifying a named namespace; equal to os.stat('/proc/PID/ns/net') of its members."""
    st = os.stat(netns_path(name))
    return (st.st_dev, st.st_ino)


def pids_by_netns(ids: Iterable[Tuple[int, int]]) -> Dict[Tuple[int, int], List[int]]:
    """Map each namespace id to the live pids inside it, from one pass over /proc.

    The same test `ip netns pids NS` makes (stat of /proc/PID/ns/net), for many namespaces at once.
    Zombies and processes that exit during the scan are skipped.
    """
    wanted = {i: [] for i in ids}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            st = os.stat("/proc/%d/ns/net" % pid)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in wanted:
            wanted[key].append(pid)
    return wanted


def cmdline(pid: int) -> str:
    """A process's command line, space-joined ('' when it is gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def list_netns() -> List[str]:
    """Names from `ip netns list` (empty list when there are none)."""
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         universal_newlines=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


_available: Optional[Tuple[bool, str]] = None


def netns_available() -> Tuple[bool, str]:
    """(True, '') when this process can create network namespaces, else (False, why). Cached."""
    global _available
    if _available is not None:
        return _available
    if os.geteuid() != 0:
        _available = (False, "simulated cluster needs root (network namespaces); running as uid %d" % os.geteuid())
    elif shutil.which("ip") is None:
        _available = (False, "simulated cluster needs `ip` (iproute2) on PATH")
    else:
        probe = "pfsimprobe%d" % os.getpid()
        add = subprocess.run(["ip", "netns", "add", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        subprocess.run(["ip", "netns", "del", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if add.returncode != 0:
            _available = (False, "`ip netns add` does not work here: %s" % add.stdout.strip())
        else:
            _available = (True, "")
    return _available

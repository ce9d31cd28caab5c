"""What a probe may touch on the node: commands, files under the sysfs root, and its configuration.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle.

Hardware is read through the interfaces real hardware uses: executables on PATH (nvidia-smi,
systemctl, ip), files under the sysfs root, and NVML. The sysfs root is /sys unless the environment
sets PREFLIGHT_SYSFS_ROOT (for a probe run inside a container that mounts the host's /sys elsewhere,
e.g. /host/sys). Likewise configuration files the jobs read (/etc/nccl.conf, ~/.nccl.conf) are read
under PREFLIGHT_HOST_ROOT when it is set (a container that mounts the host's / at /host), else from /.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from preflight.model import CommandResult

SYSFS_ENV = "PREFLIGHT_SYSFS_ROOT"
#: How much of one raw output a failed probe sends back with its error (bytes of text, per item).
RAW_CAP = 4096
HOST_ENV = "PREFLIGHT_HOST_ROOT"


class Shared:
    """What the probes of one run share: a command's result computed once (the kernel log that xid and
    ib_errors both search), whichever probe asks first; the others wait for it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: Dict[Any, threading.Lock] = {}
        self._values: Dict[Any, Any] = {}

    def once(self, key: Any, compute: Any) -> Any:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            return self._values[key]


class NodeContext:
    """The probe's window on the node. One per check per probe run; cheap to build. The contexts of one run
    hold the same Shared (the runner passes it), so run_once() runs a command once for all of them."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, sysfs_root: Optional[str] = None,
                 shared: Optional[Shared] = None, deadline: Optional[float] = None) -> None:
        self.config: Dict[str, Any] = dict(config or {})
        self.sysfs_root = sysfs_root or os.environ.get(SYSFS_ENV) or "/sys"
        self.host_root = os.environ.get(HOST_ENV) or "/"
        self.shared = shared if shared is not None else Shared()
        self.deadline = deadline  # time.monotonic() by which the probe must have answered (None: no limit)

    def remaining(self) -> Optional[float]:
        """Seconds left before the probe run's deadline (a long command must end before it); None: no limit."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def host_path(self, path: str) -> str:
        """A node's absolute path (/etc/nccl.conf) as this probe reaches it: under the host root."""
        return os.path.join(self.host_root, path.lstrip("/"))

    def sys_path(self, *parts: str) -> str:
        """An absolute path under the sysfs root: ctx.sys_path("class", "infiniband")."""
        return os.path.join(self.sysfs_root, *parts)

    def which(self, program: str) -> Optional[str]:
        return shutil.which(program)

    def run(self, argv: Sequence[str], timeout: float = 15.0, input: Optional[str] = None) -> CommandResult:
        """Run a program (never through a shell). rc 127 when it does not exist; timed_out on deadline."""
        argv = [str(a) for a in argv]
        try:
            proc = subprocess.run(
                argv,
                input=input,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=timeout,
                universal_newlines=True,
                errors="replace",
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", "%s: command not found" % argv[0])
        except PermissionError as exc:
            return CommandResult(argv, 126, "", str(exc))
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return CommandResult(argv, -1, out, "timed out after %gs" % timeout, timed_out=True)
        return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)

    def run_once(self, argv: Sequence[str], timeout: float = 15.0) -> CommandResult:
        """run(), but once per probe run: a probe that asks for the same argv later gets the same result."""
        argv = [str(a) for a in argv]
        return self.shared.once(("run",) + tuple(argv), lambda: NodeContext.run(self, argv, timeout))

    @staticmethod
    def read(path: str) -> Optional[str]:
        """A small text file's content stripped of its trailing newline; None when it cannot be read.

        sysfs attributes that the driver refuses to report (EINVAL on a virtual NIC's speed) read as None.
        """
        try:
            with open(path, "r", errors="replace") as handle:
                return handle.read().rstrip("\n")
        except OSError:
            return None

    @staticmethod
    def listdir(path: str) -> List[str]:
        """Sorted directory entries; [] when the directory does not exist."""
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    @staticmethod
    def exists(path: str) -> bool:
        """Whether a path exists (a sysfs link such as class/net/IF/device)."""
        return os.path.exists(path)


def _cap(text: Optional[str], cap: int) -> Optional[str]:
    if text is None or len(text) <= cap:
        return text
    return text[:cap] + "\n[... %d more characters]" % (len(text) - cap)


class RecordingContext(NodeContext):
    """A NodeContext that keeps what the probe ran and read, in order.

    Every probe runs in one: when it fails, its error carries the raw outputs it was given (raw(), capped),
    and `preflight check --capture` sends all of them back (events), to be written as test fixtures.
    """

    def __init__(self, config: Optional[Dict[str, Any]] = None, sysfs_root: Optional[str] = None,
                 shared: Optional[Shared] = None, deadline: Optional[float] = None) -> None:
        super().__init__(config, sysfs_root, shared, deadline)
        self.events: List[Dict[str, Any]] = []

    def run_once(self, argv: Sequence[str], timeout: float = 15.0) -> CommandResult:
        res = NodeContext.run_once(self, argv, timeout)
        # recorded in every probe that used it, so each probe's capture replays on its own
        self.events.append({"kind": "run", "argv": list(res.argv), "rc": res.rc, "stdout": res.stdout,
                            "stderr": res.stderr, "timed_out": res.timed_out})
        return res

    def run(self, argv: Sequence[str], timeout: float = 15.0, input: Optional[str] = None) -> CommandResult:
        res = NodeContext.run(self, argv, timeout, input)
        self.events.append({"kind": "run", "argv": list(res.argv), "rc": res.rc, "stdout": res.stdout,
                            "stderr": res.stderr, "timed_out": res.timed_out})
        return res

    def read(self, path: str) -> Optional[str]:  # type: ignore[override]
        text = NodeContext.read(path)
        self.events.append({"kind": "read", "path": path, "text": text})
        return text

    def listdir(self, path: str) -> List[str]:  # type: ignore[override]
        entries = NodeContext.listdir(path)
        self.events.append({"kind": "listdir", "path": path, "entries": entries})
        return entries

    def exists(self, path: str) -> bool:  # type: ignore[override]
        found = NodeContext.exists(path)
        self.events.append({"kind": "exists", "path": path, "found": found})
        return found

    def raw(self, cap: int = RAW_CAP, last: int = 4) -> List[Dict[str, Any]]:
        """The last commands run and files read (listings left out), each output capped at cap characters."""
        out = []
        for event in [e for e in list(self.events) if e["kind"] in ("run", "read")][-last:]:
            item = dict(event)
            for key in ("stdout", "stderr", "text"):
                if key in item:
                    item[key] = _cap(item[key], cap)
            out.append(item)
        return out

    def record(self) -> Dict[str, Any]:
        """Everything recorded, for --capture."""
        env = {k: os.environ[k] for k in ("SSH_CONNECTION",) if k in os.environ}
        return {"events": list(self.events), "sysfs_root": self.sysfs_root, "config": self.config, "env": env}

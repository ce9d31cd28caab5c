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
from typing import Any, Dict, List, Optional, Sequence

from preflight.model import CommandResult

SYSFS_ENV = "PREFLIGHT_SYSFS_ROOT"
HOST_ENV = "PREFLIGHT_HOST_ROOT"


class NodeContext:
    """The probe's window on the node. One per probe run; cheap to build."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, sysfs_root: Optional[str] = None) -> None:
        self.config: Dict[str, Any] = dict(config or {})
        self.sysfs_root = sysfs_root or os.environ.get(SYSFS_ENV) or "/sys"
        self.host_root = os.environ.get(HOST_ENV) or "/"

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

"""A simulated node without sshd, for probe tests: the same bin/ and sys/ the SimNode offers, in tmp_path."""

from __future__ import annotations

import os


class LocalNode:
    def __init__(self, root: str, name: str = "n001") -> None:
        self.name = name
        self.dir = root
        self.bin_dir = os.path.join(root, "bin")
        self.sys_dir = os.path.join(root, "sys")
        for d in (self.bin_dir, os.path.join(self.sys_dir, "bus", "pci", "devices"), os.path.join(self.sys_dir, "class")):
            os.makedirs(d, exist_ok=True)

    def install_executable(self, name: str, text: str) -> str:
        path = os.path.join(self.bin_dir, name)
        if os.path.lexists(path):
            os.unlink(path)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o755)
        return path

    def write_sys(self, relpath: str, text) -> str:
        path = os.path.join(self.sys_dir, relpath.lstrip("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
        return path

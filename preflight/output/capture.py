"""`preflight check --capture DIR`: every node's raw probe inputs, written as test fixtures.

For each node and each check whose probe ran there, DIR/<node>/<check>.json is a case in the fixture
format of tests/fixture_cases.py, and DIR/<node>/<check>/ its node snapshot:

    <check>/commands.json   every command the probe ran: [{argv, rc, stdout, stderr, timed_out}]
    <check>/sys/...         every file it read under the sysfs root, at its path below that root
                            (directories it listed or tested for are created, so listings replay)
    <check>/files/...       files it read elsewhere (/proc, /etc): kept for the reader, not replayed

The case's "expected" holds the facts the probe returned on the node; for a probe that failed, "error"
holds its message. Copied into tests/fixtures/<check>/ (the json and the folder), it is a test case:
the runner replays the recorded commands through executables on PATH and reads the sysfs files.
Fix "expected" to the facts the node should have produced, and the failure is a regression test.

Controller only. The node side records through preflight.probe.context.RecordingContext.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Mapping

from preflight.errors import UsageError

SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

#: how every file and folder of a capture is opened: created fresh, never through a symlink (DIR may sit in
#: a shared directory such as /tmp, where another user could plant one pointing at a file root owns)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def folder_name(node: str) -> str:
    """A node name as one safe folder name: itself when SAFE, else every other character %XX-encoded.

    IPv6 literals (fe80::1%eth0), names with a leading '_' or '.', anything else: `fe80%3A%3A1%25eth0`.
    SAFE names hold no '%', so an encoded name never equals another node's plain one; unquote() reverses it.
    """
    if SAFE.match(node):
        return node
    out = "".join(ch if re.match(r"[A-Za-z0-9.-]", ch) else "".join("%%%02X" % b for b in ch.encode("utf-8"))
                  for ch in node)
    return out if out[0] != "." else "%2E" + out[1:]


def _safe_rel(path: str) -> str:
    """A recorded path as a relative path with no '..' (a node's answer never writes outside DIR)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError("refusing path with '..': %r" % path)
    return os.path.join(*parts) if parts else ""


class _Tree:
    """Files and folders created below one open directory, each component opened without following symlinks.

    A file is created with O_EXCL|O_NOFOLLOW; a second write of the same path in this run (a probe that
    read one file twice) replaces what this run wrote, still without following a link.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written: set = set()

    def _dir(self, rel: str) -> int:
        fd = os.dup(self.fd)
        for part in [p for p in rel.split(os.sep) if p]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            finally:
                os.close(fd)
            fd = child
        return fd

    def makedirs(self, rel: str) -> None:
        os.close(self._dir(rel))

    def write(self, rel: str, text: str) -> None:
        parent, name = os.path.split(rel)
        fd = self._dir(parent)
        try:
            flags = _NEW_FILE if rel not in self.written else (_NEW_FILE & ~(os.O_CREAT | os.O_EXCL)) | os.O_TRUNC
            out = os.open(name, flags, 0o644, dir_fd=fd)
        finally:
            os.close(fd)
        self.written.add(rel)
        with os.fdopen(out, "w", encoding="utf-8") as fh:
            fh.write(text)


def write_node(tree: _Tree, node: str, check: str, record: Mapping[str, Any], facts: Any, started: str) -> str:
    """Write one node's capture of one check (under its folder_name); the case json's path below DIR."""
    if not SAFE.match(check):
        raise ValueError("check name not safe as a folder name: %r" % check)
    base = folder_name(node)
    snap = os.path.join(base, check)
    sys_root = record.get("sysfs_root") or "/sys"
    commands: List[Dict[str, Any]] = []
    for item in record.get("events") or []:
        kind = item.get("kind")
        if kind == "run":
            commands.append({k: item.get(k) for k in ("argv", "rc", "stdout", "stderr", "timed_out")})
            continue
        path = str(item.get("path") or "")
        under_sys = path == sys_root or path.startswith(sys_root.rstrip("/") + "/")
        rel = _safe_rel(path[len(sys_root):] if under_sys else path)
        dest = os.path.join(snap, "sys" if under_sys else "files", rel)
        if kind == "read" and item.get("text") is not None:
            tree.write(dest, item["text"] + "\n" if not item["text"].endswith("\n") else item["text"])
        elif kind == "listdir" and under_sys:
            for entry in item.get("entries") or []:
                if SAFE.match(entry) or re.match(r"^[\w:.,+-]+$", entry):
                    tree.makedirs(os.path.join(dest, entry))
        elif kind == "exists" and item.get("found") and under_sys:
            tree.makedirs(dest)
    tree.makedirs(snap)
    if commands:
        tree.write(os.path.join(snap, "commands.json"), json.dumps(commands, indent=1) + "\n")
    case: Dict[str, Any] = {
        "parser": "probe",
        "command": "; ".join(" ".join(c["argv"]) for c in commands) or "sysfs reads only",
        "source": "captured by `preflight check --capture` on %s at %s" % (node, started),
        "description": "the %s probe on %s, as recorded there" % (check, node),
        "input": check,
    }
    if record.get("config"):
        case["config"] = record["config"]
    if record.get("env"):
        case["env"] = record["env"]
    if isinstance(facts, dict) and "probe_error" in facts:
        case["error"] = re.escape(str(facts.get("message") or facts["probe_error"])[:200])
    else:
        case["expected"] = facts
    path = os.path.join(base, check + ".json")
    tree.write(path, json.dumps(case, indent=1, ensure_ascii=False) + "\n")
    return path


def check_dir(root: str) -> None:
    """--capture DIR, before the run: not a symlink, and (when it exists) a directory this user owns.

    Raises UsageError. write() checks again on the directory it opens (nothing is trusted in between)."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError("cannot read --capture %s: %s" % (root, exc.strerror), "give a new directory") from None
    _judge_dir(root, st)


def _judge_dir(root: str, st: os.stat_result) -> None:
    import stat

    if stat.S_ISLNK(st.st_mode):
        raise UsageError("--capture %s is a symbolic link" % root, "give a new directory (preflight creates it)")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError("--capture %s is not a directory" % root, "give a new or empty directory")
    if st.st_uid != os.geteuid():
        raise UsageError("--capture directory %s belongs to uid %d, not to you" % (root, st.st_uid),
                         "give a new directory (preflight creates it, mode 0700)")


def write(root: str, captures: Mapping[str, Mapping[str, Any]], facts: Mapping[str, Mapping[str, Any]],
          started: str) -> List[str]:
    """Every node's capture under root, created fresh (mode 0700) or an empty directory this user owns;
    the case files written (their paths under root)."""
    parent = os.path.dirname(os.path.abspath(root))
    try:
        os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            check_dir(root)
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise UsageError("cannot create --capture directory %s: %s" % (root, exc.strerror),
                         "give a new directory in a writable place") from None
    written = []
    try:
        _judge_dir(root, os.fstat(fd))
        if os.listdir(fd):
            raise UsageError("--capture directory %s is not empty" % root, "give a new or empty directory")
        tree = _Tree(fd)
        for node in sorted(captures):
            for check, record in sorted(captures[node].items()):
                rel = write_node(tree, node, check, record, (facts.get(node) or {}).get(check), started)
                written.append(os.path.join(root, rel))
    except ValueError as exc:  # a node's record naming a path outside its folder
        raise UsageError("refusing to write the capture in %s: %s" % (root, exc), "report the node's answer") from None
    except OSError as exc:
        raise UsageError("cannot write the capture in %s: %s%s" % (
            root, exc.strerror, " (%s)" % exc.filename if exc.filename else ""),
            "give a new directory you own (something in it was replaced during the run?)") from None
    finally:
        os.close(fd)
    return written

"""The storage check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import secrets

from preflight.node_model import ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Mapping, Optional

TOKEN_FILE = ".preflight-shared-token"
WRITE_PREFIX = ".preflight-write-"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> List[Dict[str, str]]:
    """/proc/self/mountinfo → [{"mount_point", "fstype", "source"}] in file order (see proc(5)).

    Line: ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS.
    """
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2 or ":" not in fields[2]:
            raise ParseError("mountinfo line %d: expected 'ID PARENT MAJ:MIN ROOT MOUNT OPTS ... - TYPE SOURCE OPTS', got %.80r" % (number, line))
        out.append({"mount_point": _unescape(fields[4]), "fstype": tail[0], "source": _unescape(tail[1])})
    if not out:
        raise ParseError("mountinfo is empty")
    return out


def mount_of(mounts: List[Dict[str, str]], path: str) -> Optional[Dict[str, str]]:
    """The mount a (resolved) path lives on: the longest mount point that contains it (the last one
    listed when several mounts stack on the same point)."""
    best = None
    for m in mounts:
        mp = m["mount_point"]
        if path == mp or path.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) >= len(best["mount_point"]):
                best = m
    return best


def _write_token(path: str) -> Dict[str, Any]:
    token = secrets.token_hex(16)
    target = os.path.join(path, TOKEN_FILE)
    tmp = os.path.join(path, WRITE_PREFIX + secrets.token_hex(8))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, token.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never created: nothing to remove
        return {"path": path, "token": None, "error": "%s: %s" % (target, exc.strerror or exc)}
    return {"path": path, "token": token, "error": None}


def _write_test(path: str) -> Optional[str]:
    """None when a file can be created, written, fsynced and removed in path; else why not."""
    name = os.path.join(path, WRITE_PREFIX + secrets.token_hex(8))
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.write(fd, b"preflight\n")
        os.fsync(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
        os.unlink(name)
    return None


def _read_token(path: str, want: Optional[str], write_error: Optional[str] = None) -> str:
    if not want:
        return "error: the head could not write its token (%s)" % (write_error or "no token")
    try:
        with open(os.path.join(path, TOKEN_FILE)) as handle:
            got = handle.read(256).strip()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return "error: %s" % (exc.strerror or exc)
    return "match" if got == want else "differs"


def _check_path(ctx: Any, mounts: List[Dict[str, str]], entry: Mapping[str, Any]) -> Dict[str, Any]:
    path = entry["path"]
    out: Dict[str, Any] = {"path": path, "exists": os.path.exists(path), "is_dir": os.path.isdir(path)}
    if not out["is_dir"]:
        return out
    real = os.path.realpath(path)
    out["mount"] = mount_of(mounts, real)
    st = os.statvfs(path)
    out["free_bytes"] = st.f_bavail * st.f_frsize
    out["total_bytes"] = st.f_blocks * st.f_frsize
    out["write_error"] = _write_test(path)
    out["writable"] = out["write_error"] is None
    out["token"] = _read_token(path, entry.get("token"), entry.get("write_error"))
    return out


def probe(ctx: Any) -> Dict[str, Any]:
    cfg = ctx.config
    if cfg.get("phase") == 1:
        written = [_write_token(p) for p in cfg.get("paths") or []] if cfg.get("head") else []
        return {"phase": 1, "paths": list(cfg.get("paths") or []), "head": bool(cfg.get("head")), "tokens": written}
    if cfg.get("skip"):
        return {"skipped": cfg["skip"]}
    with open("/proc/self/mountinfo") as handle:
        mounts = parse_mountinfo(handle.read())
    return {"paths": [_check_path(ctx, mounts, e) for e in cfg.get("paths") or []]}

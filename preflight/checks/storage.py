"""storage: every shared path (`cluster.shared_paths`) is one writable filesystem on every node, with room.

A checkpoint directory that is the NFS/Lustre mount on 63 nodes and a plain local directory on the
64th (the mount failed at boot) works until the job restarts and rank 57 cannot find its shard.

Two phases (Check.prepare):
1. the head writes a random token into `<path>/.preflight-shared-token` on each shared path (a fixed
   name, overwritten by each run: nothing accumulates; it is left in place because the other nodes
   read it concurrently in phase 2 and no single one of them can know it is the last reader);
2. every node (the head too) reads the head's token there, creates, fsyncs and removes a file of its
   own (`.preflight-write-<random>`), and reports the mount the path lives on (/proc/self/mountinfo)
   and its free space (statvfs f_bavail: what an unprivileged writer can use).

Rule decisions: no `cluster.shared_paths`: SKIP with that reason. Per node and path: missing or not a
directory, the head's token absent or different (not the same filesystem as the head's), not writable,
or free space below `expect.shared_free_gib`: FAIL (action fix_config: mount it / fix permissions /
free space). The head's own failure to write the token is reported on the head, and the other nodes
are then not tested (ERROR). A filesystem type that differs from the majority is named in the message.

Facts (phase 2): {"paths": [{"path", "exists", "is_dir", "mount": {"mount_point", "fstype", "source"}|None,
                   "free_bytes", "total_bytes", "writable": bool, "write_error": str|None,
                   "token": "match"|"differs"|"missing"|"error: ..."}]}
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Dict, List, Mapping, Optional

from preflight.model import Check, ClusterView, Finding, ParseError, Setting, Status, probe_error

NAME = "storage"
TOKEN_FILE = ".preflight-shared-token"
WRITE_PREFIX = ".preflight-write-"
GiB = 1 << 30


# ----------------------------------------------------------------------------------------------- parse


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


# ----------------------------------------------------------------------------------------------- probe


def prepare(cluster: Mapping[str, Any], node: str, is_head: bool) -> Dict[str, Any]:
    """Phase-1 config: the shared paths, and whether this node is the head (which writes the tokens)."""
    return {"phase": 1, "paths": list(cluster.get("shared_paths") or []), "head": is_head}


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


# ------------------------------------------------------------------------------------------------ plan


def plan(view: ClusterView) -> Dict[str, Dict[str, Any]]:
    """Every live node reads the tokens the head wrote in phase 1."""
    paths = list(view.cluster.get("shared_paths") or [])
    if not paths:
        return {}
    head = view.head.name
    facts = view.facts.get(head, {}).get(NAME)
    written = {t["path"]: t for t in (facts or {}).get("tokens") or [] if isinstance(t, dict) and t.get("path")}
    entries = [
        {"path": p, "token": (written.get(p) or {}).get("token"), "write_error": (written.get(p) or {}).get("error")}
        for p in paths
    ]
    if not any(e["token"] for e in entries):
        why = "the head %s could not write its token (see its storage finding)" % head
        return {n.name: ({"skip": why} if n.name != head else {"paths": entries}) for n in view.live}
    return {n.name: {"paths": entries} for n in view.live}


# ------------------------------------------------------------------------------------------------ rule


def _problems(p: Mapping[str, Any], head: str, want_free: Optional[float]) -> List[str]:
    path = p["path"]
    if not p.get("exists"):
        return ["%s does not exist (expected the shared filesystem mounted there)" % path]
    if not p.get("is_dir"):
        return ["%s is not a directory" % path]
    out = []
    mount = p.get("mount") or {}
    on = "%s %s on %s" % (mount.get("fstype", "?"), mount.get("source", "?"), mount.get("mount_point", "?"))
    token = p.get("token")
    if token == "missing":
        out.append("%s is not the filesystem the head %s sees: its token is not there (here: %s)" % (path, head, on))
    elif token == "differs":
        out.append("%s holds a different token than the head %s wrote (another filesystem, or a concurrent run; here: %s)" % (path, head, on))
    elif token != "match":
        out.append("%s: the head %s's token could not be read (%s)" % (path, head, str(token).replace("error: ", "")))
    if not p.get("writable"):
        out.append("%s is not writable (%s)" % (path, p.get("write_error")))
    if want_free is not None and p.get("free_bytes") is not None and p["free_bytes"] < want_free * GiB:
        out.append("%s has %.1f GiB free (expected >= %g GiB)" % (path, p["free_bytes"] / float(GiB), want_free))
    return out


def rule(view: ClusterView) -> List[Finding]:
    paths = list(view.cluster.get("shared_paths") or [])
    if not paths:
        return [Finding(NAME, n.name, Status.SKIP, "no cluster.shared_paths in the inventory") for n in view.live]
    head = view.head.name
    want_free = view.expect.get("shared_free_gib")
    out: List[Finding] = []
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts)
        if err is None and (not isinstance(facts.get("paths"), list) or facts.get("phase") == 1):
            err = Finding(NAME, name, Status.ERROR, "no phase-2 storage facts (the network phase did not run here)")
        if err is not None:
            out.append(err)
            continue
        problems: List[str] = []
        for p in facts["paths"]:
            problems.extend(_problems(p, head, want_free))
        if problems:
            out.append(Finding(NAME, name, Status.FAIL, "%s: %s" % (name, "; ".join(problems)), data={"paths": facts["paths"]}))
        else:
            shown = []
            for p in facts["paths"]:
                m = p.get("mount") or {}
                shown.append("%s (%s %s, %.1f GiB free)" % (p["path"], m.get("fstype", "?"), m.get("source", "?"), (p.get("free_bytes") or 0) / float(GiB)))
            out.append(Finding(NAME, name, Status.PASS, "shared with %s and writable: %s" % (head, ", ".join(shown))))
    return out


CHECK = Check(
    name=NAME,
    claim="Every cluster.shared_paths entry is the same writable filesystem on every node (a token the head "
    "writes is read by all), with the free space expect.shared_free_gib asks for",
    why="A checkpoint or dataset path that is a local directory on one node (its NFS/Lustre mount failed) "
    "lets the job start and then lose or never find that rank's shards; a full or read-only share kills "
    "the job at its first checkpoint.",
    fix="Mount the shared filesystem on the named node (findmnt PATH; check /etc/fstab or the automounter and "
    "`mount -a`), fix its permissions for the job's user, or free space on it.",
    probe=probe,
    rule=rule,
    phase=2,
    plan=plan,
    prepare=prepare,
    action="fix_config",
    reads="/proc/self/mountinfo, statvfs and one small written, fsynced and removed file per shared path",
    takes="< 1 s (the filesystem's latency)",
    order=87,
    settings=(
        Setting("shared_paths", "paths", "directories every node must see as one writable filesystem", default=()),
        Setting("expect.shared_free_gib", "number", "free space each shared path must have", low=0, high=10 ** 9, unit="GiB"),
    ),
)

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


def _safe_rel(path: str) -> str:
    """A recorded path as a relative path with no '..' (a node's answer never writes outside DIR)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError("refusing path with '..': %r" % path)
    return os.path.join(*parts) if parts else ""


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def write_node(root: str, node: str, check: str, record: Mapping[str, Any], facts: Any, started: str) -> str:
    """Write one node's capture of one check; the case json's path."""
    if not SAFE.match(node) or not SAFE.match(check):
        raise ValueError("node or check name not safe as a folder name: %r %r" % (node, check))
    base = os.path.join(root, node)
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
            _write(dest, item["text"] + "\n" if not item["text"].endswith("\n") else item["text"])
        elif kind == "listdir" and under_sys:
            for entry in item.get("entries") or []:
                if SAFE.match(entry) or re.match(r"^[\w:.,+-]+$", entry):
                    os.makedirs(os.path.join(dest, entry), exist_ok=True)
        elif kind == "exists" and item.get("found") and under_sys:
            if not os.path.exists(dest):
                os.makedirs(dest, exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    if commands:
        _write(os.path.join(snap, "commands.json"), json.dumps(commands, indent=1) + "\n")
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
    _write(path, json.dumps(case, indent=1, ensure_ascii=False) + "\n")
    return path


def write(root: str, captures: Mapping[str, Mapping[str, Any]], facts: Mapping[str, Mapping[str, Any]],
          started: str) -> List[str]:
    """Every node's capture under root; the case files written."""
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise UsageError("cannot create --capture directory %s: %s" % (root, exc.strerror),
                         "give a writable directory") from None
    written = []
    for node in sorted(captures):
        for check, record in sorted(captures[node].items()):
            written.append(write_node(root, node, check, record, (facts.get(node) or {}).get(check), started))
    return written

"""The storage check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from preflight.checks.storage import NAME
from preflight.model import ClusterView, Finding, Status, probe_error

GiB = 1 << 30


def prepare(cluster: Mapping[str, Any], node: str, is_head: bool) -> Dict[str, Any]:
    """Phase-1 config: the shared paths, and whether this node is the head (which writes the tokens)."""
    return {"phase": 1, "paths": list(cluster.get("shared_paths") or []), "head": is_head}


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

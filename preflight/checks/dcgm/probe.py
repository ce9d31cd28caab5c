"""The dcgm check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.common import one_line
from preflight.model import ParseError

#: How long each level may run before dcgmi is killed (DCGM user guide, "Run levels": level 1 ~seconds,
#: level 2 ~2 minutes, level 3 ~30 minutes on 8 GPUs), with headroom for slow starts.
LEVEL_BUDGET_S = {1: 90.0, 2: 420.0, 3: 2700.0}
#: The seconds kept free before the probe run's deadline (the probe must still answer after a kill).
DEADLINE_SLACK_S = 3.0
#: dcgmi's own --timeout is this much shorter than the kill: time for it to stop the diagnostic and answer.
INNER_MARGIN_S = 10.0
SEVERITIES = {0: "NONE", 1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET"}
ROOT_3X, ROOT_4X = "DCGM GPU Diagnostic", "DCGM Diagnostic"
STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip"}
_HOSTENGINE = re.compile(r"host ?engine|unable to establish a connection", re.I)


def probe(ctx: Any) -> Dict[str, Any]:
    """Run `dcgmi diag -r LEVEL -j` where dcgmi exists on a GPU node, killed at its deadline."""
    level = int(ctx.config.get("level") or 1)
    if level not in LEVEL_BUDGET_S:
        raise ValueError("dcgm level %r: expected 1, 2 or 3" % level)
    path = ctx.which("dcgmi")
    facts: Dict[str, Any] = {"dcgmi": path, "level": level, "ran": False}
    if path is None:
        return facts
    if (ctx.config.get("node") or {}).get("gpus_per_node") == 0:
        facts["not_started"] = "CPU-only node"
        return facts
    timeout = LEVEL_BUDGET_S[level]
    left = ctx.remaining()
    if left is not None:
        if left - DEADLINE_SLACK_S < 5.0:
            facts["not_started"] = "only %.0f s left before the probe deadline" % max(left, 0.0)
            return facts
        timeout = min(timeout, left - DEADLINE_SLACK_S)
    # dcgmi's own --timeout (DCGM 3.3.8+) stops the diagnostic inside nv-hostengine (dcgmStopDiagnostic): a kill
    # of the client alone would leave it running there. The kill at `timeout` is the backstop.
    argv = ["dcgmi", "diag", "-r", str(level), "-j", "--timeout", str(int(max(1.0, timeout - INNER_MARGIN_S)))]
    t0 = time.monotonic()
    res = ctx.run(argv, timeout=timeout)
    if not res.timed_out and res.rc != 0 and "PARSE ERROR" in res.stderr and "--timeout" in res.stderr:
        argv = argv[:5]  # a dcgmi before 3.3.8: no --timeout; the kill is then the only deadline
        timeout = timeout - (time.monotonic() - t0)
        res = ctx.run(argv, timeout=timeout)
    facts.update(ran=True, argv=argv, rc=None if res.timed_out else res.rc, timed_out=res.timed_out,
                 timeout_s=round(timeout, 1), elapsed_s=round(time.monotonic() - t0, 2))
    facts["result"] = None if res.timed_out else parse_dcgmi_diag(res.stdout, res.stderr, res.rc)
    return facts


def _document(text: str) -> Optional[Dict[str, Any]]:
    """The JSON object in dcgmi's output (after any banner lines); None when there is none."""
    for match in re.finditer(r"(?m)^\s*\{", text):
        try:
            doc, _end = json.JSONDecoder().raw_decode(text[match.start():].lstrip())
        except ValueError as exc:
            raise ParseError("dcgmi diag -j: invalid JSON after line %d: %s" % (text[:match.start()].count("\n") + 1, exc))
        if not isinstance(doc, dict):
            raise ParseError("dcgmi diag -j: expected a JSON object, got %s" % type(doc).__name__)
        return doc
    return None


def _int(value: Any, what: str) -> Optional[int]:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ParseError("dcgmi diag -j: %s %.40r is not an integer" % (what, value))


def _status(value: Any, where: str) -> str:
    text = str(value or "").strip().lower()
    if text not in STATUSES:
        raise ParseError("dcgmi diag -j: %s status %.40r (expected Pass, Fail, Warn or Skip)" % (where, value))
    return STATUSES[text]


def _error(test: str, entity: Optional[str], gpu: Optional[int], message: Any, item: Mapping[str, Any]) -> Dict[str, Any]:
    severity = _int(item.get("error_severity"), "error_severity")
    return {"test": test, "entity": entity, "gpu": gpu, "code": _int(item.get("error_id"), "error_id"),
            "category": _int(item.get("error_category"), "error_category"),
            "severity": SEVERITIES.get(severity, "UNKNOWN") if severity is not None else "UNKNOWN",
            "message": one_line(message)}


def _entity(result: Mapping[str, Any]) -> Tuple[Optional[str], Optional[int]]:
    """("GPU 3", 3) from a 4.x result (entity_group/entity_id) or a 3.x one (gpu_id "3"); (None, None) for
    a result about the node (3.x Deployment tests, 4.x test_summary)."""
    if "entity_group" in result:
        group, ident = str(result.get("entity_group")), _int(result.get("entity_id"), "entity_id")
        return "%s %s" % (group, ident), ident if group == "GPU" else None
    if result.get("gpu_id") not in (None, ""):
        gpu = _int(result.get("gpu_id"), "gpu_id")
        return "GPU %d" % gpu, gpu
    return None, None


def _test(category: str, test: Mapping[str, Any], errors: List[Dict[str, Any]]) -> Dict[str, Any]:
    name = str(test.get("name") or "?")
    results = test.get("results") or []
    if not isinstance(results, list):
        raise ParseError("dcgmi diag -j: test %r: results is not a list" % name)
    statuses: List[str] = []
    failed: List[str] = []
    seen = set()
    for result in results:
        if not isinstance(result, dict):
            raise ParseError("dcgmi diag -j: test %r: a result is not an object" % name)
        entity, gpu = _entity(result)
        if "status" in result:
            status = _status(result["status"], "test %r" % name)
            statuses.append(status)
            if status in ("fail", "warn"):
                failed.append(entity or "node")
        warnings = result.get("warnings")
        if isinstance(warnings, str):  # 3.x Deployment: one error per result entry, fields beside it
            if warnings.strip():
                errors.append(_error(name, entity, gpu, warnings, result))
        elif isinstance(warnings, list):
            for item in warnings:
                if not isinstance(item, dict) or "warning" not in item:
                    raise ParseError("dcgmi diag -j: test %r: a warning without its text" % name)
                err = _error(name, entity, gpu, item["warning"], item)
                seen.add((err["code"], err["message"]))
                errors.append(err)
        elif warnings is not None:
            raise ParseError("dcgmi diag -j: test %r: warnings is %s" % (name, type(warnings).__name__))
    summary = test.get("test_summary")
    if isinstance(summary, dict):  # 4.x: the test's own status, and errors tied to no entity
        status = _status(summary.get("status"), "test %r summary" % name)
        for item in summary.get("warnings") or []:
            if isinstance(item, dict) and "warning" in item:
                err = _error(name, None, None, item["warning"], item)
                if (err["code"], err["message"]) not in seen:
                    errors.append(err)
    elif statuses:
        status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else (
            "pass" if "pass" in statuses else "skip")
    else:
        raise ParseError("dcgmi diag -j: test %r has neither results nor a test_summary" % name)
    return {"category": category, "name": name, "status": status, "failed": failed}


def parse_dcgmi_diag(stdout: str, stderr: str = "", rc: Optional[int] = 0) -> Dict[str, Any]:
    """`dcgmi diag -r N -j` output (DCGM 3.x or 4.x JSON, after any banner) and exit status -> facts."""
    doc = _document(stdout or "")
    out: Dict[str, Any] = {"format": None, "version": None, "driver": None, "rc": rc, "runtime_error": None,
                           "hostengine": True, "gpus": [], "tests": [], "errors": []}
    if doc is None:
        text = one_line((stdout or "") + " " + (stderr or "")).strip()
        if rc == 0 or not text:
            raise ParseError("dcgmi diag -j: no JSON document in the output (exit %s): %.120r" % (rc, text))
        out.update(format="text", runtime_error=text[:400], hostengine=not _HOSTENGINE.search(text))
        return out
    if ROOT_4X in doc:
        out["format"], root = "4.x", doc[ROOT_4X]
        meta = doc.get("metadata") or {}
        out["version"], out["driver"] = meta.get("version"), meta.get("Driver Version Detected")
        for group in doc.get("entity_groups") or []:
            if isinstance(group, dict) and group.get("entity_group") == "GPU":
                out["gpus"] = [_int(e.get("entity_id"), "entity_id") for e in group.get("entities") or []]
    elif ROOT_3X in doc:
        out["format"], root = "3.x", doc[ROOT_3X]
        out["version"], out["driver"] = doc.get("version"), doc.get("Driver Version Detected")
        out["gpus"] = list(range(len(doc.get("GPU Device IDs") or [])))
    else:
        raise ParseError("dcgmi diag -j: neither %r (DCGM 4.x) nor %r (3.x) at the root (keys: %s)" % (
            ROOT_4X, ROOT_3X, ", ".join(sorted(doc)[:6])))
    if not isinstance(root, dict):
        raise ParseError("dcgmi diag -j: %r is not an object" % out["format"])
    if root.get("runtime_error"):
        out["version"] = out["version"] or root.get("version")
        text = one_line(root["runtime_error"])
        out.update(runtime_error=text[:400], hostengine=not _HOSTENGINE.search(text))
        return out
    categories = root.get("test_categories")
    if not isinstance(categories, list) or not categories:
        raise ParseError("dcgmi diag -j: no test_categories under %r" % (ROOT_4X if out["format"] == "4.x" else ROOT_3X))
    for category in categories:
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            raise ParseError("dcgmi diag -j: a test category without its tests list")
        for test in category["tests"]:
            if isinstance(test, dict):
                out["tests"].append(_test(str(category.get("category") or "?"), test, out["errors"]))
    return out

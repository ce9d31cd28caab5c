"""The dcgm check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import json
import re
import time

from preflight.common import one_line
from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Mapping, Optional, Tuple

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
_HOSTENGINE = lazy(r"host ?engine|unable to establish a connection", re.I)


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
    timeout, why = ctx.budget(LEVEL_BUDGET_S[level], DEADLINE_SLACK_S, 5.0)
    if timeout is None:
        facts["not_started"] = why
        return facts
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
        line = text[:match.start()].count("\n") + 1
        try:
            doc, _end = json.JSONDecoder(parse_constant=_no_constant).raw_decode(text[match.start():].lstrip())
        except ValueError as exc:
            raise ParseError("dcgmi diag -j: invalid JSON after line %d: %s" % (line, exc))
        except RecursionError:
            raise ParseError("dcgmi diag -j: the JSON document after line %d is nested too deeply" % line) from None
        if not isinstance(doc, dict):
            raise ParseError("dcgmi diag -j: expected a JSON object, got %s" % type(doc).__name__)
        return doc
    return None


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not a number dcgmi writes" % name)


def _int(value: Any, what: str) -> Optional[int]:
    """An integer field (4.x writes numbers, 3.x gpu_id a string); None when absent or empty."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,18}\s*", value):
        return int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    raise ParseError("dcgmi diag -j: %s %.40r is not an integer" % (what, value))


def _obj(value: Any, what: str, default: Any = None) -> Any:
    """A JSON object field; `default` when absent (None), ParseError naming it when of another type."""
    if value is None and default is not None:
        return default
    if not isinstance(value, dict):
        raise ParseError("dcgmi diag -j: %s is %s, expected an object" % (what, type(value).__name__))
    return value


def _list(value: Any, what: str) -> List[Any]:
    """A JSON array field; [] when absent (None), ParseError naming it when of another type."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError("dcgmi diag -j: %s is %s, expected a list" % (what, type(value).__name__))
    return value


def _text(value: Any, what: str) -> Optional[str]:
    """A string field as one printable line; None when absent; ParseError naming it when not a string."""
    if value is None:
        return None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ParseError("dcgmi diag -j: %s is %s, expected text" % (what, type(value).__name__))
    return one_line(value)


def _status(value: Any, where: str) -> str:
    text = value.strip().lower() if isinstance(value, str) else ""
    if text not in STATUSES:
        raise ParseError("dcgmi diag -j: %s status %.40r (expected Pass, Fail, Warn or Skip)" % (where, value))
    return STATUSES[text]


def _error(test: str, entity: Optional[str], gpu: Optional[int], message: Any, item: Mapping[str, Any]) -> Dict[str, Any]:
    severity = _int(item.get("error_severity"), "error_severity")
    return {"test": test, "entity": entity, "gpu": gpu, "code": _int(item.get("error_id"), "error_id"),
            "category": _int(item.get("error_category"), "error_category"),
            "severity": SEVERITIES.get(severity, "UNKNOWN") if severity is not None else "UNKNOWN",
            "message": _text(message, "test %r warning" % test)}


def _entity(result: Mapping[str, Any]) -> Tuple[Optional[str], Optional[int]]:
    """("GPU 3", 3) from a 4.x result (entity_group/entity_id) or a 3.x one (gpu_id "3"); (None, None) for
    a result about the node (3.x Deployment tests, 4.x test_summary)."""
    if "entity_group" in result:
        group, ident = _text(result.get("entity_group"), "entity_group"), _int(result.get("entity_id"), "entity_id")
        return "%s %s" % (group, ident), ident if group == "GPU" else None
    if result.get("gpu_id") not in (None, ""):
        gpu = _int(result.get("gpu_id"), "gpu_id")
        return "GPU %d" % gpu, gpu
    return None, None


def _result_errors(name: str, result: Mapping[str, Any], entity: Optional[str], gpu: Optional[int],
                   errors: List[Dict[str, Any]]) -> List[Tuple[Any, Any]]:
    """Append one result's errors (3.x Deployment: one text beside the fields; else a list of warnings);
    return their (code, message) keys."""
    warnings = result.get("warnings")
    if isinstance(warnings, str):
        if warnings.strip():
            errors.append(_error(name, entity, gpu, warnings, result))
        return []
    keys = []
    for item in _list(warnings, "test %r warnings" % name):
        if not isinstance(item, dict) or "warning" not in item:
            raise ParseError("dcgmi diag -j: test %r: a warning without its text" % name)
        err = _error(name, entity, gpu, item["warning"], item)
        keys.append((err["code"], err["message"]))
        errors.append(err)
    return keys


def _test(category: str, test: Mapping[str, Any], errors: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One test entry: its status ("not run" where dcgmi lists only its name: DCGM 4.x writes no result
    and no test_summary for a test whose every result is DCGM_DIAG_RESULT_NOT_RUN, dcgmi/Diag.cpp
    HelperJsonAddResult), the entities it failed, and its errors appended to `errors`."""
    name = _text(test.get("name"), "test name") or "?"
    results = _list(test.get("results"), "test %r results" % name)
    statuses: List[str] = []
    failed: List[str] = []
    seen = set()
    for result in results:
        result = _obj(result, "a result of test %r" % name)
        entity, gpu = _entity(result)
        if "status" in result:
            status = _status(result["status"], "test %r" % name)
            statuses.append(status)
            if status in ("fail", "warn"):
                failed.append(entity or "node")
        seen.update(_result_errors(name, result, entity, gpu, errors))
    summary = test.get("test_summary")
    if summary is not None:  # 4.x: the test's own status, and errors tied to no entity
        summary = _obj(summary, "test %r test_summary" % name)
        status = _status(summary.get("status"), "test %r summary" % name)
        tail: List[Dict[str, Any]] = []
        _result_errors(name, summary, None, None, tail)
        errors.extend(e for e in tail if (e["code"], e["message"]) not in seen)
    elif statuses:
        status = "fail" if "fail" in statuses else "warn" if "warn" in statuses else (
            "pass" if "pass" in statuses else "skip")
    elif not results and set(test) <= {"name", "results"}:
        status = "not run"
    else:
        raise ParseError("dcgmi diag -j: test %r has results without a status and no test_summary" % name)
    return {"category": category, "name": name, "status": status, "failed": failed}


def _header(doc: Mapping[str, Any], out: Dict[str, Any]) -> Tuple[str, Any]:
    """Fill format, version, driver and gpus from the document's root; return the diagnostic's root key."""
    if ROOT_4X in doc:
        out["format"], key = "4.x", ROOT_4X
        meta = _obj(doc.get("metadata"), "metadata", {})
        out["version"] = _text(meta.get("version"), "metadata version")
        out["driver"] = _text(meta.get("Driver Version Detected"), "metadata Driver Version Detected")
        for group in _list(doc.get("entity_groups"), "entity_groups"):
            group = _obj(group, "an entity_groups entry")
            if group.get("entity_group") == "GPU":
                out["gpus"] = [_int(_obj(e, "a GPU entity").get("entity_id"), "entity_id")
                               for e in _list(group.get("entities"), "GPU entities")]
    elif ROOT_3X in doc:
        out["format"], key = "3.x", ROOT_3X
        out["version"] = _text(doc.get("version"), "version")
        out["driver"] = _text(doc.get("Driver Version Detected"), "Driver Version Detected")
        out["gpus"] = list(range(len(_list(doc.get("GPU Device IDs"), "GPU Device IDs"))))
    else:
        raise ParseError("dcgmi diag -j: neither %r (DCGM 4.x) nor %r (3.x) at the root (keys: %s)" % (
            ROOT_4X, ROOT_3X, ", ".join(one_line(k)[:40] for k in sorted(doc)[:6])))
    return key, _obj(doc[key], repr(key))


def parse_dcgmi_diag(stdout: str, stderr: str = "", rc: Optional[int] = 0) -> Dict[str, Any]:
    """`dcgmi diag -r N -j` output (DCGM 3.x or 4.x JSON, after any banner) and exit status -> facts.

    Any document these formats do not allow is a ParseError naming the field."""
    doc = _document(stdout or "")
    out: Dict[str, Any] = {"format": None, "version": None, "driver": None, "rc": rc, "runtime_error": None,
                           "hostengine": True, "gpus": [], "tests": [], "errors": []}
    if doc is None:
        text = one_line((stdout or "") + " " + (stderr or "")).strip()
        if rc == 0 or not text:
            raise ParseError("dcgmi diag -j: no JSON document in the output (exit %s): %.120r" % (rc, text))
        out.update(format="text", runtime_error=text[:400], hostengine=not _HOSTENGINE.search(text))
        return out
    key, root = _header(doc, out)
    runtime_error = _text(root.get("runtime_error"), "runtime_error")
    if runtime_error:
        out["version"] = out["version"] or _text(root.get("version"), "version")
        out.update(runtime_error=runtime_error[:400], hostengine=not _HOSTENGINE.search(runtime_error))
        return out
    categories = _list(root.get("test_categories"), "test_categories")
    if not categories:
        raise ParseError("dcgmi diag -j: no test_categories under %r" % key)
    for category in categories:
        category = _obj(category, "a test category")
        label = _text(category.get("category"), "category") or "?"
        if "tests" not in category:
            raise ParseError("dcgmi diag -j: category %r without its tests list" % label)
        for test in _list(category["tests"], "category %r tests" % label):
            out["tests"].append(_test(label, _obj(test, "a test of category %r" % label), out["errors"]))
    return out

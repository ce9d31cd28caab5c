"""dcgm: where DCGM is installed, its diagnostic (`dcgmi diag`) passes on every GPU of the node.

Runs ``dcgmi diag -r <level> -j --timeout <s>`` (level 1 by default: DCGM's quick deployment/software
validation; ``--dcgm-level 2|3`` opts in to the medium and long hardware runs) under two deadlines, because
level 2 is known to hang on B200/GB200 and a hung diagnostic must cost its deadline, not the run: dcgmi's
own ``--timeout`` (DCGM 3.3.8+; it stops the diagnostic inside nv-hostengine and answers a runtime_error
"Timeout", exit 245), 10 s before an outer deadline at which the probe kills dcgmi. A dcgmi before 3.3.8
refuses ``--timeout`` (TCLAP's "PARSE ERROR"): it is run again without it, the kill then the only deadline. Nodes without ``dcgmi`` on PATH SKIP with that reason; CPU-only nodes SKIP
without running it.

Real formats, from NVIDIA/DCGM's sources (dcgmi/Diag.cpp, nvvs/include/NvvsJsonStrings.h,
testing/python3/dcgm_diag_schema.json; tags 3.3.1 and 4.x), and the table outputs of DCGM 2.4.6/3.3.1/
4.2.3 pasted in NVIDIA/DCGM#49, #253 and NVIDIA/go-dcgm#52 (../shared/realworld/dcgmi_diag):

- DCGM 3.x: root ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [...]}]}]}, "version", "Driver Version Detected", "GPU Device IDs", "GPU Device Serials"}``.
  Deployment (level-one) results carry one status for the node and their errors on the result itself
  (``"warnings": "<text>", "error_id", "error_category", "error_severity"``); plugin results carry
  ``"gpu_id": "3"`` and ``"warnings": [{"warning", "error_id", "error_category", "error_severity"}]``.
- DCGM 4.x: root ``{"DCGM Diagnostic": {"test_categories": [...]}, "entity_groups": [{"entity_group":
  "GPU", "entities": [{"entity_id", "device_id", "serial_num"}]}], "metadata": {"version", "Driver Version
  Detected"}}``; each test has ``results`` per entity (``entity_group``, ``entity_id``, ``status``,
  ``warnings`` as above, ``info``) and a ``test_summary`` (``status`` and every error of the test).
- DCGM 4.x lists a test it did not run as ``{"name": "pcie"}`` alone: dcgmi/Diag.cpp (HelperJsonAddResult,
  HelperJsonAddTestSummary) writes no result for DCGM_DIAG_RESULT_NOT_RUN and no test_summary for a test
  whose own result is NOT_RUN. Such a test is "not run"; the rest of the document is still judged. A real
  4.x test as dcgmi wrote it on an 8-GPU node (per-GPU results with info arrays, test_summary): NVIDIA/DCGM#215.
- Either shape may say ``"runtime_error"`` under its root key (the diagnostic could not run), and output
  may start with a banner line before the JSON document.
- Exit status: 0 all passed; 226 (DCGM_ST_NVVS_ERROR = -30) a test failed; 205 (DCGM_ST_NVVS_ISOLATE_ERROR
  = -51) a failure of ISOLATE severity; 235 (DCGM_ST_CONNECTION_NOT_VALID = -21) no nv-hostengine.

Facts schema::

    dcgmi  "/usr/bin/dcgmi" | None          level 1|2|3
    ran    bool (False: CPU-only node, or too little time left: "not_started" says why)
    argv, rc int|None, timed_out bool, timeout_s float, elapsed_s float
    result {format "3.x"|"4.x"|"text", version, driver, rc, runtime_error str|None, hostengine bool,
            gpus [int], tests [{category, name, status "pass"|"fail"|"warn"|"skip"|"not run", failed ["GPU 3", ...]}],
            errors [{test, entity "GPU 3"|None, gpu int|None, code, category, severity, message}]} | None

Rule (per GPU node). Error severities (dcgmlib/dcgm_errors.h dcgmErrorSeverity_t, each error code's
severity in dcgmlib/src/dcgm_errors.c) become preflight actions:

- ISOLATE ("cannot perform workload, GPU should be isolated"): FAIL, isolate.
- RESET ("drain and reset GPU": pending/failed row remap, graphics processes): FAIL, reset_gpu.
- TRIAGE, UNKNOWN, NONE on a failing test ("should be triaged": NVLink down, Xid, CUDA errors): FAIL, retest
  (rerun and read the error; the diagnostic did not say the hardware is bad).
- CONFIG: FAIL, fix_config (ECC disabled, a denylisted driver, fabric-manager training). Persistence mode
  off (error 29) is a WARN, fix_config: jobs run, the driver re-initialises on every start; not bad hardware.
- MONITOR ("can perform workload, but needs to be monitored"): WARN.
- A failing test with no error listed: FAIL (isolate when dcgmi exited 205, else retest); exit 205 with no
  ISOLATE error parsed still FAILs isolate; exit 226 with nothing failing in the JSON is an ERROR.
- dcgmi overran its deadline, or stopped the diagnostic at its --timeout (runtime_error "Return: (-11)"):
  ERROR (retest; the level and, at level 2, the B200 hang named). Any other runtime error: ERROR. No nv-hostengine: SKIP (DCGM installed but not running is a deployment choice), but WARN when
  other GPU nodes of the run did run the diagnostic (the service died here).
- all tests passed, skipped or not run: PASS naming the DCGM version, level, tests and GPUs; every listed test
  not run: ERROR (retest).
- A document neither format allows (a field of the wrong type, non-finite numbers, nesting past the JSON
  decoder's depth) is a ParseError naming the field, so the probe reports it as such.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.common import one_line, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node

NAME = "dcgm"
#: How long each level may run before dcgmi is killed (DCGM user guide, "Run levels": level 1 ~seconds,
#: level 2 ~2 minutes, level 3 ~30 minutes on 8 GPUs), with headroom for slow starts.
LEVEL_BUDGET_S = {1: 90.0, 2: 420.0, 3: 2700.0}
#: The seconds kept free before the probe run's deadline (the probe must still answer after a kill).
DEADLINE_SLACK_S = 3.0
#: dcgmi's own --timeout is this much shorter than the kill: time for it to stop the diagnostic and answer.
INNER_MARGIN_S = 10.0
SEVERITIES = {0: "NONE", 1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET"}
EXIT_TEST_FAILED, EXIT_ISOLATE, EXIT_NO_HOSTENGINE = 226, 205, 235
PERSISTENCE_MODE = 29  # DCGM_FR_PERSISTENCE_MODE
ROOT_3X, ROOT_4X = "DCGM GPU Diagnostic", "DCGM Diagnostic"
STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip"}
_HOSTENGINE = re.compile(r"host ?engine|unable to establish a connection", re.I)


# --------------------------------------------------------------------------------------------- probe


def prepare(cluster: Mapping[str, Any], node: str, is_head: bool) -> Dict[str, Any]:
    """Phase-1 config: the diagnostic level the run asked for (`--dcgm-level`, default 1)."""
    return {"level": int(cluster.get("dcgm_level") or 1)}


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


# --------------------------------------------------------------------------------------------- parse


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


# ---------------------------------------------------------------------------------------------- rule

#: severity -> (status, action) of the finding it makes
_VERDICT = {
    "ISOLATE": (Status.FAIL, "isolate"),
    "RESET": (Status.FAIL, "reset_gpu"),
    "TRIAGE": (Status.FAIL, "retest"),
    "UNKNOWN": (Status.FAIL, "retest"),
    "NONE": (Status.FAIL, "retest"),
    "CONFIG": (Status.FAIL, "fix_config"),
    "MONITOR": (Status.WARN, None),
}
_WORDS = {
    "isolate": "DCGM says isolate the GPU",
    "reset_gpu": "DCGM says drain and reset the GPU",
    "retest": "DCGM says triage: rerun and read the error",
    "fix_config": "a configuration DCGM rejects",
    None: "DCGM says monitor: the GPU can still run work",
}


def _describe(err: Mapping[str, Any]) -> str:
    where = "%s %s" % (err["entity"], err["test"]) if err.get("entity") else err["test"]
    return "%s: %s (error %s, %s)" % (where, err["message"], err.get("code"), err["severity"])


def _verdict(err: Mapping[str, Any]) -> Tuple[Status, Optional[str]]:
    if err.get("code") == PERSISTENCE_MODE:
        return Status.WARN, "fix_config"
    return _VERDICT.get(err["severity"], (Status.FAIL, "retest"))


def _label(facts: Mapping[str, Any]) -> str:
    result = facts.get("result") or {}
    return "dcgmi diag -r %s (DCGM %s)" % (facts.get("level"), result.get("version") or "?")


def _judge_result(name: str, facts: Mapping[str, Any]) -> List[Finding]:
    result = facts["result"]
    label = _label(facts)
    rc = result.get("rc")
    groups: Dict[Tuple[Status, Optional[str]], List[Dict[str, Any]]] = {}
    for err in result["errors"]:
        groups.setdefault(_verdict(err), []).append(err)
    out: List[Finding] = []
    for (status, action), errs in sorted(groups.items(), key=lambda kv: -kv[0][0].rank):
        shown = "; ".join(_describe(e) for e in errs[:3]) + ("; and %d more" % (len(errs) - 3) if len(errs) > 3 else "")
        out.append(Finding(NAME, name, status, "%s %s: %s — %s" % (name, label, shown, _WORDS[action]),
                           expected="every DCGM test passes", actual=shown, data={"errors": errs, "rc": rc},
                           action=action))
    failing = [t for t in result["tests"] if t["status"] == "fail"]
    explained = {e["test"] for e in result["errors"]}  # a test failed by its errors is judged by them
    silent = [t for t in failing if t["name"] not in explained]
    if silent:
        what = ", ".join("%s (%s)" % (t["name"], ", ".join(t["failed"]) or "node") for t in silent)
        out.append(Finding(NAME, name, Status.FAIL, "%s %s: failed %s without an error message%s" % (
            name, label, what, "; dcgmi exited 205 (isolate)" if rc == EXIT_ISOLATE else ""),
            expected="every DCGM test passes", actual=what, action="isolate" if rc == EXIT_ISOLATE else "retest"))
    if rc == EXIT_ISOLATE and not any(f.action == "isolate" for f in out):
        out.append(Finding(NAME, name, Status.FAIL, "%s %s: exited 205, an isolate-class failure, though its JSON names "
                           "no ISOLATE error" % (name, label), expected="exit 0", actual="exit 205", action="isolate"))
    if rc == EXIT_TEST_FAILED and not any(f.status.is_problem or f.status is Status.WARN for f in out):
        out.append(Finding(NAME, name, Status.ERROR, "%s %s: exited 226 (a test failed) but its JSON names no failing "
                           "test" % (name, label), expected="exit 0", actual="exit 226"))
    if rc not in (0, EXIT_TEST_FAILED, EXIT_ISOLATE) and not out:
        out.append(Finding(NAME, name, Status.ERROR, "%s %s: exited %s with every listed test passing" % (name, label, rc),
                           expected="exit 0", actual="exit %s" % rc))
    if not out:
        out.append(_all_passed(name, label, result))
    return out


def _all_passed(name: str, label: str, result: Mapping[str, Any]) -> Finding:
    """PASS naming what ran; ERROR when dcgmi listed tests but ran none of them."""
    count = {s: len([t for t in result["tests"] if t["status"] == s]) for s in ("pass", "skip", "not run")}
    if result["tests"] and count["not run"] == len(result["tests"]):
        return Finding(NAME, name, Status.ERROR, "%s %s: listed %s but ran none" % (
            name, label, plural(count["not run"], "test")), expected="a result per test", actual="not run",
            action="retest")
    return Finding(NAME, name, Status.PASS, "%s: %s on %s: %s passed%s%s (driver %s)" % (
        name, label, plural(len(result["gpus"]), "GPU"), plural(count["pass"], "test"),
        ", %d skipped" % count["skip"] if count["skip"] else "",
        ", %d not run" % count["not run"] if count["not run"] else "", result.get("driver") or "?"))


def _overran(name: str, facts: Mapping[str, Any], how: str) -> Finding:
    hang = " (level 2 is known to hang on B200/GB200: run level 1, or raise --timeout)" if facts.get("level") == 2 else ""
    limit = facts.get("timeout_s") or 0
    return Finding(NAME, name, Status.ERROR, "%s: dcgmi diag -r %s did not finish within %g s (%s)%s" % (
        name, facts.get("level"), limit, how, hang), expected="a result within %g s" % limit, actual="no answer",
        action="retest")


def _judge(node: Any, facts: Mapping[str, Any], diagnosed: int) -> List[Finding]:
    name = node.name
    if facts.get("dcgmi") is None:
        return [Finding(NAME, name, Status.SKIP, "dcgmi not installed: DCGM diagnostics not run")]
    if not facts.get("ran"):
        return [Finding(NAME, name, Status.ERROR, "%s: dcgmi diag not started: %s" % (name, facts.get("not_started") or "?"))]
    if facts.get("timed_out"):
        return [_overran(name, facts, "killed")]
    result = facts.get("result") or {}
    if result.get("runtime_error"):
        if "Return: (-11)" in result["runtime_error"]:
            return [_overran(name, facts, "dcgmi stopped it at its --timeout")]
        if not result.get("hostengine"):
            text = "%s: dcgmi is installed but nv-hostengine does not answer (%s)" % (name, result["runtime_error"])
            if diagnosed:
                return [Finding(NAME, name, Status.WARN, text + "; %s ran the diagnostic: start nvidia-dcgm here" % plural(diagnosed, "other node"),
                                action="fix_config")]
            return [Finding(NAME, name, Status.SKIP, text + ": DCGM diagnostics not run")]
        return [Finding(NAME, name, Status.ERROR, "%s: %s could not run: %s (exit %s)" % (
            name, _label(facts), result["runtime_error"], result.get("rc")), action="retest")]
    return _judge_result(name, facts)


def _diagnosed(facts: Any) -> bool:
    return isinstance(facts, dict) and isinstance(facts.get("result"), dict) and bool(facts["result"].get("tests"))


def rule(view: ClusterView) -> List[Finding]:
    ran = {n for n, f in view.of(NAME).items() if _diagnosed(f)}
    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, len(ran - {node.name})))


CHECK = Check(
    name=NAME,
    claim="Where DCGM is installed, `dcgmi diag` (level 1; --dcgm-level 2|3 for the hardware runs) passes on every GPU",
    why="DCGM's diagnostic is NVIDIA's own verdict on a GPU: deployment problems (driver, libraries, persistence, "
    "pending row remaps, InfoROM) at level 1, memory, PCIe, NVLink and stress faults at levels 2-3; a GPU it asks "
    "to isolate or reset fails the job that lands on it.",
    fix="Follow the error's severity: ISOLATE: drain the node and RMA the GPU; RESET: drain, `nvidia-smi -r -i N` "
    "or reboot; CONFIG: fix the setting named (nvidia-smi -pm 1, ECC, fabric manager); TRIAGE: rerun "
    "`dcgmi diag -r 2` and read the error; no nv-hostengine: `systemctl start nvidia-dcgm`.",
    probe=probe,
    rule=rule,
    prepare=prepare,
    action="retest",
    reads="dcgmi diag -r LEVEL -j, where dcgmi is installed",
    takes="level 1 ~10-90 s, 2 ~2-7 min, 3 ~30 min; 0 without dcgmi",
    order=47,
)

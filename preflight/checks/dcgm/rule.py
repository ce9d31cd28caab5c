"""The dcgm check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.checks.dcgm import NAME
from preflight.common import plural
from preflight.model import ClusterView, Finding, Status, per_gpu_node

EXIT_TEST_FAILED, EXIT_ISOLATE, EXIT_NO_HOSTENGINE = 226, 205, 235
PERSISTENCE_MODE = 29  # DCGM_FR_PERSISTENCE_MODE


def prepare(cluster: Mapping[str, Any], node: str, is_head: bool) -> Dict[str, Any]:
    """Phase-1 config: the diagnostic level the run asked for (`--dcgm-level`, default 1)."""
    return {"level": int(cluster.get("dcgm_level") or 1)}


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

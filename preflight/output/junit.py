"""The report as JUnit XML, so CI systems (Jenkins, GitLab, GitHub test reporters) show each check.

Shape (the common Ant/Jenkins/GitLab dialect)::

    <testsuites name="preflight" tests= failures= errors= skipped= time=>
      <testsuite name="preflight" tests= failures= errors= skipped= time= timestamp=>
        <properties> schema_version, preflight_version, inventory, inventory_sha256, exit_code,
                     nodes_pass, nodes_warn, nodes_fail, nodes_unavailable (the report's node_summary:
                     the same node counts as the terminal, the JSON and Prometheus) </properties>
        <testcase classname="preflight.<check>" name="<node>">      one per (check, node)
        <testcase classname="preflight.<check>" name="<check>">     a cluster-wide finding (node null)

All findings of one (check, node) make one case; the worst status (`Status.rank`) decides it:

    fail  -> <failure message= type="fail:isolate">  every finding of the case in the body; the type
                                                    names the action(s) asked for after the status
    error -> <error message= type="error:retest">    likewise
    skip  -> <skipped message=>                     also a node Slurm had out of service (unavailable)
                                                    and a check that could not run on an unreachable node
                                                    (data.not_run): its node's ssh case carries the cause
    warn  -> passes; the messages go to <system-out>
    pass  -> passes; the messages go to <system-out>

`timestamp` is the run's start in UTC without a zone suffix (the JUnit schema forbids one).
Characters XML 1.0 cannot carry (ANSI escapes from command output, NUL, ...) are written as ``\\xNN``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.output.history import PathLike, atomic_write_text, parse_timestamp
from preflight.model import Status

SUITE_NAME = "preflight"

# XML 1.0 Char production, complemented: what must not appear in the document at all.
_INVALID_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(text: Any) -> str:
    return _INVALID_XML.sub(lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256
                            else "\\u%04x" % ord(m.group()), str(text))


def _finding_line(result: Mapping[str, Any]) -> str:
    line = "[%s] %s" % (result.get("status", "?"), result.get("message", ""))
    extra = []
    if result.get("action") is not None:
        extra.append("action %s" % result["action"])
    if result.get("expected") is not None:
        extra.append("expected %s" % result["expected"])
    if result.get("actual") is not None:
        extra.append("actual %s" % result["actual"])
    if extra:
        line += " (%s)" % ", ".join(extra)
    return line


def _action_type(findings: List[Mapping[str, Any]], worst: Status, plain: str) -> str:
    """The failure's type attribute: "fail" / "error", then the actions asked for ("fail:isolate")."""
    actions: List[str] = []
    for f in findings:
        if f["status"] == worst.value and f.get("action") and f["action"] not in actions:
            actions.append(f["action"])
    return ":".join([plain] + actions)


def _group(results: List[Mapping[str, Any]]) -> Dict[Tuple[str, Optional[str]], List[Mapping[str, Any]]]:
    """Findings by (check, node), keyed in order of first appearance."""
    cases: Dict[Tuple[str, Optional[str]], List[Mapping[str, Any]]] = {}
    for result in results:
        cases.setdefault((result["check"], result.get("node")), []).append(result)
    return cases


def _junit_timestamp(started_at: Optional[str]) -> Optional[str]:
    started = parse_timestamp(started_at)
    return started.strftime("%Y-%m-%dT%H:%M:%S") if started else None


def _set(elem: ET.Element, **attrs: Any) -> None:
    for key, value in attrs.items():
        if value is not None:
            elem.set(key, _xml_safe(value))


def to_junit(report: Mapping[str, Any]) -> str:
    """The report document as a JUnit XML string (UTF-8 declaration, ``<testsuites>`` root)."""
    cases = _group(list(report.get("results") or []))
    counts = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
    duration = "%.3f" % float(report.get("duration_s") or 0.0)

    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite")
    props = ET.SubElement(suite, "properties")
    for name in ("schema_version", "preflight_version", "inventory", "inventory_sha256", "exit_code"):
        if report.get(name) is not None:
            _set(ET.SubElement(props, "property"), name=name, value=report[name])
    for status, count in (report.get("node_summary") or {}).items():
        _set(ET.SubElement(props, "property"), name="nodes_%s" % status, value=count)
    if not len(props):
        suite.remove(props)

    for (check, node), findings in cases.items():
        worst = max((Status(f["status"]) for f in findings), key=lambda s: s.rank)
        if all((f.get("data") or {}).get("not_run") for f in findings):
            worst = Status.SKIP  # counted once, as its node's ssh failure (the report's summary: not_run)
        case = ET.SubElement(suite, "testcase")
        _set(case, classname="%s.%s" % (SUITE_NAME, check), name=node if node is not None else check)
        lines = "\n".join(_finding_line(f) for f in findings)
        headline = "; ".join(f.get("message", "") for f in findings if f["status"] == worst.value) or findings[0].get("message", "")
        if worst is Status.FAIL:
            counts["failures"] += 1
            failure = ET.SubElement(case, "failure")
            _set(failure, message=headline, type=_action_type(findings, worst, "fail"))
            failure.text = _xml_safe(lines)
        elif worst is Status.ERROR:
            counts["errors"] += 1
            error = ET.SubElement(case, "error")
            _set(error, message=headline, type=_action_type(findings, worst, "error"))
            error.text = _xml_safe(lines)
        else:
            if worst is Status.SKIP:
                counts["skipped"] += 1
                _set(ET.SubElement(case, "skipped"), message=headline)
            out = ET.SubElement(case, "system-out")
            out.text = _xml_safe(lines)

    timestamp = _junit_timestamp(report.get("started_at"))
    for elem in (root, suite):
        _set(elem, name=SUITE_NAME, **{k: str(v) for k, v in counts.items()}, time=duration)
    _set(suite, timestamp=timestamp)
    # attribute order: name, counts, time, timestamp; properties first among children (as the XSD wants)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(report: Mapping[str, Any], path: PathLike) -> None:
    """Write `to_junit(report)` to path atomically."""
    atomic_write_text(path, to_junit(report))

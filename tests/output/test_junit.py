"""JUnit XML: parsed back by junitparser and checked against the structure Jenkins and GitLab read."""

import xml.etree.ElementTree as ET

import pytest

junitparser = pytest.importorskip("junitparser")

from preflight.output.junit import to_junit, write_junit  # noqa: E402


def _report(results, **extra):
    doc = {
        "preflight_version": "0.1.0",
        "started_at": "2026-11-22T13:30:00Z",
        "duration_s": 12.3,
        "inventory": "hosts.yaml",
        "inventory_sha256": "ab" * 32,
        "checks": ["ssh", "gpu", "driver", "fabric_manager", "allreduce"],
        "nodes": [{"name": "n001", "host": "198.18.0.2", "gpus": 8, "status": "fail"},
                  {"name": "n002", "host": "198.18.0.3", "gpus": 8, "status": "warn"}],
        "results": results,
        "summary": {},
        "allreduce": None,
        "exit_code": 1,
    }
    doc.update(extra)
    return doc


def _r(check, node, status, message, **kw):
    return dict(check=check, node=node, status=status, message=message, **kw)


RESULTS = [
    _r("ssh", "n001", "pass", "reachable"),
    _r("ssh", "n002", "pass", "reachable"),
    _r("gpu", "n001", "pass", "GPU0 ok"),
    _r("gpu", "n001", "fail", "GPU3 missing", expected="8 GPUs", actual="7 GPUs"),
    _r("gpu", "n001", "warn", "GPU5 hot"),
    _r("gpu", "n002", "warn", "GPU1 retired pages 3"),
    _r("driver", None, "error", "no driver facts gathered"),
    _r("fabric_manager", "n001", "skip", "no NVSwitch on this node"),
    _r("fabric_manager", "n002", "skip", "no NVSwitch on this node"),
    _r("allreduce", None, "pass", "busbw 180 GB/s"),
]


def _cases(xml_text):
    suites = junitparser.JUnitXml.fromstring(xml_text)
    (suite,) = list(suites)
    return suite, {(c.classname, c.name): c for c in suite}


def test_parsed_by_junitparser_with_counts_and_cases():
    text = to_junit(_report(RESULTS))
    suite, cases = _cases(text)
    assert suite.name == "preflight"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (8, 1, 1, 2)
    assert suite.time == pytest.approx(12.3)
    assert suite.timestamp == "2026-11-22T13:30:00"
    assert set(cases) == {
        ("preflight.ssh", "n001"), ("preflight.ssh", "n002"),
        ("preflight.gpu", "n001"), ("preflight.gpu", "n002"),
        ("preflight.driver", "driver"),
        ("preflight.fabric_manager", "n001"), ("preflight.fabric_manager", "n002"),
        ("preflight.allreduce", "allreduce"),
    }


def test_worst_status_wins_and_every_message_is_in_the_body():
    _, cases = _cases(to_junit(_report(RESULTS)))
    gpu1 = cases[("preflight.gpu", "n001")]
    (failure,) = gpu1.result
    assert isinstance(failure, junitparser.Failure)
    assert failure.message == "GPU3 missing"
    assert failure.type == "fail"
    for text in ("GPU0 ok", "GPU3 missing", "expected 8 GPUs", "actual 7 GPUs", "GPU5 hot"):
        assert text in failure.text

    driver = cases[("preflight.driver", "driver")]
    assert isinstance(driver.result[0], junitparser.Error)
    assert driver.result[0].message == "no driver facts gathered"

    skipped = cases[("preflight.fabric_manager", "n001")]
    assert isinstance(skipped.result[0], junitparser.Skipped)
    assert skipped.result[0].message == "no NVSwitch on this node"


def test_warn_passes_with_message_in_system_out():
    _, cases = _cases(to_junit(_report(RESULTS)))
    warned = cases[("preflight.gpu", "n002")]
    assert warned.is_passed and not warned.result
    assert "GPU1 retired pages 3" in warned.system_out
    assert cases[("preflight.ssh", "n001")].is_passed


def test_structure_jenkins_and_gitlab_accept():
    root = ET.fromstring(to_junit(_report(RESULTS)).encode("utf-8"))
    assert root.tag == "testsuites"
    for attr in ("tests", "failures", "errors", "time"):
        assert attr in root.attrib
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for attr in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp"):
        assert attr in suite.attrib
    children = [c.tag for c in suite]
    # properties (if any) first, then only testcases
    assert children[0] == "properties" and set(children[1:]) == {"testcase"}
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["preflight_version"] == "0.1.0" and props["exit_code"] == "1"
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases)
    assert int(suite.get("failures")) == len(suite.findall("testcase/failure"))
    assert int(suite.get("errors")) == len(suite.findall("testcase/error"))
    assert int(suite.get("skipped")) == len(suite.findall("testcase/skipped"))
    allowed = {"failure", "error", "skipped", "system-out", "system-err"}
    for case in cases:
        assert case.get("classname") and case.get("name")
        assert {c.tag for c in case} <= allowed
        assert len([c for c in case if c.tag in ("failure", "error", "skipped")]) <= 1


def test_hostile_text_is_escaped_and_stays_well_formed():
    nasty = 'a <b> & "c" \'d\'\nline2 \x1b[31mred\x1b[0m \x00'
    results = [_r("gpu", 'n"<&>', "fail", nasty, actual="]]>")]
    text = to_junit(_report(results))
    _, cases = _cases(text)
    (case,) = cases.values()
    assert case.name == 'n"<&>'
    msg = case.result[0].message
    assert msg.startswith('a <b> & "c" \'d\'\nline2 \\x1b[31mred')
    assert msg.endswith("\\x00")
    assert "actual ]]>" in case.result[0].text


def test_empty_report_is_a_valid_empty_suite():
    suite, cases = _cases(to_junit(_report([])))
    assert cases == {} and suite.tests == 0 and suite.failures == 0


def test_write_junit_is_atomic_and_readable(tmp_path):
    path = tmp_path / "preflight.xml"
    path.write_text("old")
    write_junit(_report(RESULTS), path)
    assert path.read_text(encoding="utf-8") == to_junit(_report(RESULTS))
    assert [p.name for p in tmp_path.iterdir()] == ["preflight.xml"]
    junitparser.JUnitXml.fromfile(str(path))

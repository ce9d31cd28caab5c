"""dcgm: the probe through a `dcgmi` on PATH (documents, exit codes, banner, hang) and the rule's verdicts."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest

from preflight.checks.dcgm import probe as dcgm_probe
from preflight.checks.dcgm import rule as dcgm_rule
from preflight.model import ParseError, Status
from preflight.probe.context import NodeContext
from tests import fixture_cases as fc
from tests.builders import StubNode, names, view
from tests.sim.dcgm_hw import install_dcgmi


@pytest.fixture
def node(tmp_path, monkeypatch):
    stub = StubNode(tmp_path)
    monkeypatch.setenv("PATH", stub.bin_dir)
    return stub


def _ctx(level=1, gpus=8, deadline_s=None):
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    return NodeContext({"level": level, "node": {"gpus_per_node": gpus}}, deadline=deadline)


# ----------------------------------------------------------------------------------------------- probe


def test_probe_without_dcgmi_runs_nothing(node):
    assert dcgm_probe.probe(_ctx()) == {"dcgmi": None, "level": 1, "ran": False}


def test_probe_reads_the_document_after_a_banner_with_its_exit_status(node):
    install_dcgmi(node, "dcgm4_r1_persistence_off", banner="Warning: nv-hostengine 4.2.3 is newer than dcgmi\n")
    facts = dcgm_probe.probe(_ctx())
    assert facts["ran"] and facts["rc"] == 226 and not facts["timed_out"]
    assert facts["argv"][:6] == ["dcgmi", "diag", "-r", "1", "-j", "--timeout"]
    assert int(facts["argv"][6]) == dcgm_probe.LEVEL_BUDGET_S[1] - dcgm_probe.INNER_MARGIN_S  # dcgmi stops it before the kill
    assert facts["result"] == fc.expected("dcgm", "dcgm4_r1_persistence_off")


def test_probe_asks_for_the_level_given(node):
    install_dcgmi(node, "dcgm4_r2_dbe_isolate", levels=(2,))
    facts = dcgm_probe.probe(_ctx(level=2))
    assert facts["rc"] == 205 and facts["result"]["errors"][1]["severity"] == "ISOLATE"


def test_probe_on_a_cpu_only_node_does_not_run_dcgmi(node):
    install_dcgmi(node, hang=True)
    facts = dcgm_probe.probe(_ctx(gpus=0))
    assert facts["ran"] is False and facts["not_started"] == "CPU-only node"


def test_a_hung_diagnostic_is_killed_before_the_probe_deadline(node):
    path = install_dcgmi(node, hang=True)
    t0 = time.monotonic()
    facts = dcgm_probe.probe(_ctx(level=2, deadline_s=dcgm_probe.DEADLINE_SLACK_S + 6))
    took = time.monotonic() - t0
    assert facts["timed_out"] and facts["rc"] is None and facts["result"] is None
    assert took < dcgm_probe.DEADLINE_SLACK_S + 6  # it answered before the run's deadline
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(path)], "dcgmi outlived its deadline"
    out = dcgm_rule.rule(_one(facts))
    assert out[0].status is Status.ERROR and "did not finish within" in out[0].message
    assert "known to hang on B200/GB200" in out[0].message and "(killed)" in out[0].message


def test_a_diagnostic_dcgmi_stops_at_its_own_timeout_is_an_error_naming_it(node):
    install_dcgmi(node, hang="stops")
    facts = dcgm_probe.probe(_ctx(level=2, deadline_s=dcgm_probe.DEADLINE_SLACK_S + dcgm_probe.INNER_MARGIN_S + 3))
    assert not facts["timed_out"] and facts["rc"] == 245 and "Return: (-11)" in facts["result"]["runtime_error"]
    out = dcgm_rule.rule(_one(facts))
    assert out[0].status is Status.ERROR and "(dcgmi stopped it at its --timeout)" in out[0].message
    assert "known to hang on B200/GB200" in out[0].message


def test_a_dcgmi_before_3_3_8_is_run_again_without_timeout(node):
    install_dcgmi(node, "dcgm3_r1_pass_banner", old=True)
    facts = dcgm_probe.probe(_ctx())
    assert facts["argv"] == ["dcgmi", "diag", "-r", "1", "-j"] and facts["rc"] == 0
    assert facts["result"]["version"] == "3.3.1"


def _cmdline(pid):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def test_too_little_time_left_starts_nothing(node):
    install_dcgmi(node, hang=True)
    facts = dcgm_probe.probe(_ctx(deadline_s=4))
    assert facts["ran"] is False and "left before the probe deadline" in facts["not_started"]
    assert dcgm_rule.rule(_one(facts))[0].status is Status.ERROR


def test_no_hostengine_is_read_from_the_plain_text_error(node):
    install_dcgmi(node, "no_hostengine")
    facts = dcgm_probe.probe(_ctx())
    assert facts["result"]["hostengine"] is False and facts["rc"] == 235


def test_prepare_passes_the_level_and_defaults_to_1():
    assert dcgm_rule.prepare({}, "n001", True) == {"level": 1}
    assert dcgm_rule.prepare({"dcgm_level": 3}, "n001", False) == {"level": 3}


# ------------------------------------------------------------------------------------------------ rule


def _facts(case, level=1):
    result = copy.deepcopy(fc.expected("dcgm", case))
    return {"dcgmi": "/usr/bin/dcgmi", "level": level, "ran": True, "rc": result["rc"], "timed_out": False,
            "timeout_s": 90.0, "result": result}


def _one(facts, gpus=8):
    return view({"n001": {"dcgm": facts}}, gpus=gpus)


def test_all_passed_is_a_pass_naming_version_level_and_gpus():
    out = dcgm_rule.rule(_one(_facts("dcgm4_r1_pass_4gpu")))
    assert [f.status for f in out] == [Status.PASS]
    assert out[0].message == "n001: dcgmi diag -r 1 (DCGM 4.2.3) on 4 GPUs: 1 test passed (driver 570.148.08)"
    out = dcgm_rule.rule(_one(_facts("dcgm3_r1_pass_banner")))
    assert out[0].status is Status.PASS and "9 tests passed" in out[0].message and "DCGM 3.3.1" in out[0].message


def test_persistence_off_is_a_config_warning_not_bad_hardware():
    out = dcgm_rule.rule(_one(_facts("dcgm4_r1_persistence_off")))
    assert [(f.status, f.action) for f in out] == [(Status.WARN, "fix_config")]
    assert "GPU 1 software: Persistence mode for GPU 1 is disabled" in out[0].message
    assert "error 29, CONFIG" in out[0].message


def test_isolate_severity_fails_with_isolate_and_monitor_stays_a_warning():
    out = dcgm_rule.rule(_one(_facts("dcgm4_r2_dbe_isolate", level=2)))
    got = [(f.status, f.action) for f in out]
    assert got == [(Status.FAIL, "isolate"), (Status.WARN, None)], out
    assert "GPU 2 memory: Detected 2 volatile double-bit ECC error(s) in GPU 2" in out[0].message
    assert "DCGM says isolate the GPU" in out[0].message and "dcgmi diag -r 2" in out[0].message


def test_triage_fails_with_retest_and_the_3x_deployment_error_is_read():
    out = dcgm_rule.rule(_one(_facts("dcgm3_r2_nvlink_down_persistence", level=2)))
    got = [(f.status, f.action) for f in out]
    assert got == [(Status.FAIL, "retest"), (Status.WARN, "fix_config")], out
    assert "GPU 0 PCIe: GPU 0's NvLink link 0 is currently down" in out[0].message and "and 2 more" in out[0].message
    assert "Persistence Mode: Persistence mode for GPU 0 is disabled" in out[1].message


def test_reset_severity_asks_for_a_gpu_reset():
    facts = _facts("dcgm4_r1_persistence_off")
    err = facts["result"]["errors"][0]
    err.update(code=80, severity="RESET", message="GPU 1 had uncorrectable memory errors and row remapping failed.")
    out = dcgm_rule.rule(_one(facts))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")]


def test_exit_205_without_an_isolate_error_still_isolates():
    facts = _facts("dcgm4_r1_persistence_off")
    facts["result"]["rc"] = 205
    out = dcgm_rule.rule(_one(facts))
    assert (Status.FAIL, "isolate") in [(f.status, f.action) for f in out]
    assert any("exited 205" in f.message for f in out)


def test_a_failed_test_without_an_error_is_not_passed():
    facts = _facts("dcgm4_r1_persistence_off")
    facts["result"]["errors"] = []
    out = dcgm_rule.rule(_one(facts))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "retest")]
    assert "failed software (GPU 1) without an error message" in out[0].message


def test_exit_226_with_nothing_failing_is_an_error():
    facts = _facts("dcgm4_r1_pass_4gpu")
    facts["result"]["rc"] = 226
    assert [f.status for f in dcgm_rule.rule(_one(facts))] == [Status.ERROR]


def test_runtime_errors_are_errors():
    out = dcgm_rule.rule(_one(_facts("dcgm4_runtime_error_timeout", level=2)))
    assert [f.status for f in out] == [Status.ERROR] and "did not finish within 90 s (dcgmi stopped it" in out[0].message
    facts = _facts("dcgm4_runtime_error_timeout")
    facts["result"]["runtime_error"] = "Error: Unable to complete diagnostic for group 2147483647. Return: (-7) : DCGM initialization error"
    out = dcgm_rule.rule(_one(facts))
    assert [f.status for f in out] == [Status.ERROR] and "could not run: Error: Unable to complete" in out[0].message


def test_no_hostengine_skips_alone_and_warns_when_other_nodes_ran_it():
    alone = dcgm_rule.rule(_one(_facts("no_hostengine")))
    assert [f.status for f in alone] == [Status.SKIP] and "nv-hostengine does not answer" in alone[0].message
    n = names(3)
    facts = {n[0]: {"dcgm": _facts("dcgm4_r1_pass_4gpu")}, n[1]: {"dcgm": _facts("dcgm4_r1_pass_4gpu")},
             n[2]: {"dcgm": _facts("no_hostengine")}}
    out = {f.node: f for f in dcgm_rule.rule(view(facts))}
    assert out[n[2]].status is Status.WARN and "2 other nodes ran the diagnostic" in out[n[2]].message
    assert out[n[0]].status is Status.PASS


def test_not_installed_skips_and_cpu_only_nodes_skip():
    out = dcgm_rule.rule(_one({"dcgmi": None, "level": 1, "ran": False}))
    assert [f.status for f in out] == [Status.SKIP] and "dcgmi not installed" in out[0].message
    cpu = view({"c1": {"dcgm": {"dcgmi": "/usr/bin/dcgmi", "level": 1, "ran": False,
                                "not_started": "CPU-only node"}}}, gpus=0)
    assert [f.status for f in dcgm_rule.rule(cpu)] == [Status.SKIP]


def test_missing_facts_are_an_error_never_a_pass():
    assert [f.status for f in dcgm_rule.rule(view({"n001": {}}))] == [Status.ERROR]


def test_node_read_text_reaches_the_report_as_one_printable_line():
    doc = open(os.path.join(fc.fixture_dir("dcgm"), "dcgm4_r1_persistence_off.txt")).read()
    doc = doc.replace("Persistence mode for GPU 1 is disabled.", "Persistence\\u001b[2J mode\\nfor GPU 1 is disabled.")
    err = dcgm_probe.parse_dcgmi_diag(doc, "", 226)["errors"][0]
    assert err["message"].startswith("Persistence?[2J mode for GPU 1 is disabled.")


def test_level_3_needs_a_deadline_that_fits_and_level_2_raises_an_unset_one(capsys):
    from preflight import cli, engine
    from preflight.errors import UsageError

    assert cli.main(["node", "--dcgm-level", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dcgm-level 3 runs `dcgmi diag -r 3` for up to 2700 s" in err and "--timeout 2716" in err
    assert engine.dcgm_timeout(1, None) is None and engine.dcgm_timeout(1, 30.0) == 30.0
    assert engine.dcgm_timeout(2, None) == dcgm_probe.LEVEL_BUDGET_S[2] + 2 * dcgm_probe.DEADLINE_SLACK_S + 10.0
    assert engine.dcgm_timeout(3, 3000.0) == 3000.0
    with pytest.raises(UsageError, match="--timeout 100 is shorter"):
        engine.dcgm_timeout(2, 100.0)


# ------------------------------------------------------------------------------- tests listed, not run


def test_a_test_listed_but_not_run_is_not_run_and_the_isolate_on_another_gpu_still_fails():
    """DCGM 4.x writes {"name": "pcie"} alone for a test it did not run (dcgmi/Diag.cpp HelperJsonAddResult);
    the old parser threw the whole document away as a ParseError and the node stayed in service."""
    facts = _facts("dcgm4_r2_not_run_isolate", level=2)
    assert [(t["name"], t["status"]) for t in facts["result"]["tests"]] == [
        ("software", "pass"), ("memory", "fail"), ("memory_bandwidth", "not run"), ("pcie", "not run")]
    out = dcgm_rule.rule(_one(facts))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "isolate"), (Status.WARN, None)], out
    assert "GPU 2 memory: Detected 2 volatile double-bit ECC error(s) in GPU 2" in out[0].message


def test_not_run_tests_are_named_in_the_pass_and_a_document_with_nothing_run_is_an_error():
    facts = _facts("dcgm4_r1_pass_4gpu")
    facts["result"]["tests"].append({"category": "Integration", "name": "pcie", "status": "not run", "failed": []})
    out = dcgm_rule.rule(_one(facts))
    assert [f.status for f in out] == [Status.PASS] and "1 test passed, 1 not run" in out[0].message
    for test in facts["result"]["tests"]:
        test["status"] = "not run"
    out = dcgm_rule.rule(_one(facts))
    assert [(f.status, f.action) for f in out] == [(Status.ERROR, "retest")] and "listed 2 tests but ran none" in out[0].message


# ------------------------------------------------------------------------------ malformed documents


JSON_CASES = ("dcgm215_dcgm4_r3_diagnostic_excerpt", "dcgm3_r1_pass_banner", "dcgm3_r2_nvlink_down_persistence", "dcgm4_r1_pass_4gpu",
              "dcgm4_r1_persistence_off", "dcgm4_r2_dbe_isolate", "dcgm4_r2_not_run_isolate",
              "dcgm4_runtime_error_timeout")
#: What a malformed field may hold instead: every JSON type, empties, huge and non-integral numbers.
REPLACEMENTS = (None, True, 0, -1, 2 ** 70, 1.5, 1e308, "", "x", "Fail", [], [None], {}, {"name": None})


def _paths(node, path=()):
    yield path
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, path + (key,))


def _mutants(doc):
    """Every field of the document replaced by each REPLACEMENTS value, and every key deleted."""
    for path in list(_paths(doc))[1:]:
        for value in REPLACEMENTS + ("<delete>",):
            copy_ = copy.deepcopy(doc)
            parent = copy_
            for key in path[:-1]:
                parent = parent[key]
            if value == "<delete>":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
            yield path, copy_


def _judge_or_parse_error(text, rc):
    """Parse, then judge what parsed: only a ParseError may come out, never another exception."""
    try:
        result = dcgm_probe.parse_dcgmi_diag(text, "", rc)
    except ParseError as exc:
        assert str(exc).startswith("dcgmi diag -j:") and "\n" not in str(exc)
        return None
    facts = {"dcgmi": "/usr/bin/dcgmi", "level": 2, "ran": True, "rc": rc, "timed_out": False, "timeout_s": 90.0,
             "result": result}
    return dcgm_rule.rule(_one(facts))


@pytest.mark.parametrize("case", JSON_CASES)
def test_every_mutation_of_a_real_document_is_judged_or_a_parse_error(case):
    text = open(os.path.join(fc.fixture_dir("dcgm"), case + ".txt")).read()
    banner, _, body = text.partition("{")
    doc = json.loads("{" + body)
    judged = errors = 0
    for path, mutant in _mutants(doc):
        try:
            out = _judge_or_parse_error(banner + json.dumps(mutant), 226)
        except Exception as exc:  # the failure names the mutation that broke the parser
            raise AssertionError("%s at %s: %s: %s" % (case, "/".join(map(str, path)), type(exc).__name__, exc))
        judged, errors = judged + (out is not None), errors + (out is None)
    assert judged and errors  # the mutations reached both outcomes


@pytest.mark.parametrize("text", [
    '{"DCGM Diagnostic": ' * 100000 + "{}" + "}" * 100000,  # deeper than the JSON decoder recurses
    '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "a", "results": [{"entity_group": '
    '"GPU", "entity_id": 1e400, "status": "Pass"}]}]}]}}',
    '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "a", "results": [{"entity_group": '
    '"GPU", "entity_id": NaN, "status": "Pass"}]}]}]}}',
    '{"DCGM GPU Diagnostic": {"test_categories": []}, "GPU Device IDs": 7}',
    '{"DCGM Diagnostic": {"test_categories": [{"category": "x"}]}}',
    '{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "a", "results": []}]}]},'
    ' "metadata": []}',
])
def test_pathological_documents_are_parse_errors(text):
    with pytest.raises(ParseError, match="^dcgmi diag -j: "):
        dcgm_probe.parse_dcgmi_diag(text, "", 226)


def test_the_real_dcgm4_excerpt_passes():
    """NVIDIA/DCGM#215's 8-GPU 'diagnostic' test (info arrays cut short by DCGM 4): read as one test passed."""
    out = dcgm_rule.rule(_one(_facts("dcgm215_dcgm4_r3_diagnostic_excerpt", level=3)))
    assert [f.status for f in out] == [Status.PASS] and "on 8 GPUs: 1 test passed" in out[0].message

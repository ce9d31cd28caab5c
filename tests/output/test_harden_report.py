"""One unreachable node is one line in the terminal: its cause first, with the checks that could not run."""

from __future__ import annotations

from preflight import engine
from preflight.output import report
from preflight.model import Finding, NodeInfo, Status
from tests.output.test_report import make_report, render
from tests import builders

CHECKS = ["ssh", "gpu", "driver", "fabric_manager", "nic", "ib_hca", "mtu", "ports"]


def unreachable_run(dead=("gpu-0003",)):
    rep = make_report(4, [], selected=CHECKS)
    infos = [NodeInfo(s.name, s.host, 8, i == 0) for i, s in enumerate(rep.inventory.nodes)]
    why = {name: "unreachable: connection refused (%s:22); is sshd running?" % name for name in dead}
    view = builders.view({}, nodes=infos, expect={}, cluster={}, unreachable=why)
    findings = engine.judge(view, ["ssh"]) + [
        f for name in CHECKS[1:] for f in engine.judge(view, [name]) if f.node in dead
    ]
    rep.findings = findings
    rep.view = view
    return rep


def test_unreachable_node_is_one_line_with_its_cause_and_the_checks_not_run():
    rep = unreachable_run()
    text = render(rep, width=160)
    assert "not checked" not in text, text
    statuses = ("PASS", "WARN", "FAIL", "SKIP", "ERROR")
    lines = [l for l in text.splitlines() if "gpu-0003" in l and l.startswith(statuses)]  # table rows
    assert len(lines) == 1, text
    assert lines[0].startswith("FAIL") and "connection refused" in lines[0] and "7 checks not run" in lines[0], lines[0]
    # why/fix only for checks that really failed: ssh here, none of the seven that did not run
    assert "ssh: " in text
    for name in CHECKS[1:]:
        assert "\n%s: " % name not in text, name
    assert "7 not run" in text.splitlines()[-1]


def test_json_keeps_the_not_run_results_as_data():
    rep = unreachable_run()
    doc = report.to_json(rep)
    not_run = [r for r in doc["results"] if r["node"] == "gpu-0003" and r["check"] != "ssh"]
    assert len(not_run) == 7 and all(r["status"] == "error" for r in not_run)


def test_a_real_failure_on_another_node_keeps_its_explanation():
    rep = unreachable_run()
    rep.findings.append(Finding("driver", "gpu-0001", Status.FAIL, "driver 535 (majority 550)"))
    text = render(rep, width=160)
    assert "\ndriver: " in text and "\ngpu: " not in text

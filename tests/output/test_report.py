"""The report: console rendering at a fixed width, JSON round trip, readability at 1,000 nodes."""

from __future__ import annotations

import io
import json
import os

from rich.console import Console

from preflight.output import report
from preflight.engine import RunReport
from preflight.inventory import Inventory, NodeSpec
from preflight.model import Finding, NodeInfo, Status
from tests.report_schema import assert_valid
from tests.paths import REPO
from tests import builders


def make_report(n_nodes, findings, selected=("ssh", "driver", "ib_hca")):
    nodes = [NodeSpec(name="gpu-%04d" % i, host="10.0.%d.%d" % (i // 250, i % 250 + 1), line=i) for i in range(1, n_nodes + 1)]
    inv = Inventory(path="hosts.yaml", nodes=nodes, sha256="ab" * 32)
    infos = [NodeInfo(s.name, s.host, 8, i == 0) for i, s in enumerate(nodes)]
    view = builders.view({s.name: {} for s in nodes}, nodes=infos)
    return RunReport(inv, list(selected), findings, view, "2026-11-22T13:00:00Z", 12.34)


def render(rep, verbose=False, width=100):
    buf = io.StringIO()
    report.render(rep, Console(file=buf, width=width, color_system=None, force_terminal=False), verbose=verbose)
    return buf.getvalue()


def fleet_findings(n):
    out = []
    for i in range(1, n + 1):
        name = "gpu-%04d" % i
        out.append(Finding("ssh", name, Status.PASS, "reachable, python 3.11.7"))
        if i == 64:
            out.append(Finding("driver", name, Status.FAIL, "driver 535.104.05 (majority 550.54.15 on %d nodes)" % (n - 1),
                               expected="550.54.15", actual="535.104.05"))
        else:
            out.append(Finding("driver", name, Status.PASS, "driver 550.54.15"))
        if i in (7, 8, 9, 700):
            out.append(Finding("ib_hca", name, Status.FAIL, "mlx5_3 port 1: state DOWN (expected ACTIVE at 400 Gb/s)"))
        else:
            out.append(Finding("ib_hca", name, Status.PASS, "8 ports ACTIVE at 400 Gb/s"))
    return out


def test_console_report_golden():
    rep = make_report(8, fleet_findings(8)[:24] + [Finding("driver", None, Status.WARN, "no expectation set")])
    text = render(rep)
    expected = (
        "preflight %s · hosts.yaml · 8 nodes · ssh, driver, ib_hca · 12.3 s\n"
        "status  check     nodes            finding                                                \n"
        "FAIL    ib_hca    gpu-[0007-0008]  mlx5_3 port 1: state DOWN (expected ACTIVE at 400 Gb/s)\n"
        "WARN    driver    cluster          no expectation set                                     \n"
        "PASS    2 checks  gpu-[0001-0008]  8 nodes: ssh, driver                                   \n"
        "PASS    ib_hca    gpu-[0001-0006]  6 nodes                                                \n"
    ) % report.__version__
    assert text.startswith(expected), text
    assert "ib_hca: " in text and "fix: " in text  # why and fix printed for the failed check
    assert text.rstrip().endswith("nodes: 6 pass · 0 warn · 2 fail · 0 unavailable\n"
                                  "22 pass · 1 warn · 2 fail · 0 skip · 0 error  → exit 1")


def test_thousand_nodes_fold_to_one_line_per_distinct_finding():
    rep = make_report(1000, fleet_findings(1000))
    text = render(rep, width=160)
    lines = text.splitlines()
    table = lines[1 : lines.index("")]
    assert len(table) == 1 + 5, "\n".join(table)  # header, 2 FAIL rows, 3 PASS rows: one line each
    assert any("gpu-[0007-0009,0700]" in line and "state DOWN" in line for line in table)
    assert any("gpu-0064" in line and "majority 550.54.15 on 999 nodes" in line for line in table)
    assert any("gpu-[0001-1000]" in line and "1000 nodes" in line for line in table)
    # failures come first
    assert table[1].startswith("FAIL") and table[-1].startswith("PASS")


def test_verbose_lists_pass_messages():
    rep = make_report(2, fleet_findings(2))
    assert "reachable, python 3.11.7" in render(rep, verbose=True)
    assert "reachable, python 3.11.7" not in render(rep)


def test_json_round_trip_and_shape():
    findings = fleet_findings(10)
    rep = make_report(10, findings)
    doc = json.loads(report.dumps(report.to_json(rep)))
    assert doc["summary"] == {"pass": 27, "warn": 0, "fail": 3, "skip": 0, "error": 0, "not_run": 0}
    assert doc["node_summary"] == {"pass": 7, "warn": 0, "fail": 3, "unavailable": 0}
    assert_valid(doc)
    assert doc["exit_code"] == 1 and doc["inventory_sha256"] == "ab" * 32
    back = [Finding.from_json(r) for r in doc["results"]]
    assert sorted(back, key=repr) == sorted(findings, key=repr)
    status = {n["name"]: n["status"] for n in doc["nodes"]}
    assert status["gpu-0007"] == "fail" and status["gpu-0001"] == "pass"
    assert [r["status"] for r in doc["results"]][:4] == ["fail"] * 3 + ["pass"]  # failures first


def test_node_without_findings_is_fail_not_pass():
    rep = make_report(2, [Finding("ssh", "gpu-0001", Status.PASS, "ok")])
    doc = report.to_json(rep)
    assert {n["name"]: n["status"] for n in doc["nodes"]} == {"gpu-0001": "pass", "gpu-0002": "fail"}
    assert_valid(doc)


def test_fold_mixes_cluster_and_nodes():
    assert report.fold(["n001", "n002", "n003", "n005"]) == "n[001-003,005]"
    assert report.fold([None]) == "cluster"
    assert report.fold([None, "n001"]) == "cluster, n001"


def test_messages_from_nodes_are_text_not_markup():
    """A gloo error like '[/__w/pytorch/.../pair.cc:537]' once crashed the console report."""
    rep = make_report(1, [Finding("ssh", "gpu-0001", Status.FAIL, "failed [/__w/pair.cc:537] [bold]x[/bold]")])
    assert "failed [/__w/pair.cc:537] [bold]x[/bold]" in render(rep, width=160)


def test_one_truth_node_status_and_counts_in_terminal_json_junit_prometheus():
    """A pass, a warn, a failing, an unreachable (its checks not run) and an unavailable node (Slurm had
    it drained): every output states the same node statuses and the same counts."""
    import re
    import xml.etree.ElementTree as ET

    from preflight.output import junit, prometheus
    from preflight.slurm import drain

    names = ["gpu-%04d" % i for i in range(1, 6)]
    findings = [Finding("ssh", n, Status.PASS, "reachable") for n in names[:3]]
    findings += [Finding("driver", names[0], Status.PASS, "ok"), Finding("driver", names[1], Status.WARN, "old"),
                 Finding("driver", names[2], Status.FAIL, "bad", action="fix_config"),
                 Finding("ssh", names[3], Status.FAIL, "timed out", action="isolate")]
    findings += [Finding(c, names[3], Status.ERROR, "not checked: node unreachable (see ssh)", action="retest",
                         data={"not_run": "unreachable"}) for c in ("driver", "ib_hca")]
    findings += [Finding("ssh", names[4], Status.FAIL, "Slurm reports", action="isolate")]
    findings = drain.set_aside(findings, {names[4]: {"state": ["IDLE", "DRAIN"], "reason": "by hand"}})
    rep = make_report(5, findings)
    doc = json.loads(report.dumps(report.to_json(rep)))
    assert_valid(doc)
    want = {"pass": 1, "warn": 1, "fail": 2, "unavailable": 1}
    assert doc["node_summary"] == want
    assert [n["status"] for n in doc["nodes"]] == ["pass", "warn", "fail", "fail", "unavailable"]
    assert doc["summary"] == {"pass": 4, "warn": 1, "fail": 2, "skip": 1, "error": 0, "not_run": 2}

    text = render(rep, width=160)
    assert "nodes: 1 pass · 1 warn · 2 fail · 1 unavailable" in text
    assert "4 pass · 1 warn · 2 fail · 1 skip · 0 error · 2 not run  → exit 1" in text
    assert "gpu-0005: Slurm reports it IDLE+DRAIN (reason: by hand); not checked" in text
    assert "gpu-0005" not in [line for line in text.splitlines() if line.startswith(("FAIL", "SKIP"))].__str__()

    props = {p.get("name"): p.get("value") for p in ET.fromstring(junit.to_junit(doc).split("\n", 1)[1]).iter("property")}
    assert {k[6:]: int(v) for k, v in props.items() if k.startswith("nodes_")} == want
    assert props["schema_version"] == report.SCHEMA_VERSION
    suite = ET.fromstring(junit.to_junit(doc).split("\n", 1)[1]).find("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("2", "0")  # not-run checks are skipped, not errors

    prom = prometheus.to_prometheus(doc)
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r'^preflight_nodes\{status="(\w+)"\} (\d+)$', prom, re.M)}
    assert counts == want
    assert 'preflight_node_status{node="gpu-0005"} 1' in prom and 'preflight_node_status{node="gpu-0004"} 3' in prom
    assert 'preflight_findings{status="not_run"} 2' in prom and 'preflight_findings{status="error"} 0' in prom


def test_published_schema_is_package_data_and_refuses_an_old_shape():
    """The schema travels in the wheel (pyproject's package-data) and rejects what 1.x readers must
    never meet: a node status outside pass/warn/fail/unavailable, a document without schema_version."""
    import jsonschema
    import pytest

    doc = report.to_json(make_report(2, fleet_findings(2)))
    assert_valid(doc)
    with open(os.path.join(REPO, "pyproject.toml")) as fh:
        assert '"output/report.schema.json"' in fh.read()
    for broken in ({**doc, "nodes": [dict(doc["nodes"][0], status="skip")]},
                   {k: v for k, v in doc.items() if k != "schema_version"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, report.schema())

"""The CLI's usage errors: one line, exit 2, before any connection."""

from __future__ import annotations

import json

import pytest

from preflight import cli


def one_line(capsys):
    return first_line(capsys.readouterr().err)


def first_line(err):
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


GOOD = {"preflight_version": "0.1.0", "started_at": "2026-01-01T00:00:00Z", "inventory": "h", "inventory_sha256": "1",
        "checks": ["ssh"], "nodes": [{"name": "a", "host": "a", "gpus": 0, "head": True, "status": "pass"}],
        "results": [{"check": "ssh", "node": "a", "status": "pass", "message": "ok"}], "summary": {},
        "allreduce": None, "exit_code": 0}


@pytest.mark.parametrize("doc", [{"a": 1}, [1, 2], "text", 3, {"preflight_version": "1", "results": [{"x": 1}]},
                                 {"preflight_version": "1", "results": [{"check": "ssh", "node": "a", "status": "weird"}]},
                                 dict(GOOD, allreduce={"busbw_gbps": "fast"}), dict(GOOD, nodes=[1])])
def test_diff_of_json_that_is_not_a_report_is_exit_2(tmp_path, capsys, doc):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(GOOD))
    bad.write_text(json.dumps(doc))
    assert cli.main(["diff", str(good), str(bad)]) == 2
    line = one_line(capsys)
    assert str(bad) in line and "not a preflight report" in line
    assert cli.main(["diff", str(bad), str(good)]) == 2
    one_line(capsys)


def test_diff_of_two_reports_still_works(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert cli.main(["diff", str(good), str(good)]) == 0
    assert "no changes" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e9", "0"])
def test_timeout_that_is_no_deadline_is_a_usage_error(tmp_path, capsys, value):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("nodes: [a]\n")
    assert cli.main(["check", str(inv), "--timeout=" + value, "--no-progress"]) == 2
    assert "--timeout" in one_line(capsys)


@pytest.mark.parametrize("option", ["--json", "--env-file", "--hostfile", "--junit", "--prometheus", "--history"])
def test_unwritable_output_is_refused_before_connecting(tmp_path, capsys, option):
    inv = tmp_path / "hosts.yaml"
    # a node on this machine's loopback (refused at once): the usage error must come before the run
    inv.write_text("nodes:\n  - {host: 127.0.0.1, port: 1}\n")
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "out"  # its "directory" is a file: nothing can be written there
    rc = cli.main(["check", str(inv), option, str(target), "--no-progress"])
    assert rc == 2
    captured = capsys.readouterr()
    assert "preflight " not in captured.out and "ssh" not in captured.out  # no run, no report
    line = first_line(captured.err)
    assert str(target.parent) in line or str(target) in line, line

"""--capture: a node's raw probe inputs come back as fixtures that replay to the same facts; a failed probe
carries the raw output it failed on (capped)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from preflight import cli
from preflight.output import capture
from preflight.probe import runner
from preflight.probe.context import RAW_CAP
from tests import fixture_cases as fc


def test_capture_of_a_real_local_run_replays_to_the_same_facts(tmp_path, monkeypatch, capsys):
    """`preflight check --capture DIR` on this machine (the real `ip`, the real /sys), then each case written
    is run the way tests/test_fixtures.py runs a committed one: recorded commands replayed from PATH."""
    out = tmp_path / "cap"
    rc = cli.main(["check", "--only", "nic", "--no-progress", "--capture", str(out)])
    assert rc in (0, 1)
    node = os.listdir(str(out))
    assert len(node) == 1
    case = out / node[0] / "nic.json"
    doc = json.loads(case.read_text())
    assert doc["parser"] == "probe" and doc["input"] == "nic" and "ip -j addr show" in doc["command"]
    assert (out / node[0] / "nic" / "commands.json").exists()
    assert (out / node[0] / "nic" / "sys" / "class" / "net" / "lo" / "type").exists()
    recorded = doc["expected"]
    # replay: copied into a fixture tree, the case runs like any other
    check_dir = tmp_path / "fixtures" / "nic"
    check_dir.parent.mkdir()
    os.rename(str(out / node[0]), str(check_dir))
    path = str(check_dir / "nic.json")
    monkeypatch.setattr(fc, "ROOT", str(tmp_path / "fixtures"))
    parser, args, env = fc.prepare(path, fc.load(path), str(tmp_path / "bin"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    assert fc.as_json(parser(*args)) == recorded
    assert "captured" in capsys.readouterr().out


def test_capture_dir_must_be_new_or_empty(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x").write_text("")
    assert cli.main(["check", "--only", "ssh", "--no-progress", "--capture", str(tmp_path / "old")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_failed_probe_carries_its_raw_output_capped(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    garbage = "not json " * 1000  # 9000 characters
    (bindir / "ip").write_text("#!%s\nimport sys\nsys.stdout.write(%r)\n" % (sys.executable, garbage))
    (bindir / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    facts = runner.run_probes({"nic": {}}, 20)["nic"]
    assert "not valid JSON" in facts["probe_error"] and "not valid JSON" in facts["message"]
    raw = next(r for r in facts["raw"] if r.get("argv") == ["ip", "-j", "addr", "show"])
    assert raw["stdout"].startswith("not json not json") and len(raw["stdout"]) < RAW_CAP + 100
    assert "more characters" in raw["stdout"]
    json.dumps(facts)


def test_probe_error_finding_shows_the_raw_output():
    from preflight.model import Status, probe_error

    finding = probe_error("nic", "n1", {"probe_error": "ParseError: x", "raw": [{"kind": "run", "stdout": "junk"}]})
    assert finding.status == Status.ERROR and finding.data == {"raw": [{"kind": "run", "stdout": "junk"}]}


def test_capture_refuses_paths_that_climb_out(tmp_path):
    record = {"sysfs_root": "/sys", "events": [{"kind": "read", "path": "/sys/../../etc/x", "text": "t"}]}
    with pytest.raises(ValueError):
        capture.write_node(str(tmp_path), "n1", "nic", record, {}, "now")
    with pytest.raises(ValueError):
        capture.write_node(str(tmp_path), "../n1", "nic", {"events": []}, {}, "now")

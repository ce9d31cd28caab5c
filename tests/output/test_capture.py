"""--capture: a node's raw probe inputs come back as fixtures that replay to the same facts; a failed probe
carries the raw output it failed on (capped)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from preflight import cli
from preflight.errors import UsageError
from preflight.output import capture
from preflight.probe import runner
from preflight.probe.context import RAW_CAP
from tests import fixture_cases as fc


def test_capture_of_a_real_local_run_replays_to_the_same_facts(tmp_path, monkeypatch, capsys):
    """`preflight check --capture DIR` on this machine (the real `ip`, the real /sys), then each case written
    is run the way tests/checks/test_fixtures.py runs a committed one: recorded commands replayed from PATH."""
    out = tmp_path / "cap"
    rc = cli.main(["check", "--only", "nic", "--no-progress", "--capture", str(out)])
    assert rc in (0, 1)
    node = os.listdir(str(out))
    assert len(node) == 1
    case = out / node[0] / "nic.json"
    doc = json.loads(case.read_text())
    assert doc["parser"] == "probe" and doc["input"] == "nic" and "ip -j -d addr show" in doc["command"]
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
    raw = next(r for r in facts["raw"] if r.get("argv") == ["ip", "-j", "-d", "addr", "show"])
    assert raw["stdout"].startswith("not json not json") and len(raw["stdout"]) < RAW_CAP + 100
    assert "more characters" in raw["stdout"]
    json.dumps(facts)


def test_probe_error_finding_shows_the_raw_output():
    from preflight.model import Status, probe_error

    finding = probe_error("nic", "n1", {"probe_error": "ParseError: x", "raw": [{"kind": "run", "stdout": "junk"}]})
    assert finding.status == Status.ERROR and finding.data == {"raw": [{"kind": "run", "stdout": "junk"}]}


def test_capture_refuses_paths_that_climb_out(tmp_path):
    record = {"sysfs_root": "/sys", "events": [{"kind": "read", "path": "/sys/../../etc/x", "text": "t"}]}
    with pytest.raises(UsageError, match="refusing path with '..'"):
        capture.write(str(tmp_path / "a"), {"n1": {"nic": record}}, {}, "now")
    capture.write(str(tmp_path / "b"), {"../n1": {"nic": {"events": []}}}, {}, "now")  # a name, never a path
    assert os.listdir(str(tmp_path / "b")) == ["%2E.%2Fn1"] and sorted(os.listdir(str(tmp_path))) == ["a", "b"]


# --- item 16 of issue 26: DIR may sit in /tmp, where another user can plant links ------------------------------

NIC_RECORD = {"sysfs_root": "/sys", "events": [
    {"kind": "run", "argv": ["ip", "-j", "addr", "show"], "rc": 0, "stdout": "[]", "stderr": "", "timed_out": False},
    {"kind": "read", "path": "/sys/class/net/eth0/mtu", "text": "1500"},
    {"kind": "read", "path": "/sys/class/net/eth0/mtu", "text": "1500"},  # read twice: rewritten, not refused
    {"kind": "listdir", "path": "/sys/class/net", "entries": ["eth0", "lo"]}]}


class _Planting(dict):
    """captures whose first lookup plants a symlink in DIR: after every check on DIR, before any write."""

    def __init__(self, root, name, target, items):
        super().__init__(items)
        self.plant = (root, name, target)

    def __getitem__(self, key):
        if self.plant:
            root, name, target = self.plant
            os.symlink(target, os.path.join(root, name))
            self.plant = None
        return super().__getitem__(key)


def test_a_symlink_planted_in_the_capture_dir_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "nic.json").write_text("precious\n")
    root = str(tmp_path / "cap")
    with pytest.raises(UsageError, match="cannot write the capture"):
        capture.write(root, _Planting(root, "n1", str(victim), {"n1": {"nic": NIC_RECORD}}), {"n1": {"nic": {}}}, "now")
    assert (victim / "nic.json").read_text() == "precious\n" and sorted(os.listdir(str(victim))) == ["nic.json"]


def test_capture_dir_that_is_a_symlink_or_anothers_is_refused_before_the_run(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").symlink_to(victim)
    assert cli.main(["check", "--only", "ssh", "--no-progress", "--capture", str(tmp_path / "link")]) == 2
    assert "is a symbolic link" in capsys.readouterr().err and os.listdir(str(victim)) == []
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(str(theirs), 65534, 65534)
    assert cli.main(["check", "--only", "ssh", "--no-progress", "--capture", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert "belongs to uid 65534, not to you" in err and "Traceback" not in err and os.listdir(str(theirs)) == []
    with pytest.raises(UsageError, match="belongs to uid 65534"):  # and again where the files are written
        capture.write(str(theirs), {"n1": {"nic": NIC_RECORD}}, {}, "now")


def test_capture_dir_is_created_private_and_files_fresh(tmp_path):
    root = tmp_path / "new" / "cap"
    written = capture.write(str(root), {"n1": {"nic": NIC_RECORD}}, {"n1": {"nic": {"interfaces": []}}}, "now")
    assert written == [str(root / "n1" / "nic.json")]
    assert (root.stat().st_mode & 0o777) == 0o700
    assert (root / "n1" / "nic" / "sys" / "class" / "net" / "eth0" / "mtu").read_text() == "1500\n"
    assert (root / "n1" / "nic" / "sys" / "class" / "net" / "lo").is_dir()


def test_ipv6_and_underscore_node_names_are_captured_under_a_safe_encoding(tmp_path):
    nodes = ["fe80::1%eth0", "2001:db8::7", "_login", "n1", ".hidden"]
    root = tmp_path / "cap"
    written = capture.write(str(root), {n: {"nic": NIC_RECORD} for n in nodes}, {n: {"nic": {}} for n in nodes}, "now")
    folders = sorted(os.listdir(str(root)))
    assert folders == sorted(["fe80%3A%3A1%25eth0", "2001%3Adb8%3A%3A7", "%5Flogin", "n1", "%2Ehidden"]), folders
    assert len(written) == len(nodes)
    from urllib.parse import unquote

    assert sorted(unquote(f) for f in folders) == sorted(nodes)  # reversible: the folder names the node
    doc = json.loads((root / "fe80%3A%3A1%25eth0" / "nic.json").read_text())
    assert "fe80::1%eth0" in doc["source"]

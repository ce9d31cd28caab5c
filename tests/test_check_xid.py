"""xid check (parser cases: tests/fixtures/xid, run by tests/test_fixtures.py): the probe against fake journalctl/dmesg, the rule."""

from __future__ import annotations

import os

import pytest

from preflight.checks import xid
from preflight.model import ClusterView, NodeInfo, Status
from preflight.probe import kernlog
from preflight.probe.context import NodeContext


# ------------------------------------------------------------------------------------------------ probe


def _exe(bin_dir, name, body):
    path = os.path.join(str(bin_dir), name)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)


@pytest.fixture
def node(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sys_root = tmp_path / "sys"
    (sys_root / "module" / "nvidia").mkdir(parents=True)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir)
    return bin_dir, NodeContext(sysfs_root=str(sys_root))


def test_probe_reads_journalctl(node):
    bin_dir, ctx = node
    _exe(bin_dir, "journalctl", "echo '[  100.000001] n1 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.'\n")
    facts = xid.probe(ctx)
    assert facts["source"] == "journalctl" and facts["log_error"] is None
    assert [e["code"] for e in facts["log"]["events"]] == [79]
    assert facts["uptime_s"] > 0


def test_probe_falls_back_to_dmesg_when_the_journal_has_no_kernel_lines(node):
    bin_dir, ctx = node
    _exe(bin_dir, "journalctl", "echo '-- No entries --'\n")
    _exe(bin_dir, "dmesg", "echo '[  100.000001] NVRM: Xid (PCI:0000:44:00): 13, pid=1, name=python, Graphics Exception'\n")
    facts = xid.probe(ctx)
    assert facts["source"] == "dmesg"
    assert facts["log"]["events"][0]["code"] == 13


def test_probe_says_why_when_no_log_can_be_read(node):
    bin_dir, ctx = node
    _exe(bin_dir, "journalctl", "echo 'Failed to get journal access: Permission denied' >&2; exit 1\n")
    _exe(bin_dir, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n")
    facts = xid.probe(ctx)
    assert facts["log"] is None and facts["source"] is None
    assert "Permission denied" in facts["log_error"] and "Operation not permitted" in facts["log_error"]


def test_probe_does_not_read_the_log_without_nvidia(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run: a call would be rc 127
    facts = xid.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts == {"nvidia": False, "source": None, "log_error": None, "uptime_s": None, "log": None}


# ------------------------------------------------------------------------------------------------- rule


def _event(code, bus="0000:44:00", ts=100.0, kind="xid", severity=None, device=None, detail="", link=None):
    return {"kind": kind, "pci": bus, "code": code, "ts": ts, "detail": detail, "device": device, "severity": severity, "link": link}


def _view(events_by_node, uptime=1000.0, window=None, gpus=8):
    nodes = [NodeInfo(n, n, gpus) for n in events_by_node]
    facts = {}
    for n, events in events_by_node.items():
        log = None if events is None else {"lines": 500, "first_ts": 0.0, "events": kernlog.fold(events, xid.FOLD_KEY), "unparsed": []}
        facts[n] = {
            "xid": {"nvidia": True, "source": "journalctl" if log else None, "log_error": None if log else "journalctl -k: rc 1",
                    "uptime_s": uptime, "log": log},
            "gpu": {"gpus": [{"index": 2, "pci_bus_id": "00000000:44:00.0"}]},
        }
    return ClusterView(nodes, facts, cluster={"xid_window_s": window})


def test_rule_passes_a_clean_log():
    out = xid.rule(_view({"n1": [], "n2": []}))
    assert [f.status for f in out] == [Status.PASS, Status.PASS]
    assert "no Xid/SXid since boot in 500 kernel log lines (journalctl)" in out[0].message


def test_rule_fails_xid79_names_the_gpu_and_folds_repeats():
    out = xid.rule(_view({"n1": [], "n2": [_event(79, ts=100.0), _event(79, ts=400.0)]}))
    bad = [f for f in out if f.status is Status.FAIL]
    assert len(bad) == 1 and bad[0].node == "n2"
    assert "n2 GPU 2 (0000:44:00.0): Xid 79 ×2 since boot" in bad[0].message
    assert "fallen off the bus" in bad[0].message and bad[0].action == "reboot"
    assert "last 10 min ago" in bad[0].message


def test_rule_warns_application_xid_and_unknown_codes():
    out = xid.rule(_view({"n1": [_event(13), _event(999)]}))
    assert {f.status for f in out} == {Status.WARN}
    assert any(f.action == "check_app" for f in out)


def test_rule_window_ignores_old_events():
    view = _view({"n1": [_event(48, ts=100.0)]}, uptime=100000.0, window=3600)
    out = xid.rule(view)
    assert [f.status for f in out] == [Status.PASS]
    assert "in the last 60 min" in out[0].message


def test_rule_sxid_fatal_fails_non_fatal_warns():
    events = [_event(24007, "0000:c3:00.0", kind="sxid", severity="Fatal", device="nvidia-nvswitch0"),
              _event(12028, "0000:05:00.0", kind="sxid", severity="Non-fatal", device="nvidia-nvswitch3")]
    out = xid.rule(_view({"n1": events}))
    by = {f.status: f for f in out}
    assert "nvidia-nvswitch0 (0000:c3:00.0): SXid 24007" in by[Status.FAIL].message
    assert Status.WARN in by


def test_rule_unreadable_log_is_an_error_not_a_pass():
    out = xid.rule(_view({"n1": None}))
    assert [f.status for f in out] == [Status.ERROR]
    assert "kernel log not readable" in out[0].message


def test_rule_xid_on_a_gpu_the_driver_no_longer_lists():
    out = xid.rule(_view({"n1": [_event(79, bus="0000:9b:00")]}))
    assert "GPU at 0000:9b:00 (not listed by the driver now)" in out[0].message


def test_rule_skips_cpu_nodes():
    out = xid.rule(_view({"n1": []}, gpus=0))
    assert out[0].status is Status.SKIP


def test_rule_pass_says_when_the_log_does_not_reach_back_to_boot():
    view = _view({"n1": []}, uptime=100000.0)
    view.facts["n1"]["xid"]["log"]["first_ts"] = 96400.0
    out = xid.rule(view)
    assert out[0].status is Status.PASS and "; the log only covers the last 60 min" in out[0].message


# ------------------------------------------------------------------------- a long log: facts folded on the node


def _xid_log(lines, gpus=8, codes=(79, 48, 13)):
    """`lines` Xid lines (journalctl -o short-monotonic), GPUs and codes in turn, one every 0.01 s from 10 s."""
    return "[    0.000000] n1 kernel: Linux version 5.15.0-105-generic\n" + "".join(
        "[%12.6f] n1 kernel: NVRM: Xid (PCI:0000:%02x:00): %d, pid=%d, name=python, Ch 00000008\n"
        % (10 + i / 100.0, 0x18 + 0x11 * (i % gpus), codes[(i // gpus) % len(codes)], i) for i in range(lines))


def test_facts_do_not_grow_with_the_log():
    """Issue 26 item 12: one event per line made 200k Xid lines 43 MB of facts (1M: the node timed out)."""
    import json

    facts = xid.parse_kernel_log(_xid_log(200000), "journalctl")
    assert len(json.dumps(facts)) < 64 * 1024
    assert facts["lines"] == 200001 and sum(e["count"] for e in facts["events"]) == 200000
    assert len(facts["events"]) == 8 * 3  # one entry per (GPU, code)
    first = facts["events"][0]
    assert (first["pci"], first["code"], first["first_ts"]) == ("0000:18:00", 79, 10.0)
    assert first["last_ts"] == first["recent"][-1] and len(first["recent"]) == kernlog.RECENT
    view = _view({"n1": []}, uptime=3000.0)
    view.facts["n1"]["xid"]["log"] = facts
    out = xid.rule(view)
    assert any("n1 GPU at 0000:18:00 (not listed by the driver now): Xid 79 ×%d since boot" % first["count"] in f.message
               and f.action == "reboot" for f in out)


def test_window_counts_the_folded_events_inside_it():
    """A folded entry keeps its last RECENT stamps: a window counts those inside it, exactly up to RECENT."""
    events = [_event(79, ts=float(t)) for t in range(100, 10001, 100)]  # one every 100 s
    out = xid.rule(_view({"n1": events}, uptime=10000.0, window=550))
    assert "Xid 79 ×6 in the last 9 min" in out[0].message  # 9500..10000: six, the older 94 left out
    out = xid.rule(_view({"n1": events}, uptime=10000.0, window=5000))
    assert "Xid 79 ×%d+ in the last" % kernlog.RECENT in out[0].message  # only a lower bound is known
    out = xid.rule(_view({"n1": events}, uptime=10000.0, window=20000))
    assert "Xid 79 ×100 in the last" in out[0].message  # the first one is inside: all of them

"""xid check (parser cases: tests/fixtures/xid, run by tests/checks/test_fixtures.py): the probe against fake journalctl/dmesg, the rule."""

from __future__ import annotations

import os

import pytest

from preflight.checks.xid import probe as xid_probe
from preflight.checks.xid import rule as xid_rule
from preflight.model import NodeInfo, Status
from preflight.probe import kernlog
from preflight.probe.context import NodeContext
from tests import builders


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
    facts = xid_probe.probe(ctx)
    assert facts["source"] == "journalctl" and facts["log_error"] is None
    assert [e["code"] for e in facts["log"]["events"]] == [79]
    assert facts["uptime_s"] > 0


def test_probe_falls_back_to_dmesg_when_the_journal_has_no_kernel_lines(node):
    bin_dir, ctx = node
    _exe(bin_dir, "journalctl", "echo '-- No entries --'\n")
    _exe(bin_dir, "dmesg", "echo '[  100.000001] NVRM: Xid (PCI:0000:44:00): 13, pid=1, name=python, Graphics Exception'\n")
    facts = xid_probe.probe(ctx)
    assert facts["source"] == "dmesg"
    assert facts["log"]["events"][0]["code"] == 13


def test_probe_says_why_when_no_log_can_be_read(node):
    bin_dir, ctx = node
    _exe(bin_dir, "journalctl", "echo 'Failed to get journal access: Permission denied' >&2; exit 1\n")
    _exe(bin_dir, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n")
    facts = xid_probe.probe(ctx)
    assert facts["log"] is None and facts["source"] is None
    assert "Permission denied" in facts["log_error"] and "Operation not permitted" in facts["log_error"]


def test_probe_does_not_read_the_log_without_nvidia(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run: a call would be rc 127
    facts = xid_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts == {"nvidia": False, "source": None, "log_error": None, "uptime_s": None, "log": None}


# ------------------------------------------------------------------------------------------------- rule


def _event(code, bus="0000:44:00", ts=100.0, kind="xid", severity=None, device=None, detail="", link=None):
    return {"kind": kind, "pci": bus, "code": code, "ts": ts, "detail": detail, "device": device, "severity": severity, "link": link}


def _view(events_by_node, uptime=1000.0, window=None, gpus=8):
    nodes = [NodeInfo(n, n, gpus) for n in events_by_node]
    facts = {}
    for n, events in events_by_node.items():
        log = None if events is None else {"lines": 500, "first_ts": 0.0, "events": kernlog.fold(events, xid_rule.FOLD_KEY), "unparsed": []}
        facts[n] = {
            "xid": {"nvidia": True, "source": "journalctl" if log else None, "log_error": None if log else "journalctl -k: rc 1",
                    "uptime_s": uptime, "log": log},
            "gpu": {"gpus": [{"index": 2, "pci_bus_id": "00000000:44:00.0"}]},
        }
    return builders.view(facts, nodes=nodes, cluster={"xid_window_s": window})


def test_rule_passes_a_clean_log():
    out = xid_rule.rule(_view({"n1": [], "n2": []}))
    assert [f.status for f in out] == [Status.PASS, Status.PASS]
    assert "no Xid/SXid since boot in 500 kernel log lines (journalctl)" in out[0].message


def test_rule_fails_xid79_names_the_gpu_and_folds_repeats():
    out = xid_rule.rule(_view({"n1": [], "n2": [_event(79, ts=100.0), _event(79, ts=400.0)]}))
    bad = [f for f in out if f.status is Status.FAIL]
    assert len(bad) == 1 and bad[0].node == "n2"
    assert "n2 GPU 2 (0000:44:00.0): Xid 79 ×2 since boot" in bad[0].message
    assert "fallen off the bus" in bad[0].message and bad[0].action == "reboot"
    assert "last 10 min ago" in bad[0].message


def test_rule_warns_application_xid_and_unknown_codes():
    out = xid_rule.rule(_view({"n1": [_event(13), _event(999)]}))
    assert {f.status for f in out} == {Status.WARN}
    assert any(f.action == "check_app" for f in out)


def test_rule_window_ignores_old_events():
    view = _view({"n1": [_event(48, ts=100.0)]}, uptime=100000.0, window=3600)
    out = xid_rule.rule(view)
    assert [f.status for f in out] == [Status.PASS]
    assert "in the last 60 min" in out[0].message


def test_rule_sxid_fatal_fails_non_fatal_warns():
    events = [_event(24007, "0000:c3:00.0", kind="sxid", severity="Fatal", device="nvidia-nvswitch0"),
              _event(12028, "0000:05:00.0", kind="sxid", severity="Non-fatal", device="nvidia-nvswitch3")]
    out = xid_rule.rule(_view({"n1": events}))
    by = {f.status: f for f in out}
    assert "nvidia-nvswitch0 (0000:c3:00.0): SXid 24007" in by[Status.FAIL].message
    assert Status.WARN in by


def test_rule_unreadable_log_is_an_error_not_a_pass():
    out = xid_rule.rule(_view({"n1": None}))
    assert [f.status for f in out] == [Status.ERROR]
    assert "kernel log not readable" in out[0].message


def test_rule_xid_on_a_gpu_the_driver_no_longer_lists():
    out = xid_rule.rule(_view({"n1": [_event(79, bus="0000:9b:00")]}))
    assert "GPU at 0000:9b:00 (not listed by the driver now)" in out[0].message


def test_rule_skips_cpu_nodes():
    out = xid_rule.rule(_view({"n1": []}, gpus=0))
    assert out[0].status is Status.SKIP


def test_rule_pass_says_when_the_log_does_not_reach_back_to_boot():
    view = _view({"n1": []}, uptime=100000.0)
    view.facts["n1"]["xid"]["log"]["first_ts"] = 96400.0
    out = xid_rule.rule(view)
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

    facts = xid_probe.parse_kernel_log(_xid_log(200000), "journalctl")
    assert len(json.dumps(facts)) < 64 * 1024
    assert facts["lines"] == 200001 and sum(e["count"] for e in facts["events"]) == 200000
    assert len(facts["events"]) == 8 * 3  # one entry per (GPU, code)
    first = facts["events"][0]
    assert (first["pci"], first["code"], first["first_ts"]) == ("0000:18:00", 79, 10.0)
    assert first["last_ts"] == first["recent"][-1] and len(first["recent"]) == kernlog.RECENT
    view = _view({"n1": []}, uptime=3000.0)
    view.facts["n1"]["xid"]["log"] = facts
    out = xid_rule.rule(view)
    assert any("n1 GPU at 0000:18:00 (not listed by the driver now): Xid 79 ×%d since boot" % first["count"] in f.message
               and f.action == "reboot" for f in out)


def test_window_counts_the_folded_events_inside_it():
    """A folded entry keeps its last RECENT stamps: a window counts those inside it, exactly up to RECENT."""
    events = [_event(79, ts=float(t)) for t in range(100, 10001, 100)]  # one every 100 s
    out = xid_rule.rule(_view({"n1": events}, uptime=10000.0, window=550))
    assert "Xid 79 ×6 in the last 9 min" in out[0].message  # 9500..10000: six, the older 94 left out
    out = xid_rule.rule(_view({"n1": events}, uptime=10000.0, window=5000))
    assert "Xid 79 ×%d+ in the last" % kernlog.RECENT in out[0].message  # only a lower bound is known
    out = xid_rule.rule(_view({"n1": events}, uptime=10000.0, window=20000))
    assert "Xid 79 ×100 in the last" in out[0].message  # the first one is inside: all of them


# ------------------------------------------- issue 40: GPU failures that are not an "Xid N:" line, real captures


def _judged(case, gpus=((2, "00000000:44:00.0"),), uptime=100000.0, window=None):
    """The xid rule on one node whose facts are the fixture's parsed log (tests/fixtures/xid/<case>.json)."""
    from tests.fixture_cases import expected

    facts = {"xid": {"nvidia": True, "source": "dmesg", "log_error": None, "uptime_s": uptime, "log": expected("xid", case)},
             "gpu": {"gpus": [{"index": i, "pci_bus_id": bus} for i, bus in gpus]}}
    out = xid_rule.rule(builders.view({"n1": facts}, cluster={"xid_window_s": window}))
    return sorted(out, key=lambda f: f.message)


def test_gpu_fallen_off_the_bus_without_an_xid_fails_reboot_named_by_its_bus():
    out = _judged("nvsentinel155_fallen_off_bus_no_xid", gpus=((3, "00000000:B3:00.0"),))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")]  # the "failed for 1 device(s)" line adds none
    assert "n1 GPU 3 (0000:b3:00.0): GPU has fallen off the bus" in out[0].message and "as Xid 79" in out[0].message


def test_gpu_fallen_off_the_bus_old_one_line_form():
    out = _judged("bumblebee554_gpu_at_fallen_off_bus_old_driver", gpus=())
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")]
    assert "GPU at 0000:01:00 (not listed by the driver now)" in out[0].message and "×2" in out[0].message


def test_probe_failed_for_an_unsupported_gpu_is_a_config_fault_not_a_reboot():
    """Twin of the GPU off the bus: the probe failed because the open module does not drive this GPU."""
    out = _judged("ogkm587_open_module_unsupported_probe_failed", gpus=())
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "fix_config")]
    assert "0000:01:00" in out[0].message and "does not support this GPU" in out[0].message


def test_healthy_open_module_boot_passes():
    out = _judged("ogkm1064_healthy_open_module_boot")
    assert [f.status for f in out] == [Status.PASS]


def test_xid79_and_its_fallen_off_line_are_one_finding():
    out = _judged("journalctl_h100_xid79_63", gpus=((2, "00000000:44:00.0"), (0, "00000000:18:00.0")))
    on_44 = [f for f in out if "0000:44:00" in f.message]
    assert len(on_44) == 1 and "Xid 79" in on_44[0].message


def test_old_driver_gpu_at_line_is_no_longer_missed():
    out = _judged("dmesg_old_driver_and_sxid", gpus=())
    assert any(f.status is Status.FAIL and "GPU at 0000:01:00" in f.message and "fallen off the bus" in f.message for f in out)


def test_gsp_hang_without_xid_fails_reset_on_the_gpu_the_driver_numbers():
    gpus = [(i, "00000000:%02X:00.0" % b) for i, b in enumerate((0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB))]
    out = _judged("ogkm1230_gsp_timeout_gpu6_no_xid", gpus=gpus)
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")]
    assert "GPU 6 (0000:ba:00.0, the driver's GPU6 taken as GPU 6)" in out[0].message
    assert "GSP firmware RPC timed out" in out[0].message and "Memory Subsystem Error" in out[0].message


def test_gsp_hang_in_journal_short_format_time_unknown():
    out = _judged("bazzite4449_gsp_heartbeat_journal_short_no_hostname", gpus=((0, "00000000:05:00.0"),), window=3600)
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")]
    assert "GPU 0 (0000:05:00.0" in out[0].message and "time unknown" in out[0].message


def test_gsp_banner_mapped_by_the_xid119_line_is_told_once():
    out = _judged("gpud500_xid119_names_gpu4_gsp", gpus=((4, "00000000:9B:00.0"),))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")] and "Xid 119" in out[0].message


def test_xid45_caused_by_nvlink_xid_is_judged_as_its_cause():
    out = _judged("ogkm1150_xid45_caused_by_nvlink_stripped_kernel", gpus=())
    assert len(out) == 4 and {(f.status, f.action) for f in out} == {(Status.FAIL, "reset_gpu")}
    assert any("Xid 45 ×2 since boot (time unknown): caused by previous Xid 149, judged as Xid 149: NVLink NETIR error" in f.message for f in out)


def test_xid45_twins_no_cause_or_an_application_cause_stay_check_app():
    events = [_event(45, detail="pid=1, name=python3, Ch 00000008"), _event(45, bus="0000:9b:00", detail="x")]
    view = _view({"n1": events})
    view.facts["n1"]["xid"]["log"]["events"][1]["causes"] = {"13": 1}
    out = xid_rule.rule(view)
    assert {(f.status, f.action) for f in out} == {(Status.WARN, "check_app")}
    assert any("caused by previous Xid 13" in f.message for f in out)


def test_xid45_whose_cause_is_logged_on_the_same_gpu_is_told_in_the_cause():
    events = [_event(149, severity="Fatal", link=3, detail="NETIR Fatal XC0 i0 Link 3 (0x0)"), _event(45, detail="Ch 1 caused by previous Xid 149")]
    view = _view({"n1": events})
    view.facts["n1"]["xid"]["log"]["events"][1]["causes"] = {"149": 1}
    out = xid_rule.rule(view)
    assert len(out) == 1 and out[0].status is Status.FAIL and "Xid 149 link 3" in out[0].message
    assert "then Xid 45 caused by it" in out[0].message


def test_nvlink_xid_severity_is_the_drivers():
    out = _judged("gpud1160_1174_nvlink_xid_severity_no_printk_time", gpus=())
    by_code = {(f.data["code"], f.data.get("link")): (f.status, f.action) for f in out}
    assert by_code[(144, 0)] == (Status.WARN, None) and by_code[(145, 13)] == (Status.WARN, None)
    assert by_code[(149, 0)] == (Status.FAIL, "reset_gpu") and by_code[(149, -1)] == (Status.FAIL, "reset_gpu")


def test_nonfatal_nvlink_xid_repeated_on_one_link_in_the_window_fails():
    nonfatal = dict(severity="Non-fatal", detail="RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)")
    out = xid_rule.rule(_view({"n1": [_event(145, ts=900.0, link=13, **nonfatal), _event(145, ts=950.0, link=13, **nonfatal)]}, window=600))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")] and "repeated on link 13" in out[0].message
    # twins: the first one outside the window; two links once each
    out = xid_rule.rule(_view({"n1": [_event(145, ts=100.0, link=13, **nonfatal), _event(145, ts=950.0, link=13, **nonfatal)]}, window=600))
    assert [f.status for f in out] == [Status.WARN]
    out = xid_rule.rule(_view({"n1": [_event(145, ts=900.0, link=12, **nonfatal), _event(145, ts=950.0, link=13, **nonfatal)]}, window=600))
    assert [f.status for f in out] == [Status.WARN, Status.WARN]


def test_sxid_severity_is_the_word_lines_never_the_data_payload():
    out = _judged("nvtrust124_sxid_nonfatal_severity_and_data_lines", gpus=())
    assert [f.status for f in out] == [Status.PASS]  # 22013: the Fabric Manager guide says to ignore it
    assert "ignored SXid 22013 ×5" in out[0].message


def test_sxid_without_severity_takes_the_guides():
    out = _judged("gpud338_sxid_data_only_dmesg_decode_iso", gpus=())
    assert [f.status for f in out] == [Status.WARN] and "egress non-posted PRIV error" in out[0].message
    out = _judged("sxid_data_only_fatal_from_guide", gpus=())
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")] * 2
    assert any("always fatal" in f.message for f in out)


_LINES = ("NVRM: Xid (PCI:0000:44:00): 79, pid=1, name=python, GPU has fallen off the bus.",
          "NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has",
          "NVRM: fallen off the bus and is not responding to commands.",
          "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 24007, Fatal, Link 30 sourcetrack timeout error",
          "NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout *****")
#: one prefix per kernlog.FORMATS entry: (source, the first line's prefix, a continuation line's indent)
_PREFIXES = {
    "dmesg": ("dmesg", "[ 1843.308145] ", " " * 15), "dmesg (printk.time=0)": ("dmesg", "", "    "),
    "dmesg -T": ("dmesg", "[Fri Aug 30 11:43:09 2024] ", " " * 27), "dmesg -d": ("dmesg", "[  +0.000421] ", " " * 14),
    "dmesg --time-format iso": ("dmesg", "2025-01-25T10:34:54,859532+00:00 ", " " * 33),
    "dmesg -x": ("dmesg", "kern  :err   : [ 1843.308145] ", " " * 30),
    "dmesg -r": ("dmesg", "<4>[ 1843.308145] ", " " * 18),
    "journalctl -o short-monotonic": ("journalctl", "[ 1843.308145] gpu-017 kernel: ", " " * 31),
    "journalctl -o short": ("journalctl", "Nov 23 12:01:02 gpu-017 kernel: ", " " * 32),
    "journalctl -o short-iso": ("journalctl", "2026-11-23T12:01:02+0000 gpu-017 kernel: ", " " * 41),
    "kernel: ... (stripped)": ("dmesg", "kernel: ", " " * 8),
    "syslog file (kern.log)": ("dmesg", "Mar 21 20:18:56 pc kernel: [ 1843.308145] ", " " * 42),
}


@pytest.mark.parametrize("fmt", kernlog.FORMATS)
def test_every_kernel_log_format_gives_the_same_events(fmt):
    source, prefix, indent = _PREFIXES[fmt]
    text = "\n".join((indent if line.startswith("NVRM: (PCI") or line.startswith("NVRM: fallen") else prefix) + line
                     for line in _LINES) + "\n"
    facts = xid_probe.parse_kernel_log(text, source)
    assert [(e["kind"], e["pci"], e["code"], e["severity"], e["count"]) for e in facts["events"]] == [
        ("xid", "0000:44:00", 79, None, 1), ("sxid", "0000:84:00.0", 24007, "Fatal", 1)]
    assert [(e["kind"], e["pci"], e["gpu"]) for e in facts["nvrm"]] == [("fallen_off_bus", "0000:b3:00", None), ("gsp_timeout", None, "GPU6")]
    assert facts["lines"] == 4 and not facts["unparsed"]
    mono = [e["first_ts"] for e in facts["events"]]
    assert mono == ([1843.308145] * 2 if "1843" in prefix else [None, None])


def test_gpu_fallen_off_the_bus_on_a_console_without_indent_is_one_finding():
    out = _judged("console_fallen_off_bus_unindented_probe_with_driver", gpus=((0, "00000000:02:00.0"),))
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")]
    assert "GPU 0 (0000:02:00.0): GPU has fallen off the bus" in out[0].message and "probe of the GPU failed" in out[0].message


def test_kern_log_line_keeps_its_monotonic_stamp_and_xid79_tells_the_gpu_line():
    out = _judged("t450s_kern_log_xid79_and_gpu_line", gpus=((0, "00000000:01:00.0"),), uptime=3666.0)
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reboot")]
    assert "GPU 0 (0000:01:00.0): Xid 79 since boot (last 60 min ago)" in out[0].message


def test_gsp_heartbeat_without_a_gpu_number_names_the_only_gpu():
    out = _judged("ogkm1125_gsp_heartbeat_no_gpu_number_resume", gpus=((0, "00000000:09:00.0"),), uptime=40000.0)
    assert [(f.status, f.action) for f in out] == [(Status.FAIL, "reset_gpu")]
    assert "GPU 0 (0000:09:00.0, the node's only GPU)" in out[0].message and "×2" not in out[0].message
    two = _judged("ogkm1125_gsp_heartbeat_no_gpu_number_resume", gpus=((0, "00000000:09:00.0"), (1, "00000000:0A:00.0")), uptime=40000.0)
    assert [f.status for f in two] == [Status.FAIL] and "a GPU (the line names none)" in two[0].message


def test_gpu_given_to_another_driver_is_no_failed_probe():
    """Twin of the failed probe: on a passthrough host the nvidia driver was never asked to take the GPU."""
    assert [f.status for f in _judged("vfio_host_probe_routine_not_called", gpus=())] == [Status.PASS]

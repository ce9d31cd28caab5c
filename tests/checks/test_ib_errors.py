"""ib_errors: counter parsing on real-format trees, the probe's two reads, and the rule's rates."""

import os


from preflight.checks.ib_errors import probe as ib_errors_probe
from preflight.checks.ib_errors import rule as ib_errors_rule
from preflight.model import NodeInfo, Status
from preflight.probe.context import NodeContext
from tests.sim import ib_hw
from tests.paths import TESTS
from tests import builders

ZERO = dict.fromkeys(ib_errors_probe.COUNTERS, 0)


def test_saturation_widths():
    assert ib_errors_rule.saturated("excessive_buffer_overrun_errors", 15)
    assert not ib_errors_rule.saturated("excessive_buffer_overrun_errors", 14)
    assert ib_errors_rule.saturated("link_downed", 255)
    assert not ib_errors_rule.saturated("symbol_error", 255)


def test_probe_reads_the_sim_tree_twice(tmp_path):
    ib_hw.write_tree(str(tmp_path), ib_hw.cluster_files([{}, {"counters": {"symbol_error": 7}}]))
    facts = ib_errors_probe.probe(NodeContext({"interval_s": 0.01}, sysfs_root=str(tmp_path)))
    assert [ib_errors_rule.label(p) for p in facts["ports"]] == ["mlx5_0:1", "mlx5_1:1"]
    assert facts["ports"][1]["after"]["symbol_error"] == 7
    assert facts["ports"][0]["state"] == "ACTIVE" and facts["ports"][0]["link_layer"] == "ib"
    assert "dir" not in facts["ports"][0]


def test_probe_without_hcas_does_not_sleep(tmp_path):
    facts = ib_errors_probe.probe(NodeContext({"interval_s": 30}, sysfs_root=str(tmp_path)))
    assert facts["ports"] == [] and facts["interval_s"] == 0.0


def _port(before=None, after=None, hca="mlx5_0"):
    b = dict(ZERO, **(before or {}))
    return {"hca": hca, "port": 1, "link_layer": "ib", "state": "ACTIVE", "before": b, "after": dict(b, **(after or {}))}


def _view(ports_by_node, previous=None, at=1000.0):
    nodes = [NodeInfo(n, n, 8) for n in ports_by_node]
    facts = {n: {"ib_errors": {"interval_s": 1.0, "at": at, "ports": ps}} for n, ps in ports_by_node.items()}
    cluster = {"previous": previous} if previous else {}
    return builders.view(facts, nodes=nodes, cluster=cluster)


def by_node(findings):
    return {f.node: f for f in findings}


def test_quiet_ports_pass_and_carry_counters():
    out = by_node(ib_errors_rule.rule(_view({"n1": [_port()], "n2": [_port(before={"port_rcv_errors": 14})]})))
    assert out["n1"].status is Status.PASS and out["n2"].status is Status.PASS  # old errors are not judged
    assert out["n2"].data["counters"]["mlx5_0:1"]["port_rcv_errors"] == 14


def test_link_flap_during_probe_fails_with_isolate():
    out = by_node(ib_errors_rule.rule(_view({"n1": [_port()], "n2": [_port(after={"link_downed": 1}, hca="mlx5_3")]})))
    f = out["n2"]
    assert f.status is Status.FAIL and f.action == "isolate"
    assert "n2 mlx5_3 port 1: link went down 1 time (link flap)" in f.message
    assert out["n1"].status is Status.PASS


def test_symbol_error_rate_above_threshold_warns():
    f = ib_errors_rule.rule(_view({"n1": [_port(after={"symbol_error": 50})]}))[0]
    assert f.status is Status.WARN and "symbol_error +50 in 1s = 50/s (threshold 10/s)" in f.message
    f = ib_errors_rule.rule(_view({"n1": [_port(after={"symbol_error": 5})]}))[0]
    assert f.status is Status.PASS


def test_saturated_counter_warns_never_passes():
    f = ib_errors_rule.rule(_view({"n1": [_port(before={"link_downed": 255})]}))[0]
    assert f.status is Status.WARN and "link_downed saturated at 255" in f.message


def test_unavailable_counters_warn():
    p = _port()
    p["after"] = dict.fromkeys(ib_errors_probe.COUNTERS)
    f = ib_errors_rule.rule(_view({"n1": [p]}))[0]
    assert f.status is Status.WARN and "unavailable" in f.message


def _previous(node, counters, at):
    return {"started_at": "2026-11-22T10:00:00Z",
            "results": [{"check": "ib_errors", "node": node, "status": "pass", "message": "",
                         "data": {"counters": {"mlx5_0:1": dict(ZERO, **counters)}, "at": at}}]}


def test_symbol_errors_since_last_run_above_ibta_bound_fail():
    prev = _previous("n1", {"symbol_error": 100}, at=1000.0 - 3600)
    f = ib_errors_rule.rule(_view({"n1": [_port(before={"symbol_error": 400})]}, previous=prev))[0]
    assert f.status is Status.FAIL and "symbol_error +300 since the last run (2026-11-22T10:00:00Z) = 300/h" in f.message


def test_slow_symbol_errors_and_cleared_counters_pass():
    prev = _previous("n1", {"symbol_error": 100}, at=1000.0 - 3600)
    assert ib_errors_rule.rule(_view({"n1": [_port(before={"symbol_error": 150})]}, previous=prev))[0].status is Status.PASS
    # lower than before: cleared (reboot, perfquery -R), not compared
    assert ib_errors_rule.rule(_view({"n1": [_port(before={"symbol_error": 3})]}, previous=prev))[0].status is Status.PASS


def test_link_downed_since_last_run_warns():
    prev = _previous("n1", {"link_downed": 2}, at=0.0)
    f = ib_errors_rule.rule(_view({"n1": [_port(before={"link_downed": 3})]}, previous=prev))[0]
    assert f.status is Status.WARN and "link went down 1 time since the last run" in f.message


def test_no_hca_skips_and_missing_facts_error():
    view = builders.view({"n1": {"ib_errors": {"interval_s": 0, "at": 1, "ports": []}}, "n2": {}},
                         nodes=[NodeInfo("n1", "n1", 0), NodeInfo("n2", "n2", 0)])
    out = by_node(ib_errors_rule.rule(view))
    assert out["n1"].status is Status.SKIP and out["n2"].status is Status.ERROR


# ------------------------------------------------------------------------------- link flaps in the kernel log

FIXTURES = os.path.join(TESTS, "fixtures", "ib_errors")
HCA_PCI = {"mlx5_0": "0000:1a:00.0", "mlx5_1": "0000:3c:00.0", "mlx5_2": "0000:5d:00.0"}


def _log_facts(name="journalctl_hgx_link_flaps.txt", uptime=9200.0, text=None):
    if text is None:
        with open(os.path.join(FIXTURES, name)) as fh:
            text = fh.read()
    log = dict(ib_errors_probe.parse_link_events(text, "journalctl", HCA_PCI), source="journalctl", error=None)
    ports = [dict(_port(hca=h)) for h in sorted(HCA_PCI)]
    return {"interval_s": 1.0, "at": 1000.0, "ports": ports, "hca_pci": HCA_PCI, "uptime_s": uptime, "kernel_log": log}


def _rule(facts, **cluster):
    view = builders.view({"n1": {"ib_errors": facts}}, cluster=cluster)
    return ib_errors_rule.rule(view)[0]


def test_flaps_since_boot_are_named_per_port_and_boot_bringup_is_not_a_flap():
    f = _rule(_log_facts())
    assert f.status is Status.FAIL and f.action == "isolate"  # the module's High Temperature error
    assert "n1 mlx5_0 port 1: transceiver module error since boot" in f.message and "High Temperature" in f.message
    assert "n1 mlx5_1 port 1: link went down 1 time since boot in the kernel log (last 30 min ago" in f.message
    # unplug + netdev down of one event count once; the netdev's "Link down" at boot (16 s) is bring-up
    assert "n1 mlx5_2 port 1: link went down 1 time since boot" in f.message
    assert f.data["flaps"] == {"mlx5_1:1": 1, "mlx5_2:1": 1}


def test_flaps_outside_the_window_are_ignored():
    f = _rule(_log_facts(), xid_window_s=1000)
    assert f.data["flaps"] == {"mlx5_2:1": 1}
    assert "mlx5_1" not in f.message and "in the last 16 min" in f.message


def test_repeated_flaps_fail_single_flap_warns():
    boot = "[   15.6] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link ACTIVE\n"
    flap = "[ %d.5] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link DOWN\n[ %d.9] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link ACTIVE\n"
    once = _rule(_log_facts(text=boot + flap % (100, 101)))
    assert once.status is Status.WARN and "link went down 1 time" in once.message and once.action is None
    thrice = _rule(_log_facts(text=boot + "".join(flap % (t, t + 1) for t in (100, 200, 300))))
    assert thrice.status is Status.FAIL and "link went down 3 times" in thrice.message and thrice.action == "isolate"


def test_quiet_log_passes_and_says_what_it_searched():
    boot = ("[   15.1] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link INIT\n"
            "[   15.6] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link ACTIVE\n")
    f = _rule(_log_facts(text=boot))
    assert f.status is Status.PASS
    assert "no link flap since boot in 2 kernel log lines (journalctl)" in f.message


def test_unreadable_log_is_said_not_passed_off_as_quiet():
    facts = _log_facts()
    facts["kernel_log"] = {"source": None, "error": "journalctl -k: rc 1; dmesg: rc 1: Operation not permitted",
                           "lines": 0, "first_ts": None, "events": []}
    f = _rule(facts)
    assert f.status is Status.PASS  # the counters were read; the log's absence is stated, xid reports it on GPU nodes
    assert "kernel log not read (journalctl -k: rc 1; dmesg: rc 1: Operation not permitted): link flaps since boot not checked" in f.message


def _fake_journalctl(tmp_path, text):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    script = bindir / "journalctl"
    script.write_text("#!/bin/sh\necho x >> %s\ncat <<'EOF'\n%sEOF\n" % (calls, text))
    script.chmod(0o755)
    return str(bindir), calls


def test_probe_maps_pci_to_hca_and_reads_the_log_once_for_xid_too(tmp_path, monkeypatch):
    from preflight.checks.xid import probe as xid_probe
    from preflight.probe.context import Shared

    with open(os.path.join(FIXTURES, "journalctl_hgx_link_flaps.txt")) as fh:
        text = fh.read()
    bindir, calls = _fake_journalctl(tmp_path, text)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ["PATH"])
    sysfs = tmp_path / "sys"
    ib_hw.write_tree(str(sysfs), ib_hw.cluster_files([{}, {}]))
    # class/infiniband/<hca>/device links to the PCI function, as the kernel publishes it
    for hca, bdf in (("mlx5_0", "0000:1a:00.0"), ("mlx5_1", "0000:3c:00.0")):
        real = sysfs / "devices" / "pci0000:00" / bdf
        real.mkdir(parents=True)
        dev = sysfs / "class" / "infiniband" / hca / "device"
        for child in dev.iterdir() if dev.is_dir() else []:
            child.rename(real / child.name)
        dev.rmdir()
        dev.symlink_to(os.path.relpath(str(real), str(dev.parent)))
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    shared = Shared()
    facts = ib_errors_probe.probe(NodeContext({"interval_s": 0.01}, sysfs_root=str(sysfs), shared=shared))
    xfacts = xid_probe.probe(NodeContext({}, sysfs_root=str(sysfs), shared=shared))
    assert calls.read_text().count("x") == 1  # one journalctl for both checks
    assert facts["hca_pci"] == {"mlx5_0": "0000:1a:00.0", "mlx5_1": "0000:3c:00.0"}
    assert facts["kernel_log"]["source"] == "journalctl" and sum(e["count"] for e in facts["kernel_log"]["events"]) == 13
    assert xfacts["source"] == "journalctl" and xfacts["log"]["lines"] == 16
    # a separate run (its own Shared) reads the log again
    ib_errors_probe.probe(NodeContext({"interval_s": 0.01}, sysfs_root=str(sysfs)))
    assert calls.read_text().count("x") == 2


def test_a_port_flapping_all_day_is_folded_on_the_node():
    """Issue 26 item 12: link events are folded per port and state; the flaps are still counted after an up."""
    import json

    boot = "[   15.1] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link DOWN\n"  # bring-up: not a flap
    flap = "[ %d.5] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link ACTIVE\n[ %d.9] h kernel: mlx5_core 0000:3c:00.0 mlx5_1: Port: 1 Link DOWN\n"
    text = boot + "".join(flap % (t, t) for t in range(100, 100 + 20000))
    log = ib_errors_probe.parse_link_events(text, "journalctl", HCA_PCI)
    assert len(json.dumps(log)) < 8 * 1024 and log["lines"] == 40001
    down = [e for e in log["events"] if e["state"] == "DOWN"]
    assert sorted((e["after_up"], e["count"]) for e in down) == [(False, 1), (True, 20000)]
    facts = dict(_log_facts(text=text, uptime=30000.0))
    f = _rule(facts)
    assert f.status is Status.FAIL and "mlx5_1 port 1: link went down 20000 times since boot" in f.message

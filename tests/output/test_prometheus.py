"""Prometheus textfile: parsed back with prometheus_client's own parser."""

import pytest

parser = pytest.importorskip("prometheus_client.parser")

from preflight.model import Status  # noqa: E402
from preflight.output.prometheus import STATUS_VALUE, escape_label_value, to_prometheus, write_prometheus  # noqa: E402


def _r(check, node, status, message="m", **kw):
    return dict(check=check, node=node, status=status, message=message, **kw)


def _report(**extra):
    doc = {
        "preflight_version": "0.1.0",
        "started_at": "2026-11-22T13:30:00Z",
        "duration_s": 12.3,
        "inventory": "hosts.yaml",
        "inventory_sha256": "cd" * 32,
        "checks": ["ssh", "gpu", "driver", "allreduce"],
        "nodes": [
            {"name": "n001", "host": "198.18.0.2", "gpus": 8, "status": "fail"},
            {"name": "n002", "host": "198.18.0.3", "gpus": 8, "status": "pass"},
        ],
        "results": [
            _r("ssh", "n001", "pass"),
            _r("ssh", "n002", "pass"),
            _r("gpu", "n001", "warn"),
            _r("gpu", "n001", "fail"),
            _r("gpu", "n002", "pass"),
            _r("driver", None, "error"),
            _r("fabric_manager", "n002", "skip"),
        ],
        "summary": {"pass": 3, "warn": 1, "fail": 1, "skip": 1, "error": 1},
        "allreduce": {
            "backend": "gloo", "world_size": 16, "nodes": ["n001", "n002"], "verdict": "pass",
            "busbw_gbps": 180.5, "threshold_gbps": None,
            "curve": [
                {"bytes": 1024, "time_s": 0.0001, "algbw_gbps": 0.01, "busbw_gbps": 0.02,
                 "slowest_rank": 3, "fastest_rank": 0},
                {"bytes": 1 << 30, "time_s": 0.011, "algbw_gbps": 97.6, "busbw_gbps": 180.5,
                 "slowest_rank": 7, "fastest_rank": 1},
            ],
        },
        "exit_code": 1,
    }
    doc.update(extra)
    return doc


def _samples(text):
    """{(metric name, frozenset(labels)): value} and the family types, via the official parser."""
    out, types = {}, {}
    for family in parser.text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, "duplicate series %r" % (key,)
            out[key] = s.value
    return out, types


def _get(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def test_status_numbering_is_documented_order():
    assert STATUS_VALUE == {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


def test_check_and_node_status_parse_back():
    samples, types = _samples(to_prometheus(_report()))
    assert set(types.values()) == {"gauge"}
    assert _get(samples, "preflight_check_status", check="gpu", node="n001") == 3
    assert _get(samples, "preflight_check_ok", check="gpu", node="n001") == 0
    assert _get(samples, "preflight_check_status", check="gpu", node="n002") == 0
    assert _get(samples, "preflight_check_ok", check="fabric_manager", node="n002") == 1
    assert _get(samples, "preflight_check_status", check="fabric_manager", node="n002") == 1
    # cluster-wide findings carry node=""
    assert _get(samples, "preflight_check_status", check="driver", node="") == 4
    assert _get(samples, "preflight_check_ok", check="driver", node="") == 0
    assert _get(samples, "preflight_node_status", node="n001") == 3
    assert _get(samples, "preflight_node_status", node="n002") == 0
    # one series per (check, node) despite two gpu findings on n001
    assert len([k for k in samples if k[0] == "preflight_check_status"]) == 6


def test_run_metrics_and_findings():
    samples, _ = _samples(to_prometheus(_report()))
    assert _get(samples, "preflight_last_run_timestamp_seconds") == 1795354200.0  # 2026-11-22T13:30:00Z
    assert _get(samples, "preflight_run_duration_seconds") == 12.3
    assert _get(samples, "preflight_exit_code") == 1
    for status, count in {"pass": 3, "warn": 1, "fail": 1, "skip": 1, "error": 1}.items():
        assert _get(samples, "preflight_findings", status=status) == count
    assert _get(samples, "preflight_run_info", version="0.1.0", inventory="hosts.yaml",
                inventory_sha256="cd" * 32) == 1


def test_allreduce_metrics():
    samples, _ = _samples(to_prometheus(_report()))
    assert _get(samples, "preflight_allreduce_busbw_gbps") == 180.5
    assert _get(samples, "preflight_allreduce_status") == 0
    assert _get(samples, "preflight_allreduce_world_size") == 16
    assert _get(samples, "preflight_allreduce_algbw_gbps", bytes="1024") == 0.01
    assert _get(samples, "preflight_allreduce_algbw_gbps", bytes=str(1 << 30)) == 97.6
    assert _get(samples, "preflight_allreduce_curve_busbw_gbps", bytes="1024") == 0.02
    assert _get(samples, "preflight_allreduce_time_seconds", bytes=str(1 << 30)) == 0.011
    assert not any(k[0] == "preflight_allreduce_threshold_gbps" for k in samples)  # null: absent


def test_no_allreduce_means_no_allreduce_metrics():
    text = to_prometheus(_report(allreduce=None))
    samples, types = _samples(text)
    assert not any(name.startswith("preflight_allreduce") for name in types)
    assert "preflight_allreduce" not in text


def test_every_family_has_help_and_type_once():
    text = to_prometheus(_report())
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert sorted(helps) == sorted(names) and len(helps) == len(set(helps))
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_label_values_are_escaped():
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    weird = 'n"1\\x\ny'
    report = _report(nodes=[], results=[_r('gp"u', weird, "fail")])
    samples, _ = _samples(to_prometheus(report))
    assert _get(samples, "preflight_check_status", check='gp"u', node=weird) == 3
    # a node without a status in `nodes` gets the worst of its findings
    assert _get(samples, "preflight_node_status", node=weird) == 3


def test_write_prometheus_atomic(tmp_path):
    path = tmp_path / "preflight.prom"
    path.write_text("stale 1\n")
    path.chmod(0o640)
    write_prometheus(_report(), path)
    assert path.read_text() == to_prometheus(_report())
    assert (path.stat().st_mode & 0o777) == 0o640  # an existing file keeps its mode
    assert [p.name for p in tmp_path.iterdir()] == ["preflight.prom"]
    fresh = tmp_path / "new.prom"
    write_prometheus(_report(), fresh)
    assert (fresh.stat().st_mode & 0o777) == 0o644  # readable by a collector running as another user


def test_a_report_from_before_schema_1_keeps_working():
    """Reports kept by --history before node statuses were pass/warn/fail/unavailable said skip/error."""
    old = {"nodes": [{"name": "n001", "status": "error"}, {"name": "n002", "status": "skip"}], "results": []}
    samples, _ = _samples(to_prometheus(old))
    assert _get(samples, "preflight_node_status", node="n001") == 3 and _get(samples, "preflight_node_status", node="n002") == 0

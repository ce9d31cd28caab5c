"""Run history on disk and the diff between two runs."""

import copy
import json
import os

import pytest

from preflight.output.diff import diff, render_diff
from preflight.output.history import atomic_write_text, list_runs, load, parse_timestamp, previous, prune, record

SHA_A = "a1" * 32
SHA_B = "b2" * 32


def _r(check, node, status, message="ok", **kw):
    return dict(check=check, node=node, status=status, message=message, **kw)


def _report(started_at="2026-11-22T13:30:00Z", sha=SHA_A, nodes=("n001", "n002", "n003"), results=None,
            busbw=180.0):
    if results is None:
        results = []
        for n in nodes:
            results += [
                _r("ssh", n, "pass", "reachable"),
                _r("gpu", n, "pass", "8 GPUs"),
                _r("driver", n, "pass", "driver 550.54.15", expected="550.54.15", actual="550.54.15"),
            ]
    return {
        "preflight_version": "0.1.0",
        "started_at": started_at,
        "duration_s": 3.0,
        "inventory": "hosts.yaml",
        "inventory_sha256": sha,
        "checks": ["ssh", "gpu", "driver"],
        "nodes": [{"name": n, "host": "h-" + n, "gpus": 8, "status": "pass"} for n in nodes],
        "results": results,
        "summary": {},
        "allreduce": None if busbw is None else {"backend": "nccl", "world_size": 8 * len(nodes),
                                                 "verdict": "pass", "busbw_gbps": busbw, "curve": []},
        "exit_code": 0,
    }


def _set_status(report, check, node, status, message, **kw):
    report["results"] = [r for r in report["results"] if not (r["check"] == check and r["node"] == node)]
    report["results"].append(_r(check, node, status, message, **kw))


# --- history -------------------------------------------------------------------------------------


def test_record_creates_dir_and_names_file_by_time_and_hash(tmp_path):
    hist = tmp_path / "deep" / "history"
    path = record(_report(), hist)
    assert path.name == "20261122T133000Z-%s.json" % SHA_A[:12]
    assert load(path) == _report()
    assert [p.name for p in hist.iterdir()] == [path.name]  # no temporary left behind


def test_record_never_overwrites_same_second(tmp_path):
    first = record(_report(), tmp_path)
    second = record(_report(), tmp_path)
    third = record(_report(), tmp_path)
    assert first != second != third
    assert second.name.endswith("-1.json") and third.name.endswith("-2.json")
    assert [r.path for r in list_runs(tmp_path)] == [first, second, third]
    assert previous(tmp_path, SHA_A, before=third) == second


def test_previous_same_inventory_before_given_run(tmp_path):
    a1 = record(_report("2026-11-22T10:00:00Z"), tmp_path)
    b1 = record(_report("2026-11-22T11:00:00Z", sha=SHA_B), tmp_path)
    a2 = record(_report("2026-11-22T12:00:00+00:00"), tmp_path)
    a3 = record(_report("2026-11-22T14:00:00+01:00"), tmp_path)  # 13:00 UTC
    (tmp_path / "notes.txt").write_text("not a run")
    assert a3.name.startswith("20261122T130000Z")
    assert previous(tmp_path, SHA_A, before=a3) == a2
    assert previous(tmp_path, SHA_A, before=a2) == a1
    assert previous(tmp_path, SHA_A, before=a1) is None
    assert previous(tmp_path, SHA_A) == a3
    assert previous(tmp_path, SHA_B, before=b1) is None
    assert previous(tmp_path, SHA_B) == b1
    assert [r.path for r in list_runs(tmp_path, SHA_A)] == [a1, a2, a3]
    assert len(list_runs(tmp_path)) == 4


def test_previous_passes_over_corrupt_file_and_missing_dir(tmp_path):
    good = record(_report("2026-11-22T10:00:00Z"), tmp_path)
    (tmp_path / ("20261122T110000Z-%s.json" % SHA_A[:12])).write_text("{truncated")
    new = record(_report("2026-11-22T12:00:00Z"), tmp_path)
    assert previous(tmp_path, SHA_A, before=new) == good
    assert previous(tmp_path / "nope", SHA_A) is None
    assert list_runs(tmp_path / "nope") == []


def test_prune_keeps_newest_per_inventory(tmp_path):
    runs = [record(_report("2026-11-22T1%d:00:00Z" % i), tmp_path) for i in range(4)]
    other = record(_report(sha=SHA_B), tmp_path)
    removed = prune(tmp_path, keep=2)
    assert sorted(removed) == sorted(runs[:2])
    assert {r.path for r in list_runs(tmp_path)} == {runs[2], runs[3], other}


def test_atomic_write_no_clobber(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_text(target, "one")
    with pytest.raises(FileExistsError):
        atomic_write_text(target, "two", overwrite=False)
    assert target.read_text() == "one"
    assert os.listdir(tmp_path) == ["x.json"]


def test_parse_timestamp_forms():
    assert parse_timestamp("2026-11-22T13:30:00Z") == parse_timestamp("2026-11-22T14:30:00+01:00")
    assert parse_timestamp("2026-11-22T13:30:00.250Z").microsecond == 250000
    assert parse_timestamp("2026-11-22T13:30:00.25Z").microsecond == 250000
    assert parse_timestamp("2026-11-22T13:30:00.123456789+00:00").microsecond == 123456
    assert parse_timestamp(None) is None
    with pytest.raises(ValueError):
        parse_timestamp("yesterday")


# --- diff ----------------------------------------------------------------------------------------


def test_identical_runs_have_no_changes():
    result = diff(_report(), _report())
    assert not result.has_regressions and not result.has_changes
    assert render_diff(result)[-1] == "verdict: no changes"


def test_node_goes_from_pass_to_ssh_fail_is_went_down():
    old = _report()
    new = copy.deepcopy(old)
    _set_status(new, "ssh", "n002", "fail", "connect timeout after 10s")
    _set_status(new, "gpu", "n002", "error", "no facts gathered for this check")
    _set_status(new, "driver", "n002", "error", "no facts gathered for this check")
    result = diff(old, new)
    assert [(c.node, c.old, c.new) for c in result.went_down] == [("n002", "pass", "fail")]
    assert result.new_failures == []  # the node's other errors are what "down" means
    assert result.version_drift == []  # no actual on an unreachable node is not drift
    assert result.has_regressions
    lines = render_diff(result)
    assert "went down (1): n002" in lines
    assert "  n002: ssh fail: connect timeout after 10s" in lines
    assert lines[-1] == "verdict: 1 regression"

    back = diff(new, old)
    assert not back.has_regressions
    assert {(c.check, c.node) for c in back.recovered} == {("ssh", "n002"), ("gpu", "n002"), ("driver", "n002")}


def test_new_failure_and_recovery():
    old = _report()
    _set_status(old, "gpu", "n001", "fail", "GPU3 missing")
    new = _report()
    _set_status(new, "gpu", "n003", "error", "nvidia-smi timed out")
    new["results"].append(_r("fabric_manager", None, "fail", "fabric manager down"))
    result = diff(old, new)
    assert [(c.check, c.node, c.old, c.new) for c in result.new_failures] == [
        ("fabric_manager", None, None, "fail"),
        ("gpu", "n003", "pass", "error"),
    ]
    assert [(c.check, c.node, c.old, c.new) for c in result.recovered] == [("gpu", "n001", "fail", "pass")]
    lines = render_diff(result)
    assert "  gpu n003: pass -> error: nvidia-smi timed out" in lines
    assert "  fabric_manager: absent -> fail: fabric manager down" in lines
    assert "  gpu n001: fail -> pass" in lines
    assert lines[-1] == "verdict: 2 regressions"


def test_failure_that_stays_failing_is_not_new():
    old = _report()
    _set_status(old, "gpu", "n001", "fail", "GPU3 missing")
    new = copy.deepcopy(old)
    _set_status(new, "gpu", "n001", "error", "GPU3 missing, NVML error")
    assert not diff(old, new).has_regressions


def test_node_removed_and_added():
    old = _report(nodes=("n001", "n002", "n003", "n004"))
    new = _report(nodes=("n001", "n002", "n005"))
    result = diff(old, new)
    assert result.nodes_removed == ["n003", "n004"]
    assert result.nodes_added == ["n005"]
    assert not result.has_regressions and result.has_changes
    lines = render_diff(result)
    assert "nodes removed (2): n[003-004]" in lines
    assert "nodes added (1): n005" in lines
    assert lines[-1] == "verdict: no regressions"


def test_driver_version_change():
    old = _report()
    new = copy.deepcopy(old)
    _set_status(new, "driver", "n003", "pass", "driver 560.35.03", expected="560.35.03", actual="560.35.03")
    result = diff(old, new)
    assert [(v.node, v.old, v.new) for v in result.version_drift] == [("n003", "550.54.15", "560.35.03")]
    assert not result.has_regressions
    assert "  n003: 550.54.15 -> 560.35.03" in render_diff(result)


@pytest.mark.parametrize(
    "new_bw, dropped, improved",
    [(150.0, True, False), (170.0, False, False), (162.1, False, False), (161.9, True, False),
     (200.0, False, True)],
)
def test_busbw_threshold(new_bw, dropped, improved):
    result = diff(_report(busbw=180.0), _report(busbw=new_bw), bw_threshold=0.10)
    assert result.busbw.dropped is dropped and result.busbw.improved is improved
    assert result.has_regressions is dropped
    lines = render_diff(result)
    if dropped:
        assert any(line.startswith("all-reduce busbw dropped: 180.00 -> %.2f GB/s" % new_bw) for line in lines)
    elif not improved:
        assert not any("busbw" in line for line in lines)


def test_busbw_beyond_threshold_drop_text():
    lines = render_diff(diff(_report(busbw=180.0), _report(busbw=150.0)))
    assert "all-reduce busbw dropped: 180.00 -> 150.00 GB/s (-16.7%, threshold 10%)" in lines


def test_busbw_missing_on_one_side_is_noted_not_regression():
    result = diff(_report(busbw=180.0), _report(busbw=None))
    assert result.busbw is None and not result.has_regressions
    assert "not measured now" in result.busbw_note


def test_inventory_change_is_noted():
    result = diff(_report(sha=SHA_A), _report(sha=SHA_B))
    assert result.inventory_changed and not result.has_regressions
    assert "inventory changed (different inventory_sha256)" in render_diff(result)


def test_history_then_diff_round_trip(tmp_path):
    """The cron flow: record, find the previous run of this inventory, diff."""
    old = _report("2026-11-22T12:00:00Z")
    new = _report("2026-11-22T13:00:00Z", busbw=120.0)
    record(old, tmp_path)
    current = record(new, tmp_path)
    prev = previous(tmp_path, new["inventory_sha256"], before=current)
    result = diff(load(prev), json.loads(current.read_text()))
    assert result.busbw_dropped and result.has_regressions

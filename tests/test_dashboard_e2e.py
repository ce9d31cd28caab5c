"""The shipped Grafana dashboard answers from real parts: every query of every panel returns data for the run.

A month-like history (a GPU board with an Xid night after night, a flapping port, a drain) goes through
the real recorder (escalation, drain policy, SQLite) and the real textfile writer; a real
`prometheus-node-exporter` serves the file with its textfile collector and a real `prometheus` scrapes it
every second. Each panel's PromQL is then sent to Prometheus's HTTP API (/api/v1/query), as Grafana
would, and must return series that say what the run said. Both daemons listen on free loopback ports
(never 9090/9100), keep their state under the test's tmp dir, and are killed in teardown even when a
test fails. Without the Debian packages (`apt-get install prometheus prometheus-node-exporter`) the
module skips, naming them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import pytest

from preflight import cli
from preflight.history import recorder
from preflight.history.db import History
from preflight.model import Finding, Status
from preflight.output import dashboard
from preflight.output.prometheus import history_metrics, to_prometheus, write_prometheus
from preflight.slurm import drain
from tests import history_fleet as fleet

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
needs_daemons = pytest.mark.skipif(
    not (PROMETHEUS and NODE_EXPORTER),
    reason="needs the Debian packages prometheus and prometheus-node-exporter (apt-get install -y prometheus "
    "prometheus-node-exporter): %s not on PATH" % " and ".join(
        n for n, p in (("prometheus", PROMETHEUS), ("prometheus-node-exporter", NODE_EXPORTER)) if not p))

NODES = fleet.node_names(6)
LEMON, FLAPPY = NODES[1], NODES[4]
LEMON_GPU = 3
NIGHTS = 4
#: each node's loopback bus bandwidth in the last run; the lemon's node is the slow one
NODE_GBPS = {n: 11.5 + i * 0.25 for i, n in enumerate(NODES)}
NODE_GBPS[LEMON] = 4.0
DEADLINE_S = 90.0  # daemons starting and the first scrape, on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _night(day: int) -> Dict[str, Any]:
    """One run's report: the lemon's GPU 3 raises Xid 79 every night, FLAPPY's port flaps on the last;
    an all-reduce with a threshold and each node's loopback round (the report's node_rounds)."""
    faults = [fleet.xid(LEMON, LEMON_GPU)] + ([fleet.flaky(FLAPPY)] if day == NIGHTS - 1 else [])
    doc = fleet.report(day, NODES, faults, busbw=12.5)
    doc["allreduce"].update(backend="gloo", threshold_gbps=8.0, node_rounds=[
        {"name": "loopback", "what": "the node alone", "median_gbps": 12.0, "named": [LEMON], "nodes": dict(NODE_GBPS)}])
    doc["summary"] = {"pass": sum(r["status"] == "pass" for r in doc["results"]),
                      "fail": sum(r["status"] == "fail" for r in doc["results"])}
    return doc


def _finding(r: Dict[str, Any]) -> Finding:
    return Finding(r["check"], r["node"], Status(r["status"]), r["message"], action=r.get("action"), data=r.get("data"))


def _write_textfile(tmp: Path, textfile: Path) -> Dict[str, Any]:
    """Record the nights as `preflight check --history --drain` does (decide, record, metrics), then write
    the last night's textfile through the real writer; returns that night's report."""
    would = lambda fs: sorted(drain.plan(fs, NODES, {}, drain=True, resume=False, max_fraction=0.5).drain)  # noqa: E731
    with History(str(tmp / "history.sqlite")) as h:
        for day in range(NIGHTS):
            doc = _night(day)
            _, actions = recorder.decide(h, doc, [_finding(r) for r in doc["results"]], {}, would, False, lambda _l: None)
            recorder.record(h, None, doc, None, actions, {}, lambda _l: None)
        write_prometheus(doc, textfile, recorder.metrics(h, {}))
    return doc


def _query(port: int, expr: str) -> List[Dict[str, Any]]:
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr}))
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _stop(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _die_with_this_process() -> None:
    """In the daemon's child: SIGKILL when pytest dies, even by SIGKILL (no teardown runs then)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _start(argv: List[str], log: Path, procs: List[subprocess.Popen]) -> subprocess.Popen:
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_this_process)
    procs.append(proc)
    return proc


def _wait_for_scrape(port: int, started: float, procs: List[subprocess.Popen], logs: List[Path]) -> None:
    """Until Prometheus holds the run's start time from the textfile: a bounded poll, never a bare sleep."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        dead = [(p, log) for p, log in zip(procs, logs) if p.poll() is not None]
        if dead:
            raise AssertionError("%s exited %s: %s" % (dead[0][0].args[0], dead[0][0].returncode, dead[0][1].read_text()[-2000:]))
        try:
            found = _query(port, "preflight_last_run_timestamp_seconds")
        except (urllib.error.URLError, ConnectionError, OSError):
            found = []
        if any(float(s["value"][1]) == started for s in found):
            return
        time.sleep(0.2)
    raise AssertionError("Prometheus had not scraped the textfile within %.0f s: %s" % (DEADLINE_S, logs[-1].read_text()[-2000:]))


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """(Prometheus port, the run's report): node exporter serving the textfile, Prometheus scraping it."""
    tmp = tmp_path_factory.mktemp("dashboard")
    textdir = tmp / "textfile"
    textdir.mkdir()
    doc = _write_textfile(tmp, textdir / "preflight.prom")
    exporter_port, prom_port = _free_port(), _free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: preflight\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n" % exporter_port)
    procs: List[subprocess.Popen] = []
    logs = [tmp / "node_exporter.log", tmp / "prometheus.log"]
    try:
        _start([NODE_EXPORTER, "--web.listen-address=127.0.0.1:%d" % exporter_port, "--collector.disable-defaults",
                "--collector.textfile", "--collector.textfile.directory=%s" % textdir], logs[0], procs)
        _start([PROMETHEUS, "--config.file=%s" % (tmp / "prometheus.yml"), "--storage.tsdb.path=%s" % (tmp / "tsdb"),
                "--web.listen-address=127.0.0.1:%d" % prom_port, "--web.console.templates=%s" % tmp,
                "--web.console.libraries=%s" % tmp], logs[1], procs)
        from preflight.output.history import parse_timestamp

        _wait_for_scrape(prom_port, parse_timestamp(doc["started_at"]).timestamp(), procs, logs)
        yield prom_port, doc
    finally:
        _stop(procs)


def _labels(series: List[Dict[str, Any]], name: str) -> List[str]:
    return sorted(s["metric"].get(name, "") for s in series)


@needs_daemons
def test_every_panel_query_returns_data_for_the_run(prom):
    port, _doc = prom
    found = list(dashboard.queries(dashboard.load()))
    assert len(found) >= 10
    empty = [(title, ref, expr) for title, ref, expr in found if not _query(port, expr)]
    assert empty == [], "panel queries with no data: %s" % empty


@needs_daemons
def test_the_panels_say_what_the_run_said(prom):
    port, doc = prom
    q = {title + "/" + ref: expr for title, ref, expr in dashboard.queries(dashboard.load())}
    statuses = {s["metric"]["status"]: float(s["value"][1]) for s in _query(port, q["Nodes by status/A"])}
    assert statuses == {"pass": 4.0, "fail": 2.0, "warn": 0.0, "unavailable": 0.0}
    failing = {s["metric"]["check"]: float(s["value"][1]) for s in _query(port, q["Failing checks over time/A"])}
    assert failing == {"xid": 1.0, "ib_errors": 1.0}
    busbw = {(s["metric"]["node"], s["metric"]["test"]): float(s["value"][1]) for s in _query(port, q["Bus bandwidth per node over time/A"])}
    assert busbw == {(n, "loopback"): g for n, g in NODE_GBPS.items()}
    assert [float(s["value"][1]) for s in _query(port, q["Bus bandwidth per node over time/C"])] == [8.0]
    lemons = _query(port, q["Lemons: GPU serials with repeat faults/A"])
    assert [(s["metric"]["subject"], s["metric"]["fault"], s["metric"]["node"], s["value"][1]) for s in lemons] == [
        ("gpu:" + fleet.serial(LEMON, LEMON_GPU), "xid:xid79", LEMON, str(NIGHTS))]
    acted = {(s["metric"]["node"], s["metric"]["kind"]) for s in _query(port, q["Actions of the last run/A"])}
    assert (LEMON, "drain") in acted and (FLAPPY, "hold") in acted  # a first flap is held, never drained
    assert (FLAPPY, "drain") not in acted
    drains = {s["metric"]["kind"]: float(s["value"][1]) for s in _query(port, q["Drains by preflight/A"])}
    assert drains.get("drain") == 1.0 and doc["exit_code"] == 1


def test_the_dashboard_is_valid_grafana_json_and_ships_with_the_package(capsys, tmp_path):
    board = dashboard.load()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] and board["schemaVersion"] >= 36
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    for panel in board["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and panel["description"]
            assert all(t["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for t in panel["targets"])
    titles = " | ".join(p["title"] for p in board["panels"])
    for wanted in ("Nodes by status", "Failing checks over time", "Bus bandwidth per node", "Lemons", "Drains"):
        assert wanted in titles
    assert cli.main(["dashboard"]) == 0
    assert json.loads(capsys.readouterr().out) == board
    assert cli.main(["dashboard", "-o", str(tmp_path / "preflight.json")]) == 0
    assert json.loads((tmp_path / "preflight.json").read_text()) == board
    provider = tmp_path / "provisioning"
    provider.mkdir()
    assert cli.main(["dashboard", "--output", str(provider)]) == 0  # a provider's folder
    assert json.loads((provider / "preflight.json").read_text()) == board
    assert cli.main(["dashboard", "-o", str(tmp_path / "missing" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and len(err.strip().splitlines()) == 1


def test_healthy_twin_a_clean_run_draws_no_failure_lemon_or_drain(tmp_path):
    """A clean night after nights without faults: no failing check, no lemon, no action in the textfile,
    so those panels stay empty while fleet status shows every node passing."""
    h_docs = [fleet.report(day, NODES) for day in range(NIGHTS)]
    with History(str(tmp_path / "h.sqlite")) as h:
        for doc in h_docs:
            recorder.record(h, None, doc, None, [], {}, lambda _l: None)
        text = to_prometheus(h_docs[-1]) + history_metrics(recorder.metrics(h, {}))
    lines = text.splitlines()
    assert 'preflight_nodes{status="pass"} %d' % len(NODES) in lines and 'preflight_nodes{status="fail"} 0' in lines
    assert not [line for line in lines if line.startswith("preflight_check_status{") and not line.endswith(" 0")]
    for absent in ("preflight_history_repeat_fault_runs{", "preflight_history_actions{", "preflight_check_action{",
                   "preflight_allreduce_node_busbw_gbps{"):
        assert absent not in text


def test_node_busbw_series_name_the_node_and_test_and_skip_missing_figures():
    doc = _night(0)
    doc["allreduce"]["node_rounds"] = [{"name": "nvlink", "nodes": {NODES[0]: 370.5, NODES[1]: None}},
                                       {"name": "nic", "nodes": {NODES[0]: 96.25}}]
    lines = to_prometheus(doc).splitlines()
    assert [line for line in lines if line.startswith("preflight_allreduce_node_busbw_gbps{")] == [
        'preflight_allreduce_node_busbw_gbps{node="%s",test="nvlink"} 370.5' % NODES[0],
        'preflight_allreduce_node_busbw_gbps{node="%s",test="nic"} 96.25' % NODES[0]]

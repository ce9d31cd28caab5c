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
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from preflight import cli
from preflight.history import recorder
from preflight.history.db import History
from preflight.model import Finding, Status
from preflight.output import dashboard
from preflight.output.prometheus import history_metrics, to_prometheus, write_prometheus
from preflight.slurm import drain
from tests import history_fleet as fleet
from tests.netports import free_port as _free_port  # a port of this worker's own block

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
#: each node's loopback bus bandwidth; the lemon's node falls from HEALTHY_GBPS to its figure here on the last night
NODE_GBPS = {n: 11.5 + i * 0.25 for i, n in enumerate(NODES)}
NODE_GBPS[LEMON] = 4.0
HEALTHY_GBPS = 12.0
DEADLINE_S = 90.0  # daemons starting and a scrape, on a loaded 2-core machine
PORT_TRIES = 3  # a free port another process takes before the daemon binds it: new ports


def _night(day: int) -> Dict[str, Any]:
    """One run's report: the lemon's GPU 3 raises Xid 79 every night, and on the last night its node's
    bandwidth falls and FLAPPY's port flaps; an all-reduce with a threshold and each node's loopback
    round (the report's node_rounds)."""
    last = day == NIGHTS - 1
    faults = [fleet.xid(LEMON, LEMON_GPU)] + ([fleet.flaky(FLAPPY)] if last else [])
    doc = fleet.report(day, NODES, faults, busbw=12.5)
    gbps = dict(NODE_GBPS, **({} if last else {LEMON: HEALTHY_GBPS}))
    doc["allreduce"].update(backend="gloo", threshold_gbps=8.0, node_rounds=[
        {"name": "loopback", "what": "the node alone", "median_gbps": 12.0, "named": [LEMON] if last else [], "nodes": gbps}])
    doc["summary"] = {"pass": sum(r["status"] == "pass" for r in doc["results"]),
                      "fail": sum(r["status"] == "fail" for r in doc["results"])}
    return doc


def _finding(r: Dict[str, Any]) -> Finding:
    return Finding(r["check"], r["node"], Status(r["status"]), r["message"], action=r.get("action"), data=r.get("data"))


def _record_nights(tmp: Path, textfile: Path, scraped: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
    """Record the nights as `preflight check --history --drain` does (decide, record, metrics); after each
    of the last two, write the textfile through the real writer and wait until `scraped(report)`.
    Returns the last night's report."""
    would = lambda fs: sorted(drain.plan(fs, NODES, {}, drain=True, resume=False, max_fraction=0.5).drain)  # noqa: E731
    with History(str(tmp / "history.sqlite")) as h:
        for day in range(NIGHTS):
            doc = _night(day)
            _, actions = recorder.decide(h, doc, [_finding(r) for r in doc["results"]], {}, would, False, lambda _l: None)
            recorder.record(h, None, doc, None, actions, {}, lambda _l: None)
            if day >= NIGHTS - 2:
                write_prometheus(doc, textfile, recorder.metrics(h, {}))
                scraped(doc)
    return doc


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _api(port: int, path: str, **params: Any) -> Any:
    body = json.loads(_get("http://127.0.0.1:%d/api/v1/%s?%s" % (port, path, urllib.parse.urlencode(params))))
    assert body["status"] == "success", (path, params, body)
    return body["data"]["result"]


def _query(port: int, expr: str) -> List[Dict[str, Any]]:
    return _api(port, "query", query=expr)


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
    procs.clear()


def _die_with_this_process() -> None:
    """In the daemon's child: SIGKILL when pytest dies, even by SIGKILL (no teardown runs then)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _start(argv: List[str], log: Path, procs: List[subprocess.Popen]) -> None:
    with open(log, "wb") as fh:
        procs.append(subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_this_process))


class PortTaken(Exception):
    """A daemon could not bind the port chosen for it: another process took it first."""


def _until(ready: Callable[[], bool], procs: List[subprocess.Popen], logs: List[Path], what: str) -> None:
    """Poll `ready` until it holds, a daemon exits (PortTaken when it could not bind) or DEADLINE_S passes."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs):
            if proc.poll() is not None:
                text = log.read_text(errors="replace")[-2000:]
                if "address already in use" in text:
                    raise PortTaken(text)
                raise AssertionError("%s exited %s: %s" % (proc.args[0], proc.returncode, text))
        try:
            if ready():
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError("%s not within %.0f s: %s" % (what, DEADLINE_S, logs[-1].read_text(errors="replace")[-2000:]))


def _launch(tmp: Path, textdir: Path, procs: List[subprocess.Popen], logs: List[Path]) -> int:
    """Start the node exporter (textfile collector only) and Prometheus scraping it every second, each on a
    free loopback port; returns Prometheus's port once both answer."""
    for attempt in range(PORT_TRIES):
        exporter, port = _free_port(), _free_port()
        (tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: preflight\n    static_configs:\n      - targets: ['127.0.0.1:%d']\n" % exporter)
        _start([NODE_EXPORTER, "--web.listen-address=127.0.0.1:%d" % exporter, "--collector.disable-defaults",
                "--collector.textfile", "--collector.textfile.directory=%s" % textdir], logs[0], procs)
        _start([PROMETHEUS, "--config.file=%s" % (tmp / "prometheus.yml"), "--storage.tsdb.path=%s" % (tmp / "tsdb"),
                "--web.listen-address=127.0.0.1:%d" % port, "--web.console.templates=%s" % tmp,
                "--web.console.libraries=%s" % tmp], logs[1], procs)
        try:
            _until(lambda: bool(_get("http://127.0.0.1:%d/metrics" % exporter)) and bool(_get("http://127.0.0.1:%d/-/ready" % port)),
                   procs, logs, "node exporter and Prometheus answering")
            return port
        except PortTaken:
            _stop(procs)
            if attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """(Prometheus port, the last run's report): the node exporter serving the textfile, Prometheus
    scraping it, both killed at the end however the module went."""
    from preflight.output.history import parse_timestamp

    tmp = tmp_path_factory.mktemp("dashboard")
    textdir = tmp / "textfile"
    textdir.mkdir()
    procs: List[subprocess.Popen] = []
    logs = [tmp / "node_exporter.log", tmp / "prometheus.log"]
    try:
        port = _launch(tmp, textdir, procs, logs)

        def scraped(doc: Dict[str, Any]) -> None:
            started = parse_timestamp(doc["started_at"]).timestamp()
            _until(lambda: any(float(s["value"][1]) == started for s in _query(port, "preflight_last_run_timestamp_seconds")),
                   procs, logs, "Prometheus holding the run of %s" % doc["started_at"])

        yield port, _record_nights(tmp, textdir / "preflight.prom", scraped)
    finally:
        _stop(procs)


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


@needs_daemons
def test_bandwidth_per_node_over_time_shows_where_it_was_lost(prom):
    """Two runs scraped one after the other: the lemon's node keeps one series that falls from the healthy
    figure to its own, the other nodes' stay flat (Grafana's range query of the same panel)."""
    port, _doc = prom
    expr = dict(((t, r), e) for t, r, e in dashboard.queries(dashboard.load()))[("Bus bandwidth per node over time", "A")]
    now = time.time()
    series = _api(port, "query_range", query=expr, start=now - 600, end=now, step=1)
    by_node = {s["metric"]["node"]: [float(v) for _t, v in s["values"]] for s in series}
    assert sorted(by_node) == sorted(NODES)
    lemon = by_node[LEMON]
    assert lemon[0] == HEALTHY_GBPS and lemon[-1] == NODE_GBPS[LEMON] and sorted(set(lemon)) == [NODE_GBPS[LEMON], HEALTHY_GBPS]
    assert all(set(v) == {NODE_GBPS[n]} for n, v in by_node.items() if n != LEMON)


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

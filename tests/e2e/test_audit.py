"""A scheduled audit end to end: two runs with --history/--junit/--prometheus, a node dies in between,
`preflight diff` names it; the files parse with standard parsers."""

from __future__ import annotations

import glob
import sys

from junitparser import JUnitXml
from prometheus_client.parser import text_string_to_metric_families
from tests.paths import REPO



def test_diff_names_the_node_that_went_down(sim_cluster, tmp_path):
    cluster = sim_cluster(3)
    inv = cluster.inventory()
    history = tmp_path / "history"
    junit, prom = tmp_path / "last.xml", tmp_path / "preflight.prom"

    def audit():
        return cluster.ctl(
            [sys.executable, "-m", "preflight", "check", inv, "--skip", "allreduce", "--no-progress",
             "--history", str(history), "--junit", str(junit), "--prometheus", str(prom)],
            cwd=REPO, timeout=240,
        )

    first = audit()
    assert first.returncode == 0, first.stdout + first.stderr
    cluster.stop_sshd(2)
    second = audit()
    assert second.returncode == 1

    # oldest first as preflight orders them: two runs within one second are <stamp>-<hash>.json and
    # <stamp>-<hash>-1.json, which a plain sort of the names puts the wrong way round
    from preflight.output.history import list_runs

    runs = [str(run.path) for run in list_runs(history)]
    assert len(runs) == 2 and len(glob.glob(str(history / "*.json"))) == 2
    diff = cluster.ctl([sys.executable, "-m", "preflight", "diff", *runs], cwd=REPO, timeout=60)
    assert diff.returncode == 1, diff.stdout  # a regression
    assert "n002" in diff.stdout and "went down" in diff.stdout.lower(), diff.stdout
    assert "n001" not in diff.stdout and "n003" not in diff.stdout

    suites = list(JUnitXml.fromfile(str(junit)))
    cases = {(case.classname, case.name): case for suite in suites for case in suite}
    assert ("preflight.ssh", "n001") in cases
    assert cases[("preflight.ssh", "n002")].result and cases[("preflight.ssh", "n002")].result[0]._tag == "failure"

    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    ssh = {s.labels["node"]: s.value for s in families["preflight_check_status"].samples if s.labels["check"] == "ssh"}
    assert ssh == {"n001": 0, "n002": 3, "n003": 0}  # 0 pass, 3 fail
    assert cluster.leftover_processes() == {}

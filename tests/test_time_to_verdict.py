"""benchmarks/time_to_verdict.py's judgement of two trees' runs: verdicts compared over the checks both
report, each differing run named by its tree; the same raised deadlines for both trees from 32 nodes."""

from __future__ import annotations

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "time_to_verdict.py")
_spec = importlib.util.spec_from_file_location("time_to_verdict", _PATH)
ttv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ttv)

BOTH = [["allreduce", "-", "pass"], ["nic", "n001", "pass"], ["nic", "n002", "pass"]]
NEW = [["nvbandwidth", "n001", "skip"], ["nvbandwidth", "n002", "skip"]]


def test_a_check_only_one_tree_has_is_listed_not_a_disagreement():
    results = {"before": [{"verdicts": BOTH}], "after": [{"verdicts": sorted(BOTH + NEW)}]}
    assert ttv.disagreements(results) == []
    assert ttv.only_in_one(results) == {"before": [], "after": ["nvbandwidth"]}


def test_a_difference_names_each_run_by_its_tree_before_first():
    failed = [v if v[1] != "n002" else ["nic", "n002", "fail"] for v in BOTH]
    results = {"after": [{"verdicts": failed + NEW}], "before": [{"verdicts": BOTH}]}
    (line,) = ttv.disagreements(results)
    assert line.index("before#1 [('nic', 'n002', 'pass')]") < line.index("after#1 [('nic', 'n002', 'fail')]"), line
    assert "nvbandwidth" not in line


def test_both_trees_get_the_same_raised_deadlines_from_32_nodes():
    assert ttv.deadlines_for(16, "auto") == {}
    assert ttv.deadlines_for(64, "auto") == {"init_timeout": 320.0, "total_timeout": 620.0}
    assert ttv.deadlines_for(4, "90") == {"init_timeout": 90.0, "total_timeout": 390.0}


def test_cpu_kinds_come_from_the_command_lines_the_simulator_runs():
    assert ttv.kind_of('python3 -u - {"warm": true, "backend": "gloo", "go_fd": 5}') == "ranks"
    assert ttv.kind_of("/usr/bin/python3 -m preflight check /tmp/hosts.yaml --no-progress --json r.json") == "controller"
    assert ttv.kind_of("bash -c echo preflight-pid $$; exec python3 -S -c import sys") == "probes"
    assert ttv.kind_of("sshd: root@notty") == "sshd"
    assert ttv.kind_of("slurmstepd: [12.0]") == "slurm"
    assert ttv.kind_of("/usr/sbin/munged") == "other"


def test_a_run_under_which_the_page_cache_went_away_is_marked_and_a_quiet_one_is_not(tmp_path):
    # /proc/vmstat's layout (name, a space, the value), counters from this machine's
    stat = tmp_path / "vmstat"
    stat.write_text("nr_free_pages 5776845\nworkingset_refault_file 1000\npgmajfault 1797\ndrop_pagecache 0\n")
    before = ttv.vmstat(str(stat))
    assert before == {"workingset_refault_file": 1000, "pgmajfault": 1797, "drop_pagecache": 0}
    quiet = dict(before, workingset_refault_file=1000 + ttv.REFAULT_NOTE_PAGES - 1, pgmajfault=1900)
    assert ttv.page_cache_note(before, quiet) is None  # some faults, under 100 MiB read back: an ordinary run
    dropped = dict(before, drop_pagecache=1)
    assert "drop_pagecache +1" in ttv.page_cache_note(before, dropped)
    reread = dict(before, workingset_refault_file=1000 + 160843)
    assert "workingset_refault_file +160843" in ttv.page_cache_note(before, reread)


def test_no_vmstat_is_no_note_not_an_error(tmp_path):
    assert ttv.vmstat(str(tmp_path / "absent")) == {}
    assert ttv.page_cache_note({}, {}) is None
    assert ttv.page_cache_note({"drop_pagecache": 0}, {}) is None  # a counter read once is no delta

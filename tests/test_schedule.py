"""The test modules' hand-out order (tests/schedule.py): the measured slowest first, then the other simulated-cluster
modules by how many of their tests build a cluster, then the rest; a module's tests stay together and in order."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests import schedule
from tests.paths import REPO


def _item(nodeid, *fixtures):
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))


def test_slowest_first_then_simulated_clusters_by_count_then_the_rest_in_order():
    first, second = schedule.RUN_FIRST[1], schedule.RUN_FIRST[0]
    items = [
        _item("tests/unit/test_a.py::test_1"),
        _item("tests/e2e/test_one_sim.py::test_1", "sim_cluster"),
        _item("tests/unit/test_b.py::test_1"),
        _item(first + "::test_1", "sim_cluster"),
        _item("tests/e2e/test_two_sims.py::test_1", "slurm_healed", "slurm_cluster"),
        _item("tests/e2e/test_two_sims.py::test_2[x]", "module_cluster"),
        _item("tests/unit/test_a.py::test_2"),
        _item(second + "::test_1"),
        _item(first + "::test_2"),
        _item("tests/e2e/test_one_sim.py::test_2"),
    ]
    got = [item.nodeid for item in schedule.ordered(items)]
    assert got == [
        second + "::test_1",
        first + "::test_1", first + "::test_2",
        "tests/e2e/test_two_sims.py::test_1", "tests/e2e/test_two_sims.py::test_2[x]",
        "tests/e2e/test_one_sim.py::test_1", "tests/e2e/test_one_sim.py::test_2",
        "tests/unit/test_a.py::test_1", "tests/unit/test_a.py::test_2",
        "tests/unit/test_b.py::test_1",
    ]


def test_no_simulated_cluster_anywhere_keeps_pytests_order():
    """The twin: a run of unit modules only (no RUN_FIRST module, no cluster fixture) is handed out as collected."""
    items = [_item("tests/b/test_z.py::t1"), _item("tests/a/test_y.py::t1"), _item("tests/b/test_z.py::t2")]
    assert [i.nodeid for i in schedule.ordered(items)] == ["tests/b/test_z.py::t1", "tests/b/test_z.py::t2",
                                                            "tests/a/test_y.py::t1"]


@pytest.mark.parametrize("module", schedule.RUN_FIRST)
def test_every_module_named_to_run_first_exists(module):
    """A renamed or split module would silently fall back to rule 2: rename it in RUN_FIRST too."""
    assert os.path.isfile(os.path.join(REPO, module)), "tests/schedule.py RUN_FIRST names a missing module: " + module

"""The flap-proof drain on a real Slurm (tests/sim/slurm.py): a config-class fault is held the first
night, --shadow decides the drain and drains nothing, the next real run drains it; the database says
each decision. The twin (the same fault drains at once without --history) is
tests/actions/test_slurm_ops.py::test_data_link_down_drains_for_the_nic_not_for_mtu."""

from __future__ import annotations


import pytest

from preflight.history.db import History

N = 4
ALL = "n[001-%03d]" % N


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(N)


pytestmark = pytest.mark.usefixtures("slurm_healed")  # the test leaves the shared cluster as it found it


def _run(cluster, db, *extra):
    argv = ["check", "--slurm", "--nodelist", ALL, "--skip", "allreduce", "--drain", "--max-drain-fraction", "0.5",
            "--history", db] + list(extra)
    done = cluster.slurm.preflight(argv, timeout=240)
    done.said = " ".join(done.stdout.split())  # the console wraps lines at its width
    return done


def test_a_config_fault_is_held_once_shadowed_then_drained(cluster, tmp_path):
    db = str(tmp_path / "audit.sqlite")
    cluster.data_link_down("n003")
    first = _run(cluster, db)
    assert first.returncode == 1, first.stderr[-2000:]
    assert "not drained yet: n003: nic seen in 1 of the 2 runs needed within 7 d (not a decided hardware fault)" \
        in first.said, first.stdout[-3000:]
    assert cluster.slurm.reasons() == {}

    shadow = _run(cluster, db, "--shadow")
    assert "shadow: would have drained n003; drained nothing" in shadow.said, shadow.stdout[-3000:]
    assert cluster.slurm.reasons() == {}

    last = _run(cluster, db)
    reasons = cluster.slurm.reasons()
    assert list(reasons) == ["n003"] and reasons["n003"].startswith("preflight: nic: "), (reasons, last.stdout[-3000:])
    with History(db) as h:
        decided = h.conn.execute("SELECT a.run_id, n.name, a.kind, a.shadow FROM actions a JOIN nodes n ON n.id = a.node_id"
                                 " ORDER BY a.run_id, a.kind").fetchall()
    assert decided == [(1, "n003", "hold", 0), (2, "n003", "drain", 1), (3, "n003", "drain", 0)]

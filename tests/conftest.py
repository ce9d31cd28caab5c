"""Shared fixtures. `sim_cluster` builds simulated clusters (network namespaces + real sshd per node)."""

from __future__ import annotations

import pytest

from tests.sim.netns import netns_available

_stale_checked = False


@pytest.fixture
def sim_cluster():
    """Factory: sim_cluster(n, **opts) -> a started SimCluster, torn down after the test even on failure.

    Skips the test when network namespaces cannot be used here (not root, no iproute2 netns).
    """
    global _stale_checked
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)
    from tests.sim.cluster import SimCluster, cleanup_stale

    if not _stale_checked:
        _stale_checked = True
        cleanup_stale()
    clusters = []

    def factory(n: int = 3, **opts) -> SimCluster:
        cluster = SimCluster(n, **opts)
        clusters.append(cluster)
        return cluster.start()

    try:
        yield factory
    finally:
        errors = []
        for cluster in reversed(clusters):
            try:
                cluster.stop()
            except Exception as exc:  # keep tearing the others down
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture(scope="module")
def slurm_cluster():
    """Factory: slurm_cluster(n, **opts) -> a started SimCluster whose nodes also run slurmd (tests/sim/slurm.py).

    Module-scoped (a Slurm start costs seconds): tests heal their faults. Skips where network
    namespaces or the Slurm/munge packages are missing; torn down after the module even on failure.
    """
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)
    from tests.sim import slurm
    from tests.sim.cluster import SimCluster, cleanup_stale

    missing = slurm.available()
    if missing:
        pytest.skip(missing)
    cleanup_stale()
    clusters = []

    def factory(n: int = 3, **opts) -> SimCluster:
        cluster = SimCluster(n, slurm=True, **opts)
        clusters.append(cluster)
        return cluster.start()

    try:
        yield factory
    finally:
        for cluster in reversed(clusters):
            cluster.stop()

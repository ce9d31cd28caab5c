"""Shared fixtures, defined once for every test module: `sim_cluster` (per test), `module_cluster` and
`slurm_cluster` (per module) build simulated clusters (network namespaces + real sshd per node, slurmd beside
it for the last), `slurm_healed` puts a module's shared Slurm cluster back after each test, `reaper` kills
what a test started indirectly. pytest_collection_modifyitems hands the modules to pytest-xdist slowest first
(tests/schedule.py)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.sim.netns import netns_available

_stale_checked = False


@pytest.fixture
def reaper():
    """Pids a test started indirectly: SIGKILLed after the test whatever it found, so none outlives it."""
    started = []
    yield started
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # already gone (reaped by the code under test): nothing left to kill
            continue


#: workers for `-n auto` at the least (pyproject's addopts; --maxprocesses=4 still caps it): the suite mostly
#: waits on simulated nodes, so on CI's 2 cores a third worker shortens it. Measured on a clean clone on a
#: 2-core machine: 2 workers 916 s, 3 workers 736 s, the same 2,043 tests passing and the same CPU (13 min user).
MIN_WORKERS = 3


def pytest_xdist_auto_num_workers(config):
    """-n auto: one worker a core (as pytest-xdist counts them), but never fewer than MIN_WORKERS."""
    return max(MIN_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def pytest_collection_modifyitems(items):
    """The slowest modules first (tests/schedule.py), so pytest-xdist's loadfile workers finish together."""
    from tests.schedule import ordered

    items[:] = ordered(items)


@contextlib.contextmanager
def _started_clusters(**fixed):
    """A factory(n, **opts) of started SimClusters (with the `fixed` options); every cluster it made is
    stopped on the way out, also when the test or another cluster's stop failed (the first error is raised)."""
    from tests.sim.cluster import SimCluster

    clusters = []

    def factory(n: int = 3, **opts) -> SimCluster:
        cluster = SimCluster(n, **fixed, **opts)
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


def _need_netns() -> None:
    """Skip the test where network namespaces cannot be used here (not root, no iproute2 netns)."""
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)


@pytest.fixture
def sim_cluster():
    """Factory: sim_cluster(n, **opts) -> a started SimCluster, torn down after the test even on failure.

    Skips the test when network namespaces cannot be used here (not root, no iproute2 netns).
    """
    global _stale_checked
    _need_netns()
    from tests.sim.cluster import cleanup_stale

    if not _stale_checked:
        _stale_checked = True
        cleanup_stale()
    with _started_clusters() as factory:
        yield factory


@pytest.fixture(scope="module")
def module_cluster():
    """Factory: module_cluster(n, **opts) -> a started SimCluster shared by a module's tests (one start for the
    module, as a Kubernetes double over it: tests heal their faults), torn down after the module even on failure."""
    _need_netns()
    from tests.sim.cluster import cleanup_stale

    cleanup_stale()
    with _started_clusters() as factory:
        yield factory


@pytest.fixture(scope="module")
def slurm_cluster():
    """Factory: slurm_cluster(n, **opts) -> a started SimCluster whose nodes also run slurmd (tests/sim/slurm.py).

    Module-scoped (a Slurm start costs seconds): tests heal their faults (`slurm_healed`). Skips where network
    namespaces or the Slurm/munge packages are missing; torn down after the module even on failure.
    """
    _need_netns()
    from tests.sim import slurm
    from tests.sim.cluster import cleanup_stale

    missing = slurm.available()
    if missing:
        pytest.skip(missing)
    cleanup_stale()
    with _started_clusters(slurm=True) as factory:
        yield factory


@pytest.fixture
def slurm_healed(cluster):
    """The module's Slurm `cluster`, put back after each test as the test found it: faults healed, jobs and
    reservations gone, drained or down nodes resumed, every node idle (SimSlurm.settle). A module that shares
    one Slurm cluster across tests marks them `pytestmark = pytest.mark.usefixtures("slurm_healed")`."""
    yield cluster
    cluster.heal()
    cluster.slurm.settle(90)

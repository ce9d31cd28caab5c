"""The order in which pytest-xdist hands test modules to its workers: the slowest first, so that none starts last
and runs alone while the other workers idle.

pyproject.toml's addopts run `--dist loadfile --no-loadscope-reorder`: a module is one unit of work (its tests
share module-scoped simulated clusters), handed out in collection order as workers free up. pytest-xdist's own
reordering (modules with the most tests first) handed out last the simulated-cluster modules with a few tests of
a minute or more each (the all-reduce scenarios, the env file through Slurm), so the suite ended with one of them
running alone. tests/conftest.py's pytest_collection_modifyitems applies `ordered` instead:

1. RUN_FIRST: the modules measured slowest (docs/development.md, Tests: how to measure them), in that order;
2. then every other module whose tests build a simulated cluster (the fixtures in SIM_FIXTURES), those with
   the most such tests first;
3. then the rest (unit tests, seconds each), in pytest's order, to fill the workers' gaps at the end.

Tests keep their order inside a module. A module missing from RUN_FIRST is still scheduled by rule 2.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

#: fixtures that start a simulated cluster (tests/conftest.py), directly or under another fixture
SIM_FIXTURES = frozenset({"sim_cluster", "module_cluster", "slurm_cluster"})

#: the slowest modules, slowest first (per-module wall of `--durations=0 --junitxml` runs: docs/development.md);
#: the two Kubernetes modules apart, as their preflight runs take turns (tests/sim/kubeapi.controller_turn)
RUN_FIRST = (
    "tests/actions/test_slurm_ops.py",
    "tests/transport/test_k8s_e2e.py",
    "tests/e2e/test_allreduce_hangs.py",
    "tests/e2e/test_allreduce_slow.py",
    "tests/e2e/test_allreduce_confirm.py",
    "tests/actions/test_slurm_preempt.py",
    "tests/transport/test_slurm_allreduce.py",
    "tests/e2e/test_allreduce_concurrent.py",
    "tests/actions/test_k8s_safety.py",
    "tests/transport/test_slurm_e2e.py",
    "tests/e2e/test_catalogue.py",
    "tests/transport/test_slurm_bundle.py",
    "tests/actions/test_slurm_requeue.py",
    "tests/transport/test_bundle_srun.py",
    "tests/e2e/test_allreduce.py",
    "tests/e2e/test_envfile.py",
    "tests/e2e/test_envfile_slurm.py",
)


def module_of(nodeid: str) -> str:
    """The module part of a test id: its path, before the first "::"."""
    return nodeid.split("::", 1)[0]


def ordered(items: Sequence) -> List:
    """The items regrouped module by module in the order above; each module's items in their own order."""
    groups: Dict[str, List] = {}
    for item in items:
        groups.setdefault(module_of(item.nodeid), []).append(item)

    def key(entry: Tuple[int, str]) -> Tuple[int, int, int]:
        position, module = entry
        if module in RUN_FIRST:
            return (0, RUN_FIRST.index(module), position)
        sim = sum(1 for item in groups[module] if SIM_FIXTURES & set(getattr(item, "fixturenames", ())))
        return (1, -sim, position) if sim else (2, 0, position)

    order = sorted(enumerate(groups), key=key)
    return [item for _position, module in order for item in groups[module]]

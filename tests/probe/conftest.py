"""Fixtures of the probe tests."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

import preflight.probe

#: the rank's script, as the agent runs it (a file, not a package module)
WORKER = os.path.join(os.path.dirname(preflight.probe.__file__), "bench_worker.py")


@pytest.fixture(scope="module")
def worker():
    """The worker module, loaded from its file; the sys.path entry its import drops is put back."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("preflight_bench_worker_under_test", WORKER)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module

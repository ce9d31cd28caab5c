"""A rank imports torch without numpy (bench_worker._without_numpy): `import torch` would load numpy where it is
installed, and numpy's OpenBLAS would start a thread per CPU in every rank, for a bridge no rank uses.

The real worker file and the real torch, in a fresh interpreter: a numpy package placed first on the path
records its import in a file; the rank's import must never reach it, and must print no warning about it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest

from tests.probe.conftest import WORKER


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the rank needs torch")
def test_a_ranks_torch_import_never_loads_numpy_and_says_nothing_about_it(tmp_path):
    marker = tmp_path / "numpy-was-imported"
    fake = tmp_path / "site" / "numpy"
    fake.mkdir(parents=True)
    # Without the rank's guard, torch imports this package at `import torch` (checked by hand: with the guard
    # disabled this test fails on the marker).
    (fake / "__init__.py").write_text("open(%r, 'w').close()\nraise ModuleNotFoundError('the test numpy')\n" % str(marker))
    script = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('w', %r)\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        "w._take_stdout()\n"  # as a rank: events on the real stdout, anything else printed to stderr
        "torch, dist, device = w._import_torch('gloo', 0)\n"
        "print('RESULT', torch.ones(2).sum().item(), dist.is_available(), 'numpy' in sys.modules and sys.modules['numpy'] is not None)\n"
    ) % WORKER
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), PYTHONWARNINGS="default")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events] == ["imported"], proc.stdout
    assert "RESULT 2.0 True False" in proc.stderr, proc.stderr[-2000:]
    assert not marker.exists(), "the rank's torch import loaded numpy"
    assert "NumPy" not in proc.stderr and "numpy" not in proc.stderr, proc.stderr[-2000:]


def test_a_numpy_already_loaded_is_left_alone(monkeypatch, worker):
    loaded = types.ModuleType("numpy")
    monkeypatch.setitem(sys.modules, "numpy", loaded)
    worker._without_numpy()
    assert sys.modules["numpy"] is loaded


def test_a_numpy_not_loaded_is_blocked(monkeypatch, worker):
    monkeypatch.setitem(sys.modules, "numpy", None)  # undone last: this process's numpy back as it was
    monkeypatch.delitem(sys.modules, "numpy")
    worker._without_numpy()
    assert "numpy" in sys.modules and sys.modules["numpy"] is None
    with pytest.raises(ImportError):
        importlib.import_module("numpy")

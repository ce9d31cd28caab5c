"""A rank imports torch with the cyclic garbage collector off and freezes what it loaded (bench_worker._import_torch):
the collector's passes over torch's ~240,000 new objects during the import free almost nothing.

The real worker file and the real torch, in a fresh interpreter: a finder first on sys.meta_path records, for
every torch module looked up, whether the collector was on; it finds nothing itself, so the real import goes on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.probe.conftest import WORKER

SPY = (
    "import gc, importlib.util, sys\n"
    "seen = []\n"
    "class Spy:\n"
    "    @staticmethod\n"
    "    def find_spec(name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'torch':\n"
    "            seen.append(gc.isenabled())\n"
    "        return None\n"
    "sys.meta_path.insert(0, Spy)\n"
    "spec = importlib.util.spec_from_file_location('w', %r)\n"
    "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
    "w._take_stdout()\n"
)


def run(script, env=None):
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the rank needs torch")
def test_a_ranks_torch_import_runs_without_the_collector_and_leaves_it_on_with_torch_frozen():
    script = SPY % WORKER + (
        "torch, dist, device = w._import_torch('gloo', 0)\n"
        "import json\n"
        "print('FACTS', json.dumps({'lookups': len(seen), 'on_during': sum(seen), 'on_after': gc.isenabled(),\n"
        "      'frozen': gc.get_freeze_count(), 'sum': torch.ones(2).sum().item(), 'collected': gc.collect()}), file=sys.stderr)\n"
    )
    proc = run(script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    facts = json.loads(proc.stderr.split("FACTS ", 1)[1].splitlines()[0])
    assert facts["lookups"] > 100, facts  # torch's own modules were looked up through the spy
    assert facts["on_during"] == 0, facts  # none with the collector on
    assert facts["on_after"] is True, facts
    assert facts["frozen"] > 100000, facts  # torch's objects are out of later collections' way
    assert facts["sum"] == 2.0 and facts["collected"] >= 0, facts


def test_a_failed_import_leaves_the_collector_as_it_found_it(tmp_path):
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the test torch: libtorch_cpu.so: cannot open shared object file')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    for before in ("on", "off"):
        script = SPY % WORKER + (
            "gc.disable()\n" if before == "off" else ""
        ) + (
            "try:\n"
            "    w._import_torch('gloo', 0)\n"
            "except ImportError as exc:\n"
            "    print('RAISED', exc, file=sys.stderr)\n"
            "print('ON AFTER', gc.isenabled(), 'ON DURING', sum(seen), 'OF', len(seen), file=sys.stderr)\n"
        )
        proc = run(script, env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "RAISED the test torch: libtorch_cpu.so" in proc.stderr, proc.stderr[-2000:]
        expected = "ON AFTER %s ON DURING 0 OF 1" % (before == "on")
        assert expected in proc.stderr, (before, proc.stderr[-2000:])

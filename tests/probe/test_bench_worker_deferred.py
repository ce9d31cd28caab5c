"""A gloo rank's `import torch` defers torch's Python meta kernels (bench_worker.DEFERRED_TORCH_MODULES):
torch/__init__.py ends by importing torch._meta_registrations, which registers shape functions for the meta device,
fake tensors and torch.compile, and imports torch._prims, torch._refs and torch._decomp to build them; the
all-reduce uses none of it. The compute tier does (torch._prims.rng_prims makes `torch.Generator()` possible in
torch 2.13) and loads the real modules first (_load_deferred; tests/checks/test_gpu_compute.py runs it end to end).

The real worker file and the real torch, in fresh interpreters: the rank's collectives on a one-rank gloo group
(all-reduce, broadcast, a sub-group) and a matmul run with the stand-in in place; the first name asked of it
imports the real module; _load_deferred makes a seeded Generator possible; PREFLIGHT_RANK_FULL_TORCH_IMPORT=1
imports torch whole; a GPU (nccl) rank defers nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import types

import pytest

from tests.probe.conftest import WORKER

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the rank needs torch")

LOADED = "{m: m in sys.modules for m in ('torch._prims', 'torch._refs', 'torch._decomp')}"

SCRIPT = (
    "import importlib.util, json, os, sys\n"
    "spec = importlib.util.spec_from_file_location('w', %r)\n"
    "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
    "w._take_stdout()\n"
    "torch, dist, device = w._import_torch('gloo', 0)\n"
    "facts = {'after_import': " + LOADED + ",\n"
    "         'deferred': type(sys.modules['torch._meta_registrations']).__name__,\n"
    "         'bound': torch._meta_registrations is sys.modules['torch._meta_registrations']}\n"
    "store = dist.TCPStore('127.0.0.1', %d, 1, True)\n"
    "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
    "t = torch.full((1024,), 3.0)\n"
    "dist.all_reduce(t); dist.broadcast(t, 0)\n"
    "sub = dist.new_group([0]); dist.all_reduce(t, group=sub)\n"
    "facts['sum'] = t.sum().item()\n"
    "facts['matmul'] = (torch.ones(64, 64) @ torch.ones(64, 64))[0, 0].item()\n"
    "dist.destroy_process_group()\n"
    "facts['after_collectives'] = " + LOADED + "\n"
    "facts['has_dunder_path'] = hasattr(sys.modules['torch._meta_registrations'], '__path__')\n"
    "facts['after_dunder'] = type(sys.modules['torch._meta_registrations']).__name__\n"
    "facts['asked'] = callable(torch._meta_registrations.activate_meta)\n"
    "facts['after_asking'] = type(sys.modules['torch._meta_registrations']).__name__\n"
    "facts['after_asking_loaded'] = " + LOADED + "\n"
    "facts['rebound'] = torch._meta_registrations is sys.modules['torch._meta_registrations']\n"
    "w._load_deferred()\n"
    "facts['generator'] = torch.randn(2, generator=torch.Generator().manual_seed(7)).tolist() == "
    "torch.randn(2, generator=torch.Generator().manual_seed(7)).tolist()\n"
    "print('FACTS', json.dumps(facts), file=sys.stderr)\n"
    "os._exit(0)\n"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def facts_of(env):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT % (WORKER, free_port())], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events] == ["imported"], proc.stdout
    return json.loads(proc.stderr.split("FACTS ", 1)[1].splitlines()[0])


@needs_torch
def test_a_rank_runs_its_collectives_without_torchs_meta_kernels_and_gets_them_when_asked():
    env = {k: v for k, v in os.environ.items() if k != "PREFLIGHT_RANK_FULL_TORCH_IMPORT"}
    facts = facts_of(env)
    none = {"torch._prims": False, "torch._refs": False, "torch._decomp": False}
    assert facts["after_import"] == none, facts
    assert facts["deferred"] == "_Deferred" and facts["bound"], facts
    assert facts["sum"] == 3.0 * 1024 and facts["matmul"] == 64.0, facts
    assert facts["after_collectives"] == none, facts  # nothing a rank does needed them
    # the import machinery's probes load nothing
    assert facts["has_dunder_path"] is False and facts["after_dunder"] == "_Deferred", facts
    assert facts["asked"] is True and facts["after_asking"] == "module", facts  # the first name asked: the real one
    assert facts["after_asking_loaded"] == {"torch._prims": True, "torch._refs": True, "torch._decomp": True}, facts
    assert facts["rebound"] is True, facts
    assert facts["generator"] is True, facts  # the compute tier's seeded generator works once torch is whole


@needs_torch
def test_the_full_import_switch_imports_torch_whole():
    facts = facts_of(dict(os.environ, PREFLIGHT_RANK_FULL_TORCH_IMPORT="1"))
    assert facts["after_import"] == {"torch._prims": True, "torch._refs": True, "torch._decomp": True}, facts
    assert facts["deferred"] == "module" and facts["bound"], facts
    assert facts["sum"] == 3.0 * 1024 and facts["matmul"] == 64.0, facts


def test_nothing_is_deferred_where_torch_is_already_loaded(monkeypatch, worker):
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.delitem(sys.modules, "torch._meta_registrations", raising=False)
    worker._defer_unused_torch_modules("gloo")
    assert "torch._meta_registrations" not in sys.modules


def test_a_gpu_rank_defers_nothing_and_a_cpu_rank_does(monkeypatch, worker):
    monkeypatch.delenv("PREFLIGHT_RANK_FULL_TORCH_IMPORT", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # undone last: this process's torch back as it was
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setitem(sys.modules, "torch._meta_registrations", None)
    monkeypatch.delitem(sys.modules, "torch._meta_registrations")
    worker._defer_unused_torch_modules("nccl")
    assert "torch._meta_registrations" not in sys.modules
    worker._defer_unused_torch_modules("gloo")
    assert isinstance(sys.modules["torch._meta_registrations"], worker._Deferred)


def test_a_stand_in_loads_the_real_module_on_the_first_name_asked(monkeypatch, tmp_path, worker):
    pkg = tmp_path / "deferpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stand_in = worker._Deferred("deferpkg.heavy")
    monkeypatch.setitem(sys.modules, "deferpkg.heavy", stand_in)
    assert importlib.import_module("deferpkg.heavy") is stand_in  # an import finds the stand-in, loads nothing
    assert sys.modules["deferpkg.heavy"] is stand_in
    with pytest.raises(AttributeError):
        stand_in.__path__  # noqa: B018 - the import machinery's probe: no import
    assert stand_in.LOADED is True  # the first name: the real module
    real = sys.modules["deferpkg.heavy"]
    assert real is not stand_in and not isinstance(real, worker._Deferred)
    assert stand_in.LOADED is True and real.LOADED is True  # a kept reference to the stand-in still answers
    monkeypatch.delitem(sys.modules, "deferpkg")
    monkeypatch.delitem(sys.modules, "deferpkg.heavy")

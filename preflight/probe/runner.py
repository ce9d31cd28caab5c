"""Node-side entry point: run the requested probes concurrently and return one JSON document of facts.

Standard library only, Python 3.8 compatible. Called by the bundle's bootstrap as main(config, bundle).

config = {"mode": "probe", "checks": {name: probe_config, ...}, "probe_timeout_s": 30, "capture": bool,
          "warm": {"backend", "local_world_size", "python", "reserves"}}   (optional: the all-reduce's ranks
                                     start now, and "reserves" more sets for the launches after it: bench_warm)
       | {"mode": "bench", "bench": {...}}   (see preflight.probe.bench_agent)

A bench config may say "tasks": k (k ranks on the node). A transport that launches k tasks on the node,
one per rank (srun), adds "split": true; each task then runs its own rank (SLURM_LOCALID picks which,
bench_agent.task_share), and merge() joins the node's k result documents into one.
"""

from __future__ import annotations

import importlib
import os
import threading
import time

from preflight.probe.context import RecordingContext, Shared

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional


def _run_probe(name: str, ctx: RecordingContext) -> Dict[str, Any]:
    try:
        probe = importlib.import_module("preflight.checks.%s.probe" % name).probe
    except ModuleNotFoundError:
        return {"probe_error": "check %s has no node probe" % name}
    facts = probe(ctx)
    if not isinstance(facts, dict):
        return {"probe_error": "probe returned %s, not a mapping" % type(facts).__name__}
    return facts


class _ProbeThread(threading.Thread):
    """One probe in a daemon thread of its own: its facts, or the exception it raised."""

    def __init__(self, name: str, ctx: RecordingContext) -> None:
        threading.Thread.__init__(self, name="probe-" + name, daemon=True)
        self.check, self.ctx = name, ctx
        self.facts: Optional[Dict[str, Any]] = None
        self.exc: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.facts = _run_probe(self.check, self.ctx)
        except BaseException as exc:  # SystemExit too: reported by run_probes with its last frame
            self.exc = exc


def _failed(exc: BaseException, ctx: RecordingContext) -> Dict[str, Any]:
    """A probe bug or an unexpected node state: reported, never hidden."""
    import traceback  # only on this path: a healthy run need not load it

    tb = traceback.extract_tb(exc.__traceback__)
    where = "%s:%d" % (tb[-1].filename, tb[-1].lineno) if tb else "?"
    return {"probe_error": "%s: %s (at %s)" % (type(exc).__name__, exc, where), "message": str(exc), "raw": ctx.raw()}


def run_probes(checks: Dict[str, Dict[str, Any]], timeout_s: float, records: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """{check name: facts}; a probe that raised or overran its time maps to {"probe_error": ...} with the
    raw outputs it had been given ("raw": the last commands and reads, capped). records, when given,
    receives every probe's full recording (for --capture).

    One plain daemon thread per probe, not concurrent.futures: its import (and the logging it pulls in)
    cost every node about a tenth of a Python start per run, for a pool that never reused a thread."""
    facts: Dict[str, Any] = {}
    shared = Shared()  # one kernel log read for xid and ib_errors (NodeContext.run_once)
    deadline = time.monotonic() + timeout_s  # a probe running a long command (dcgm) ends it before this
    contexts = {name: RecordingContext(cfg or {}, shared=shared, deadline=deadline) for name, cfg in checks.items()}
    threads = [_ProbeThread(name, ctx) for name, ctx in contexts.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    pending = [t for t in threads if t.is_alive()]
    running = {t.check: contexts[t.check].running for t in pending}
    shared.stop()  # the commands of probes that overran: their whole process groups, and none started after
    for t in threads:
        if t in pending:
            continue
        facts[t.check] = t.facts if t.exc is None else _failed(t.exc, contexts[t.check])
    for t in pending:
        name = t.check
        killed = " (killed with its children: %s)" % " ".join(running[name])[:200] if running[name] else ""
        facts[name] = {"probe_error": "did not finish within %g s%s" % (timeout_s, killed),
                       "raw": contexts[name].raw()}
    if records is not None:
        records.update({name: ctx.record() for name, ctx in contexts.items()})
    return facts


def main(config: Dict[str, Any], bundle: bytes) -> Dict[str, Any]:
    mode = config.get("mode", "probe")
    started = time.time()
    if mode == "probe":
        records: Optional[Dict[str, Any]] = {} if config.get("capture") else None
        warm = _warm(config.get("warm"), bundle)  # before the probes: the ranks import torch while they run
        facts = run_probes(config.get("checks", {}), float(config.get("probe_timeout_s", 30)), records)
        # bytecode: this module ran from the controller's compiled code (same Python version), not its source
        out = {"facts": facts, "elapsed_s": time.time() - started, "bytecode": bool(globals().get("__cached__"))}
        if records is not None:
            out["capture"] = records
        if warm is not None:
            out["warm"] = warm
        return out
    if mode == "bench":
        from preflight.probe import bench_agent

        bench = config["bench"]
        if config.get("split"):
            bench = bench_agent.task_share(bench, int(os.environ.get("SLURM_LOCALID", "0")))
        return {"bench": bench_agent.run(bench, bundle), "elapsed_s": time.time() - started}
    return {"error": "unknown mode %r" % mode}


def _warm(spec: Optional[Dict[str, Any]], bundle: bytes) -> Optional[Dict[str, Any]]:
    """Start the all-reduce's ranks ahead of it (preflight.probe.bench_warm), in this, the main, thread."""
    if not spec:
        return None
    from preflight.probe import bench_agent

    return bench_agent.warm(spec, bundle)


def merge(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One node's result from the results of its tasks (a split bench run: one task per rank)."""
    if len(results) == 1:
        return results[0]
    from preflight.probe import bench_agent

    benches = [r.get("bench") for r in results]
    if not all(isinstance(b, dict) for b in benches):
        return next(r for r in results if not isinstance(r.get("bench"), dict))
    return {"bench": bench_agent.merge(benches), "elapsed_s": max(float(r.get("elapsed_s") or 0) for r in results)}

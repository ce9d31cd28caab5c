"""Node side of the all-reduce test: start this node's ranks, watch them against deadlines, report.

The controller sends the probe bundle to every participating node and calls `run(config)` on each, all
nodes at once (or runs `python -m preflight.probe.bench_agent < config.json`, which prints the result
document as one JSON line). The agent always returns a result document: it never raises for a rank that
fails or hangs, and it leaves no rank process behind on any exit path.

Standard library only, Python 3.8 compatible. The agent never imports torch: the rank processes do,
with the interpreter named by `python`.

Config (built by the controller)::

    {
      "backend": "gloo" | "nccl",
      "master_addr": "198.19.0.2",     # where global rank 0 (on node_rank 0) hosts the TCPStore
      "master_port": 29500,
      "world_size": 8,                 # ranks across all nodes
      "node_rank": 0,
      "nnodes": 4,
      "local_world_size": 2,           # ranks on this node: one per GPU; 1 on a CPU node (gloo)
      "rank_offset": 0,                # global rank of local rank 0; default node_rank * local_world_size
      "local_rank_offset": 0,          # LOCAL_RANK of this agent's first rank (task_share: one rank a task)
      "env": {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "=eth1"},   # set in the ranks
      "sizes": [1024, 2048, ...],      # bytes per all-reduce, in sweep order (rounded down to float32)
      "warmup": 2, "iters": 5,         # iters: each size's cap
      "iters_min": 3,                  # optional: a size stops once stable, after at least this many
      "latency_growth": 1.5,           # optional (the whole-cluster sweep): ... or once latency-bound
      "deadlines": {"init_s": 30, "op_s": 20, "total_s": 120, "kill_grace_s": 3, "fail_grace_s": 5},
      "python": "/path/to/python",     # interpreter for the ranks; default sys.executable
      "size_budget_s": 15,             # optional; default op_s * SIZE_BUDGET_FRACTION (see bench_worker)
      "start_at": 1700000000.0,        # optional: wall-clock time the ranks start timing (bench_worker)
      "pairs": {"rotations": [[[0, 4], [1, 5], ...], ...], "iters": 20},
                                       # optional: after the sweep, the same ranks time these disjoint
                                       # sub-groups at the sweep's last size (bench_worker._pair_phase)
      "node": {"kind": "loopback" | "local", "nodes": [[0], [1], ...], "warn": 0.1, "iters": 5},
                                       # optional: before those pairs, every node alone, then suspects
                                       # beside known-good nodes unless "confirm": false (bench_worker._node_phase)
      "run_id": "9f2c...",             # optional: this launch's id; a rank whose store answers with
                                       # another id is at another preflight run's store (bench_worker)
      "compute": {"seconds": 2, "gemm_n": 8192, "copy_bytes": 1073741824, "sdc_n": 512, "sdc_steps": 8},
                                       # optional (--tier standard): GEMM, copy and SDC digest after the
                                       # sweep, in the same ranks (bench_worker._compute_phase)
      "next_warm": {"backend": "gloo", "local_world_size": 1, "python": "...", "after": "store"},
                                       # optional: start the next round's ranks during this one, for the
                                       # next bench in this process to adopt (bench_spares)
    }

Two runs at once: the agent that hosts the store (node_rank 0, first task) claims the rendezvous port
for preflight first (preflight.probe.portclaim). When another run (this user's or root's) holds the
claim, no rank starts and the document says who holds it ("busy"); the ranks of other nodes, if
started, find the other run's store by its run id and stop, never joining it.

Deadlines, layered (all measured on this node's monotonic clock):

    init_s    from a rank's start to its init_done: torch import, store connection, process group
              creation and one 1-element all-reduce
    op_s      after init, the longest a rank may go without progress: one size's warm-up, timed
              iterations and verification, or the final teardown (and, after "done", its exit)
    total_s   the whole run, from the call to run(); keep it under the controller's outer deadline
    fail_grace_s  once a local rank has failed, how long the others get to report their own error
                  (gloo peers notice a dead rank at once; NCCL ones hang) before they are stopped
    kill_grace_s  SIGTERM to SIGKILL: a rank blocked in a collective may ignore SIGTERM

When a deadline passes, every rank still running is stopped and reported as "timeout" at the stage it
was in; the deadline that fired is named in the document.

Result document::

    {
      "node_rank": 0, "hostname": "n001", "backend": "gloo", "world_size": 8,
      "sizes": [1024, ...],             # the sweep, as run (rounded down to whole float32 elements)
      "elapsed_s": 12.3,
      "at": {"start": t, "end": t},     # wall-clock time (the node's clock) the agent began and returned
      "deadline": null | {"kind": "init"|"op"|"total", "limit_s": 30},
      "error": null | "invalid config: ...",
      "busy": {"port": 29500, "pid": 4242, "uid": 0},   # only when another preflight run holds the port
                                                          # (its claim believed: this user's or root's)
      "rendezvous": {"addr": "198.19.0.2", "port": 29500, "arrived": [0, 1, ...]},   # node_rank 0 only
      "ranks": [
        {"rank": 0, "local_rank": 0, "pid": 1234,
         "status": "ok" | "timeout" | "error" | "aborted",
         "stage": null | "init" | "size" | "finish",   # where a rank that did not finish stopped
         "step": null | "import" | "store" | "group",  # within init: importing torch, connecting
                                                       # to the store, creating the process group
         "bytes": null | 2048,                          # the size in progress when stage is "size"
         "error": null | "RuntimeError: ...",
         "exit": null | 0 | -9,                          # exit status (-N: killed by signal N)
         "stderr_tail": "...",                           # last lines of the rank's stderr
         "import_s": 4.1, "init_s": 5.3,                 # seconds from the rank's start to "imported" and
                                                         # to "init_done" (null if it never got there)
         "store_s": 4.3,                                 # ... and to its store connection
         "sizes": [{"bytes": 1024, "time_s": 1.2e-05, "ok": true, "min_s": ..., "max_s": ...}],
         "cut": null | {"bytes": N, "took_s": .., "projected_s": .., "budget_s": ..},  # sweep ended early
         "nccl_log": null | "...",   # nccl: the rank's NCCL_DEBUG=INFO lines (first NCCL_LOG_MAX bytes)
         "pairs": null | [{"rotation": 0, "ranks": [0, 4], "bytes": N, "time_s": .., "min_s": .., "ok": true}],
         "pairs_error": null | "...",  # the pair phase failed or hung; the sweep's results (status) stand
         "pairs_s": null | 1.9,        # seconds from the pair phase's start to its end
         "nodes": null | [{"pass": 0, "node": 0, "ranks": 2, "bytes": N, "time_s": .., "min_s": .., "ok": true}],
         "node_error": null | "...",   # the partner-free tests of the same phase (bench_worker._node_phase)
         "sweep_s": null | 0.9,        # seconds from init_done to the pair phase's start (the sweep)
         "node_s": null | 0.4,         # seconds of that phase spent in the partner-free tests
         "compute": null | {"device", "versions", "gemm", "copy", "sdc", "nvml"},  # bench_worker._compute_phase
         "compute_error": null | "...",  # the compute phase failed; the sweep's results stand
         "warm": false,      # true: started during the node checks (bench_warm) and adopted; import_s is
                             # then the rank's own import and init_s counts from its go
         "at": {"imported": t, "store": t, "init_done": t, "pairs_start": t, "node_done": t, "pairs_done": t,
                "done": t, "exit": t}}
                             # the rank's wall-clock time (time.time(), the node's clock) of each step
                             # it reached: the run's timeline (stage._timeline)
      ]
    }

"aborted" marks a rank the agent stopped because another local rank failed first.

Why plain subprocesses and not torchrun: the agent owns every deadline and needs to know, per rank,
where it stopped; torchrun's elastic agent adds its own rendezvous, restarts and timeouts on top, hides
a hung rank behind its own (long) timeouts, and starts workers in ways that make a clean, complete
kill harder. Here each rank is a direct child in the agent's own process group (never setsid: the
controller's group kill must reach it), and each asks the kernel to kill it should the agent die.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from preflight.probe import bench_spares, portclaim

WORKER_MODULE = "preflight.probe.bench_worker"
WORKER_PATH = "preflight/probe/bench_worker.py"  # inside the probe bundle's zip
COMPUTE_MODULE = "preflight.probe.bench_compute"
COMPUTE_PATH = "preflight/probe/bench_compute.py"

#: The rank's steps whose wall-clock time its document keeps ("at"), and "exit" (seen by the agent).
TIMELINE = ("imported", "store", "init_done", "pairs_start", "node_done", "pairs_done", "done")

DEFAULT_DEADLINES = {"init_s": 60.0, "op_s": 30.0, "total_s": 300.0, "kill_grace_s": 3.0, "fail_grace_s": 5.0}
STDERR_TAIL = 4000
#: A size may take at most this share of the op deadline (warm-up, timed iterations and check included):
#: the ranks end the sweep before a size projected to take longer (the "cut" event).
SIZE_BUDGET_FRACTION = 0.5
#: NCCL_DEBUG=INFO output kept per rank (bytes, whole lines, from the start): enough for init and the
#: connections of an 8-GPU node, bounded so 8 ranks cannot blow up the result document.
NCCL_LOG_MAX = 48 * 1024
#: With nccl the ranks always run under these (over the config's env): the lines
#: preflight.checks.allreduce.nccllog.parse_nccl_log reads are in the INIT, NET and ENV subsystems.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}
_NCCL_DEBUG_LINE = re.compile(rb"(?: NCCL INFO |^NCCL version )")

EventHook = Callable[[Dict[str, Any], Dict[str, Any]], None]


class _Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        BaseException.__init__(self, signum)
        self.signum = signum


class _Rank:
    """One rank process and what it has said so far."""

    def __init__(self, rank: int, local_rank: int) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.proc = None  # type: Optional[Any]
        self.started = 0.0
        self.last_progress = 0.0
        self.out = b""
        self.err = b""
        self.err_line = b""  # an unfinished stderr line
        self.nccl_log = []  # type: List[str]
        self.nccl_bytes = 0
        self.open_fds = 0
        self.step = "import"
        self.init_done = False
        self.done = False
        self.sizes = []  # type: List[Dict[str, Any]]
        self.status = None  # type: Optional[str]
        self.stage = None  # type: Optional[str]
        self.bytes = None  # type: Optional[int]
        self.error = None  # type: Optional[str]
        self.exit = None  # type: Optional[int]
        self.arrived = None  # type: Optional[List[int]]
        self.import_s = None  # type: Optional[float]
        self.init_s = None  # type: Optional[float]
        self.store_s = None  # type: Optional[float]  # to the store connection (a round's init waits to start)
        self.cut = None  # type: Optional[Dict[str, Any]]
        self.pairs = []  # type: List[Dict[str, Any]]
        self.pairs_state = None  # type: Optional[str]  # "running" after pairs_start, "done" after pairs_done
        self.pairs_error = None  # type: Optional[str]
        self.pairs_t0 = None  # type: Optional[float]
        self.pairs_s = None  # type: Optional[float]
        self.nodes = []  # type: List[Dict[str, Any]]
        self.node_error = None  # type: Optional[str]
        self.init_at = None  # type: Optional[float]
        self.sweep_s = None  # type: Optional[float]
        self.node_s = None  # type: Optional[float]
        self.compute = None  # type: Optional[Dict[str, Any]]
        self.compute_error = None  # type: Optional[str]
        self.warm = False  # started ahead of the bench and handed its go (bench_warm)
        self.go_fd = None  # type: Optional[int]  # a warm rank's go pipe, kept open while it runs
        self.at = {}  # type: Dict[str, float]  # wall-clock time of each step (TIMELINE), for the run's timeline

    @property
    def settled(self) -> bool:
        return self.status is not None

    def where(self, sizes: List[int]) -> None:
        """Record the stage this rank is in now: init, the size after the last one reported, or finish."""
        if not self.init_done:
            self.stage, self.bytes = "init", None
        elif len(self.sizes) < len(sizes):
            self.stage, self.bytes = "size", sizes[len(self.sizes)]
        else:
            self.stage, self.bytes = "finish", None

    def add_stderr(self, chunk: bytes, final: bool = False) -> None:
        """Split stderr into NCCL's debug lines (kept from the start, up to NCCL_LOG_MAX bytes: init and
        network selection come first) and everything else (the tail is kept: the error comes last)."""
        data = self.err_line + chunk
        lines = data.split(b"\n")
        self.err_line = b"" if final else lines.pop()
        other = []
        for line in lines:
            if _NCCL_DEBUG_LINE.search(line):
                if self.nccl_bytes + len(line) + 1 <= NCCL_LOG_MAX:
                    self.nccl_log.append(line.decode("utf-8", "replace"))
                    self.nccl_bytes += len(line) + 1
            elif line or other:
                other.append(line)
        if other:
            self.err = (self.err + b"\n".join(other) + b"\n")[-4 * STDERR_TAIL:]

    def stderr_tail(self) -> str:
        return self.err[-STDERR_TAIL:].decode("utf-8", "replace")

    def last_stderr_line(self) -> str:
        for line in reversed(self.stderr_tail().splitlines()):
            if line.strip():
                return line.strip()[:300]
        return ""

    def to_json(self) -> Dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.proc.pid if self.proc is not None else None,
            "status": self.status,
            "stage": None if self.status == "ok" else self.stage,
            "step": self.step if (self.status != "ok" and self.stage == "init") else None,
            "bytes": None if self.status == "ok" else self.bytes,
            "error": self.error,
            "exit": self.exit,
            "stderr_tail": self.stderr_tail() if self.status != "ok" else "",
            "import_s": self.import_s,
            "init_s": self.init_s,
            "store_s": self.store_s,
            "sizes": self.sizes,
            "cut": self.cut,
            "nccl_log": "\n".join(self.nccl_log) if self.nccl_log else None,
            "pairs": self.pairs if self.pairs_state else None,
            "pairs_error": self.pairs_error,
            "pairs_s": self.pairs_s,
            "nodes": self.nodes if self.pairs_state else None,
            "node_error": self.node_error,
            "sweep_s": self.sweep_s,
            "node_s": self.node_s,
            "compute": self.compute,
            "compute_error": self.compute_error,
            "warm": self.warm,
            "at": self.at,
        }

    def settle_in_pairs(self, why: str) -> bool:
        """A rank stopped in the pair phase (after its sweep): the sweep's results stand, the pair phase
        failed. True when that applied."""
        if self.pairs_state != "running":
            return False
        self.status = "ok"
        self.pairs_error = self.pairs_error or why
        return True


def _normalise(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config with defaults filled in; ValueError names what is wrong."""
    cfg = dict(config)
    for key in ("backend", "master_addr", "master_port", "world_size", "node_rank", "sizes"):
        if key not in cfg:
            raise ValueError("missing %r" % key)
    if cfg["backend"] not in ("gloo", "nccl"):
        raise ValueError("backend must be gloo or nccl, not %r" % (cfg["backend"],))
    cfg["world_size"] = int(cfg["world_size"])
    cfg["node_rank"] = int(cfg["node_rank"])
    cfg["master_port"] = int(cfg["master_port"])
    cfg["local_world_size"] = int(cfg.get("local_world_size", 1))
    offset = cfg.get("rank_offset")
    cfg["rank_offset"] = int(cfg["node_rank"] * cfg["local_world_size"] if offset is None else offset)
    cfg["local_rank_offset"] = int(cfg.get("local_rank_offset", 0))
    if cfg["local_world_size"] < 1 or cfg["local_rank_offset"] < 0:
        raise ValueError("local_world_size must be >= 1 and local_rank_offset >= 0")
    if cfg["rank_offset"] < 0 or cfg["rank_offset"] + cfg["local_world_size"] > cfg["world_size"]:
        raise ValueError(
            "ranks %d..%d do not fit world_size %d"
            % (cfg["rank_offset"], cfg["rank_offset"] + cfg["local_world_size"] - 1, cfg["world_size"])
        )
    sizes = [int(s) for s in cfg["sizes"]]
    if not sizes or min(sizes) < 4:
        raise ValueError("sizes must be a non-empty list of byte counts >= 4")
    cfg["sizes"] = [s - s % 4 for s in sizes]
    cfg["warmup"] = max(0, int(cfg.get("warmup", 2)))
    cfg["iters"] = max(1, int(cfg.get("iters", 5)))
    cfg["iters_min"] = min(cfg["iters"], max(1, int(cfg.get("iters_min") or cfg["iters"])))
    deadlines = dict(DEFAULT_DEADLINES)
    deadlines.update({k: float(v) for k, v in (cfg.get("deadlines") or {}).items()})
    cfg["deadlines"] = deadlines
    budget = cfg.get("size_budget_s")
    cfg["size_budget_s"] = float(deadlines["op_s"] * SIZE_BUDGET_FRACTION if budget is None else budget)
    cfg["env"] = {str(k): str(v) for k, v in (cfg.get("env") or {}).items()}
    cfg["python"] = cfg.get("python") or default_python()
    return cfg


def warm(spec: Dict[str, Any], bundle: Optional[bytes] = None) -> Dict[str, Any]:
    """Start this node's ranks ahead of the bench (preflight.probe.bench_warm): {"started": n} or {"error"}."""
    from preflight.probe import bench_warm

    try:
        source = worker_source(bundle)
    except (OSError, ImportError, KeyError, ValueError) as exc:
        return {"error": "cannot load the bench worker: %s" % exc}
    return bench_warm.start(spec, source, default_python(), NCCL_DEBUG_ENV)


def default_python() -> str:
    """The ranks' interpreter when the config names none: this one."""
    return sys.executable


def task_share(config: Dict[str, Any], local_id: int) -> Dict[str, Any]:
    """The config for one of a node's local_world_size tasks (srun launches one task per rank): the
    rank local_id of this node's ranks, alone under its own agent. merge() joins the tasks' documents."""
    local = int(config.get("local_world_size", 1))
    if not 0 <= local_id < local:
        raise ValueError("task %d of a node with %d ranks" % (local_id, local))
    offset = config.get("rank_offset")
    first = int(config.get("node_rank", 0)) * local if offset is None else int(offset)
    return dict(config, local_world_size=1, rank_offset=first + local_id, local_rank_offset=local_id)


def merge(docs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One node's result document from its tasks' documents (task_share): every rank, in rank order; the
    first deadline and error (which task said it is kept); the rendezvous from the task of rank 0."""
    docs = sorted(docs, key=lambda d: min([r.get("rank", 0) for r in d.get("ranks") or []] or [0]))
    out = dict(docs[0])
    out["ranks"] = sorted((r for d in docs for r in d.get("ranks") or []), key=lambda r: r.get("rank", 0))
    out["elapsed_s"] = max(float(d.get("elapsed_s") or 0) for d in docs)
    for key in ("deadline", "error", "rendezvous"):
        out[key] = next((d[key] for d in docs if d.get(key)), None)
    if out["rendezvous"] is None:
        del out["rendezvous"]
    return out


def worker_source(bundle: Optional[bytes] = None) -> str:
    """The ranks' program: bench_worker's source, preceded by bench_compute's as the string literal
    COMPUTE_SOURCE (bench_worker._compute_module compiles it); from the probe bundle's zip when given,
    else from the importer.

    The bundle is imported from memory on the node (nothing is written to disk), so the ranks get the
    program on stdin (`python -u - CONFIG`), not a file path.
    """
    compute, worker = (_source(bundle, module, path) for module, path in (
        (COMPUTE_MODULE, COMPUTE_PATH), (WORKER_MODULE, WORKER_PATH)))
    return "COMPUTE_SOURCE = %r\n%s" % (compute, worker)


def _source(bundle: Optional[bytes], module: str, path: str) -> str:
    if bundle:
        import io
        import zipfile

        with zipfile.ZipFile(io.BytesIO(bundle)) as zf:
            return zf.read(path).decode("utf-8")
    import importlib.util

    spec = importlib.util.find_spec(module)
    source = spec.loader.get_source(module) if spec is not None and spec.loader is not None else None
    if not source:
        raise ImportError("cannot read the source of %s" % module)
    return source


def run(
    config: Dict[str, Any], bundle: Optional[bytes] = None, on_event: Optional[EventHook] = None
) -> Dict[str, Any]:
    """Run this node's ranks of the all-reduce sweep and return the result document (never raises).

    bundle: the probe bundle's zip bytes (the node-side runner passes them), where the worker's source
    is read from; without it the worker is found through the import system.
    on_event(rank_info, event), when given, is called in the agent's thread for every protocol line a
    rank prints (rank_info: {"rank", "local_rank", "pid"}): a node-side runner may stream progress.
    """
    t0 = time.monotonic()
    doc = {
        "at": {"start": round(time.time(), 3)},
        "node_rank": config.get("node_rank"),
        "hostname": socket.gethostname(),
        "backend": config.get("backend"),
        "world_size": config.get("world_size"),
        "sizes": config.get("sizes"),
        "deadline": None,
        "error": None,
        "ranks": [],
    }  # type: Dict[str, Any]
    try:
        cfg = _normalise(config)
    except (ValueError, TypeError, AttributeError) as exc:
        doc["error"] = "invalid config: %s" % exc
        doc["elapsed_s"] = round(time.monotonic() - t0, 3)
        return doc

    try:
        cfg["worker_source"] = worker_source(bundle)
    except (OSError, ImportError, KeyError, ValueError) as exc:
        doc["error"] = "cannot load the bench worker: %s" % exc
        doc["elapsed_s"] = round(time.monotonic() - t0, 3)
        return doc
    doc["sizes"] = cfg["sizes"]
    spares = bench_spares.Spares(cfg, default_python(), NCCL_DEBUG_ENV)  # the next bench's ranks
    claim = None
    if cfg["node_rank"] == 0 and cfg["local_rank_offset"] == 0:  # this node hosts the store
        claim = portclaim.claim(cfg["master_port"])  # a squatter of another uid is not believed: the store binds
        if claim.busy is not None:
            doc["busy"] = dict(claim.busy, port=cfg["master_port"])
            doc["error"] = "%s holds the rendezvous port %d on this node" % (
                portclaim.describe(doc["busy"]), cfg["master_port"])
            doc["elapsed_s"] = round(time.monotonic() - t0, 3)
            return doc
    try:
        return _run_claimed(cfg, doc, t0, on_event, spares)
    finally:
        if claim is not None:
            claim.close()
        spares.settle()  # warm ranks not adopted are stopped, but the spares started for the next bench


def _run_claimed(cfg: Dict[str, Any], doc: Dict[str, Any], t0: float, on_event: Optional[EventHook],
                 spares: Any = None) -> Dict[str, Any]:
    """run(), once the port is claimed (or not this agent's to claim)."""
    ranks = [_Rank(cfg["rank_offset"] + i, cfg["local_rank_offset"] + i) for i in range(cfg["local_world_size"])]
    restore = _trap_signals()
    try:
        _supervise(cfg, ranks, doc, t0, on_event, spares)
    except Exception as exc:  # a bug here must still yield a document, ranks stopped
        doc["error"] = "agent error: %s: %s" % (type(exc).__name__, exc)
    except _Interrupted as exc:
        _stop(ranks, cfg["deadlines"]["kill_grace_s"])
        restore()
        restore = _nothing
        # The caller asked us to stop: do it the way the signal would have, children already gone.
        raise SystemExit(128 + exc.signum) from None
    finally:
        _stop(ranks, cfg["deadlines"]["kill_grace_s"])
        restore()
    if spares is not None:
        spares.at_end(ranks)  # if no rank got that far (a fault: the rounds follow), the spares start now

    for r in ranks:  # only after an agent error: never leave a rank without a verdict
        if not r.settled:
            r.where(cfg["sizes"])
            r.status, r.error = "error", "stopped by the agent: %s" % doc["error"]
    doc["ranks"] = [r.to_json() for r in ranks]
    if cfg["node_rank"] == 0 and ranks and ranks[0].rank == 0:
        doc["rendezvous"] = {"addr": cfg["master_addr"], "port": cfg["master_port"], "arrived": ranks[0].arrived}
    doc["elapsed_s"] = round(time.monotonic() - t0, 3)
    doc["at"]["end"] = round(time.time(), 3)
    return doc


def _nothing() -> None:
    pass


def _trap_signals() -> Callable[[], None]:
    """Turn SIGTERM/SIGHUP/SIGINT into an exception (main thread only) so the ranks are always killed."""
    if threading.current_thread() is not threading.main_thread():
        return _nothing
    previous = {}

    def handler(signum, _frame):
        raise _Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def rank_env(cfg: Dict[str, Any], rank: _Rank) -> Dict[str, str]:
    """A rank's whole environment: this process's, the config's env, and the rank's identity."""
    env = dict(os.environ)
    env.update(cfg["env"])
    if cfg["backend"] == "nccl":
        env.update(NCCL_DEBUG_ENV)  # what NCCL chose is part of the verdict (checks.allreduce)
        env.pop("NCCL_DEBUG_FILE", None)  # the lines must come to us
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        {
            "RANK": str(rank.rank),
            "WORLD_SIZE": str(cfg["world_size"]),
            "LOCAL_RANK": str(rank.local_rank),
            "LOCAL_WORLD_SIZE": str(cfg["local_world_size"]),
            "GROUP_RANK": str(cfg["node_rank"]),
            "MASTER_ADDR": str(cfg["master_addr"]),
            "MASTER_PORT": str(cfg["master_port"]),
            "PYTHONUNBUFFERED": "1",
            "PREFLIGHT_AGENT_PID": str(os.getpid()),
        }
    )
    return env


def _spawn(cfg: Dict[str, Any], rank: _Rank, sel: selectors.BaseSelector) -> None:
    """Start (or adopt, warm) the rank's process and watch its output."""
    worker_cfg = {
        "backend": cfg["backend"],
        "sizes": cfg["sizes"],
        "warmup": cfg["warmup"],
        "iters": cfg["iters"],
        "iters_min": cfg["iters_min"],  # the sweep's stop rule (bench_worker._stop_rule)
        "stable_tol": cfg.get("stable_tol"),
        "latency_growth": cfg.get("latency_growth"),  # a latency-bound size stops at iters_min (bench_worker)
        # torch's own timeout is only a backstop behind the agent's deadlines.
        "timeout_s": cfg["deadlines"]["total_s"] + 30,
        # stop the sweep before a size that would run into the op deadline (see bench_worker)
        "size_budget_s": cfg["size_budget_s"],
        "start_at": cfg.get("start_at"),
        "pairs": cfg.get("pairs"),
        "node": cfg.get("node"),
        "run_id": cfg.get("run_id"),
        "compute": cfg.get("compute"),
    }
    rank.started = rank.last_progress = time.monotonic()
    if not bench_spares.adopt(cfg, rank, worker_cfg, rank_env(cfg, rank)):
        _start_cold(cfg, rank, worker_cfg)
    if rank.proc is None:
        return
    for stream, name in ((rank.proc.stdout, "out"), (rank.proc.stderr, "err")):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ, (rank, name))
        rank.open_fds += 1


def _start_cold(cfg: Dict[str, Any], rank: _Rank, worker_cfg: Dict[str, Any]) -> None:
    """Start the rank's process now: the worker's source on stdin, its config as the argument."""
    import subprocess

    try:
        # The program comes on stdin (`python -`): `ps` shows the rank and its config, not 9 KB of source.
        rank.proc = subprocess.Popen(
            [cfg["python"], "-u", "-", json.dumps(worker_cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=rank_env(cfg, rank),
            close_fds=True,
        )
    except OSError as exc:
        rank.status, rank.stage, rank.error = "error", "init", "cannot start %s: %s" % (cfg["python"], exc)
        return
    try:
        rank.proc.stdin.write(cfg["worker_source"].encode("utf-8"))
    except OSError:
        pass  # it died at once; its exit status and stderr tell why
    finally:
        try:
            rank.proc.stdin.close()
        except OSError:
            pass


def _supervise(cfg, ranks, doc, t0, on_event, spares=None) -> None:
    dl = cfg["deadlines"]
    sizes = cfg["sizes"]
    sel = selectors.DefaultSelector()
    try:
        for r in ranks:
            _spawn(cfg, r, sel)
        failed_at = None  # type: Optional[float]
        while True:
            _reap(ranks, sizes)
            if spares is not None:
                spares.poll(ranks)
            live = [r for r in ranks if not r.settled]
            if not live:
                return
            if failed_at is None and any(r.status in ("error",) for r in ranks):
                failed_at = time.monotonic()
            now = time.monotonic()
            # The earliest deadline any live rank is under.
            fire = [("total", t0 + dl["total_s"], dl["total_s"])]
            for r in live:
                if r.done:  # results are in; give the interpreter op_s to shut down before stopping it
                    fire.append(("finish", r.last_progress + dl["op_s"], dl["op_s"]))
                elif not r.init_done:
                    fire.append(("init", r.started + dl["init_s"], dl["init_s"]))
                else:
                    fire.append(("op", r.last_progress + dl["op_s"], dl["op_s"]))
            if failed_at is not None:
                fire.append(("failed", failed_at + dl["fail_grace_s"], dl["fail_grace_s"]))
            kind, when, limit = min(fire, key=lambda f: f[1])
            if now >= when:
                _expire(ranks, sizes, kind, limit, doc, dl["kill_grace_s"])
                return
            wait = min(when - now, 0.5)
            if sel.get_map():
                for key, _mask in sel.select(timeout=wait):
                    _read(key, sel, sizes, on_event)
            else:
                time.sleep(min(wait, 0.05))
    finally:
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
        sel.close()


def _read(key, sel, sizes, on_event) -> None:
    rank, name = key.data
    try:
        chunk = os.read(key.fileobj.fileno(), 65536)
    except BlockingIOError:
        return
    except OSError:
        chunk = b""
    if not chunk:
        sel.unregister(key.fileobj)
        rank.open_fds -= 1
        if name == "err":
            rank.add_stderr(b"", final=True)
        return
    if name == "err":
        rank.add_stderr(chunk)
        return
    rank.out += chunk
    while b"\n" in rank.out:
        line, rank.out = rank.out.split(b"\n", 1)
        try:
            event = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue  # not a protocol line
        if isinstance(event, dict):
            _on_event(rank, event, sizes)
            if on_event is not None:
                on_event({"rank": rank.rank, "local_rank": rank.local_rank, "pid": rank.proc.pid}, event)


def _on_event(rank: _Rank, event: Dict[str, Any], sizes: List[int]) -> None:
    kind = event.get("event")
    now = time.monotonic()
    if kind in TIMELINE and isinstance(event.get("t"), (int, float)):
        rank.at.setdefault(kind, round(float(event["t"]), 3))
    if kind == "imported":
        rank.step = "store"
        # a warm rank imported before its go: its own figure (the import and CUDA init in the rank)
        rank.import_s = event.get("import_s") if rank.warm else round(now - rank.started, 3)
    elif kind == "store":
        rank.step = "group"
        rank.store_s = round(now - rank.started, 3)
    elif kind == "arrived":
        rank.arrived = list(event.get("ranks") or [])
    elif kind == "init_done":
        rank.init_done, rank.step, rank.last_progress = True, None, now
        rank.init_s = round(now - rank.started, 3)
        rank.init_at = now
    elif kind == "size":
        entry = {k: v for k, v in event.items() if k not in ("event", "t")}
        rank.sizes.append(entry)
        rank.last_progress = now
    elif kind == "cut":
        rank.cut = {k: v for k, v in event.items() if k not in ("event", "t")}
        rank.last_progress = now
    elif kind == "pairs_start":
        rank.pairs_state, rank.last_progress, rank.pairs_t0 = "running", now, now
        rank.sweep_s = round(now - rank.init_at, 3) if rank.init_at is not None else None
    elif kind == "pair":
        rank.pairs.append({k: v for k, v in event.items() if k not in ("event", "t")})
        rank.last_progress = now
    elif kind in ("pairs_ready", "node_ready"):  # a rotation's (or the node phase's) sub-groups are made
        rank.last_progress = now
    elif kind == "node":
        rank.nodes.append({k: v for k, v in event.items() if k not in ("event", "t")})
        rank.last_progress = now
    elif kind in ("node_done", "node_error"):
        if kind == "node_error":
            rank.node_error = str(event.get("error") or "unknown error")
        rank.node_s = round(now - rank.pairs_t0, 3) if rank.pairs_t0 is not None else None
        rank.last_progress = now
    elif kind in ("pairs_done", "pairs_error"):
        rank.pairs_state, rank.last_progress = "done", now
        rank.pairs_s = round(now - rank.pairs_t0, 3) if rank.pairs_t0 is not None else None
        if kind == "pairs_error":
            rank.pairs_error = str(event.get("error") or "unknown error")
    elif kind in ("compute", "compute_step", "compute_error"):  # the compute tier (bench_worker._compute_phase)
        if kind == "compute":
            rank.compute = {k: v for k, v in event.items() if k not in ("event", "t")}
        elif kind == "compute_error":
            rank.compute_error = str(event.get("error") or "unknown error")
        rank.last_progress = now
    elif kind == "done":
        rank.done, rank.last_progress = True, now
    elif kind == "error":
        rank.where(sizes)
        rank.status = "error"
        rank.error = str(event.get("error") or "unknown error")
        if event.get("stage") in ("init", "size", "finish", "compute"):
            rank.stage, rank.bytes = event["stage"], event.get("bytes")


def _reap(ranks: List[_Rank], sizes: List[int]) -> None:
    """Settle the ranks whose process has exited and whose output has been read to the end."""
    for r in ranks:
        if r.proc is None or r.exit is not None:
            continue
        rc = r.proc.poll()
        if rc is None or r.open_fds > 0:
            continue
        r.exit = rc
        r.at["exit"] = round(time.time(), 3)
        if r.settled:
            continue
        if r.done:
            r.status = "ok"
            continue
        how = "killed by signal %d" % -rc if rc < 0 else "exited with code %d" % rc
        last = r.last_stderr_line()
        if r.settle_in_pairs("rank process %s in the pair phase%s" % (how, (": " + last) if last else "")):
            continue
        r.where(sizes)
        r.status = "error"
        r.error = "rank process %s%s" % (how, (": " + last) if last else "")


def _expire(ranks, sizes, kind, limit, doc, grace) -> None:
    """A deadline passed: stop every rank still running and record where each was."""
    # A rank that reported done has all its results out, whichever deadline fired: they stand (at "finish"
    # every live rank is such a rank; rank 0 may also be waiting for the others to leave its store).
    for r in ranks:
        if not r.settled and r.done:
            r.status = "ok"
    failed = [r.local_rank for r in ranks if r.status == "error"]
    live = [r for r in ranks if not r.settled]
    in_pairs = [r for r in live if r.pairs_state == "running"]
    for r in in_pairs:  # past the sweep: its results stand; the pair phase is what stopped
        r.settle_in_pairs("no progress within the %s deadline (%g s) in the pair phase" % (kind, limit))
    if in_pairs and kind in ("init", "op", "total"):
        doc["pairs_deadline"] = {"kind": kind, "limit_s": limit}
    for r in ranks:
        if r.settled:
            continue
        r.where(sizes)
        if kind == "failed":
            r.status = "aborted"
            r.error = "stopped by the agent after local rank %s failed" % ",".join(str(x) for x in failed)
        else:
            r.status = "timeout"
            r.error = "no progress within the %s deadline (%g s)" % (kind, limit)
    if kind in ("init", "op", "total") and len(in_pairs) < len(live):
        doc["deadline"] = {"kind": kind, "limit_s": limit}
    _stop(ranks, grace)


def _stop(ranks: List[_Rank], grace: float) -> None:
    """SIGTERM every rank process still alive, SIGKILL what is left after grace, reap them all."""
    alive = [r for r in ranks if r.proc is not None and r.proc.poll() is None]
    for r in alive:
        _signal(r, signal.SIGTERM)
    end = time.monotonic() + grace
    while alive and time.monotonic() < end:
        alive = [r for r in alive if r.proc.poll() is None]
        if alive:
            time.sleep(0.05)
    for r in alive:
        _signal(r, signal.SIGKILL)
    for r in ranks:
        if r.proc is None:
            continue
        try:
            r.proc.wait(timeout=max(grace, 1.0))
        except Exception:  # a process in uninterruptible sleep (D state) outlives us; nothing more to do
            pass
        if r.exit is None and r.proc.returncode is not None:
            r.exit = r.proc.returncode
        if r.go_fd is not None:  # a warm rank's lifeline: closed once it is gone (or it ends it)
            os.close(r.go_fd)
            r.go_fd = None
        for stream in (r.proc.stdout, r.proc.stderr):
            if stream is not None:
                _drain_into(r, stream)
                stream.close()


def _drain_into(rank: _Rank, stream) -> None:
    """Keep the last stderr a killed rank wrote (its only clue); stdout after a kill is not trusted."""
    try:
        data = os.read(stream.fileno(), 65536) if not stream.closed else b""
    except OSError:
        return
    if stream is rank.proc.stderr:
        rank.add_stderr(data, final=True)


def _signal(rank: _Rank, sig: int) -> None:
    try:
        rank.proc.send_signal(sig)
    except OSError:
        pass


def main() -> int:
    """Read a config JSON from stdin, run, print the result document as one JSON line."""
    config = json.load(sys.stdin)
    print(json.dumps(run(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

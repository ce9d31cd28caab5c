"""One rank of the timed all-reduce test: rendezvous, sweep the sizes, check the sums, report as JSON lines.

Started by bench_agent (one process per GPU, or one per CPU node) as `python -u - '<json config>'`, this
file's source on stdin after a COMPUTE_SOURCE line (_compute_module; the probe bundle lives in memory on the
node, so there is no file to point at; running it as a file works the same), with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT and the configured NCCL_*/GLOO_* variables in its environment. A rank
started ahead of the bench (preflight.probe.bench_warm: during the node checks) gets the config {"warm":
true, "backend", "go_fd"} instead: it imports torch, then waits on the pipe go_fd for one line, {"cfg": the
config above, "env": the variables its environment lacks}, and goes on as any rank; EOF on that pipe ends it
at once, whatever it is doing (_go_channel).
The JSON config carries what the environment does not: backend, sizes, warmup, iters, iters_min and
stable_tol (optional: the sweep's stop rule, see _stop_rule), start_at (optional: wall-clock time to start
timing, see _wait_for_start), run_id (optional: see RUN_KEY) and the torch-side timeout (a backstop only:
the agent's deadlines fire first and kill this process).

Protocol: one JSON object per line on the *original* stdout (file descriptor 1 is re-pointed at stderr
before torch is imported, so a library that prints cannot corrupt the stream):

    {"event": "imported", "t": ..., "import_s": ..}    torch imported (and on GPUs this rank's CUDA context
                                                       made), import_s seconds after it began
    {"event": "store", "t": ...}                       connected to the rendezvous store, arrival recorded
    {"event": "arrived", "ranks": [0, 1, ...]}         global rank 0 only: ranks that reached the store so far
    {"event": "init_done", "t": ..., "pid": ...}       process group up and a first 1-element all-reduce done
    {"event": "size", "bytes": N, "time_s": median, "ok": true, "min_s": .., "max_s": .., "cpu_s": ..,
     "iters": timed iterations run, "stop": "stable" | "latency" | "cap" | "budget"}   (why it ran that many)
    {"event": "size", "bytes": N, ..., "ok": false, "expected": 3.0, "got": 2.0, "mismatches": 12}
    {"event": "cut", "bytes": N, "took_s": .., "projected_s": .., "budget_s": ..}
                                                       the sweep stops before size N, projected over
                                                       size_budget_s (see Budget; all ranks agree)
    {"event": "pairs_start", "bytes": N, "iters": K}   the fleet rounds begin (config "pairs", _pair_phase)
    {"event": "pair", "rotation": r, "ranks": [..], "bytes": N, "time_s": .., "min_s": .., "ok": true}
    {"event": "pairs_ready", "rotation": r}             a rotation's sub-groups are made (progress)
    {"event": "node_ready"} {"event": "node", "pass": 0|1, "node": i, ...}   the partner-free tests, before
        the pairs (config "node", _node_phase); {"event": "node_done"} or {"event": "node_error", "error": ..}
    {"event": "pairs_done"} | {"event": "pairs_error", "error": "..."}
    {"event": "compute_step", "what": "gemm bf16"}      the compute tier (config "compute", after the pairs):
    {"event": "compute", "gemm": .., "copy": .., "sdc": ..}   progress, then its figures (bench_compute);
    {"event": "compute_error", "error": "..."}                or why it stopped (the sweep's results stand)
    {"event": "done", "t": ...}                        process group destroyed
    {"event": "error", "stage": "init"|"size"|"finish", "bytes": N|null, "error": "Type: message"}

Timing: on GPU each iteration is bracketed by CUDA events on the current stream; on CPU by perf_counter
around a blocking all_reduce, with the process's CPU time over the same span (cpu_s, CPU only: how
much of time_s the rank spent copying and summing rather than waiting). No barrier between iterations:
every rank times its own view, and the controller takes the slowest rank's median as the collective's
time. The buffer is refilled with (rank + 1) before every iteration (outside the timed region) so values
never grow toward overflow.

Iterations: `iters` is the cap; with iters_min below it a size stops as soon as every rank's last
iters_min iterations are within stable_tol of their best ("stable"), with latency_growth in the config (the
whole-cluster sweep) when a size below the last took no longer than latency_growth times the size before it
("latency": latency-bound, its figure would not move with more iterations), or before its time would pass
size_budget_s ("budget"); else at the cap ("cap"). All ranks run the same count (_agree_stop).

Budget: with size_budget_s in the config, after each size the ranks agree (a MAX all-reduce of the
seconds each would spend on it at its best iteration's pace) on how long the next, larger size would
take, scaled by its byte count; when that is over the budget the sweep ends there ("cut") instead of
running into the agent's op deadline: a slow link ends as a slow, complete measurement, not a killed rank.
With the stop rule that agreement rides on the size's stop decision, which carries an upper bound of it
(_agree_stop); a separate MAX all-reduce runs only when that bound alone would cut.

Correctness: the last timed iteration's result (a freshly filled buffer, as every iteration's) is checked:
every element must equal world_size * (world_size + 1) / 2 (exact in float32 for any realistic world size).

Runs with the interpreter named by the inventory (the one that has torch); Python 3.8 compatible.
"""

import os
import sys

# Run from stdin or -c, sys.path[0] is "" (the working directory); run as a file, it is the file's directory.
# Drop it so a stray torch.py or json.py there can never shadow the real one (unless -I/-P already did).
if sys.path and not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
    _here = os.path.dirname(os.path.abspath(globals().get("__file__") or ""))
    if sys.path[0] == "" or os.path.abspath(sys.path[0]) == _here:
        del sys.path[0]

import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

ARRIVED_KEY = "preflight/arrived/%d"
#: rank 0 writes its run's id here as soon as its store is up; every other rank reads it before it
#: records its arrival: a rank that reached another preflight run's store (two runs at once on one head
#: and port) stops there instead of joining that run
RUN_KEY = "preflight/run_id"

#: every rank but 0 adds 1 here when it is done; rank 0, the store's host, ends once all have (_leave)
LEFT_KEY = "preflight/left"
LEAVE_WAIT_S = 10.0
LEAVE_POLL_S = 0.02

#: how often a rank looks for rank 0's store before its own TCPStore client connects (see _wait_for_store)
STORE_POLL_S = 0.05

_events = None
_events_lock = threading.Lock()


def emit(event, **fields):
    """Write one protocol line and flush it."""
    doc = {"event": event, "t": time.time()}
    doc.update(fields)
    line = json.dumps(doc) + "\n"
    with _events_lock:
        _events.write(line)
        _events.flush()


def _take_stdout():
    """Keep the real stdout for protocol lines; send everything else written to fd 1 to stderr."""
    global _events
    fd = os.dup(1)
    os.dup2(2, 1)
    _events = os.fdopen(fd, "w", buffering=1)


def _die_with_parent():
    """Ask the kernel to SIGKILL this rank if the agent dies (Linux), and exit if it is already gone."""
    agent = os.environ.get("PREFLIGHT_AGENT_PID")
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if agent and os.getppid() != int(agent):
        os._exit(3)


_SOURCE_LOCATION = re.compile(r"^\[[^\]\s]+\.(?:cc|cpp|h|hpp):\d+\]\s*")


def _describe(exc):
    text = str(exc).strip().splitlines()
    # torch errors can be pages long (C++ traceback); the first line carries the cause. gloo prefixes it
    # with its source location ("[/__w/pytorch/.../gloo/transport/tcp/pair.cc:537] Read error ..."): noise.
    first = _SOURCE_LOCATION.sub("", text[0]) if text else ""
    return "%s: %s" % (type(exc).__name__, first[:500])


class _ArrivalWatch(threading.Thread):
    """Global rank 0 only: report which ranks have reached the store, until all have or init ends.

    Uses its own store client: a TCPStore client is one socket and the main thread's is blocked in
    init_process_group. When some node never arrives, this is what names it.
    """

    def __init__(self, dist, host, port, world_size):
        threading.Thread.__init__(self, name="arrival-watch", daemon=True)
        self.dist, self.host, self.port, self.world_size = dist, host, port, world_size
        self.stop = threading.Event()

    def run(self):
        try:
            client = self.dist.TCPStore(
                self.host, self.port, self.world_size, False, timeout=datetime.timedelta(seconds=10)
            )
        except Exception:  # the report is best effort; init itself reports store trouble
            return
        missing = list(range(self.world_size))
        arrived = []
        while missing and not self.stop.is_set():
            now_in = [r for r in missing if client.check([ARRIVED_KEY % r])]
            if now_in:
                arrived = sorted(arrived + now_in)
                missing = [r for r in missing if r not in now_in]
                emit("arrived", ranks=arrived)
            self.stop.wait(0.5)


def _wait_for_store(host, port, seconds):
    """Return once the store's port takes a connection, or after seconds (the TCPStore then says why).

    torch's TCPStore client, refused, retries after a backoff that grows to seconds: a rank ready before
    rank 0's store listens connected up to that backoff late, and the whole world waited for the last one.
    A refused plain connect costs microseconds, so a rank polling every STORE_POLL_S connects within that
    of the store's start (benchmarks/rendezvous_scale.py, variants late and same-time vs their -poll twins).
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
            return
        except OSError:  # refused (not listening yet) or unreachable: the TCPStore's own error names it
            if time.monotonic() + STORE_POLL_S >= deadline:
                return
            time.sleep(STORE_POLL_S)


def _check_run(store, rank, run_id, host, port):
    """Rank 0 publishes its run's id on the store; the others check that the store is their run's."""
    if not run_id:
        return
    if rank == 0:
        store.set(RUN_KEY, run_id)
        return
    theirs = store.get(RUN_KEY).decode("utf-8", "replace")
    if theirs != run_id:
        raise RuntimeError("the rendezvous store at %s:%d belongs to another preflight run (run %s, not this "
                           "run's %s)" % (host, port, theirs[:16], run_id[:16]))


def main(argv):
    """One rank, start to end: import torch, (warm: wait for the go), rendezvous, sweep, the phases after it."""
    _take_stdout()
    _die_with_parent()
    cfg = json.loads(argv[1])
    go = _go_channel(int(cfg["go_fd"])) if cfg.get("warm") else None
    state = {"stage": "init", "bytes": None}
    try:
        torch, dist, device = _import_torch(cfg["backend"], int(os.environ["LOCAL_RANK"]))
        if go is not None:
            cfg = _wait_for_go(go)
        gpu = cfg["backend"] == "nccl"
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = _rendezvous(torch, dist, device, gpu, rank, world_size, cfg)
        _wait_for_start(cfg.get("start_at"))
        emit("init_done", pid=os.getpid())
        done_sizes = _sweep(torch, dist, device, gpu, rank, world_size, cfg, state)
        if (cfg.get("pairs") or cfg.get("node")) and done_sizes:
            state.update(stage="pairs", bytes=done_sizes[-1])
            try:
                _pair_phase(torch, dist, device, gpu, rank, done_sizes[-1], cfg)
            except Exception as exc:  # the sweep's results stand; the agent reports this as pairs_error
                emit("pairs_error", error=_describe(exc))
        if cfg.get("compute"):
            state.update(stage="compute", bytes=None)
            try:
                _load_deferred()
                emit("compute", **_compute_module().compute_phase(torch, dist, device, gpu, cfg["compute"], emit))
            except Exception as exc:  # the sweep's results stand; the agent reports this as compute_error
                emit("compute_error", error=_describe(exc))
        state.update(stage="finish", bytes=None)
        dist.destroy_process_group()
        emit("done")
        _leave(store, rank, world_size)
        return 0
    except BaseException as exc:  # noqa: B902 - report everything, including KeyboardInterrupt
        emit("error", stage=state["stage"], bytes=state["bytes"], error=_describe(exc))
        return 1


def _import_torch(backend, local_rank):
    """Import torch (and on GPUs make this rank's CUDA context): (torch, torch.distributed, device).
    Emits "imported" with import_s, the seconds this took in this process.

    The import runs with the cyclic garbage collector off, and what it loaded is then frozen (gc.freeze: moved
    where later collections do not walk it). Importing torch 2.13 leaves about 240,000 tracked objects, and
    the collector's ~370 passes over them during the import free about 7,000: work for nearly nothing.
    Afterwards a collection no longer walks torch's modules either. Reference counting frees as before, and
    the import's few thousand cyclic leftovers stay frozen (no RSS difference against collecting them first,
    which costs a full pass of ~100 ms). A collector the caller had turned off stays off. torch's Python meta
    kernels are deferred on gloo ranks (DEFERRED_TORCH_MODULES: a quarter of the import). Measured
    (benchmarks/rank_import_cpu.py --before, torch 2.13.0 CPU, 2 cores): see benchmarks/README.md."""
    t0 = time.monotonic()
    _without_numpy()
    _defer_unused_torch_modules(backend)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
        import torch.distributed as dist
        _bind_deferred(torch)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()

    if backend == "nccl":
        # one GPU visible (srun --gpus-per-task binds it): device 0; all visible: the LOCAL_RANK-th
        index = local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        torch.empty(1, device=device)  # the context now, not inside the timed rendezvous
    else:
        device = torch.device("cpu")
    emit("imported", import_s=round(time.monotonic() - t0, 3))
    return torch, dist, device


def _without_numpy():
    """Keep numpy out of this process: `import torch` imports it where it is installed (for the tensor/ndarray
    bridge, which no rank uses), and numpy's OpenBLAS starts its thread pool at load, a thread per CPU up to
    its build's limit, in every rank. Measured (benchmarks/rank_import_cpu.py, torch 2.13.0 CPU, numpy
    2.4.6, 2 cores, 16 alternating runs): 2.21 -> 1.96 CPU-s a rank's import, median. torch then warns once
    ("Failed to initialize NumPy"), which _import_torch silences. A numpy already loaded (a site hook, the
    inventory's python) is left as it is."""
    if "numpy" not in sys.modules:
        sys.modules["numpy"] = None  # `import numpy` raises ImportError, as if it were not installed


# torch modules a CPU rank's `import torch` loads only to register things its all-reduce does not use:
# torch/__init__.py ends with `from torch import _meta_registrations`, which registers Python meta kernels
# (shape functions for the "meta" device, fake tensors, torch.compile and export) and, to build them, imports
# torch._prims, torch._refs and torch._decomp. The all-reduce runs eager collectives and fills on real tensors,
# dispatched to native kernels. Not everything there is for tracing: torch._prims.rng_prims sets the metaclass
# that `torch.Generator()` needs (torch 2.13 refuses to make one before), so the compute tier, which seeds its
# own generator, loads the real modules first (_load_deferred). Only gloo ranks defer: a GPU rank's import is
# mostly CUDA's, the saving small, and its NCCL path is not run here without a GPU. Measured
# (benchmarks/rank_import_cpu.py, torch 2.13.0 CPU, 2 cores): see benchmarks/README.md.
DEFERRED_TORCH_MODULES = ("torch._meta_registrations",)
FULL_IMPORT_ENV = "PREFLIGHT_RANK_FULL_TORCH_IMPORT"


class _Deferred(type(sys)):
    """Stands in sys.modules for a deferred module until something asks it for a name: then the real module is
    imported (with everything it registers) and answers, and it replaces this one in sys.modules and on its
    package. So code that does use the module gets it, at the point it would have been imported anyway."""

    def __getattr__(self, attr):
        if attr.startswith("__"):  # import machinery's probes (__path__, __file__, ...): no import for those
            raise AttributeError(attr)
        return getattr(_import_real(self.__name__), attr)


def _import_real(name):
    """The real module `name`, imported now if a _Deferred stands in its place (and bound on its package)."""
    import importlib

    if isinstance(sys.modules.get(name), _Deferred):
        del sys.modules[name]
    return importlib.import_module(name)


def _defer_unused_torch_modules(backend):
    """Put _Deferred stand-ins for DEFERRED_TORCH_MODULES before a gloo rank's `import torch` (not where torch
    is already loaded, and not with PREFLIGHT_RANK_FULL_TORCH_IMPORT=1 in the rank's environment)."""
    if backend != "gloo" or "torch" in sys.modules or os.environ.get(FULL_IMPORT_ENV) == "1":
        return
    for name in DEFERRED_TORCH_MODULES:
        sys.modules.setdefault(name, _Deferred(name))


def _bind_deferred(torch):
    """A stand-in that survived the import is bound on its package, as the real module would have been."""
    for name in DEFERRED_TORCH_MODULES:
        module = sys.modules.get(name)
        if isinstance(module, _Deferred) and not hasattr(torch, name.rpartition(".")[2]):
            setattr(torch, name.rpartition(".")[2], module)


def _load_deferred():
    """torch whole: the real DEFERRED_TORCH_MODULES for what goes beyond the all-reduce (the compute tier)."""
    for name in DEFERRED_TORCH_MODULES:
        if isinstance(sys.modules.get(name), _Deferred):
            _import_real(name)


def _go_channel(fd):
    """A rank started ahead of the bench (warm) reads its go from the pipe fd: one JSON line. The pipe's
    end is also its lifeline: EOF (the agent gone, or done with this rank, or the node's process ended
    before the bench) ends the process at once, whatever it is doing. A queue that gets the go line."""
    import queue

    box = queue.Queue()

    def watch():
        with os.fdopen(fd, "rb", 0) as pipe:
            line = pipe.readline()
            if line:
                box.put(line)
                while pipe.read(4096):
                    pass
        os._exit(3)

    threading.Thread(target=watch, name="go-watch", daemon=True).start()
    return box


def _wait_for_go(box):
    """The go: {"cfg": the worker config, "env": variables to set (rank, world, rendezvous, NCCL/GLOO env)}."""
    go = json.loads(box.get().decode("utf-8"))
    os.environ.update({str(k): str(v) for k, v in (go.get("env") or {}).items()})
    return go["cfg"]


def _rendezvous(torch, dist, device, gpu, rank, world_size, cfg):
    """Connect to the store (rank 0 hosts it), check it is this run's, form the group, one tiny all-reduce."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=float(cfg.get("timeout_s", 300)))
    if rank != 0:
        _wait_for_store(host, port, timeout.total_seconds())
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
    _check_run(store, rank, cfg.get("run_id"), host, port)
    watch = None
    if rank == 0:
        watch = _ArrivalWatch(dist, host, port, world_size)
        watch.start()
    store.set(ARRIVED_KEY % rank, socket.gethostname())
    emit("store")
    kwargs = dict(backend=cfg["backend"], store=store, rank=rank, world_size=world_size, timeout=timeout)
    if gpu:
        kwargs["device_id"] = device  # eager NCCL communicator creation (torch >= 2.3)
    try:
        dist.init_process_group(**kwargs)
    except TypeError:
        kwargs.pop("device_id", None)
        dist.init_process_group(**kwargs)
    probe = torch.ones(1, dtype=torch.float32, device=device)
    dist.all_reduce(probe)
    if gpu:
        torch.cuda.synchronize()
    if watch is not None:
        watch.stop.set()
        watch.join(2.0)
        emit("arrived", ranks=list(range(world_size)))  # the group formed: everyone arrived
    return store


def _leave(store, rank, world_size):
    """Rank 0 hosts the store and ends last: every other rank counts itself out once it is done, and rank
    0 waits (up to LEAVE_WAIT_S) until all have, so that no rank still talking to the store (a sub-group
    being made, its own teardown) finds it gone. The ranks end at once after this (_exit_now)."""
    try:
        if rank != 0:
            store.add(LEFT_KEY, 1)
            return
        deadline = time.monotonic() + LEAVE_WAIT_S
        while store.add(LEFT_KEY, 0) < world_size - 1 and time.monotonic() < deadline:
            time.sleep(LEAVE_POLL_S)
    except Exception as exc:  # noqa: BLE001 - the results are out ("done"); a store gone changes none of them
        sys.stderr.write("preflight bench: rank %d could not count out at the store: %s\n" % (rank, _describe(exc)))


def _sweep(torch, dist, device, gpu, rank, world_size, cfg, state):
    """Every size in order, each timed (until stable: _stop_rule) and checked; stops before a size
    projected over the size budget (the "cut"). [(bytes, seconds it took, runs)] of the sizes run.

    The projection scales the size's runs (warm-up, the cap's iterations) at the pace of its best
    iteration on the slowest rank: the wall time of a small size on a starved CPU is mostly stalls, which
    do not scale with the byte count (a 1 KiB size took 0.3 s under load, projected to 19 s at 64 KiB, and
    cut a healthy sweep). A slow link slows every iteration, the best one too, so it is still cut in time."""
    expected = world_size * (world_size + 1) / 2.0
    sizes = list(cfg["sizes"])
    budget = cfg.get("size_budget_s")
    runs = int(cfg.get("warmup", 2)) + max(1, int(cfg.get("iters", 5)))
    done_sizes = []
    prev_s = 0.0  # the previous size's slowest best iteration at its decision (0: none)
    for i, nbytes in enumerate(sizes):
        state.update(stage="size", bytes=nbytes)
        started = time.monotonic()
        stop = _stop_rule(cfg)
        if stop is not None:
            stop["runs"] = runs
            if stop["growth"] and prev_s and 0 < i < len(sizes) - 1 and nbytes < LATENCY_MAX_BYTES:
                stop["prev_s"] = prev_s  # a size below the last may stop as latency-bound (_agree_stop)
        out = _one_size(torch, dist, device, gpu, rank, nbytes, cfg, expected, stop=stop)
        prev_s = (stop or {}).get("bound_s", 0.0) / runs
        emit("size", **out)
        done_sizes.append((nbytes, time.monotonic() - started, int(cfg.get("warmup", 2)) + out["iters"]))
        if budget and i + 1 < len(sizes):
            state.update(bytes=sizes[i + 1])
            # the size's stop decision carried every rank's runs x best iteration so far (_agree_stop): an
            # upper bound of `took` below (a best only falls), so under it the next size cannot be cut and
            # the agreement, one more collective of every rank, is not needed
            bound = (stop or {}).get("bound_s")
            if bound is not None and bound * sizes[i + 1] / float(nbytes) <= float(budget):
                continue
            took = _slowest(torch, dist, device, gpu, runs * float(out["min_s"]))
            projected = took * sizes[i + 1] / float(nbytes)
            if projected > float(budget):
                emit("cut", bytes=sizes[i + 1], took_s=round(took, 4), projected_s=round(projected, 3),
                     budget_s=float(budget))
                break
    return done_sizes


#: The longest a rank waits for start_at (its agent's init deadline still bounds it).
MAX_START_WAIT_S = 120.0


def _compute_module():
    """preflight.probe.bench_compute: from the source the agent put before this program (COMPUTE_SOURCE,
    a string literal: this program comes on stdin, the bundle is not on its path), else imported (run as a
    file from a checkout)."""
    source = globals().get("COMPUTE_SOURCE")
    if source is None:
        from preflight.probe import bench_compute

        return bench_compute
    import types

    module = types.ModuleType("bench_compute")
    exec(compile(source, "bench_compute.py", "exec"), module.__dict__)
    return module


def _wait_for_start(start_at):
    """Groups measured side by side (the node and pair rounds) start timing together at the wall-clock
    time start_at, once every group has imported torch and formed: a group still importing must not
    steal the CPU from one being timed. Nodes' clocks agree to well under a second (the ssh check judges
    skew); a rank already late starts at once."""
    if not start_at:
        return
    wait = float(start_at) - time.time()
    if wait > 0:
        time.sleep(min(wait, MAX_START_WAIT_S))


def _slowest(torch, dist, device, gpu, seconds):
    """The largest of every rank's `seconds` (a 1-element MAX all-reduce): all ranks get the same value,
    so all of them take the same decision about the next size."""
    t = torch.tensor([float(seconds)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if gpu:
        torch.cuda.synchronize()
    return float(t.item())


def _pair_phase(torch, dist, device, gpu, rank, last, cfg):
    """The fleet rounds in this process, after the sweep: the controller's "pairs" rotations, each a list
    of disjoint rank groups (a node's ranks with another node's), all groups of a rotation at once.

    One torch import and one launch for every pair test: the groups are sub-groups of the world already
    formed (every rank creates every group, in the same order, as torch.distributed requires). They run
    at the sweep's last size, with as many iterations as fit the size budget (the ranks agree on it).
    Emits {"event": "pair", "rotation": r, "ranks": [...], "bytes", "time_s", "min_s", "max_s", "ok"}
    per rank and group, then {"event": "pairs_done"}. A failure here leaves the sweep's results standing:
    the agent reports it as the rank's pairs_error.
    """
    spec = cfg.get("pairs") or {}
    nbytes, took, runs = last
    budget = float(cfg.get("size_budget_s") or 0) or None
    warmup = int(cfg.get("warmup", 2))
    iters = int(spec.get("iters") or (cfg.get("node") or {}).get("iters") or cfg.get("iters", 5))
    per_iter = _slowest(torch, dist, device, gpu, took / float(runs))
    if budget and per_iter > 0:
        iters = max(int(cfg.get("iters", 5)), min(iters, int(budget / per_iter) - warmup))
    emit("pairs_start", bytes=nbytes, iters=iters)
    sub = dict(cfg, warmup=warmup, iters=iters)
    if cfg.get("node"):
        try:  # at the node spec's own iterations (the gloo loopback: the sweep's; judged on completion only)
            _node_phase(torch, dist, device, gpu, rank, nbytes,
                        dict(sub, iters=min(int(cfg["node"].get("iters") or iters), iters)), cfg["node"])
        except Exception as exc:  # the pairs still run; the agent reports this as the rank's node_error
            emit("node_error", error=_describe(exc))
    rotations = spec.get("rotations") or []
    mine = []  # (pair index over every rotation, time_s, min_s) of this rank's pairs
    for r, rotation in enumerate(rotations):
        for ranks, out in _pair_turn(torch, dist, device, gpu, rank, nbytes, sub, rotation, r):
            emit("pair", rotation=r, ranks=ranks, **out)
            p = sum(len(x) for x in rotations[:r]) + [sorted(int(x) for x in g) for g in rotation].index(ranks)
            mine.append((p, out["time_s"] if out["ok"] else float("inf"), out["min_s"] if out["ok"] else float("inf")))
    if spec.get("recheck") and spec.get("nodes"):
        _recheck(torch, dist, device, gpu, rank, nbytes, sub, spec, mine)
    dist.barrier()
    emit("pairs_done")


def _pair_turn(torch, dist, device, gpu, rank, nbytes, cfg, groups, r):
    """One rotation (or recheck turn): its disjoint rank groups timed at once; [(ranks, figures)] of this
    rank's group. The groups are made just before it runs (every rank makes each one, member or not), and
    say so: on a large cluster making them is progress the agent's op deadline must see."""
    made = [(sorted(int(x) for x in ranks), dist.new_group(ranks=sorted(int(x) for x in ranks))) for ranks in groups]
    emit("pairs_ready", rotation=r)
    dist.barrier()
    return [(ranks, _one_size(torch, dist, device, gpu, rank, nbytes, cfg, sum(x + 1 for x in ranks), group=group))
            for ranks, group in made if rank in ranks]


def _recheck(torch, dist, device, gpu, rank, nbytes, cfg, spec, mine):
    """Re-measure, once and in these processes, every node the rotations found low beside every partner
    (recheck_plan), beside a known-good partner with a control pair of known-good nodes at the same moment
    (alternated with it where it shares a node): a pair spoiled by a busy moment is cleared here instead
    of costing a localization round. Emits "pair" events with "recheck": true (and "control": true)."""
    pairs = [sorted(int(x) for x in ranks) for rotation in spec["rotations"] for ranks in rotation]
    nodes = [sorted(int(x) for x in ranks) for ranks in spec["nodes"]]
    node_of = {r: i for i, ranks in enumerate(nodes) for r in ranks}
    n = len(pairs)
    figures = torch.zeros(2 * n, dtype=torch.float64, device=device)
    for p, t, m in mine:
        figures[p], figures[n + p] = float(t), float(m)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)  # every pair's slowest rank, known to every rank
    vals = [float(x) for x in figures.cpu().tolist()]
    pair_nodes = [sorted({node_of[r] for r in ranks}) for ranks in pairs]
    turns = recheck_plan(pair_nodes, vals[:n], vals[n:], float(spec.get("warn", 0.1)))
    for k, turn in enumerate(turns):
        groups = [sum((nodes[i] for i in g), []) for g, _c in turn]
        control = {tuple(sorted(x)) for x, (_g, c) in zip(groups, turn) if c}
        for ranks, out in _pair_turn(torch, dist, device, gpu, rank, nbytes, cfg, groups, len(spec["rotations"]) + k):
            emit("pair", rotation=len(spec["rotations"]) + k, ranks=ranks, recheck=True,
                 **dict(out, **({"control": True} if tuple(ranks) in control else {})))


#: A recheck alternates a control that shares a node with a suspect's pair (3 nodes) this many times with it
#: (preflight.checks.allreduce.localize.ALTERNATIONS, the rounds' figure).
RECHECK_ALTERNATIONS = 3


def recheck_plan(pairs, times, bests, warn, alternations=RECHECK_ALTERNATIONS):
    """The recheck's turns, [[(node indices, is_control), ...], ...], from the rotations' pairs (node
    indices) and each pair's median and best iteration times. A node is low when every pair it sat in is
    more than `warn` below the fleet (the median over nodes of each node's median, on both kinds, the more
    favourable kept: the controller's judge.reference and grade); each low node (the slowest MAX_CONFIRM)
    goes beside a distinct known-good node, one it has not met where it can, and two spare known-good
    nodes are the control, timed at once (one turn); with fewer than two spare, a control that shares a
    partner, alternated with the suspects `alternations` times (every other time in reverse). [] when nothing
    is low or nothing is good."""
    by_node = {}
    for p, members in enumerate(pairs):
        for i in members:
            by_node.setdefault(i, []).append(p)
    bw = [[1.0 / max(f[p], 1e-12) for p in range(len(pairs))] for f in (times, bests)]
    ref = [statistics.median(statistics.median(b[p] for p in ps) for ps in by_node.values()) for b in bw]

    def fine(p):
        return max(bw[0][p] / max(ref[0], 1e-12), bw[1][p] / max(ref[1], 1e-12)) >= 1.0 - warn

    good = [i for i in sorted(by_node) if any(fine(p) for p in by_node[i])]
    low = [i for i in sorted(by_node) if i not in good][:MAX_CONFIRM]
    free, groups = list(good), []
    for s in low:
        met = {m for p in by_node[s] for m in pairs[p]}
        partner = next((g for g in free if g not in met), free[0] if free else None)
        if partner is None:
            break
        free.remove(partner)
        groups.append([s, partner])
    if not groups:
        return []
    if len(free) >= 2:
        return [[(g, False) for g in groups] + [(free[:2], True)]]
    pool = free + [g[1] for g in groups]
    if len(pool) < 2:
        return [[(g, False) for g in groups]]
    sides = [[(g, False) for g in groups], [(pool[:2], True)]]
    # every other alternation reversed (A B, B A, A B), as the controller's rounds (localize.interleaved: the
    # same expression; a rank cannot import the controller's module)
    return [side for i in range(alternations) for side in (sides if i % 2 == 0 else sides[::-1])]


#: The node phase's second pass re-measures at most this many suspects (one at a time), each beside
#: CONFIRMATIONS different known-good nodes (preflight.checks.allreduce.judge.judge_nodes wants every one low).
MAX_CONFIRM = 16
CONFIRMATIONS = 2


def _node_phase(torch, dist, device, gpu, rank, nbytes, cfg, spec):
    """The partner-free tests, in the sweep's own processes: every node alone, all nodes at once (pass 0),
    then each node more than `warn` below the median re-measured beside a known-good node measured at the
    same moment, one suspect at a time (pass 1, the confirmation; preflight.checks.allreduce.judge.judge_nodes
    reads both).

    spec: {"kind": "loopback" | "local", "nodes": [[global ranks of node 0], ...], "warn": 0.1[, "confirm":
    false: pass 0 only (_node_confirm)]}.
    "local" (nccl): the node's own ranks as a sub-group: its GPUs over NVLink/NVSwitch (or PCIe P2P).
    "loopback" (gloo, one rank a node): two gloo ranks in this process (_loopback) rendezvous in memory
    and exchange the data over TCP through the node's data-NIC address (GLOO_SOCKET_IFNAME), not lo.
    Emits {"event": "node", "pass": 0|1, "node": i, "ranks": n, "bytes", "time_s", "min_s", "max_s",
    "ok"[, "beside": i | "control_for": i]}; every rank of a node ("local") or its one rank ("loopback").
    """
    nodes = [sorted(int(x) for x in ranks) for ranks in spec["nodes"]]
    mine = next(i for i, ranks in enumerate(nodes) if rank in ranks)
    local = spec["kind"] == "local"
    made = [dist.new_group(ranks=ranks) for ranks in nodes] if local else None
    emit("node_ready")

    def measure(tag):
        if local:
            group_ranks = nodes[mine]
            out = _one_size(torch, dist, device, gpu, rank, nbytes, cfg, float(sum(x + 1 for x in group_ranks)),
                            group=made[mine])
            return dict(out, ranks=len(group_ranks))
        return dict(_loopback(torch, dist, nbytes, cfg, tag), ranks=2)

    dist.barrier()
    first = measure("p0")
    emit("node", **dict(first, node=mine, **{"pass": 0}))
    if spec.get("confirm", True):
        _node_confirm(torch, dist, device, first, mine, nodes, spec, measure)
    dist.barrier()
    emit("node_done")


def _node_confirm(torch, dist, device, first, mine, nodes, spec, measure):
    """The node phase's pass 1: each node more than `warn` below the median of pass 0, re-measured beside
    known-good nodes one suspect at a time. Skipped where the controller judges the test on completion
    only (spec "confirm": false, the gloo loopback): its figures would decide nothing."""
    # every rank learns every node's figure (its slowest rank's), so all take the same decision
    nn = len(nodes)
    figures = torch.zeros(2 * nn, dtype=torch.float64, device=device)
    figures[mine], figures[nn + mine] = float(first["time_s"]), float(first["min_s"])
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    vals = [float(x) for x in figures.cpu().tolist()]
    median, best = statistics.median(vals[:nn]), statistics.median(vals[nn:])
    # time, not bandwidth: a node is low when its time is more than 1 / (1 - warn) of the median's
    ratio = [max(median / max(vals[i], 1e-12), best / max(vals[nn + i], 1e-12)) for i in range(nn)]
    warn = float(spec.get("warn", 0.1))
    suspects = [i for i in range(nn) if ratio[i] < 1.0 - warn]
    good = sorted((i for i in range(nn) if i not in suspects), key=lambda i: vals[nn + i])
    # one suspect at a time, beside the next known-good node: the two share the moment and nothing else
    # runs (on a shared machine many pairs at once would spread as much as the first pass did); the
    # slowest MAX_CONFIRM only: more suspects than that is a fleet-wide spread, not one node
    suspects = sorted(suspects, key=lambda i: ratio[i])[:MAX_CONFIRM] if good else []
    for k, s in enumerate(suspects):
        for j in range(min(CONFIRMATIONS, len(good))):  # beside different known-good nodes, one after another
            g = good[(k + j) % len(good)]
            dist.barrier()
            if mine == s:
                emit("node", **dict(measure("p1-%d-%d" % (s, j)), node=mine, beside=g, **{"pass": 1}))
            elif mine == g:
                emit("node", **dict(measure("p1-%d-%d" % (s, j)), node=mine, control_for=s, **{"pass": 1}))


def _loopback(torch, dist, nbytes, cfg, tag):
    """Two gloo ranks of this process (two threads) all-reduce nbytes through the data NIC's address:
    the node's TCP stack, memory and CPUs with no partner. Each iteration counts at its slower thread."""
    warmup, iters = int(cfg.get("warmup", 2)), max(1, int(cfg.get("iters", 5)))
    store = dist.PrefixStore("preflight/loopback/" + tag, dist.HashStore())
    timeout = datetime.timedelta(seconds=float(cfg.get("timeout_s", 300)))
    count = max(1, nbytes // 4)
    times = [None, None]
    wrong = [0, 0]
    errors = []

    def one(r):
        try:
            pg = dist.ProcessGroupGloo(store, r, 2, timeout)
            buf = torch.empty(count, dtype=torch.float32)
            mine = []
            for i in range(warmup + iters):
                buf.fill_(r + 1)
                t0 = time.perf_counter()
                pg.allreduce([buf]).wait()
                if i >= warmup:
                    mine.append(time.perf_counter() - t0)
            # the last timed iteration (a freshly filled buffer, as every one) is the check: no extra run
            wrong[r] = int(buf.ne(3.0).sum().item())
            times[r] = mine
        except Exception as exc:  # raised below, in the calling thread
            errors.append(_describe(exc))

    threads = [threading.Thread(target=one, args=(r,), name="loopback-%d" % r, daemon=True) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors or None in times:
        raise RuntimeError("loopback: %s" % (errors[0] if errors else "a rank did not finish"))
    slower = [max(a, b) for a, b in zip(times[0], times[1])]
    return {"bytes": count * 4, "time_s": statistics.median(slower), "min_s": min(slower), "max_s": max(slower),
            "ok": wrong == [0, 0], "iters": len(slower), "iface": os.environ.get("GLOO_SOCKET_IFNAME")}


#: The sweep's stop rule's default tolerance, and how often the ranks decide after iters_min iterations
#: (each decision is one 2-element MAX all-reduce: benchmarks/allreduce_sweep_stop.py measures its cost).
STABLE_TOL, DECIDE_EVERY = 0.05, 2


def _stop_rule(cfg):
    """The sweep's stop rule from the config, or None (every size runs `iters` iterations)."""
    least, iters = int(cfg.get("iters_min") or 0), max(1, int(cfg.get("iters", 5)))
    if least < 1 or least >= iters:
        return None
    tol = cfg.get("stable_tol")
    return {"min": least, "tol": STABLE_TOL if tol is None else float(tol), "budget": cfg.get("size_budget_s"),
            "growth": float(cfg.get("latency_growth") or 0.0)}


#: Sizes from here up are never stopped as latency-bound: the GPU verdict is taken at >= 1 GiB.
LATENCY_MAX_BYTES = 1 << 30


def _agree_stop(torch, dist, device, times, elapsed, n, stop):
    """After n timed iterations: "stable" when every rank's last stop["min"] are within tol of their best,
    "latency" when the slowest rank's best is within stop["growth"] times the previous size's (stop["prev_s"],
    taken the same way: twice the bytes did not take longer, so the size measures latency, not bandwidth,
    and more iterations would only repeat that), "budget" when the next DECIDE_EVERY would take the slowest
    rank past the size budget, else None.
    All ranks get the same answer (one MAX all-reduce of [unstable, elapsed, bound]). With stop["runs"]
    (the sweep), stop["bound_s"] becomes the slowest rank's runs x best iteration so far: _sweep's cut
    projection is never above it."""
    last = sorted(times[-int(stop["min"]):])
    unstable = 1.0 if statistics.median(last) > last[0] * (1.0 + stop["tol"]) else 0.0
    bound = float(stop.get("runs") or 0) * min(times)
    t = torch.tensor([unstable, float(elapsed), bound], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    unstable, elapsed, bound = (float(x) for x in t.cpu().tolist())
    if stop.get("runs"):
        stop["bound_s"] = bound
    if not unstable:
        return "stable"
    if stop.get("prev_s") and bound / float(stop["runs"]) <= float(stop["growth"]) * float(stop["prev_s"]):
        return "latency"
    if stop["budget"] and elapsed * (n + DECIDE_EVERY) / float(n) > float(stop["budget"]):
        return "budget"
    return None


def _one_size(torch, dist, device, gpu, rank, nbytes, cfg, expected, group=None, stop=None):
    """Warm up, time `iters` all-reduces of nbytes (fewer once the ranks agree to stop: _agree_stop),
    and verify the last one's result (each iteration reduces a freshly filled buffer)."""
    count = max(1, nbytes // 4)
    warmup, iters = int(cfg.get("warmup", 2)), max(1, int(cfg.get("iters", 5)))
    buf = torch.empty(count, dtype=torch.float32, device=device)
    times = []
    cpu = []
    marks = []
    why, started = "cap", time.monotonic()
    for i in range(warmup + iters):
        n = i - warmup  # timed iterations done
        if n == 0:
            started = time.monotonic()
        elif stop and n >= stop["min"] and (n - stop["min"]) % DECIDE_EVERY == 0:
            if gpu:
                torch.cuda.synchronize()
                times = [s.elapsed_time(e) / 1e3 for s, e in marks]
            why = _agree_stop(torch, dist, device, times, time.monotonic() - started, n, stop) or why
            if why != "cap":
                break
        buf.fill_(rank + 1)
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(buf, group=group)
            end.record()
            if i >= warmup:
                marks.append((start, end))
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            dist.all_reduce(buf, group=group)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
    if gpu:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in marks]
    # buf holds the last timed all-reduce's result, of a freshly filled buffer like every iteration: it is
    # the check (a separate one cost one more collective per size, 10% of a CPU sweep)
    wrong = buf.ne(expected)
    mismatches = int(wrong.sum().item())
    out = {
        "bytes": count * 4,
        "time_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "ok": mismatches == 0,
        "iters": len(times),
        "stop": why,
    }
    if cpu:  # CPU seconds this process (all its threads) spent per timed all-reduce: gloo is CPU-bound
        out["cpu_s"] = statistics.median(cpu)
    if mismatches:
        first = int(wrong.to(torch.uint8).argmax().item())
        out.update(expected=expected, got=float(buf[first].item()), mismatches=mismatches, index=first)
    del buf, wrong
    return out


def _exit_now(code):
    """End the rank at once with code, its output flushed: everything it reports is written by then, and
    the interpreter's own shutdown with torch loaded (module teardown, atexit hooks) costs seconds of
    CPU per rank that the node's other ranks and the agent waiting for its exit would pay for
    (docs/speed.md: 2.5-4.8 s from a rank's last result to its exit on the simulator, 0.2-0.4 s this way)."""
    for stream in (_events, sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: the agent is gone and nothing more can be told
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main(sys.argv))

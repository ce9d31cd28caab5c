"""Ranks started ahead of the all-reduce: each imports torch (and makes its CUDA context) while the node
checks run, then waits for its go; the bench agent adopts them instead of starting cold ones.

Node side, standard library only, Python 3.8 compatible. The controller asks for them in a phase-1
config ({"warm": {"backend", "local_world_size", "python"}}, preflight.checks.allreduce.stage.warm); the
node's runner calls bench_agent.warm (start() here) in the bundle's main thread before its probes, and
the same process later runs the bench (a transport that keeps a node's process from phase to phase).
bench_agent._spawn then takes the warm rank of each local rank (take) and hands it its go (go): one JSON
line on a pipe of its own, {"cfg": the worker config, "env": what its environment lacks (rank, world, rendezvous, NCCL/GLOO)}.
A warm rank that does not fit the bench (another interpreter or backend, or an environment variable that
counts at import or CUDA init) is stopped and a cold one started: the verdict never depends on warming.

Nothing outlives the run, by the mechanisms every rank already has (bench_worker._die_with_parent): the
kernel SIGKILLs a rank when the process that started it dies (PR_SET_PDEATHSIG, which is why start() runs
in the main thread: the signal follows the starting *thread*), the rank is in that process's group (the
bootstrap's deadline and stdin-EOF watchdogs kill the group), and the go pipe is its lifeline: EOF on it
(that process gone, or the run over) ends the rank (bench_worker._go_channel). A node that fails phase 1
is given no bench: its kept process is ended, and its warm ranks with it, so it never joins.

Reserves: where the run will certainly launch again (nccl: the NIC loopback round, the pair screening), the
config adds "reserves": k and k more sets of the same local ranks start beside the first (RESERVES, in
launch order): each later bench adopts one set as the first bench adopts WARM. When a bench ends, what it
left in WARM is stopped and the next reserve set becomes WARM (next_set); a bench asks for no spares while
a reserve is held (bench_spares). They live by the same rules: they connect nowhere before their go, and they
die with the node process (an unused set when the stage ends the process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional

#: Variables read when torch is imported or CUDA starts: a bench env that sets one of these cannot use a
#: rank warmed without it (the thread pools and the visible devices are fixed by then).
IMPORT_TIME_PREFIXES = ("CUDA_", "OMP_", "MKL_", "KMP_", "GOMP_", "PYTORCH_", "LD_", "PYTHON", "TORCH_CUDA")


class Warm:
    """One warm rank: its process, the write end of its go pipe, what it was started with."""

    def __init__(self, proc: Any, go_fd: int, python: str, backend: str, env: Dict[str, str]) -> None:
        self.proc = proc
        self.go_fd = go_fd
        self.python = python
        self.backend = backend
        self.env = env
        self.started = time.monotonic()


#: {local rank: its warm rank}, in this node process, from start() until the bench takes them
WARM: Dict[int, Warm] = {}
#: the later launches' sets, in launch order: each becomes WARM when the bench before it ends (next_set)
RESERVES: List[Dict[int, Warm]] = []


def warm_env(backend: str, local_rank: int, local_world_size: int, nccl_env: Dict[str, str]) -> Dict[str, str]:
    """A warm rank's environment: the node process's, less what the go brings (bench_agent.rank_env)."""
    env = dict(os.environ)
    if backend == "nccl":
        env.update(nccl_env)
        env.pop("NCCL_DEBUG_FILE", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size), "PYTHONUNBUFFERED": "1",
                "PREFLIGHT_AGENT_PID": str(os.getpid())})
    return env


def start(spec: Dict[str, Any], source: str, python: str, nccl_env: Dict[str, str]) -> Dict[str, Any]:
    """Start spec["local_world_size"] warm ranks running `source`, and spec["reserves"] more sets of them for
    the later launches (any left from before are stopped first); python: the interpreter when spec names none.
    {"started": n (, "reserves": k)} or {"error": why}: a failure here only means the bench starts its ranks
    cold (bench_agent.warm calls this)."""
    discard()
    try:
        backend = str(spec["backend"])
        count = int(spec.get("local_world_size") or 1)
        python = str(spec.get("python") or python)
        reserves = max(0, int(spec.get("reserves") or 0))
    except (KeyError, TypeError, ValueError) as exc:
        return {"error": "cannot warm the ranks: %s" % exc}
    for index in range(1 + reserves):  # the first launch's set first: it is wanted soonest
        ranks = WARM if index == 0 else {}  # type: Dict[int, Warm]
        if index:
            RESERVES.append(ranks)
        error = _start_set(ranks, count, backend, source, python, nccl_env)
        if error is not None:
            discard()
            return {"error": error}
    return dict({"started": count}, **({"reserves": reserves} if reserves else {}))


def _start_set(ranks: Dict[int, Warm], count: int, backend: str, source: str, python: str,
               nccl_env: Dict[str, str]) -> Optional[str]:
    """Start one set of `count` warm ranks into `ranks`; None, or why one could not start."""
    for local_rank in range(count):
        env = warm_env(backend, local_rank, count, nccl_env)
        read_fd, go_fd = os.pipe()
        try:
            proc = subprocess.Popen([python, "-u", "-", json.dumps({"warm": True, "backend": backend,
                                                                    "go_fd": read_fd})],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, close_fds=True, pass_fds=(read_fd,))
        except OSError as exc:
            os.close(go_fd)
            return "cannot start %s: %s" % (python, exc)
        finally:
            os.close(read_fd)
        ranks[local_rank] = Warm(proc, go_fd, python, backend, env)
        try:
            proc.stdin.write(source.encode("utf-8"))
        except OSError:
            pass  # it died at once: its exit status and stderr tell the bench that adopts it why
        finally:
            _close(proc.stdin)
    return None


def fits(warm: Warm, cfg: Dict[str, Any]) -> Optional[str]:
    """None when this warm rank can run the bench config cfg (bench_agent's, normalised), else why not."""
    if warm.proc.poll() is not None:
        return "it exited with %s before its go" % warm.proc.returncode
    if warm.python != cfg["python"] or warm.backend != cfg["backend"]:
        return "started as %s %s, the bench wants %s %s" % (warm.python, warm.backend, cfg["python"], cfg["backend"])
    late = sorted(k for k, v in cfg["env"].items() if k.startswith(IMPORT_TIME_PREFIXES) and warm.env.get(k) != v)
    if late:
        return "the bench sets %s, read at import" % ", ".join(late)
    return None


def take(cfg: Dict[str, Any], local_rank: int) -> Optional[Warm]:
    """The warm rank for this local rank when it fits cfg; None otherwise (a misfit is stopped)."""
    warm = WARM.pop(local_rank, None)
    if warm is not None and fits(warm, cfg) is not None:
        stop(warm)
        return None
    return warm


def go(warm: Warm, worker_cfg: Dict[str, Any], env: Dict[str, str]) -> bool:
    """Hand the warm rank its go: the worker config and the variables its environment lacks. False when
    it cannot be told (it died: the caller stops it and starts a cold one)."""
    delta = {k: v for k, v in env.items() if warm.env.get(k) != v}
    line = json.dumps({"cfg": worker_cfg, "env": delta}).encode("utf-8") + b"\n"
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(warm.go_fd, view):]
    except OSError:
        return False
    return True


def stop(warm: Warm) -> None:
    """Kill a warm rank that will not run (SIGKILL: it holds no collective yet) and reap it."""
    try:
        warm.proc.send_signal(signal.SIGKILL)
    except OSError:
        pass
    try:
        warm.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:  # in uninterruptible sleep: the node process's group kill ends it
        pass
    close_go(warm.go_fd)
    for stream in (warm.proc.stdout, warm.proc.stderr):
        _close(stream)


def next_set() -> None:
    """A bench is over: stop the warm ranks it did not take; the next reserve set (if any) becomes WARM."""
    _stop_all(WARM)
    if RESERVES:
        WARM.update(RESERVES.pop(0))


def discard() -> None:
    """Stop every warm rank not taken, reserves included (the bench is over, or never came to this process)."""
    _stop_all(WARM)
    while RESERVES:
        _stop_all(RESERVES.pop(0))


def _stop_all(ranks: Dict[int, Warm]) -> None:
    while ranks:
        stop(ranks.pop(next(iter(ranks))))


def close_go(fd: Optional[int]) -> None:
    """Close a go pipe's write end (the rank's lifeline: it ends the rank if it still runs)."""
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass


def _close(stream: Any) -> None:
    try:
        stream.close()
    except OSError:
        pass

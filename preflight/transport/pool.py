"""SessionPool: the contract's Fleet for SSH and local nodes, one Session per node, driven by a bounded pool.

Results are data, {node: Outcome}. One connection per node, opened once and reused by every phase (local
facts, network facts, the all-reduce); a phase run with then=True also leaves each node's process waiting
for the next phase's config on the same channel (ssh.SSHSession.run_bundle). A node that fails to
connect or overruns its deadline becomes a NodeFailure in its outcome; it never hides the other nodes'
results. Ctrl-C cancels every in-flight run (remote process groups are killed) before the interrupt
propagates. The contract itself is written in transport/contract.py.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from preflight.inventory import NodeSpec
from preflight.transport.contract import NodeFailure, Outcome, Progress, Session
from preflight.transport.local import LocalSession
from preflight.transport.ssh import SSHSession


def session_for(spec: NodeSpec, accept_new_host_keys: bool = False) -> Session:
    """The session for a node: this machine's own process (`local: true`) or SSH."""
    return LocalSession(spec) if spec.local else SSHSession(spec, accept_new_host_keys)


class SessionPool:
    """The sessions to every node of an inventory, and the pool that drives them (contract.Fleet)."""

    def __init__(
        self,
        specs: List[NodeSpec],
        parallel: int = 64,
        accept_new_host_keys: bool = False,
        progress: Optional[Progress] = None,
        connect: Optional[Callable[[NodeSpec], Session]] = None,
    ) -> None:
        """connect: the session for a node (default: SSH, or a local process for a local node);
        preflight.k8s.fleet passes one that execs into the node's agent pod."""
        self.specs = {s.name: s for s in specs}
        self.connect = connect or (lambda spec: session_for(spec, self.accept_new))
        self.parallel = max(1, parallel)
        self.accept_new = accept_new_host_keys
        self.progress = progress or (lambda event, node: None)
        self.sessions: Dict[str, Session] = {}
        self.dead: Dict[str, NodeFailure] = {}
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._running = 0  # runs inside run_bundle now (not those still connecting)

    def _session(self, name: str) -> Session:
        with self._lock:
            if name in self.dead:
                raise self.dead[name]
            session = self.sessions.get(name)
        if session is None:
            session = self.connect(self.specs[name])
            try:
                session.open()
            except NodeFailure as failure:
                with self._lock:
                    self.dead[name] = failure
                session.close()
                raise
            with self._lock:
                self.sessions[name] = session
        return session

    def _one(self, name: str, config: Dict[str, Any], deadline_s: float, then: bool = False) -> Outcome:
        self.progress("start", name)
        try:
            session = self._session(name)
            with self._lock:
                if self._cancelled.is_set():  # interrupted while this connection was being opened
                    raise NodeFailure("cancelled", "interrupted before the probe started")
                self._running += 1
            try:
                run = session.run_bundle(config, deadline_s, then)
            finally:
                with self._lock:
                    self._running -= 1
        except NodeFailure as failure:
            self.progress("failed", name)
            return Outcome(name, failure=failure)
        if run.result is None:
            tail = [run.damage] if run.damage else run.stderr.strip().splitlines()[-1:] or ["no output"]
            failure = NodeFailure("damaged" if run.damage else "protocol",
                                  "probe bundle exited %s without a result: %s" % (run.rc, tail[0][:300]))
            self.progress("failed", name)
            return Outcome(name, run=run, failure=failure)
        self.progress("done", name)
        return Outcome(name, result=run.result, run=run)

    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float],
            then: bool = False) -> Dict[str, Outcome]:
        """Run the bundle once on each node named in configs, concurrently; {node: Outcome} in input order.

        then: another phase follows: every node's process stays, waiting on its channel for the next
        phase's config (SSHSession.run_bundle). A node without a config in the next run gets its kept
        process ended first.
        """
        with self._lock:
            idle = [s for n, s in self.sessions.items() if n not in configs]
        for session in idle:
            session.end_kept()
        outcomes: Dict[str, Outcome] = {}
        todo: "queue.Queue[Any]" = queue.Queue()
        for item in configs.items():
            todo.put(item)
        done: "queue.Queue[Any]" = queue.Queue()

        def worker() -> None:
            while not self._cancelled.is_set():
                try:
                    name, cfg = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    done.put((name, self._one(name, cfg, deadline_of(self.specs[name]), then)))
                except BaseException as exc:  # handed to the main thread, which raises it
                    done.put((name, exc))

        # Daemon threads, not a ThreadPoolExecutor: after Ctrl-C/SIGTERM a thread still inside a
        # connect (up to connect_timeout) must not hold the interpreter's exit.
        for i in range(min(self.parallel, max(1, len(configs)))):
            threading.Thread(target=worker, name="preflight-fanout-%d" % i, daemon=True).start()
        try:
            while len(outcomes) < len(configs):  # wake up regularly so signals reach the main thread
                try:
                    name, outcome = done.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                outcomes[name] = outcome
        except BaseException:
            self.cancel()
            raise
        return {name: outcomes[name] for name in configs}

    def cancel(self) -> None:
        """Kill every run in flight (remote process groups included), all nodes at once; start no more."""
        with self._lock:
            self._cancelled.set()
            sessions = list(self.sessions.values())
        for session in sessions:
            session.cancelled = True
        if not sessions:
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.parallel, len(sessions))) as pool:
            list(pool.map(lambda session: session.cancel(), sessions))
        # Runs whose pid line had not arrived yet kill their group themselves as soon as it does: wait
        # for them (bounded), since the daemon threads die with the process. Connects are not waited for.
        bound = max(s.spec.connect_timeout for s in sessions) + 8.0
        until = time.monotonic() + bound
        while time.monotonic() < until:
            with self._lock:
                if self._running == 0:
                    return
            time.sleep(0.05)

    def keeps_ranks(self, ranks: int) -> bool:
        """Over SSH, a bench run after a phase run with then=True goes to the same node process: ranks started
        by phase 1 (preflight.probe.bench_warm) can be adopted, however many a node runs. A local node
        (LocalSession) starts a process per run, so ranks started early would die unused: False when the
        fleet has one (the engine then starts none anywhere: a fleet mixing both is rare)."""
        with self._lock:
            return not any(s.local for s in self.specs.values())

    def describe(self) -> Dict[str, Any]:
        """What carried the run, for the report: {"kind": "ssh" (or "local"), "connections": N}, over SSH
        with "bundle": {"sent": nodes the zip went to, "kept": nodes that used their copy of it}."""
        with self._lock:
            local = all(s.local for s in self.specs.values())
            out: Dict[str, Any] = {"kind": "local" if local else "ssh", "connections": len(self.sessions)}
            ways = [getattr(s, "bundle", None) for s in self.sessions.values()]
            if any(ways):
                out["bundle"] = {"sent": ways.count("sent"), "kept": ways.count("kept")}
            return out

    def close(self) -> None:
        with self._lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for session in sessions:
            session.close()

    def __enter__(self) -> "SessionPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""The transport contract: what every backend (SSH, local, Slurm, Kubernetes) delivers to the engine above it.

Everything above a transport (the phases in preflight/engine.py, the rules, the report, the env file, the
all-reduce launcher) sees only the names in this module, so it never knows which backend carried the bundle.

A **Fleet** runs the probe bundle (preflight/transport/bundle.py) on many nodes at once:

    fleet.run(configs, deadline_of, then=False) -> {node: Outcome}
        configs     {node name: that node's config} (the JSON document the bundle's runner reads).
                    The result has the same keys, in the same order. Nodes not named are left alone
                    (a process kept for them by an earlier `then=True` run is ended first).
        deadline_of deadline_of(NodeSpec) -> seconds: the node's whole run (connect/launch included) must
                    end within it; a backend whose launch runs the node's login shell may count it from
                    when that shell started the command, and bound the shell's start on its own (SSH:
                    its start-up files may be slow on a healthy node; NodeFailure "login_shell"). A node past it is Outcome(failure=NodeFailure("timeout", ...)) and
                    everything the run started on it is killed; it never delays the other nodes beyond
                    their own deadlines.
        then        another phase follows on these nodes: a backend may keep each node's process waiting
                    for the next config (bundle.py "more": true) instead of starting a new one.
        One node's failure is data, never an exception: Outcome.failure is a NodeFailure whose kind is
        one of NodeFailure.KINDS and whose message names the cause and the fix. An Outcome with a result
        is a node that answered; a backend must never turn a received result into a failure (a process
        that cannot exit after it printed its result still answered). Only a fault of preflight itself,
        or Ctrl-C (KeyboardInterrupt, after cancel()), propagates.
    fleet.cancel()      kill every run in flight, on every node, and start no more (Ctrl-C; any thread).
    fleet.close()       end every kept process and connection; a fleet that made a scheduler allocation
                        releases it. Nothing preflight started on a node outlives close().
    fleet.describe()    what carried the run, for the report: {"kind": "ssh"|"local"|"slurm"|..., ...}.
    fleet.keeps_ranks(k) optional: True when a bench run with k ranks a node, after runs with then=True,
                        goes to the node process that ran them (what that process started ahead of the
                        bench, preflight.probe.bench_warm, is then adopted); an engine without it: False.
    with fleet: ...     closes on exit.

A node's stdout is read with **bundle.ResultReader** (feed bytes as they arrive, has_result() as soon as
the whole result is in, finish() -> RunResult). It reassembles the framed result (the `preflight-part`
lines, each with its sequence number and the result line with the length and checksum of the whole),
so a line a backend splits, joins or interleaves is put back together or detected, in time linear in
the result's size. A new backend feeds it whatever the node printed, line by line or in any chunks.

A **Session** is one node's connection for a backend that has one per node (SSH, local); pool.SessionPool
drives sessions. A backend that launches many nodes in one command (Slurm's srun step, a Kubernetes
Job) implements Fleet directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Protocol

from preflight.inventory import NodeSpec

#: progress(event, node name) with event in {"start", "done", "failed"}
Progress = Callable[[str, str], None]


class NodeFailure(Exception):
    """A node could not be used. kind: one of KINDS; message names the cause and what to do."""

    #: unreachable (no connection / not launched), host_key, auth, timeout (no result within the deadline),
    #: protocol (the bundle ended without a result), damaged (a result arrived but frames of it were lost or
    #: damaged in transit: the node answered, nothing is known to be wrong with it), scheduler (the scheduler
    #: could not run the step at all, for a reason of its own controller's: no verdict on the node), cancelled
    #: (Ctrl-C), login_shell (connected and authenticated, but the login shell's start-up files had not
    #: started the command within its bound: the login environment, not the node, is what is slow)
    KINDS = ("unreachable", "host_key", "auth", "timeout", "protocol", "damaged", "scheduler", "cancelled",
             "login_shell")

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass
class RunResult:
    """One bundle run on one node: the result document (None: none arrived) plus timing.

    rc: the exit status (None: the process was kept for a next phase, or is still running after its
    result arrived); sent_at: the controller's time.time() when the config was sent; clock: the node's
    time.time() from its `preflight-clock` line and clock_received_at when that line arrived (the ssh
    check's clock-skew window); elapsed_s: the run's monotonic duration on the controller; damage: why
    a result that arrived could not be read (frames lost or damaged in transit), else None.
    """

    rc: Optional[int]
    result: Optional[Dict[str, Any]]
    stderr: str
    sent_at: float
    clock: Optional[float]
    clock_received_at: Optional[float]
    elapsed_s: float
    damage: Optional[str] = None  # why a result that arrived gives no document (bundle.ResultReader.damage)


@dataclass
class Outcome:
    """What one node returned for one phase: the run's result document, or why there is none."""

    node: str
    result: Optional[Dict[str, Any]] = None
    run: Optional[RunResult] = None
    failure: Optional[NodeFailure] = None


class Fleet(Protocol):
    """A backend that runs the bundle on many nodes (see the module docstring for the whole contract)."""

    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float],
            then: bool = False) -> Dict[str, Outcome]:
        ...

    def cancel(self) -> None:
        ...

    def close(self) -> None:
        ...

    def describe(self) -> Dict[str, Any]:
        ...

    def __enter__(self) -> "Fleet":
        ...

    def __exit__(self, *exc: Any) -> None:
        ...


class Session(Protocol):
    """One node's connection that runs bundles (SSHSession, LocalSession); pool.SessionPool drives them.

    open() connects (raises NodeFailure); run_bundle(config, deadline_s, then) runs the bundle once and
    returns its RunResult (raises NodeFailure: timeout, unreachable, cancelled); with then=True a session
    may keep the node's process for the next phase's config instead of starting a new one; end_kept()
    lets such a process exit; cancel() kills what runs now (from any thread; `cancelled` is set first by
    the fleet, so a run that has not started its process yet stops too); close() ends everything.
    """

    spec: NodeSpec
    cancelled: bool = False

    def open(self) -> None:
        ...

    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:
        ...

    def end_kept(self) -> None:
        """Let a process kept for a next phase that will not come exit (nothing kept: nothing to do)."""

    def cancel(self) -> None:
        """Kill whatever this session is running now (Ctrl-C). Safe to call from another thread."""

    def close(self) -> None:
        ...

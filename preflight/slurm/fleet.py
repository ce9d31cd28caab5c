"""Slurm as a transport: the allocation is the inventory, one srun step per phase carries the bundle.

The transport contract (preflight.transport.contract.Fleet) — `run(configs, deadline_of) -> {node: Outcome}` — so the
engine, the rules, the report and the bench never know which backend carried the bundle.

One job step across all the nodes carries every phase of a run, one task per node:

    srun --jobid J -N n -n n --ntasks-per-node=1 -w NODES --kill-on-bad-exit=0 --no-kill --label --input=all \
         --overlap --cpu-bind=none -J preflight-TOKEN \
         /bin/sh -c 'echo preflight-node $SLURMD_NODENAME; echo preflight-pid $$; exec python3 -S -c BOOTSTRAP'

--no-kill (srun(1), salloc(1)): by default Slurm ends the whole step, and the whole job, when one of its
nodes fails (slurmd not responding for SlurmdTimeout, or set DOWN): every other node's result would be
lost to the one dead node this run is there to name (seen at 1,000 simulated nodes: the node whose slurmd
was stopped went DOWN mid-run, and srun ended with "Slurm job 1 has expired" for all 999 others). With it,
the step goes on without that node, which is named by its own timeout. The job preflight makes with
salloc carries it too; where preflight runs inside a job of the user's, that job's setting stands.

The all-reduce with one rank a node may run in a kept step; more ranks get a step with a task per rank (see run).

slurmd's own tree fan-out carries the launch. `--input=all` hands srun's stdin to every task: one
payload holds every node's config (`bundle.broadcast_config`: nodes with equal configs share one entry;
the bootstrap picks its own by SLURMD_NODENAME) and the line naming the zipped bundle, which `sbcast`
put on every node once for the run (preflight.slurm.broadcast; where sbcast fails, or a node refuses
the file, the zip itself goes on stdin as over SSH, and those nodes are re-run so); stdin then
stays open, so the bootstrap's EOF watchdog fires if preflight goes away. `--label` prefixes each output
line with the task id; the task's first line names its node. Phase 1's configs say `more`: after its
result each task waits for the next line on stdin, phase 2's configs (plans made from phase 1's facts),
so phase 2 costs no second launch, Python start or bundle transfer (at 64 simulated nodes, phase 2 went
from 6.5 s as its own step to 0.9 s). A phase in which a node timed out cancels the step; the next
phase then gets a step of its own.

Failures are named per node: a node that Slurm reports down/drained/not responding is not launched on
(its state and Slurm's reason are the failure); a slurmd that does not take the task launch is named
from srun's "Task launch ... failed on node X" and the step is re-run without it (a failed launch aborts
the whole step; nodes sbcast could not reach are tried alone first, see _broadcast); a node that has not
answered by its deadline is a timeout, and then the step is cancelled with `scancel J.S` so nothing
preflight started is left on any node.

Slurm commands are run with argv lists, never through a shell (preflight.slurm.scontrol runs them and
parses what they print; preflight.slurm.allocation makes and releases the job).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import select
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from preflight.common import fold
from preflight.errors import UsageError
from preflight.inventory import NodeSpec
from preflight.probe import runner
from preflight.slurm import broadcast
from preflight.slurm.allocation import ALLOC_WAIT_S, Allocation, allocate
from preflight.slurm.scontrol import (EXIT_RE, LAUNCH_REFUSED_RE, SCANCEL, SQUEUE, SRUN, STEP_ABORT_RE, SlurmError,
                                      controller_failure, parse_srun_stderr, run)
from preflight.transport import bundle
from preflight.transport.contract import NodeFailure, Outcome, Progress

log = logging.getLogger(__name__)

#: how long squeue/scancel may take to cancel a step (a loaded slurmctld at 1,000 nodes answers late)
SCANCEL_WAIT_S = 60.0

#: how long after srun says a node's task ended its last output may still be on the way (see _collect)
ENDED_GRACE_S = 1.0

#: how many times a run launches a step again for nodes whose launch only timed out, or whose step srun aborted
#: (see _launch_failure): each relaunch costs every node a task start, and at 1,000 simulated nodes new timeouts
#: came with each one (four relaunches of 999 tasks before this bound)
MAX_TIMEOUT_RELAUNCHES = 1

#: how a node's "launch failure" begins when srun aborted the step under it (see _collect, _launch_failure)
ABORTED = "srun aborted the step"

#: srun cuts task output lines at 1024 bytes (slurmstepd's buffer); the result JSON travels in shorter parts.
LINE_MAX = 900

_LABEL_RE = re.compile(rb"^\s*(\d+): ?(.*)$")


def failure_for(name: str, info: Dict[str, Any]) -> NodeFailure:
    reason = info.get("reason")
    return NodeFailure("unreachable", "Slurm reports %s %s%s" % (
        name, "+".join(info["state"]), " (reason: %s)" % reason if reason else ""))


# --- the transport -------------------------------------------------------------------------------


class _Task:
    def __init__(self) -> None:
        self.node: Optional[str] = None
        self.run = bundle.ResultReader()
        self.err = bytearray()


class _Step:
    """One srun step in flight: its process, its tasks (by label) and srun's own stderr."""

    def __init__(self, proc: subprocess.Popen, name: str, nodes: Sequence[str], per_node: int = 1) -> None:
        self.proc = proc
        self.name = name
        self.nodes = list(nodes)
        self.per_node = per_node  # tasks on each node (one per rank for a split bench run)
        self.tasks: Dict[int, _Task] = {}
        self.srun_err = bytearray()
        self.partial = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
        self.streams = [proc.stdout.fileno(), proc.stderr.fileno()]
        self.rc: Optional[int] = None
        self.stdin_lock = threading.Lock()  # writes in order: the payload, then each next phase's line
        #: {node: when} srun said a task of it ended while the step runs ("srun: error: n087: task 86:
        #: Killed"): a node that has not answered by then never will, and the phase need not wait for its
        #: deadline (what srun said is read again from srun_err with the rest, by parse_srun_stderr)
        self.ended_at: Dict[str, float] = {}

    def by_node(self) -> Dict[str, List[_Task]]:
        out: Dict[str, List[_Task]] = {}
        for label in sorted(self.tasks):
            task = self.tasks[label]
            if task.node:
                out.setdefault(task.node, []).append(task)
        return out

    def answered(self, names: Sequence[str]) -> List[str]:
        """The nodes all of whose tasks have printed their result."""
        by_node = self.by_node()
        return [n for n in names if sum(t.run.has_result() for t in by_node.get(n, [])) >= self.per_node]

    def read(self, timeout: float) -> None:
        """Read what srun printed within `timeout` s into the tasks (lines split by label)."""
        ready, _, _ = select.select(self.streams, [], [], timeout)
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                self.streams.remove(fd)
                rest, self.partial[fd] = self.partial[fd], b""
                if rest:
                    self._line(fd == self.proc.stdout.fileno(), rest)
                continue
            lines = (self.partial[fd] + data).split(b"\n")
            self.partial[fd] = lines.pop()
            for line in lines:
                self._line(fd == self.proc.stdout.fileno(), line)

    def _line(self, is_stdout: bool, line: bytes) -> None:
        m = _LABEL_RE.match(line)
        if not m:
            if not is_stdout:
                self.srun_err += line + b"\n"
                ended = EXIT_RE.match(line.decode("utf-8", "replace").strip())
                if ended:
                    self.ended_at.setdefault(ended.group(1), time.monotonic())
            return
        task = self.tasks.setdefault(int(m.group(1)), _Task())
        text = m.group(2)
        if is_stdout:
            if task.node is None and text.startswith(b"preflight-node "):
                task.node = text[15:].decode("utf-8", "replace").strip()
                return
            task.run.feed(text + b"\n")
        else:
            task.err += text + b"\n"


class SlurmFleet:
    """Runs the bundle on Slurm nodes: the transport contract's Fleet (preflight.transport.contract).

    Every phase of a run shares one srun step when it can: a phase run with `then=True` leaves its node
    processes waiting for the next phase's config, which the next `run` writes to the step's stdin
    (srun hands it to every task). A new step is launched only for the first phase, after a phase in
    which a node timed out or a launch failed (that step was cancelled), or for other nodes.
    """

    def __init__(self, specs: List[NodeSpec], alloc: Allocation, progress: Optional[Progress] = None,
                 kill_grace_s: float = 10.0) -> None:
        self.specs = {s.name: s for s in specs}
        self.alloc = alloc
        self.progress = progress or (lambda event, node: None)
        self.kill_grace_s = kill_grace_s
        self.dead: Dict[str, NodeFailure] = {n: failure_for(n, i) for n, i in alloc.excluded.items()}
        self.steps: List[int] = []  # tasks of every srun step launched (the report, the benchmark and the tests read it)
        self._step: Optional[_Step] = None  # the step in flight, or the one kept for the next phase
        self._lock = threading.Lock()
        self.launch_retried: Set[str] = set()  # nodes whose launch timed out once (see _launch_failure)
        self.timeout_relaunches = 0  # steps launched again for launch timeouts (at most MAX_TIMEOUT_RELAUNCHES)
        self.delivery: Optional[broadcast.Delivery] = None  # the run's sbcast of the bundle (before the first step)
        self.on_stdin: Dict[str, str] = {}  # nodes that refused the broadcast file: {node: why}; stdin for them
        pythons = {s.python for s in specs}
        if len(pythons) > 1:
            raise UsageError("nodes name different pythons (%s)" % ", ".join(sorted(pythons)),
                             "one srun step runs one command: use one `python` for all Slurm nodes")
        self.python = pythons.pop() if pythons else "python3"

    @classmethod
    def for_allocation(cls, specs: List[NodeSpec], alloc: Allocation, progress: Optional[Progress] = None) -> "SlurmFleet":
        return cls(specs, alloc, progress)

    # the Fleet interface -------------------------------------------------------------------------
    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float],
            then: bool = False) -> Dict[str, Outcome]:
        """Run the bundle once on each node named in configs; {node: Outcome} in input order.

        then=True: another phase follows on these nodes; keep their processes (and the step) for it.
        Configs that say "tasks": k (a bench run with k ranks on every node) get k tasks a node, one per
        rank ("split": the runner runs the rank SLURM_LOCALID picks), and each node's k results merged.
        """
        outcomes: Dict[str, Outcome] = {}
        for name in configs:
            self.progress("start", name)
            if name in self.dead:
                outcomes[name] = Outcome(name, failure=self.dead[name])
            elif name not in self.alloc.nodes:
                outcomes[name] = Outcome(name, failure=NodeFailure("unreachable", "%s is not in Slurm job %s" % (name, self.alloc.job_id)))
        todo = [n for n in configs if n not in outcomes]
        counts = {int(configs[n].get("tasks") or 1) for n in todo}
        per_node = counts.pop() if len(counts) == 1 else 1  # uneven ranks a node: each node's agent starts its own
        split = {"split": True} if per_node > 1 else {}
        gpus = per_node > 1 and all(configs[n].get("gpus_per_task") for n in todo) and self.alloc.gpus_held() > 0
        kept = self._step
        if kept is not None and not (todo and set(todo) <= set(kept.nodes) and kept.per_node == per_node == 1):
            self._end(kept)
            kept = None
        while todo:
            if kept is None and self.delivery is None:
                todo = self._broadcast(todo, outcomes)
                continue
            deadlines = {n: deadline_of(self.specs[n]) for n in todo}
            longest = max(deadlines.values())  # a kept task waits for the next phase as long as this one may last
            by_node = {n: dict(configs[n], deadline_s=deadlines[n] + 5, line_max=LINE_MAX, more=then,
                               wait_s=longest + bundle.NEXT_PHASE_SLACK_S, **split) for n in todo}
            started, sent_at = time.monotonic(), time.time()  # the deadlines count the launch too
            if kept is not None:
                step, kept = kept, None
                self._next_phase(step, by_node)
            else:
                step = self._launch(todo, by_node, per_node, gpus)
            got, launch_failed, whole, refused = self._collect(step, todo, deadlines, started, sent_at)
            if launch_failed or not then or not whole:
                self._end(step)
            outcomes.update(got)  # (none when a launch failed; those that answered when srun aborted the step)
            if refused:  # those nodes never ran: again, with the bundle on stdin (other nodes' outcomes stand)
                self._refused(refused)
            retried = []
            for name, why in launch_failed.items():
                failure = self._launch_failure(name, why)
                if failure is None:
                    retried.append(name)
                else:
                    self.dead[name] = failure
                    outcomes[name] = Outcome(name, failure=failure)
            if retried:
                self.timeout_relaunches += 1
                log.debug("%s run again in a new step (%s)", fold(retried), next(iter(launch_failed.values())))
            # a failed launch (or srun's abort) ended the whole step: run it again for the nodes not judged
            todo = [n for n in todo if n not in outcomes] if launch_failed or refused else []
        for name, outcome in outcomes.items():
            self.progress("done" if outcome.failure is None else "failed", name)
        return {name: outcomes[name] for name in configs}

    def _broadcast(self, todo: List[str], outcomes: Dict[str, Outcome]) -> List[str]:
        """sbcast the bundle before the first step (beside the step's 1,000 starting tasks it took 48-93 s at 1,000
        simulated nodes, 2.1 s before them; and srun aborts a whole started step for one slurmd that refuses its
        launch: 218 s and 431 machine CPU s with a dead slurmd, 142 s and 278 s this way). sbcast's word is no
        verdict (a frozen slurmd reads "Communication connection failure" there too, "Socket timed out" to srun):
        the nodes it could not reach get a launch of `true` alone; a refused one is judged and left out, any other
        stays in (a launch timeout is then retried as ever). The nodes left to run."""
        suspects = [n for n, why in self._deliver().node_errors.items() if n in todo and LAUNCH_REFUSED_RE.search(why)]
        for name, why in self._try_launch(suspects).items():
            if LAUNCH_REFUSED_RE.search(why):  # (only a refusal: a timeout here must not spend the run's relaunch)
                self.dead[name] = self._launch_failure(name, why)
                outcomes[name] = Outcome(name, failure=self.dead[name])
        return [n for n in todo if n not in outcomes]

    def _try_launch(self, names: List[str]) -> Dict[str, str]:
        """{node: launch failure} of `srun ... true` on these nodes (none for no nodes, or when srun did not answer)."""
        if not names:
            return {}
        try:
            said = run(self._argv(names, "preflight-launch-check", command=["true"]), timeout=SCANCEL_WAIT_S).stderr
        except SlurmError as exc:
            log.debug("launch check on %s: %s", fold(names), exc.args[0] if exc.args else exc)
            return {}
        launch = {n: why for n, why in parse_srun_stderr(said)[0].items() if n in names}
        log.debug("sbcast could not reach %s; a launch there: %s", fold(names), "; ".join(map(": ".join, launch.items())) or "ok")
        return launch

    def _launch_failure(self, name: str, why: str) -> Optional[NodeFailure]:
        """What a failed task launch on `name` says of the node: None the first time it is only a timeout, or srun
        aborted the step before the node answered (the node goes into the next step again).

        slurmd's forwarding (Slurm's forward.c): a node whose slurmd refuses the connection is marked alone and
        the forwarder moves on ("Communication connection failure": evidence about that node), but a forwarder
        that does not answer in time marks its whole subtree with its timeout. Seen at 1,000 simulated nodes
        (TreeWidth 50, load 540): 408 healthy nodes in runs of 50 said "Socket timed out on send/recv
        operation". A frozen slurmd says the same for itself alone. So a timeout is retried once, and a second
        one is no verdict on the node (retest; Slurm marks a slurmd that stays silent NOT_RESPONDING itself)."""
        aborted = why.startswith(ABORTED)
        if LAUNCH_REFUSED_RE.search(why) and not aborted:
            return NodeFailure("unreachable", "slurmd on %s did not take the task launch: %s" % (name, why))
        if name not in self.launch_retried and self.timeout_relaunches < MAX_TIMEOUT_RELAUNCHES:
            self.launch_retried.add(name)
            if not aborted:
                log.debug("task launch on %s failed (%s): retried once in the next step", name, why)
            return None
        again = ", twice" if name in self.launch_retried else " (the step was relaunched already)"
        if aborted:
            return NodeFailure("scheduler", (
                "not checked: %s%s before %s answered: Slurm's transport, no evidence against the node; rerun (if it "
                "repeats, the network between this host and the nodes, and slurmd's log there)") % (why, again, name))
        return NodeFailure("scheduler", (
            "not checked: Slurm could not start the task on %s%s (%s): a launch that times out is no evidence "
            "against the node (one late slurmd times out its whole forwarding subtree); if it repeats, read slurmd's "
            "log there and `scontrol show node %s`") % (name, again, why, name))

    keeps_ranks = staticmethod(lambda ranks: ranks == 1)  # one rank a node: the bench runs in the kept step (run)
    def cancel(self) -> None:
        """Cancel the step in flight (Ctrl-C): scancel, then kill srun."""
        with self._lock:
            step = self._step
        if step is not None:
            if step.proc.poll() is None:
                self._scancel(step.name)
            self._end(step)

    def describe(self) -> Dict[str, Any]:
        """What carried the run, for the report: {"kind": "slurm", "job": J, "steps": srun steps launched,
        "bundle": "sbcast" | "stdin", "bundle_on_stdin": nodes sent the bundle on stdin after all}."""
        how = "sbcast" if self.delivery is not None and self.delivery.file else "stdin"
        return {"kind": "slurm", "job": self.alloc.job_id, "steps": len(self.steps), "step_tasks": list(self.steps),
                "bundle": how, "bundle_on_stdin": sorted(self.on_stdin)}

    def close(self) -> None:
        with self._lock:
            step = self._step
        if step is not None:
            self._end(step)
        self.alloc.release_job()  # the reservation and held nodes are the caller's (cli: after --drain/--resume)

    def __enter__(self) -> "SlurmFleet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # one step ------------------------------------------------------------------------------------
    def _argv(self, names: Sequence[str], step_name: str, per_node: int = 1, gpus: bool = False,
              command: Optional[List[str]] = None) -> List[str]:
        """srun's argv for a step on `names` running the bootstrap (or `command`)."""
        shell = "echo preflight-node $SLURMD_NODENAME; " + bundle.remote_command(self.python)
        return [SRUN, "--jobid=%s" % self.alloc.job_id, "-N", str(len(names)), "-n", str(len(names) * per_node),
                "--ntasks-per-node=%d" % per_node, "-w", fold(names), "--kill-on-bad-exit=0", "--no-kill", "--label", "--input=all",
                # no CPU binding (task/affinity would pin each task, its probe threads or its rank and
                # NCCL's proxy threads, to one core); several tasks a node may outnumber the job's CPUs
                "--overlap", "--cpu-bind=none", "-J", step_name] + (["--overcommit"] if per_node > 1 else []) + (
                ["--gpus-per-task=1"] if gpus else []) + (command or ["/bin/sh", "-c", shell])

    def _launch(self, names: Sequence[str], by_node: Dict[str, Dict[str, Any]], per_node: int = 1,
                gpus: bool = False) -> _Step:
        step_name = "preflight-" + secrets.token_hex(4)
        env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CPU_BIND", "SLURM_NTASKS_PER_NODE")}
        argv = self._argv(names, step_name, per_node, gpus)
        log.debug("step %s: %s", step_name, " ".join(argv[:-1] + ["'...'"]))
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, env=env)
        except FileNotFoundError:
            raise SlurmError("srun not found", "install the Slurm client (slurm-client) or put it on PATH") from None
        step = _Step(proc, step_name, names, per_node)
        self.steps.append(len(names) * per_node)
        with self._lock:
            self._step = step
        self._write(step, bundle.stdin_payload(bundle.broadcast_config(by_node), self._bundle_file(names)))
        return step

    def _bundle_file(self, names: Sequence[str]) -> Optional[Tuple[str, str]]:
        """(path, sha256) of the bundle broadcast to the nodes (sbcast once per run, before the first step),
        or None: send it on stdin (sbcast failed, or one of these nodes refused the file before)."""
        if any(n in self.on_stdin for n in names):
            log.debug("bundle on stdin for %s: %s refused the broadcast file", fold(names),
                      fold([n for n in names if n in self.on_stdin]))
            return None
        return self._deliver().file

    def _deliver(self) -> broadcast.Delivery:
        """The run's broadcast of the bundle to every node of the job: made the first time it is asked for."""
        if self.delivery is None:
            started = time.monotonic()
            self.delivery = d = broadcast.deliver(self.alloc.job_id, list(self.alloc.nodes), bundle.base_zip())
            if d.file is None:
                log.debug("bundle on stdin to every node: %s", d.why)
            else:
                log.debug("bundle broadcast with sbcast as %s in %.2f s (%d of %d nodes had it already)%s",
                          d.file[0], time.monotonic() - started, d.kept, len(self.alloc.nodes),
                          "; sbcast failed on %s: %s" % (fold(d.node_errors), next(iter(d.node_errors.values())))
                          if d.node_errors else "")
        return self.delivery

    def _refused(self, refused: Dict[str, str]) -> None:
        """Log the nodes that refused the broadcast file (by reason) and send them the bundle on stdin from now on."""
        self.on_stdin.update(refused)
        by_why: Dict[str, List[str]] = {}
        for name, why in refused.items():
            by_why.setdefault(why.split(": ", 1)[-1], []).append(name)
        for why, names in by_why.items():
            # a missing file is sbcast's failure there (said with --debug); anything else was put there
            level = logging.DEBUG if "No such file" in why else logging.WARNING
            log.log(level, "%s refused the broadcast probe bundle (%s: %s): sent on stdin instead",
                    fold(names), self.delivery.file[0] if self.delivery and self.delivery.file else "?", why)

    def _next_phase(self, step: _Step, by_node: Dict[str, Dict[str, Any]]) -> None:
        """The kept step's processes get the next phase's config (nodes not named in it exit)."""
        for task in step.tasks.values():
            task.run, task.err = bundle.ResultReader(), bytearray()
        line = json.dumps(bundle.broadcast_config(by_node), separators=(",", ":")).encode() + b"\n"
        log.debug("step %s: next phase on %d nodes, same processes (%d bytes to every node)", step.name, len(by_node), len(line))
        self._write(step, line)

    @staticmethod
    def _write(step: _Step, data: bytes, close: bool = False) -> None:
        """Hand srun the data (then close its stdin, with close) from a thread of its own: srun takes its
        stdin only as fast as it forwards it to the tasks, and a stuck node must not stop the deadlines,
        which _collect keeps. Writes keep their order (the payload, each next phase's line, the close)."""
        def write() -> None:
            with step.stdin_lock:
                try:
                    if data:
                        step.proc.stdin.write(data)
                        step.proc.stdin.flush()
                except (BrokenPipeError, ValueError, OSError):  # srun is gone: _collect names every node
                    pass
                if close:
                    try:
                        step.proc.stdin.close()
                    except (BrokenPipeError, ValueError, OSError):
                        pass
        threading.Thread(target=write, name="preflight-srun-stdin", daemon=True).start()

    def _collect(self, step: _Step, names: Sequence[str], deadlines: Dict[str, float], started: float,
                 sent_at: float) -> Tuple[Dict[str, Outcome], Dict[str, str], bool, Dict[str, str]]:
        """This phase's outcomes, {node: launch failure} (or, when srun aborted the step, {node: why} of the nodes
        it killed unfinished: no outcome, they run again), whether the step is whole (every node answered; none
        timed out, the step was not cancelled and srun still runs), and {node: why} of the nodes that refused
        the broadcast bundle file (no outcome: they ran nothing)."""
        end = started + max(deadlines.values())
        timed_out: Dict[str, float] = {}
        while step.streams:
            now = time.monotonic()
            answered = step.answered(names)
            if len(answered) == len(names):
                break
            # the rest ended without a result (srun said so on stderr ENDED_GRACE_S ago: what the task printed
            # last travels on srun's stdout, a separate pipe, and may come after): no deadline to wait for
            gone = sum(1 for n in names if n not in answered and now - step.ended_at.get(n, now) >= ENDED_GRACE_S)
            if gone and len(answered) + gone == len(names):
                break
            for name in names:  # a node past its own deadline without a result is a timeout
                if name not in answered and now - started > deadlines[name]:
                    timed_out.setdefault(name, deadlines[name])
            if now >= end or (timed_out and len(answered) + len(timed_out) >= len(names)):
                self._scancel(step.name)
                break
            step.read(min(max(end - now, 0.01), 0.5))
        if not step.streams:
            step.rc = step.proc.wait()
        said = step.srun_err.decode("utf-8", "replace")
        launch, exits = parse_srun_stderr(said)
        srun_said = [line for line in said.splitlines() if "error:" in line]
        if launch:
            return {}, {n: why for n, why in launch.items() if n in names}, False, {}
        by_node = step.by_node()
        abort = STEP_ABORT_RE.search(said)
        if abort:  # every unfinished task was killed with the step: those nodes run again (the others' results stand)
            index = int(abort.group(1))
            task = step.tasks.get(index * step.per_node)
            why = "%s: its I/O connection to %s's slurmstepd broke" % (
                ABORTED, task.node if task and task.node else "node %d of the step" % index)
            answered = set(step.answered(names))
            log.debug("step %s: %s", step.name, abort.group(0))
            again = {n: why for n in names if n not in answered and n not in timed_out}
        else:
            again = {}
        controller = controller_failure(said)
        outcomes: Dict[str, Outcome] = {}
        refused: Dict[str, str] = {}
        job_ended = controller is not None and controller.endswith("has expired")
        for name in (n for n in names if n not in again):
            tasks = by_node.get(name, [])
            why_not = next((t.run.refused for t in tasks if t.run.refused), None)
            if why_not and name not in timed_out:
                refused[name] = why_not
                continue
            if name in timed_out:
                outcomes[name] = Outcome(name, failure=NodeFailure(
                    "timeout", "timed out: no answer within %g s; cancelled the Slurm step" % timed_out[name]))
                continue
            if len(tasks) < step.per_node and controller and (job_ended or not by_node) and name not in exits:
                # srun never ran the step anywhere, for a reason of slurmctld's, or the job ended under the
                # step: no verdict on the nodes that had not answered (469 node FAILs for one starved
                # slurmctld at 512 simulated nodes, 999 for one DOWN node at 1,000, before this)
                outcomes[name] = Outcome(name, failure=NodeFailure("scheduler", self._not_run(controller, job_ended)))
                continue
            if len(tasks) < step.per_node:
                why = exits.get(name) or "no output from %s (srun rc %s%s)" % (
                    "the task" if step.per_node == 1 else "%d of its %d tasks" % (step.per_node - len(tasks), step.per_node),
                    step.rc, ": " + srun_said[-1][:300] if srun_said else "")
                outcomes[name] = Outcome(name, failure=NodeFailure("protocol", "probe bundle gave no result: %s" % why))
                continue
            runs = []
            for task in tasks:
                task.run.err += task.err
                runs.append(task.run.finish(None, sent_at, started))
            lost = [r for r in runs if r.result is None]
            if lost:
                tail = [lost[0].damage] if lost[0].damage else lost[0].stderr.strip().splitlines()[-1:] or [exits.get(name) or "no output"]
                outcomes[name] = Outcome(name, run=lost[0], failure=NodeFailure(
                    "damaged" if lost[0].damage else "protocol", "probe bundle exited without a result: %s" % tail[0][:300]))
            else:
                outcomes[name] = Outcome(name, result=runner.merge([r.result for r in runs]), run=runs[0])
        # a node whose task ended (srun said so) has no process left in the step: the others' step goes on
        whole = step.rc is None and not timed_out and not refused and all(
            o.failure is None or n in step.ended_at for n, o in outcomes.items())
        log.debug("step %s: %d of %d nodes answered in %.2f s%s", step.name, len(names) - sum(
            1 for o in outcomes.values() if o.failure), len(names), time.monotonic() - started,
                  "; srun said: " + " / ".join(srun_said[-3:]) if srun_said else "")
        return outcomes, again, whole and not again, refused

    def _not_run(self, controller: str, job_ended: bool) -> str:
        """Why a node got no task from a step srun could not run, for a reason of Slurm's (never the node's)."""
        job = self.alloc.job_id
        if job_ended:
            return ("not checked: Slurm ended job %s before this node answered (%s): Slurm's doing, not this node's; "
                    "rerun (scontrol show job %s says why)" % (job, controller, job))
        if controller.startswith("Only allocated"):
            return ("not checked: srun could not run the step (%s): Slurm's job %s holds fewer nodes than the step "
                    "named (slurmctld took one out during the run), not this node's fault; rerun (scontrol show job %s)"
                    % (controller, job, job))
        return ("not checked: srun could not run the step (%s): Slurm's controller did not answer, not this node; "
                "run again when slurmctld answers (sdiag, slurmctld's log)" % controller)

    def _end(self, step: _Step) -> None:
        """Close the step's stdin (its tasks exit: an unfinished one through its EOF watchdog), read
        srun's last output, wait for srun, kill its process group if it will not end."""
        with self._lock:
            if self._step is step:
                self._step = None
        proc = step.proc
        # a task waiting for a next phase exits 0; then EOF (an unfinished task's watchdog kills it)
        self._write(step, b'{"groups":[]}\n' if proc.poll() is None else b"", close=True)
        until = time.monotonic() + self.kill_grace_s
        while step.streams and time.monotonic() < until:
            step.read(0.2)
        try:
            step.rc = proc.wait(timeout=max(0.1, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            step.rc = proc.wait()
        finally:
            for stream in (proc.stdout, proc.stderr):
                stream.close()

    def _scancel(self, step_name: Optional[str]) -> None:
        """Cancel our step (found by its unique name) so no task outlives the deadline.

        A slurmctld too busy to answer within SCANCEL_WAIT_S does not end the run (the nodes' verdicts
        are in): _end then kills srun, whose tasks' bootstraps see their stdin end and kill their own
        process groups, so nothing outlives the run either way; a warning says so."""
        if not step_name:
            return
        try:
            out = run([SQUEUE, "-h", "-s", "-j", self.alloc.job_id, "-o", "%i %j"], timeout=SCANCEL_WAIT_S)
            for line in out.stdout.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == step_name:
                    run([SCANCEL, "--signal=KILL", parts[0]], timeout=SCANCEL_WAIT_S)
                    run([SCANCEL, parts[0]], timeout=SCANCEL_WAIT_S)
        except SlurmError as exc:
            log.warning("could not cancel step %s of job %s (%s): ending its srun instead; each task ends "
                        "when its stdin does", step_name, self.alloc.job_id, exc.args[0] if exc.args else exc)


def fleet_for(inv: Any, progress: Optional[Progress] = None) -> SlurmFleet:
    """The Slurm transport for an inventory: its allocation, or one made now for its nodes (released at close)."""
    alloc = inv.allocation
    if alloc is None:
        alloc = allocate(nodelist=fold(s.name for s in inv.nodes), timeout=inv.cluster.get("alloc_wait_s", ALLOC_WAIT_S))
        inv.allocation = alloc
    return SlurmFleet(inv.nodes, alloc, progress)

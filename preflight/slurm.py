"""Slurm as a transport: the allocation is the inventory, one srun step per phase carries the bundle.

The same contract as preflight.gather.Fleet — `run(configs, deadline_of) -> {node: Outcome}` — so the
engine, the rules, the report and the bench never know which engine carried the bundle.

One phase is one job step across all its nodes, one task per node:

    srun --jobid J -N n -n n --ntasks-per-node=1 -w NODES --kill-on-bad-exit=0 --label --input=all \
         -J preflight-TOKEN /bin/sh -c 'echo preflight-node $SLURMD_NODENAME; echo preflight-pid $$; exec python3 -c BOOTSTRAP'

slurmd's own tree fan-out carries the launch. `--input=all` hands srun's stdin to every task: one
payload holds every node's config keyed by node name (`{"by_node": {...}}`, picked by the bootstrap
from SLURMD_NODENAME) and the zipped bundle, exactly as over SSH; stdin then stays open, so the
bootstrap's EOF watchdog fires if preflight goes away. `--label` prefixes each output line with the
task id; the task's first line names its node.

Failures are named per node: a node that Slurm reports down/drained/not responding is not launched on
(its state and Slurm's reason are the failure); a slurmd that does not take the task launch is named
from srun's "Task launch ... failed on node X" and the step is re-run without it (a failed launch aborts
the whole step); a node that has not answered by its deadline is a timeout, and then the step is
cancelled with `scancel J.S` so nothing preflight started is left on any node.

Slurm commands are run with argv lists, never through a shell. Output formats (scontrol(1), srun(1),
salloc(1) of Slurm 22.05): `scontrol -o show node` prints one `Key=Value ...` line per node with
`Reason=` last before the optional `Comment=`/`Extra=`; salloc prints `salloc: Granted job allocation N`.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from preflight import bundle
from preflight.common import expand, fold
from preflight.errors import PreflightError, UsageError
from preflight.gather import Outcome, Progress
from preflight.inventory import NodeSpec
from preflight.transport import NodeFailure, _Run

SRUN = "srun"
SALLOC = "salloc"
SCONTROL = "scontrol"
SCANCEL = "scancel"
SQUEUE = "squeue"

#: Slurm node states (base or flag) in which a node cannot run the probe.
BAD_STATES = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
              "POWER_DOWN", "POWERING_DOWN", "FUTURE", "UNKNOWN", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED")

#: srun cuts task output lines at 1024 bytes (slurmstepd's buffer); the result JSON travels in shorter parts.
LINE_MAX = 900

_LABEL_RE = re.compile(rb"^\s*(\d+): ?(.*)$")
_LAUNCH_FAIL_RE = re.compile(r"Task launch for \S+ failed on node (\S+?):\s*(.+)$")
_EXIT_RE = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
_GRANTED_RE = re.compile(r"Granted job allocation (\d+)")


class SlurmError(PreflightError):
    """Slurm could not be used (no allocation, a command failed, bad node list)."""


# --- parsers (pure) ------------------------------------------------------------------------------


def parse_show_node(text: str) -> Dict[str, Dict[str, Any]]:
    """`scontrol -o show node [LIST]` -> {node: {"state": [..], "reason": str|None, "gpus": int|None}}.

    One line per node; values hold no spaces except Reason= (free text, possibly followed by a
    `[user@time]` stamp), which runs until a following ` Comment=`/` Extra=` field or the end.
    """
    nodes: Dict[str, Dict[str, Any]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("NodeName="):
            raise ValueError("line %d is not a `scontrol -o show node` line: %r" % (lineno, line[:80]))
        reason = None
        m = re.search(r"(?:^| )Reason=(.*?)(?= (?:Comment|Extra)=|$)", line)
        if m:
            reason = re.sub(r"\s*\[[^\]@]*@[^\]]*\]$", "", m.group(1)).strip()  # drop the [user@time] stamp
            line = line[: m.start()] + line[m.end():]
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        state = fields.get("State")
        if state is None:
            raise ValueError("line %d has no State=: %r" % (lineno, line[:80]))
        gres = fields.get("Gres", "(null)")
        nodes[fields["NodeName"]] = {"state": state.split("+"), "reason": reason or None, "gpus": _gres_gpus(gres)}
    return nodes


def _gres_gpus(gres: str) -> int:
    """GPUs in a Gres= value: gpu:8, gpu:h100:8(S:0-1), gpu:a100:4,gpu:v100:2 -> 8, 8, 6; (null) -> 0."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def bad_state(state: Sequence[str]) -> bool:
    """True when a node in this state (list of base state and flags) must not be launched on."""
    return any(s.rstrip("*") in BAD_STATES for s in state) or any(s.endswith("*") for s in state)


def parse_srun_stderr(text: str) -> Tuple[Dict[str, str], Dict[str, str]]:
    """srun's own error lines -> ({node: launch failure}, {node: task exit message})."""
    launch: Dict[str, str] = {}
    exits: Dict[str, str] = {}
    for line in text.splitlines():
        m = _LAUNCH_FAIL_RE.search(line)
        if m:
            launch[m.group(1)] = m.group(2).strip()
            continue
        m = _EXIT_RE.match(line.strip())
        if m:
            exits[m.group(1)] = m.group(3).strip()
    return launch, exits


# --- running Slurm commands ----------------------------------------------------------------------


def _run(argv: List[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError("%s not found" % argv[0], "install the Slurm client (slurm-client) or put it on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError("%s did not answer within %g s" % (" ".join(argv[:3]), timeout),
                         "check that slurmctld is up (scontrol ping)") from None


def node_info(names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Slurm's view of the named nodes (state, reason, GPUs), from one `scontrol -o show node`."""
    out = _run([SCONTROL, "-o", "show", "node", fold(names)])
    if out.returncode != 0:
        raise SlurmError("scontrol show node %s failed: %s" % (fold(names), out.stderr.strip()[:300]),
                         "check the node names (sinfo -N)")
    try:
        info = parse_show_node(out.stdout)
    except ValueError as exc:
        raise SlurmError("cannot read scontrol's output: %s" % exc) from None
    missing = [n for n in names if n not in info]
    if missing:
        raise SlurmError("Slurm does not know %s" % fold(missing), "check the node names (sinfo -N)")
    return info


def failure_for(name: str, info: Dict[str, Any]) -> NodeFailure:
    reason = info.get("reason")
    return NodeFailure("unreachable", "Slurm reports %s %s%s" % (
        name, "+".join(info["state"]), " (reason: %s)" % reason if reason else ""))


@dataclass
class Allocation:
    """A Slurm job whose nodes preflight runs on; owned=True when preflight made it (and releases it)."""

    job_id: str
    nodes: List[str]
    owned: bool = False
    excluded: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # nodes Slurm reported unusable
    state: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # Slurm's view of every node before the run
    held: Dict[str, str] = field(default_factory=dict)  # preflight-drained nodes resumed into our reservation
    reservation: Optional[str] = None

    def release(self) -> None:
        if self.owned:
            self.owned = False
            _run([SCANCEL, self.job_id])
        if self.reservation:
            resv, self.reservation = self.reservation, None
            for _ in range(20):  # the reservation can be deleted once the job has left its nodes
                if _run([SCONTROL, "delete", "reservation=%s" % resv]).returncode == 0:
                    break
                time.sleep(0.5)


def current_allocation(environ: Optional[Dict[str, str]] = None) -> Allocation:
    """The allocation this process runs in (salloc shell, sbatch script): SLURM_JOB_ID and its nodelist."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise UsageError("--slurm without --nodelist/--partition needs an allocation (SLURM_JOB_ID is not set)",
                         "run inside salloc/sbatch, or give --nodelist gpu-[001-064] or --partition P --nodes N")
    try:
        nodes = expand(nodelist)
    except ValueError as exc:
        raise SlurmError("SLURM_JOB_NODELIST %r: %s" % (nodelist, exc)) from None
    return Allocation(job, nodes)


def allocate(nodelist: Optional[str] = None, partition: Optional[str] = None, nodes: Optional[int] = None,
             time_limit: str = "30", timeout: float = 120.0, recheck_ours: bool = False) -> Allocation:
    """Make an allocation for this run (salloc --no-shell); nodes Slurm reports unusable are left out.

    With a nodelist, down/drained nodes are named before allocating: asking for them would make the
    job wait forever. With --partition/--nodes, Slurm picks N usable nodes itself.

    recheck_ours (--resume): nodes drained by preflight (reason `preflight:`, slurmd responding) are
    checked too. A drained node cannot be allocated, so they go into a MAINT reservation with the
    run's other nodes, are resumed inside it (no other job can start there), and the caller drains
    again every one that does not pass (Allocation.held keeps their old reasons).
    """
    from preflight import drain
    argv = [SALLOC, "--no-shell", "-J", "preflight", "-t", time_limit, "--immediate=%d" % int(timeout)]
    excluded: Dict[str, Dict[str, Any]] = {}
    if nodelist:
        try:
            wanted = expand(nodelist)
        except ValueError as exc:
            raise UsageError("--nodelist %r: %s" % (nodelist, exc), "write ranges like gpu-[001-064]") from None
        info = node_info(wanted)
        excluded = {n: info[n] for n in wanted if bad_state(info[n]["state"])}
        held = {}
        if recheck_ours:
            held = {n: i["reason"] for n, i in excluded.items() if drain.ours(i["reason"]) and
                    not any(x.rstrip("*") in ("DOWN", "NOT_RESPONDING") or x.endswith("*") for x in i["state"])}
            excluded = {n: i for n, i in excluded.items() if n not in held}
        usable = [n for n in wanted if n not in excluded]
        if not usable:
            return Allocation("", [], False, excluded, info)
        resv = _hold(usable, held) if held else None
        argv += ["-N", str(len(usable)), "-w", fold(usable)] + (["--reservation=%s" % resv] if resv else [])
    elif nodes:
        argv += ["-N", str(nodes)]
        info, held, resv = {}, {}, None
    else:
        raise UsageError("--partition needs --nodes N", "e.g. --partition gpu --nodes 16")
    if partition:
        argv += ["-p", partition]
    out = _run(argv, timeout + 10)
    m = _GRANTED_RE.search(out.stderr + out.stdout)
    if out.returncode != 0 or not m:
        if resv:
            Allocation("", [], held=held, reservation=resv).release()
            _redrain(held)
        raise SlurmError("salloc failed: %s" % (out.stderr.strip().splitlines() or ["rc %d" % out.returncode])[-1][:300],
                         "check the partition and node names (sinfo)")
    job = m.group(1)
    got = _run([SQUEUE, "-h", "-j", job, "-o", "%N"])
    try:
        names = expand(got.stdout.strip())
    except ValueError:
        _run([SCANCEL, job])
        raise SlurmError("cannot read the nodes of job %s: %r" % (job, got.stdout.strip())) from None
    return Allocation(job, names, True, excluded, info, held, resv)


def _hold(nodes: Sequence[str], held: Dict[str, str]) -> str:
    """A MAINT reservation over `nodes`, then resume the held (preflight-drained) ones inside it."""
    import pwd

    resv = "preflight-" + secrets.token_hex(4)
    out = _run([SCONTROL, "create", "reservation", "ReservationName=%s" % resv, "Nodes=%s" % fold(nodes),
                "StartTime=now", "Duration=30", "Users=%s" % pwd.getpwuid(os.getuid()).pw_name,
                "Flags=maint,ignore_jobs"])
    if out.returncode != 0:
        raise SlurmError("cannot reserve %s to recheck drained nodes: %s" % (fold(nodes), out.stderr.strip()[:200]),
                         "run --resume as a Slurm operator (root or SlurmUser)")
    for node in held:
        _run([SCONTROL, "update", "nodename=%s" % node, "state=resume"])
    return resv


def _redrain(held: Dict[str, str]) -> None:
    for node, reason in held.items():
        _run([SCONTROL, "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason])


def specs_for(alloc: Allocation, python: str = "python3", command_timeout: float = 60.0,
              gpus_per_node: Optional[int] = None) -> List[NodeSpec]:
    """NodeSpecs for Slurm nodes (name = host = the Slurm node name); GPUs from Slurm's Gres unless given."""
    names = list(alloc.nodes) + list(alloc.excluded)
    info = dict(alloc.excluded)
    info.update(alloc.state)
    return [NodeSpec(name=n, host=n, line=0, python=python, command_timeout=command_timeout,
                     gpus_per_node=gpus_per_node if gpus_per_node is not None else int(info.get(n, {}).get("gpus") or 0))
            for n in sorted(names, key=_natural)]


def _natural(name: str) -> List[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# --- the transport -------------------------------------------------------------------------------


class _Task:
    def __init__(self) -> None:
        self.node: Optional[str] = None
        self.run = _Run()
        self.err = bytearray()
        self.done_at: Optional[float] = None


class SlurmFleet:
    """Runs the bundle on Slurm nodes, one srun step per phase. Same interface as gather.Fleet."""

    def __init__(self, specs: List[NodeSpec], alloc: Allocation, progress: Optional[Progress] = None,
                 kill_grace_s: float = 10.0) -> None:
        self.specs = {s.name: s for s in specs}
        self.alloc = alloc
        self.progress = progress or (lambda event, node: None)
        self.kill_grace_s = kill_grace_s
        self.dead: Dict[str, NodeFailure] = {n: failure_for(n, i) for n, i in alloc.excluded.items()}
        self._proc: Optional[subprocess.Popen] = None
        self._step_name: Optional[str] = None
        self._lock = threading.Lock()
        pythons = {s.python for s in specs}
        if len(pythons) > 1:
            raise UsageError("nodes name different pythons (%s)" % ", ".join(sorted(pythons)),
                             "one srun step runs one command: use one `python` for all Slurm nodes")
        self.python = pythons.pop() if pythons else "python3"

    @classmethod
    def for_allocation(cls, specs: List[NodeSpec], alloc: Allocation, progress: Optional[Progress] = None) -> "SlurmFleet":
        return cls(specs, alloc, progress)

    # the Fleet interface -------------------------------------------------------------------------
    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float]) -> Dict[str, Outcome]:
        outcomes: Dict[str, Outcome] = {}
        for name in configs:
            self.progress("start", name)
            if name in self.dead:
                outcomes[name] = Outcome(name, failure=self.dead[name])
            elif name not in self.alloc.nodes:
                outcomes[name] = Outcome(name, failure=NodeFailure("unreachable", "%s is not in Slurm job %s" % (name, self.alloc.job_id)))
        todo = [n for n in configs if n not in outcomes]
        while todo:
            got, launch_failed = self._step({n: configs[n] for n in todo}, {n: deadline_of(self.specs[n]) for n in todo})
            for name, why in launch_failed.items():
                failure = NodeFailure("unreachable", "slurmd on %s did not take the task launch: %s" % (name, why))
                self.dead[name] = failure
                outcomes[name] = Outcome(name, failure=failure)
            if launch_failed:  # a failed launch aborts the whole step: run it again without those nodes
                todo = [n for n in todo if n not in launch_failed]
                continue
            outcomes.update(got)
            todo = []
        for name, outcome in outcomes.items():
            self.progress("done" if outcome.failure is None else "failed", name)
        return {name: outcomes[name] for name in configs}

    def cancel(self) -> None:
        """Cancel the step in flight (Ctrl-C): scancel, then kill srun."""
        with self._lock:
            proc, step_name = self._proc, self._step_name
        if proc is not None and proc.poll() is None:
            self._scancel(step_name)
            self._reap(proc)

    def close(self) -> None:
        self.alloc.release()

    def __enter__(self) -> "SlurmFleet":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # one step ------------------------------------------------------------------------------------
    def _argv(self, names: Sequence[str], step_name: str) -> List[str]:
        shell = "echo preflight-node $SLURMD_NODENAME; " + bundle.remote_command(self.python)
        return [SRUN, "--jobid=%s" % self.alloc.job_id, "-N", str(len(names)), "-n", str(len(names)),
                "--ntasks-per-node=1", "-w", fold(names), "--kill-on-bad-exit=0", "--label", "--input=all",
                "--overlap", "-J", step_name, "/bin/sh", "-c", shell]

    def _step(self, configs: Dict[str, Dict[str, Any]], deadlines: Dict[str, float]) -> Tuple[Dict[str, Outcome], Dict[str, str]]:
        names = list(configs)
        step_name = "preflight-" + secrets.token_hex(4)
        payload = bundle.stdin_payload({"by_node": {n: dict(configs[n], deadline_s=deadlines[n] + 5, line_max=LINE_MAX)
                                                  for n in names}})
        started = time.monotonic()
        sent_at = time.time()
        env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CPU_BIND", "SLURM_NTASKS_PER_NODE")}
        try:
            proc = subprocess.Popen(self._argv(names, step_name), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, env=env)
        except FileNotFoundError:
            raise SlurmError("srun not found", "install the Slurm client (slurm-client) or put it on PATH") from None
        with self._lock:
            self._proc, self._step_name = proc, step_name
        tasks: Dict[int, _Task] = {}
        srun_err = bytearray()
        partial = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}
        timed_out: Dict[str, float] = {}
        try:
            try:
                proc.stdin.write(payload)
                proc.stdin.flush()
            except BrokenPipeError:
                pass
            streams = [proc.stdout.fileno(), proc.stderr.fileno()]
            end = started + max(deadlines.values())
            while streams:
                now = time.monotonic()
                by_node = {t.node: t for t in tasks.values() if t.node}
                for name in names:  # a node past its own deadline without a result is a timeout
                    task = by_node.get(name)
                    if (task is None or task.run.out.find(b"preflight-result ") < 0) and now - started > deadlines[name]:
                        timed_out.setdefault(name, deadlines[name])
                answered = sum(1 for t in tasks.values() if b"preflight-result " in t.run.out)
                if now >= end or (timed_out and answered + len(timed_out) >= len(names)):
                    self._scancel(step_name)
                    break
                ready, _, _ = select.select(streams, [], [], min(max(end - now, 0.01), 0.5))
                for fd in ready:
                    data = os.read(fd, 65536)
                    if not data:
                        streams.remove(fd)
                        continue
                    buf = partial[fd] + data
                    lines = buf.split(b"\n")
                    partial[fd] = lines.pop()
                    for line in lines:
                        self._line(fd == proc.stdout.fileno(), line, tasks, srun_err)
            for fd, rest in partial.items():
                if rest:
                    self._line(fd == proc.stdout.fileno(), rest, tasks, srun_err)
        finally:
            rc = self._reap(proc)
            with self._lock:
                self._proc = self._step_name = None
        launch, exits = parse_srun_stderr(srun_err.decode("utf-8", "replace"))
        if launch:
            return {}, {n: why for n, why in launch.items() if n in configs}
        by_node = {t.node: t for t in tasks.values() if t.node}
        outcomes: Dict[str, Outcome] = {}
        for name in names:
            task = by_node.get(name)
            if name in timed_out:
                outcomes[name] = Outcome(name, failure=NodeFailure(
                    "timeout", "timed out: no answer within %g s; cancelled the Slurm step" % timed_out[name]))
                continue
            if task is None:
                why = exits.get(name) or "no output from the task (srun rc %s)" % rc
                outcomes[name] = Outcome(name, failure=NodeFailure("protocol", "probe bundle gave no result: %s" % why))
                continue
            task.run.err += task.err
            run = task.run.finish(None, sent_at, started)
            if run.result is None:
                tail = run.stderr.strip().splitlines()[-1:] or [exits.get(name) or "no output"]
                outcomes[name] = Outcome(name, run=run, failure=NodeFailure(
                    "protocol", "probe bundle exited without a result: %s" % tail[0][:300]))
            else:
                outcomes[name] = Outcome(name, result=run.result, run=run)
        return outcomes, {}

    @staticmethod
    def _line(is_stdout: bool, line: bytes, tasks: Dict[int, _Task], srun_err: bytearray) -> None:
        m = _LABEL_RE.match(line)
        if not m:
            if not is_stdout:
                srun_err += line + b"\n"
            return
        task = tasks.setdefault(int(m.group(1)), _Task())
        text = m.group(2)
        if is_stdout:
            if task.node is None and text.startswith(b"preflight-node "):
                task.node = text[15:].decode("utf-8", "replace").strip()
                return
            task.run.feed(text + b"\n")
        else:
            task.err += text + b"\n"

    def _scancel(self, step_name: Optional[str]) -> None:
        """Cancel our step (found by its unique name) so no task outlives the deadline."""
        if not step_name:
            return
        out = _run([SQUEUE, "-h", "-s", "-j", self.alloc.job_id, "-o", "%i %j"], timeout=15)
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == step_name:
                _run([SCANCEL, "--signal=KILL", parts[0]], timeout=15)
                _run([SCANCEL, parts[0]], timeout=15)

    def _reap(self, proc: subprocess.Popen) -> Optional[int]:
        """Close srun's stdin (tasks see EOF), wait for srun to end, kill its process group if it will not."""
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            return proc.wait(timeout=self.kill_grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return proc.wait()
        finally:
            for stream in (proc.stdout, proc.stderr):
                stream.close()


def fleet_for(inv: Any, progress: Optional[Progress] = None) -> SlurmFleet:
    """The Slurm transport for an inventory: its allocation, or one made now for its nodes (released at close)."""
    alloc = inv.allocation
    if alloc is None:
        alloc = allocate(nodelist=fold(s.name for s in inv.nodes))
        inv.allocation = alloc
    return SlurmFleet(inv.nodes, alloc, progress)


def inventory(alloc: Allocation, python: str = "python3", command_timeout: float = 60.0,
              gpus_per_node: Optional[int] = None, master_port: int = 29500) -> Any:
    """An Inventory of an allocation's nodes (plus the ones Slurm reported unusable, as failures)."""
    from preflight.inventory import Inventory

    label = "slurm job %s" % alloc.job_id if alloc.job_id else "slurm"
    if not alloc.state and alloc.nodes:
        alloc.state = node_info(alloc.nodes)
    if gpus_per_node is None:
        for name, i in alloc.state.items():
            alloc.excluded.get(name, {}).setdefault("gpus", i.get("gpus"))
    return Inventory(path=label, nodes=specs_for(alloc, python, command_timeout, gpus_per_node),
                     master_port=master_port, cluster={"master_port": master_port, "mtu_full_mesh": False, "allreduce": {}},
                     transport="slurm", allocation=alloc)

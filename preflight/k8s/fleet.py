"""Kubernetes as a transport: the bundle goes into each node's agent pod over `kubectl exec -i`.

The same contract as preflight.transport.pool.SessionPool — `run(configs, deadline_of) -> {node: Outcome}`,
cancel, close, describe — and in fact the same pool: KubeFleet is a SessionPool whose sessions are KubeSessions,
so the engine, the rules, the report and the bench never know which backend carried the bundle.

One phase on one node is one process on the controller:

    kubectl [--context C] exec -i -n preflight <agent pod> -c agent -- \
        setsid -w sh -c 'echo preflight-pid $$; exec python3 -S -c BOOTSTRAP'

with bundle.stdin_payload (config line, zip) on kubectl's stdin, exactly as over SSH. `setsid` puts the
probe in a process group of its own inside the container, so the bootstrap's safety nets (kill its group
on stdin EOF or on its deadline) kill the probe and nothing else. kubectl ≥ 1.30 execs over WebSocket
(v5.channel.k8s.io) and, when its own stdin ends, sends "close stdin" to the node: preflight therefore
keeps kubectl's stdin open until the result line has arrived; the EOF the node sees then really means the
controller is done or gone, which is what the bootstrap's watchdog takes it for.

Phase 2 (the pings and the rendezvous port, planned from phase 1's facts) goes down the same stream:
phase 1's config says `more`, and the node's process waits for the next config line after its result, as
over SSH, so a run costs one exec a node. The all-reduce is not exec'd into the agents: KubeFleet hands
bench configs to an Indexed Job whose pods hold the nodes' GPUs (preflight.k8s.benchjob).

Failures are named per node: a node without a Ready agent pod is not exec'd into ("preflight agent pod
preflight-agent-gpu-07 on gpu-07 is not Ready (NodeNotReady): ..."); a kubectl that fails before the probe
started names the API server's answer; a node with no result by its deadline is a timeout: kubectl is
killed and the probe's process group is killed with a second `kubectl exec ... kill -KILL -- -PGID` (a
container runtime does not kill an exec'd process when its stream drops; the stdin EOF reaches the
watchdog as well).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from preflight.common import expand, fold
from preflight.errors import UsageError
from preflight.inventory import NodeSpec
from preflight.k8s.benchjob import BenchJob, is_bench
from preflight.k8s.manifest import IMAGE
from preflight.k8s.kubectl import (AGENT_LABEL, CONTAINER, NodePod, Kubectl, KubeError, NodeState, parse_node_pods,
                                   parse_nodes, said)
from preflight.transport import bundle
from preflight.transport.contract import NodeFailure, Outcome, Progress, RunResult, Session
from preflight.transport.pool import SessionPool

log = logging.getLogger(__name__)

#: after the result, how long kubectl gets to end its stream before it is killed
EXIT_GRACE_S = 5.0
#: the second exec that kills a hung probe's process group
KILL_TIMEOUT_S = 15.0


@dataclass
class Target:
    """The Kubernetes side of a run: which kubectl, the nodes as listed before the run, their agent pods.

    Plays the part of a Slurm Allocation on the Inventory (release() has nothing to give back: preflight
    creates nothing for phase 1 beyond the exec'd processes)."""

    kubectl: Kubectl
    nodes: Dict[str, NodeState]
    pods: Dict[str, NodePod] = field(default_factory=dict)
    held: Dict[str, str] = field(default_factory=dict)  # (the Slurm recheck hold; always empty here)
    image: str = IMAGE  # the all-reduce Job's image (preflight.k8s.benchjob)
    launch_wait_s: float = 180.0  # --k8s-wait: how long pods still starting (image pulls) are waited for

    def release(self) -> None:
        return None


def select_nodes(kubectl: Kubectl, selector: Optional[str] = None, nodelist: Optional[str] = None) -> Dict[str, NodeState]:
    """The nodes to check: those matching the label selector, or named by --nodelist (all must exist)."""
    if not selector and not nodelist:
        raise UsageError("--k8s needs the nodes to check", "give --selector LABEL (e.g. nvidia.com/gpu.present=true) "
                         "or --nodelist gpu-[01-08]")
    args = ["get", "nodes"] + (["-l", selector] if selector else [])
    try:
        nodes = parse_nodes(kubectl.json(*args))
    except ValueError as exc:
        raise KubeError("cannot read the node list: %s" % exc) from None
    if nodelist:
        try:
            wanted = expand(nodelist)
        except ValueError as exc:
            raise UsageError("--nodelist %r: %s" % (nodelist, exc), "write ranges like gpu-[001-064]") from None
        missing = [n for n in wanted if n not in nodes]
        if missing:
            raise UsageError("Kubernetes has no node %s%s" % (fold(missing), " matching %r" % selector if selector else ""),
                             "check the names (kubectl get nodes)")
        nodes = {n: nodes[n] for n in wanted}
    if not nodes:
        raise UsageError("no node matches --selector %r" % selector, "check the label (kubectl get nodes -l ...)")
    return nodes


def agent_pods(kubectl: Kubectl) -> Dict[str, NodePod]:
    """{node: the agent pod there}: the pods whose controller is the agent DaemonSet (by its uid), from one
    read of the DaemonSet and one list of the pods with its label. No DaemonSet: no agent pod."""
    from preflight.k8s.manifest import AGENT

    out = kubectl.run("get", "daemonset", AGENT, "--ignore-not-found", "-o", "json", namespaced=True)
    if out.returncode != 0:
        raise KubeError("cannot read the agent DaemonSet: %s" % said(out.stderr),
                        "check the context and your access (kubectl auth can-i get daemonsets -n %s)" % kubectl.namespace)
    if not out.stdout.strip():
        return {}
    try:
        uid = json.loads(out.stdout)["metadata"]["uid"]
        return parse_node_pods(kubectl.json("get", "pods", "-l", AGENT_LABEL, namespaced=True), ("DaemonSet", uid))
    except (ValueError, KeyError, TypeError) as exc:
        raise KubeError("cannot read the agent pods: %s" % exc) from None


def inventory(target: Target, python: str = "python3", command_timeout: float = 60.0,
              gpus_per_node: Optional[int] = None, master_port: int = 29500) -> Any:
    """An Inventory of the selected nodes (host: the node's InternalIP; GPUs: its nvidia.com/gpu capacity)."""
    from preflight.inventory import Inventory

    specs = [NodeSpec(name=n.name, host=n.address or n.name, line=0, python=python, command_timeout=command_timeout,
                      known_hosts=None, gpus_per_node=gpus_per_node if gpus_per_node is not None else n.gpus)
             for n in target.nodes.values()]
    label = "kubernetes%s" % (" context %s" % target.kubectl.context if target.kubectl.context else "")
    return Inventory(path=label, nodes=specs, master_port=master_port, transport="k8s", allocation=target,
                     cluster={"master_port": master_port, "mtu_full_mesh": False, "allreduce": {}})


class _Exec:
    """One `kubectl exec -i` in flight: the process, its open streams, the probe's pid once printed."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        assert proc.stdout and proc.stderr
        self.err = bytearray()
        self.streams: Dict[int, Any] = {proc.stdout.fileno(): None, proc.stderr.fileno(): self.err.extend}
        self.pid: Optional[int] = None
        self.killed = False
        self.lock = threading.Lock()  # stdin writes in order: the payload, each next phase's line, the close

    def write(self, data: bytes, close: bool = False) -> None:
        """Hand kubectl data from a thread of its own (it takes stdin only as fast as the stream carries it)."""
        def write() -> None:
            with self.lock:
                try:
                    if data:
                        self.proc.stdin.write(data)
                        self.proc.stdin.flush()
                    if close:
                        self.proc.stdin.close()
                except (BrokenPipeError, ValueError, OSError):  # kubectl is gone: the reader names it
                    pass
        threading.Thread(target=write, name="preflight-kubectl-stdin", daemon=True).start()

    def read(self, run: bundle.ResultReader, timeout: float) -> None:
        ready, _, _ = select.select(list(self.streams), [], [], timeout)
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                del self.streams[fd]
            elif self.streams[fd] is None:
                run.feed(data)
                if run.pid is not None:
                    self.pid = run.pid
            else:
                self.streams[fd](data)


class KubeSession(Session):
    """One node's agent pod: a run is one `kubectl exec -i` carrying the bundle on stdin; with then=True
    the probe process stays after its result and the next phase's config goes down the same stream.

    attach=True: the pod's own main process already waits for the bundle on its stdin (a Job pod of
    preflight.k8s.benchjob); the run is `kubectl attach -i` to it instead of an exec. Its kill is the
    end of that stream (stdinOnce: the process's stdin closes, its watchdog kills its group) and, for
    sure, the Job's deletion."""

    def __init__(self, spec: NodeSpec, kubectl: Kubectl, pod: Optional[NodePod], container: str = CONTAINER,
                 attach: bool = False) -> None:
        self.spec = spec
        self.kubectl = kubectl
        self.pod = pod
        self.container = container
        self.attach = attach
        self.execs = 0
        self._exec: Optional[_Exec] = None  # the one in flight or kept for the next phase
        self._lock = threading.Lock()

    def open(self) -> None:
        if self.pod is None:
            raise NodeFailure("unreachable", "no preflight agent pod on %s (namespace %s): deploy it with --k8s-deploy "
                              "or `preflight k8s manifest | kubectl apply -f -`; check its tolerations and nodeSelector"
                              % (self.spec.name, self.kubectl.namespace))
        if self.pod.stuck:  # nothing is known of the node itself: an error to fix and retest, never a drain
            raise NodeFailure("scheduler", "preflight agent pod %s on %s cannot start: %s; waiting does not "
                              "fix it: fix the image name or pull secret, the ConfigMap/Secret it needs, or what "
                              "keeps it off the node (kubectl describe pod -n %s %s)"
                              % (self.pod.name, self.spec.name, self.pod.not_ready, self.kubectl.namespace, self.pod.name))
        if self.pod.not_ready:
            raise NodeFailure("unreachable", "preflight agent pod %s on %s is %s: the node or its kubelet is down, "
                              "or the pod cannot start (kubectl describe pod -n %s %s)"
                              % (self.pod.name, self.spec.name, self.pod.not_ready, self.kubectl.namespace, self.pod.name))

    def _exec_argv(self, stdin: bool, *command: str) -> List[str]:
        assert self.pod is not None
        return self.kubectl.argv("exec", *(["-i"] if stdin else []), self.pod.name, "-c", self.container, "--", *command,
                                 namespaced=True)

    def _start(self) -> _Exec:
        if self.attach:
            assert self.pod is not None
            argv = self.kubectl.argv("attach", "-i", "--quiet", self.pod.name, "-c", self.container, namespaced=True)
        else:
            argv = self._exec_argv(True, "setsid", "-w", "sh", "-c", bundle.remote_command(self.spec.python))
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except FileNotFoundError:
            raise NodeFailure("protocol", "kubectl not found on the controller") from None
        self.execs += 1
        return _Exec(proc)

    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:
        started = time.monotonic()
        # a kept process waits for the next phase as long as this phase may last on the slowest node
        config = dict(config, deadline_s=deadline_s + 5, more=then, wait_s=deadline_s + bundle.NEXT_PHASE_SLACK_S)
        with self._lock:
            ex, self._exec = self._exec, None
        if ex is not None and ex.proc.poll() is not None:
            self._end(ex)  # the kept process is gone (its wait ran out): start anew
            ex = None
        run = bundle.ResultReader()
        if ex is None:
            payload = bundle.stdin_payload(config)  # built before the process starts
            ex = self._start()
            ex.write(payload)
        else:
            run.pid = ex.pid
            ex.err.clear()
            ex.write(json.dumps(config, separators=(",", ":")).encode() + b"\n")
        sent_at = time.time()
        with self._lock:
            self._exec = ex
        end = started + deadline_s
        try:
            while ex.streams and not run.has_result():
                if self.cancelled:
                    raise NodeFailure("cancelled", "interrupted")
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise NodeFailure("timeout", "timed out: no answer within %g s from pod %s; killed the probe%s"
                                      % (deadline_s, self.pod.name if self.pod else "?",
                                         "" if ex.pid else " (its stdin closed: the probe's watchdog ends it)"))
                ex.read(run, min(remaining, 0.5))
        except NodeFailure:
            with self._lock:
                self._exec = None
            self._kill(ex)
            for stream in (ex.proc.stdout, ex.proc.stderr):
                stream.close()
            raise
        rc: Optional[int] = None
        if not (then and run.has_result() and ex.streams):
            with self._lock:
                self._exec = None
            rc = self._end(ex, run)
        run.err += ex.err
        result = run.finish(rc, sent_at, started)
        if result.result is None and run.clock_at is None and rc and not self.attach:
            raise NodeFailure("unreachable", "kubectl %s %s failed (rc %s): %s"
                              % ("attach to" if self.attach else "exec into", self.pod.name if self.pod else "?", rc,
                                 said(ex.err.decode("utf-8", "replace"))))
        return result

    def _end(self, ex: _Exec, run: Optional[bundle.ResultReader] = None) -> Optional[int]:
        """Close kubectl's stdin (the probe exits: at once after a last result, else through its EOF
        watchdog), read what is left, let kubectl end; killed past EXIT_GRACE_S."""
        run = run or bundle.ResultReader()
        ex.write(b"{}\n" if ex.proc.poll() is None and run.has_result() is False and ex.pid else b"", close=True)
        until = time.monotonic() + EXIT_GRACE_S
        while ex.streams and time.monotonic() < until:
            ex.read(run, 0.2)
        try:
            return ex.proc.wait(timeout=max(0.1, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._killpg(ex.proc)
            return None
        finally:
            for stream in (ex.proc.stdout, ex.proc.stderr):
                stream.close()

    def end_kept(self) -> None:
        with self._lock:
            ex, self._exec = self._exec, None
        if ex is not None:
            self._end(ex)

    @staticmethod
    def _killpg(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def _kill(self, ex: _Exec) -> None:
        """Kill kubectl (the stream drops: the probe's stdin ends) and the probe's process group in the pod."""
        with self._lock:
            if ex.killed:
                return
            ex.killed = True
        self._killpg(ex.proc)
        if ex.pid is None or self.pod is None:
            return
        argv = self._exec_argv(False, "kill", "-KILL", "--", "-%d" % ex.pid)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=KILL_TIMEOUT_S)
            if done.returncode != 0:
                log.debug("%s: kill -KILL -%d in %s: %s", self.spec.name, ex.pid, self.pod.name, said(done.stderr))
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("%s: kill -KILL -%d in %s: %s", self.spec.name, ex.pid, self.pod.name, exc)

    def cancel(self) -> None:
        self.cancelled = True
        with self._lock:
            ex = self._exec
        if ex is not None:  # the run in flight sees its streams end and raises; its streams are closed there
            self._kill(ex)

    def close(self) -> None:
        self.end_kept()


class KubeFleet(SessionPool):
    """The SSH fleet's pool over KubeSessions: same run / cancel / close, same Outcome per node.

    A run of bench configs (the all-reduce) goes to an Indexed Job instead (preflight.k8s.benchjob)."""

    def __init__(self, specs: List[NodeSpec], target: Target, parallel: int = 64,
                 progress: Optional[Progress] = None) -> None:
        self.target = target
        super().__init__(specs, parallel, False, progress,
                         connect=lambda spec: KubeSession(spec, target.kubectl, target.pods.get(spec.name)))
        self.bench = BenchJob(target, self.specs, self.parallel, progress,
                              lambda spec, pod: KubeSession(spec, target.kubectl, pod, "bench", attach=True))

    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float],
            then: bool = False) -> Dict[str, Outcome]:
        if not is_bench(configs):
            return super().run(configs, deadline_of, then)
        with self._lock:
            sessions = list(self.sessions.values())
        for session in sessions:  # no agent process is kept while the Job runs
            session.end_kept()
        return self.bench.run(configs, deadline_of)

    def keeps_ranks(self, ranks: int) -> bool:
        """The bench runs as an Indexed Job, not in the agent's kept exec: nothing warmed there is adopted."""
        return False

    def cancel(self) -> None:
        self.bench.cancel()
        super().cancel()

    def describe(self) -> Dict[str, Any]:
        """What carried the run: {"kind": "k8s", "context", "namespace", "execs": kubectl exec processes,
        "jobs": all-reduce Jobs}."""
        with self._lock:
            execs = sum(getattr(s, "execs", 0) for s in self.sessions.values())
        return {"kind": "k8s", "context": self.target.kubectl.context, "namespace": self.target.kubectl.namespace,
                "execs": execs, "jobs": self.bench.jobs}


def fleet_for(inv: Any, progress: Optional[Progress] = None, parallel: int = 64) -> KubeFleet:
    """The Kubernetes transport for an inventory made by inventory(): agent pods listed now, once."""
    target: Target = inv.allocation
    target.pods = agent_pods(target.kubectl)
    return KubeFleet(inv.nodes, target, parallel, progress)


def not_ready_summary(pods: Dict[str, NodePod], nodes: Sequence[str]) -> List[str]:
    """The nodes among `nodes` without a Ready agent pod (for --k8s-deploy's wait)."""
    return [n for n in nodes if n not in pods or pods[n].not_ready]

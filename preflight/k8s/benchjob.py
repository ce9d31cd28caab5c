"""The all-reduce on Kubernetes: an Indexed Job whose pods hold their nodes' GPUs; the bundle over kubectl attach.

KubeFleet.run hands a run whose configs are all bench configs (mode "bench": the timed all-reduce and its
localization rounds, preflight/checks/allreduce/stage.py) to BenchJob.run; everything else goes over exec into
the agent pods. One run:

    1. create Job preflight-bench-<token> (manifest.bench_job): one pod per node, pinned by required node
       affinity on the node's metadata.name and spread one per node by anti-affinity, each requesting all of
       its node's nvidia.com/gpu (the scheduler then gives it idle GPUs only), hostNetwork, backoffLimitPerIndex 0,
       activeDeadlineSeconds from the run's deadline, a TTL. Its container runs the bundle's bootstrap,
       which waits for its config and zip on stdin (stdin/stdinOnce).
    2. wait (at most --k8s-wait, Target.launch_wait_s; image pulls count) until every node's pod runs or
       is stuck on what does not resolve by itself (Unschedulable: its GPUs are in use; ImagePullBackOff:
       kubectl.STUCK_REASONS): such a node is a named failure at once, the others go on.
    3. `kubectl attach -i` to each pod with its node's payload, exactly the exec payload (one KubeSession
       a node with attach=True, driven by the same SessionPool and deadlines); results come back on the
       attach stream (they are in the pods' logs too).
    4. delete the Job (its pods with it), always: after the run, on a timeout, on Ctrl-C/SIGTERM
       (KubeFleet.cancel). A preflight that was SIGKILLed cannot: its Job (annotated preflight/owner: the
       controller's host, pid and process start time) holds the nodes' GPUs until activeDeadlineSeconds.
       The next Kubernetes run names it and, when the owner was a process on its own host that is gone,
       deletes it (stale_jobs); one from another host is named, not judged, and ends by its deadline.

The rendezvous needs no Service: the pods use the host network and preflight already planned the
address (the first node's data address), as over SSH.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from preflight.common import fold
from preflight.inventory import NodeSpec
from preflight.k8s import manifest
from preflight.k8s.kubectl import KubeError, NodePod, parse_node_pods, said, stuck_reason
from preflight.transport import bundle
from preflight.transport.contract import NodeFailure, Outcome, Progress
from preflight.transport.pool import SessionPool

log = logging.getLogger(__name__)

POLL_S = 0.3


def _uid(created: str) -> Optional[str]:
    """The uid of the object `kubectl create -o json` printed (None: it printed none)."""
    try:
        return str(json.loads(created)["metadata"]["uid"])
    except (ValueError, KeyError, TypeError):
        return None


OWNER = "preflight/owner"
BENCH_LABEL = "app.kubernetes.io/name=preflight-bench"


def _start_time(pid: int) -> Optional[str]:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, who it is."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner() -> str:
    """This controller, as a Job's preflight/owner annotation: "HOST PID STARTTIME"."""
    return "%s %d %s" % (socket.gethostname(), os.getpid(), _start_time(os.getpid()) or "?")


def owner_gone(value: str) -> Optional[bool]:
    """True: the owner was a process on this host that no longer runs; False: it runs; None: another host's."""
    parts = value.split()
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return None
    return _start_time(int(parts[1])) != parts[2]


def stale_jobs(kubectl: Any) -> List[str]:
    """Name the all-reduce Jobs a killed run left (they hold their nodes' GPUs) and delete those whose
    owner is gone; one line each, for the run's notes."""
    try:
        items = kubectl.json("get", "jobs", "-l", BENCH_LABEL, namespaced=True).get("items") or []
    except KubeError as exc:
        return ["cannot look for all-reduce Jobs a killed run left: %s" % exc]
    out = []
    for job in items:
        meta = job.get("metadata") or {}
        name, who = meta.get("name") or "?", (meta.get("annotations") or {}).get(OWNER, "")
        gone = owner_gone(who)
        if gone is False:
            continue  # a run in progress on this host
        if gone is None:
            out.append("all-reduce Job %s (created %s by %s) is still there: not this host's run to judge; it "
                       "ends by its activeDeadlineSeconds (or: kubectl delete job -n %s %s)"
                       % (name, meta.get("creationTimestamp", "?"), who or "an unknown run", kubectl.namespace, name))
            continue
        done = kubectl.run("delete", "job", name, "--cascade=background", "--ignore-not-found", namespaced=True)
        out.append("all-reduce Job %s (created %s) was left by a killed run (pid %s): %s"
                   % (name, meta.get("creationTimestamp", "?"), who.split()[1],
                      "deleted, with its pods" if done.returncode == 0 else "could not delete it: %s" % said(done.stderr)))
    return out


def is_bench(configs: Dict[str, Dict[str, Any]]) -> bool:
    return bool(configs) and all(c.get("mode") == "bench" for c in configs.values())


class BenchJob:
    """One all-reduce round at a time as an Indexed Job (see the module docstring)."""

    def __init__(self, target: Any, specs: Dict[str, NodeSpec], parallel: int, progress: Optional[Progress],
                 attach: Callable[[NodeSpec, NodePod], Any]) -> None:
        """attach(spec, pod): the session that attaches to a pod's main process (fleet.KubeSession, attach=True)."""
        self.target = target
        self.attach = attach
        self.specs = specs
        self.parallel = parallel
        self.progress = progress
        self.jobs = 0
        self._lock = threading.Lock()
        self._job: Optional[str] = None
        self._fleet: Optional[SessionPool] = None
        self._cancelled = False

    def run(self, configs: Dict[str, Dict[str, Any]], deadline_of: Callable[[NodeSpec], float]) -> Dict[str, Outcome]:
        kubectl = self.target.kubectl
        nodes = list(configs)
        name = "preflight-bench-" + secrets.token_hex(4)
        longest = max(deadline_of(self.specs[n]) for n in nodes)
        python = self.specs[nodes[0]].python
        job = manifest.bench_job(name, kubectl.namespace, nodes, max(self.specs[n].gpus_per_node for n in nodes),
                                 self.target.image, ["setsid", "-w", "sh", "-c", bundle.remote_command(python)],
                                 self.target.launch_wait_s + longest + 30)
        job["metadata"]["annotations"] = {OWNER: owner()}
        with self._lock:
            if self._cancelled:
                raise KeyboardInterrupt
            self._job = name
        out = kubectl.run("create", "-f", "-", "-o", "json", stdin=json.dumps(job), timeout=60)
        self.jobs += 1
        outcomes: Dict[str, Outcome] = {}
        try:
            uid = _uid(out.stdout) if out.returncode == 0 else None
            if uid is None:
                failure = NodeFailure("unreachable", "cannot create the all-reduce Job: %s" % said(out.stderr))
                return {n: Outcome(n, failure=failure) for n in nodes}
            pods, waiting = self._wait_pods(name, uid, nodes)
            for node, why in waiting.items():
                outcomes[node] = Outcome(node, failure=NodeFailure("unreachable", "all-reduce pod for %s did not run "
                                                                   "(--k8s-wait %g s): %s" % (node, self.target.launch_wait_s, why)))
            if pods:
                fleet = SessionPool([self.specs[n] for n in pods], self.parallel, False, self.progress,
                              connect=lambda spec: self.attach(spec, pods[spec.name]))
                with self._lock:
                    self._fleet = fleet
                try:
                    with fleet:
                        outcomes.update(fleet.run({n: configs[n] for n in pods}, deadline_of))
                finally:
                    with self._lock:
                        self._fleet = None
        finally:
            self._delete(name)
        return {n: outcomes[n] for n in nodes}

    def _wait_pods(self, name: str, uid: str, nodes: List[str]) -> Any:
        """({node: its running pod}, {node: why its pod does not run}) once every pod runs or is stuck, or
        the launch wait passed."""
        kubectl = self.target.kubectl
        until = time.monotonic() + self.target.launch_wait_s
        while True:
            doc = kubectl.json("get", "pods", "-l", "preflight/run=%s" % name, namespaced=True)
            found = parse_node_pods(doc, ("Job", uid))
            running = {n: p for n, p in found.items() if n in nodes and not p.not_ready}
            stuck = [i for i in doc.get("items", []) if stuck_reason(i.get("status") or {})]
            if len(running) + len(stuck) >= len(nodes) or time.monotonic() >= until or self._cancelled:
                break
            time.sleep(POLL_S)
        waiting = {}
        pending = [i for i in doc.get("items", []) if not (i.get("spec") or {}).get("nodeName")]
        for node in nodes:
            if node in running:
                continue
            if node in found:
                waiting[node] = "pod %s is %s" % (found[node].name, found[node].not_ready)
            else:
                conds = [c for i in pending for c in (i.get("status") or {}).get("conditions") or []
                         if c.get("type") == "PodScheduled" and c.get("status") == "False"]
                waiting[node] = "not scheduled%s" % (" (%s: %s)" % (conds[0].get("reason"), conds[0].get("message"))
                                                     if conds else "") + " — are its GPUs in use?"
        if waiting:
            log.debug("all-reduce Job %s: no running pod on %s", name, fold(waiting))
        return {n: NodePod(n, p.name) for n, p in running.items()}, waiting

    def _delete(self, name: str) -> None:
        with self._lock:
            if self._job != name:
                return
            self._job = None
        out = self.target.kubectl.run("delete", "job", name, "--cascade=background", "--wait=false",
                                      "--ignore-not-found", namespaced=True, timeout=60)
        if out.returncode != 0:
            log.warning("could not delete the all-reduce Job %s (its TTL removes it): %s", name, said(out.stderr))

    def cancel(self) -> None:
        """Ctrl-C: stop the attaches, delete the Job (its pods, their processes)."""
        with self._lock:
            self._cancelled = True
            fleet, name = self._fleet, self._job
        if fleet is not None:
            fleet.cancel()
        if name is not None:
            self._delete(name)

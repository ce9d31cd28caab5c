"""A loopback Kubernetes API-server double for the real `kubectl`, whose pods run in the simulated nodes.

This module holds the cluster state and its controllers (KubeAPI); tests/sim/kuberest.py serves it over
HTTP (REST, discovery, patches) and tests/sim/kubestream.py the exec/attach streams.

No kube-apiserver, kind or k3s can run here, so this speaks the parts of the real wire protocol that
preflight's kubectl calls use (plain HTTP on 127.0.0.1; the kubeconfig from kubeconfig() points there):

    discovery     GET /version, /api, /api/v1, /apis, /apis/<group>/<version> (the legacy, unaggregated
                  documents: kubectl 1.32 asks for the aggregated v2 form and falls back when the reply's
                  Content-Type is plain application/json); /openapi/v2 and /openapi/v3 answer 404
    objects       nodes, namespaces, pods, services, configmaps, serviceaccounts, daemonsets, jobs, roles,
                  rolebindings, clusterroles, clusterrolebindings: GET, LIST (labelSelector with =, ==,
                  !=, exists, !exists; fieldSelector spec.nodeName / metadata.name), POST, PUT, DELETE
    PATCH         application/merge-patch+json (RFC 7386) and application/strategic-merge-patch+json
                  (the same merge: the fields preflight patches have no patchStrategy; the $-directives
                  kubectl adds are dropped); metadata.resourceVersion in a patch is a precondition
                  (409 Conflict when stale), as in the real server
    logs          GET .../pods/<pod>/log (a Job pod's output so far)
    exec, attach  GET .../pods/<pod>/exec or /attach upgraded to WebSocket (tests/sim/kubestream.py: the
                  channel protocol, v5.channel.k8s.io and v4.channel.k8s.io, the exit code in the final
                  Status frame)

Controllers, reduced to what a test needs: a DaemonSet gets one pod per node (Running and Ready at once,
unless the node is dead), deleted with it; an Indexed Job gets one pod per index, placed by its required
node affinity on metadata.name, one per node, its main process started at once (Succeeded/Failed
by its exit status; deleting the Job kills and deletes its pods); deleting a namespace deletes what it
holds. Watches are not served (preflight polls).

A pod's exec runs the command inside its node's network namespace (`ip netns exec`), with the node's
bin/ first on PATH and its sysfs root, as the node's sshd and slurmd do: phase 1 runs for real on the
simulated nodes. Like a container runtime, a dropped exec stream closes the process's stdin and kills
nothing. Faults: dead_node() (NotReady, its agent pod not Ready, exec refused as the real server does when
the kubelet cannot be dialled), kubelet_unreachable() (pods still Ready, exec refused); the SimCluster's
own faults (hang_commands, mtu_blackhole) apply as is.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import socketserver
import subprocess
import tempfile
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

from . import kuberest, kubestream
from .cluster import SESSION_PATH_TAIL, SimCluster
from .kuberest import RESOURCES, now


@contextlib.contextmanager
def controller_turn():
    """One preflight controller at a time in this machine's own network namespace, across test processes.

    The Kubernetes tests run preflight beside the API double, in the host's network namespace, where the
    controller claims the nodes it runs the all-reduce on (preflight.probe.portclaim: abstract Unix names per
    node). Two test modules' simulated clusters both name their nodes n001...: run at once by two xdist
    workers, the second run would rightly read "another preflight run on this machine is testing n001".
    """
    path = os.path.join(tempfile.gettempdir(), "preflight-tests-host-controller.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class KubeAPI:
    """The API-server double for one SimCluster; start() serves it, stop() ends it and every exec."""

    def __init__(self, cluster: SimCluster, gpus: int = 0) -> None:
        self.cluster = cluster
        self.gpus = gpus
        self.store: Dict[str, Dict[Tuple[str, str], Dict[str, Any]]] = {r: {} for r in RESOURCES}
        self.lock = threading.RLock()
        self.rv = 1000
        self.dead: set = set()
        self.racing: set = set()  # nodes an admin cordons right before their next PATCH
        self.held_patches: Dict[str, threading.Event] = {}  # node -> a PATCH of it waits for this, once arrived
        self.no_exec: set = set()  # nodes whose kubelet the API server cannot dial, while their pods still look Ready
        self.pod_faults: Dict[str, Tuple[str, str]] = {}  # node -> (waiting reason, message) of its agent pod
        self.requests: List[Tuple[str, str]] = []  # (method, path) of every request, for tests
        self.reviews: List[Any] = []  # (user, groups, attributes, allowed) of every `kubectl auth can-i`
        self.execs: List[subprocess.Popen] = []
        self.running: Dict[Tuple[str, str], kubestream.PodProcess] = {}  # Job pods' main processes
        self.server: Optional[socketserver.ThreadingTCPServer] = None
        self.dir = os.path.join(cluster.root, "kube")
        os.makedirs(self.dir, exist_ok=True)
        for node in cluster.nodes:
            self.put("nodes", "", self.node_doc(node))
        for ns in ("default", "kube-system"):
            self.put("namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                                         "status": {"phase": "Active"}})

    # ---- lifecycle
    def start(self) -> "KubeAPI":
        api = self

        class BoundHandler(kuberest.Handler):
            kube = api

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), BoundHandler)
        threading.Thread(target=self.server.serve_forever, name="kubeapi", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def kubeconfig(self, path: Optional[str] = None, namespace: str = "default") -> str:
        path = path or os.path.join(self.dir, "kubeconfig")
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
               "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
               "users": [{"name": "sim", "user": {"token": "sim-token"}}],
               "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}]}
        with open(path, "w") as fh:
            json.dump(doc, fh)
        return path

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """Environment for kubectl/preflight: this kubeconfig, a private discovery cache."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = self.kubeconfig()
        env["KUBECACHEDIR"] = os.path.join(self.dir, "cache")
        env["HOME"] = self.dir
        return env

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        for running in list(self.running.values()):
            running.kill()
        for proc in self.execs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass

    # ---- faults and views
    def dead_node(self, name: str) -> None:
        """The node's kubelet stops: node NotReady, its pods not Ready, exec to it refused."""
        with self.lock:
            self.dead.add(name)
            self.refresh(name)

    def kubelet_unreachable(self, name: str) -> None:
        """The API server cannot dial the node's kubelet, before the node controller notices: the pods still
        say Ready, every exec is refused with 500 (what a real API server answers then)."""
        with self.lock:
            self.no_exec.add(name)

    def agent_pod_fault(self, name: str, reason: str, message: str) -> None:
        """The node's DaemonSet pod waits for `reason` (ErrImagePull, ImagePullBackOff, CreateContainerConfigError,
        ContainerCreating: an image pull under way) or is not placed (Unschedulable), as the kubelet and the
        scheduler report it in the pod's status; revive() clears it."""
        with self.lock:
            self.pod_faults[name] = (reason, message)
            self.refresh(name)

    def revive(self, name: str) -> None:
        with self.lock:
            self.no_exec.discard(name)
            self.dead.discard(name)
            self.pod_faults.pop(name, None)
            self.refresh(name)

    def get(self, resource: str, name: str, namespace: str = "") -> Optional[Dict[str, Any]]:
        with self.lock:
            obj = self.store[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj else None

    def items(self, resource: str) -> List[Dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.store[resource].values()]

    def cordon_before_next_patch(self, name: str) -> None:
        """An admin cordons the node just before the next PATCH of it arrives (a race with preflight)."""
        with self.lock:
            self.racing.add(name)

    def hold_patches(self, name: str) -> threading.Event:
        """PATCHes of the node wait, once received, until the returned event is set (to kill the client then)."""
        self.held_patches[name] = threading.Event()
        return self.held_patches[name]

    def cordon_by_hand(self, name: str) -> None:
        """What `kubectl cordon` by an admin leaves: spec.unschedulable, no preflight annotation."""
        with self.lock:
            node = self.store["nodes"][("", name)]
            node["spec"]["unschedulable"] = True
            self.bump(node)

    # ---- store
    def node_doc(self, node: Any) -> Dict[str, Any]:
        cap = {"cpu": "4", "memory": "16Gi", "pods": "110"}
        if self.gpus:
            cap["nvidia.com/gpu"] = str(self.gpus)
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                                                           "sim/pool": "gpu"}},
                "spec": {},
                "status": {"addresses": [{"type": "InternalIP", "address": node.mgmt_ip},
                                         {"type": "Hostname", "address": node.name}],
                           "capacity": cap, "allocatable": dict(cap),
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}

    def bump(self, obj: Dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def put(self, resource: str, namespace: str, obj: Dict[str, Any]) -> Dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        if RESOURCES[resource][2]:
            meta["namespace"] = namespace
        gv, kind = RESOURCES[resource][:2]
        obj["apiVersion"], obj["kind"] = gv, kind
        self.bump(obj)
        self.store[resource][(namespace, meta["name"])] = obj
        if resource == "daemonsets":
            self.daemonset(obj)
        if resource == "jobs" and not obj.get("status"):
            self.job(obj)
        return obj

    def delete(self, resource: str, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        obj = self.store[resource].pop((namespace, name), None)
        if obj is None:
            return None
        if resource == "pods" and (namespace, name) in self.running:
            self.running.pop((namespace, name)).kill()
        uid = obj["metadata"]["uid"]
        for key, pod in list(self.store["pods"].items()):  # garbage collection of owned pods
            if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences", [])):
                self.delete("pods", key[0], key[1])
        if resource == "namespaces":
            for res, (_, _, namespaced, _) in RESOURCES.items():
                if namespaced:
                    for key in [k for k in self.store[res] if k[0] == name]:
                        self.delete(res, key[0], key[1])
        return obj

    def daemonset(self, ds: Dict[str, Any]) -> None:
        """One pod per node, named <ds>-<node>, owned by the DaemonSet; status counts its Ready pods."""
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        template = ds["spec"]["template"]
        for (_, node), _n in list(self.store["nodes"].items()):
            pod_name = "%s-%s" % (name, node)
            pod = {"metadata": {"name": pod_name, "labels": dict(template["metadata"].get("labels", {})),
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                                                     "uid": ds["metadata"]["uid"], "controller": True}]},
                   "spec": dict(copy.deepcopy(template["spec"]), nodeName=node, affinity={"nodeAffinity": {
                       "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}), "status": {}}
            self.rv += 1
            self.put("pods", ns, pod)
            self.refresh_pod(pod)
        self._dsstatus_doc(ds)

    def job(self, job: Dict[str, Any]) -> None:
        """An Indexed Job: one pod per index, placed by the template's required node affinity on the
        node's metadata.name (matchFields; one per node: the anti-affinity the real scheduler would apply), its main
        process started at once in its node's namespace; a node that is dead, or none left, leaves the
        pod Pending (Unschedulable)."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = job["spec"]["template"]
        terms = (((template["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
        candidates = [v for t in terms for e in t.get("matchFields", []) if e.get("key") == "metadata.name"
                      and e.get("operator") == "In" for v in e.get("values", [])] or [n for _, n in self.store["nodes"]]
        job["status"] = {"active": 0, "succeeded": 0, "failed": 0}
        used: set = set()
        for index in range(int(job["spec"].get("completions") or 1)):
            node = next((n for n in candidates if n not in used and n not in self.dead and ("", n) in self.store["nodes"]), None)
            labels = dict(template["metadata"].get("labels") or {}, **{"job-name": name, "batch.kubernetes.io/job-completion-index": str(index)})
            pod = {"metadata": {"name": "%s-%d-%s" % (name, index, uuid.uuid4().hex[:5]), "labels": labels,
                                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                     "uid": job["metadata"]["uid"], "controller": True}]},
                   "spec": copy.deepcopy(template["spec"]), "status": {}}
            if node is None:
                pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable", "message": "0/%d nodes are available" % len(self.store["nodes"])}]}
                self.put("pods", ns, pod)
                continue
            used.add(node)
            pod["spec"]["nodeName"] = node
            self.put("pods", ns, pod)
            self.start_pod(ns, pod, job)

    def start_pod(self, ns: str, pod: Dict[str, Any], job: Dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        command = list(container.get("command") or []) + list(container.get("args") or [])
        key = (ns, pod["metadata"]["name"])
        proc = self.spawn(pod, command)
        pod["status"] = {"phase": "Running", "hostIP": self.node_ip(pod["spec"]["nodeName"]),
                         "conditions": [{"type": "Ready", "status": "True"}],
                         "containerStatuses": [{"name": container["name"], "ready": True, "restartCount": 0,
                                                "state": {"running": {"startedAt": now()}}}]}
        job["status"]["active"] += 1

        def exited(rc: int) -> None:
            with self.lock:
                if self.running.get(key) is None:
                    return  # deleted (and killed) meanwhile
                current = self.store["pods"].get(key)
                if current is not None:
                    current["status"]["phase"] = "Succeeded" if rc == 0 else "Failed"
                    current["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "PodCompleted"}]
                    current["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": rc if rc >= 0 else 128 - rc}}
                    self.bump(current)
                owner = self.store["jobs"].get((ns, job["metadata"]["name"]))
                if owner is not None:
                    owner["status"]["active"] -= 1
                    owner["status"]["succeeded" if rc == 0 else "failed"] += 1
                    self.bump(owner)
                    if rc != 0:
                        self.job_pod_failed(owner, pod)

        self.running[key] = kubestream.PodProcess(proc, command, bool(container.get("stdinOnce")), exited)

    def job_pod_failed(self, job: Dict[str, Any], pod: Dict[str, Any]) -> None:
        """The Job controller's failure policy: with backoffLimitPerIndex the pod's index fails alone
        (status.failedIndexes); otherwise past backoffLimit (default 6) the Job fails and its active pods
        are terminated at once, their processes killed (condition Failed, reason BackoffLimitExceeded)."""
        spec, status = job["spec"], job["status"]
        if spec.get("backoffLimitPerIndex") is not None:
            index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            failed = sorted(set((status.get("failedIndexes") or "").split(",") + [index]) - {""}, key=int)
            status["failedIndexes"] = ",".join(failed)
            return
        if status["failed"] <= int(spec.get("backoffLimit", 6)):
            return
        status["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
        uid = job["metadata"]["uid"]
        for key, other in list(self.store["pods"].items()):
            running = self.running.get(key)
            if running is not None and running.rc is None and \
                    any(o.get("uid") == uid for o in other["metadata"].get("ownerReferences", [])):
                self.running.pop(key).kill()
                other["status"]["phase"] = "Failed"
                self.bump(other)
        status["active"] = 0

    def _dsstatus_doc(self, ds: Dict[str, Any]) -> None:
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        pods = [p for p in self.store["pods"].values() if p["metadata"]["namespace"] == ns and
                any(o.get("name") == name for o in p["metadata"].get("ownerReferences", []))]
        ready = sum(1 for p in pods if pod_ready(p))
        ds["status"] = {"desiredNumberScheduled": len(pods), "currentNumberScheduled": len(pods),
                        "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": len(pods),
                        "numberMisscheduled": 0, "observedGeneration": 1}

    def refresh_pod(self, pod: Dict[str, Any]) -> None:
        fault = self.pod_faults.get(pod["spec"].get("nodeName") or kuberest.pinned(pod))
        if fault is not None and pod["metadata"].get("ownerReferences", [{}])[0].get("kind") == "DaemonSet":
            return self._faulty_pod(pod, *fault)
        if pod["metadata"].get("ownerReferences", [{}])[0].get("kind") == "DaemonSet":
            pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or kuberest.pinned(pod)
        dead = pod["spec"].get("nodeName") in self.dead
        pod["status"] = {"phase": "Running", "hostIP": self.node_ip(pod["spec"].get("nodeName")),
                         "conditions": [{"type": "Ready", "status": "False" if dead else "True",
                                         **({"reason": "NodeNotReady"} if dead else {})}],
                         "containerStatuses": [{"name": c["name"], "ready": not dead, "restartCount": 0,
                                                "image": c.get("image", ""), "state": {"running": {"startedAt": now()}}}
                                               for c in pod["spec"].get("containers", [])]}

    def _faulty_pod(self, pod: Dict[str, Any], reason: str, message: str) -> None:
        """Pending: unplaced (Unschedulable, no nodeName) or placed with its container waiting for `reason`."""
        if reason == "Unschedulable":
            node = pod["spec"].pop("nodeName", None) or kuberest.pinned(pod)
            pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                             "reason": reason, "message": message.replace("NODE", node)}]}
            return
        pod["spec"]["nodeName"] = pod["spec"].get("nodeName") or kuberest.pinned(pod)
        pod["status"] = {"phase": "Pending", "hostIP": self.node_ip(pod["spec"]["nodeName"]),
                         "conditions": [{"type": "PodScheduled", "status": "True"},
                                        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
                         "containerStatuses": [{"name": c["name"], "ready": False, "restartCount": 0,
                                                "image": c.get("image", ""), "state": {"waiting": {"reason": reason, "message": message}}}
                                               for c in pod["spec"].get("containers", [])]}

    def node_ip(self, name: Optional[str]) -> str:
        node = self.store["nodes"].get(("", name or ""))
        return node["status"]["addresses"][0]["address"] if node else ""

    def refresh(self, name: str) -> None:
        node = self.store["nodes"][("", name)]
        node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown" if name in self.dead else "True",
                                         "reason": "NodeStatusUnknown" if name in self.dead else "KubeletReady"}]
        self.bump(node)
        for pod in self.store["pods"].values():
            if (pod["spec"].get("nodeName") or kuberest.pinned(pod)) == name:
                self.refresh_pod(pod)
                self.bump(pod)
        for ds in self.store["daemonsets"].values():
            self._dsstatus_doc(ds)

    # ---- exec
    def spawn(self, pod: Dict[str, Any], command: List[str]) -> subprocess.Popen:
        """The exec'd command in its node's network namespace, with the node's environment."""
        node = self.cluster.node(pod["spec"]["nodeName"])
        env = {"PATH": "%s:%s" % (node.bin_dir, SESSION_PATH_TAIL), "PREFLIGHT_SYSFS_ROOT": node.sys_dir,
               "PREFLIGHT_HOST_ROOT": node.root_dir, "HOSTNAME": pod["metadata"]["name"], "HOME": "/root"}
        for container in pod["spec"].get("containers", [])[:1]:
            for item in container.get("env", []):
                if "value" in item:
                    env[item["name"]] = self.host_path(node, pod, container, item["value"])
                elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                    env[item["name"]] = node.name
        argv = ["ip", "netns", "exec", node.ns, "env", "-i"] + ["%s=%s" % kv for kv in env.items()] + list(command)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.execs.append(proc)
        return proc

    @staticmethod
    def host_path(node: Any, pod: Dict[str, Any], container: Dict[str, Any], value: str) -> str:
        """A path in the container's view, as the simulated node has it: a value under the mountPath of a
        hostPath volume becomes that host path, with the node's "/" being its root_dir and /sys its sysfs."""
        volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"].get("volumes", []) if "hostPath" in v}
        for mount in sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            root = mount["mountPath"].rstrip("/") or "/"
            if mount["name"] in volumes and (value == root or value.startswith(root + "/")):
                host = volumes[mount["name"]]
                host = {"/": node.root_dir, "/sys": node.sys_dir}.get(host, host)
                return host + value[len(root):] if root != "/" else os.path.join(host, value.lstrip("/"))
        return value


def pod_ready(pod: Dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions", []))

"""A loopback Kubernetes API-server double for the real `kubectl`, whose pods run in the simulated nodes.

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

import copy
import datetime
import http.server
import json
import os
import socketserver
import subprocess
import threading
import urllib.parse
import uuid
from typing import Any, Dict, List, Optional, Tuple

from . import kubestream
from .cluster import SESSION_PATH_TAIL, SimCluster

SERVER_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.4", "platform": "linux/amd64",
                  "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2025-04-22T16:03:56Z",
                  "goVersion": "go1.23.8", "compiler": "gc"}

# plural -> (group/version, kind, namespaced, short names)
RESOURCES: Dict[str, Tuple[str, str, bool, List[str]]] = {
    "nodes": ("v1", "Node", False, ["no"]),
    "namespaces": ("v1", "Namespace", False, ["ns"]),
    "pods": ("v1", "Pod", True, ["po"]),
    "services": ("v1", "Service", True, ["svc"]),
    "configmaps": ("v1", "ConfigMap", True, ["cm"]),
    "serviceaccounts": ("v1", "ServiceAccount", True, ["sa"]),
    "daemonsets": ("apps/v1", "DaemonSet", True, ["ds"]),
    "jobs": ("batch/v1", "Job", True, []),
    "roles": ("rbac.authorization.k8s.io/v1", "Role", True, []),
    "rolebindings": ("rbac.authorization.k8s.io/v1", "RoleBinding", True, []),
    "clusterroles": ("rbac.authorization.k8s.io/v1", "ClusterRole", False, []),
    "clusterrolebindings": ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", False, []),
}
VERBS = ["create", "delete", "get", "list", "patch", "update"]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, **extra: Any) -> Dict[str, Any]:
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
           "reason": reason, "code": code}
    doc.update(extra)
    return doc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives ($setElementOrder/..., $retainKeys, $patch)
            continue
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _strip_directives(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip_directives(v) for k, v in doc.items() if not k.startswith("$setElementOrder/")}
    if isinstance(doc, list):
        return [_strip_directives(v) for v in doc]
    return doc


def match_labels(labels: Dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: Dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def match_fields(obj: Dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if (str(_field(obj, key) or "") == value) == neg:
            return False
    return True


# --- the server -----------------------------------------------------------------------------------


class KubeAPI:
    """The API-server double for one SimCluster; start() serves it, stop() ends it and every exec."""

    def __init__(self, cluster: SimCluster, gpus: int = 0) -> None:
        self.cluster = cluster
        self.gpus = gpus
        self.store: Dict[str, Dict[Tuple[str, str], Dict[str, Any]]] = {r: {} for r in RESOURCES}
        self.lock = threading.RLock()
        self.rv = 1000
        self.dead: set = set()
        self.no_exec: set = set()  # nodes whose kubelet the API server cannot dial, while their pods still look Ready
        self.requests: List[Tuple[str, str]] = []  # (method, path) of every request, for tests
        self.execs: List[subprocess.Popen] = []
        self.running: Dict[Tuple[str, str], kubestream.PodProcess] = {}  # Job pods' main processes
        self.server: Optional[socketserver.ThreadingTCPServer] = None
        self.dir = os.path.join(cluster.root, "kube")
        os.makedirs(self.dir, exist_ok=True)
        for node in cluster.nodes:
            self._put("nodes", "", self._node_doc(node))
        for ns in ("default", "kube-system"):
            self._put("namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                                         "status": {"phase": "Active"}})

    # ---- lifecycle
    def start(self) -> "KubeAPI":
        api = self

        class Handler(_Handler):
            kube = api

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
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
            self._refresh(name)

    def kubelet_unreachable(self, name: str) -> None:
        """The API server cannot dial the node's kubelet, before the node controller notices: the pods still
        say Ready, every exec is refused with 500 (what a real API server answers then)."""
        with self.lock:
            self.no_exec.add(name)

    def revive(self, name: str) -> None:
        with self.lock:
            self.no_exec.discard(name)
            self.dead.discard(name)
            self._refresh(name)

    def get(self, resource: str, name: str, namespace: str = "") -> Optional[Dict[str, Any]]:
        with self.lock:
            obj = self.store[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj else None

    def items(self, resource: str) -> List[Dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for o in self.store[resource].values()]

    def cordon_by_hand(self, name: str) -> None:
        """What `kubectl cordon` by an admin leaves: spec.unschedulable, no preflight annotation."""
        with self.lock:
            node = self.store["nodes"][("", name)]
            node["spec"]["unschedulable"] = True
            self._bump(node)

    # ---- store
    def _node_doc(self, node: Any) -> Dict[str, Any]:
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

    def _bump(self, obj: Dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _put(self, resource: str, namespace: str, obj: Dict[str, Any]) -> Dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        if RESOURCES[resource][2]:
            meta["namespace"] = namespace
        gv, kind = RESOURCES[resource][:2]
        obj["apiVersion"], obj["kind"] = gv, kind
        self._bump(obj)
        self.store[resource][(namespace, meta["name"])] = obj
        if resource == "daemonsets":
            self._daemonset(obj)
        if resource == "jobs" and not obj.get("status"):
            self._job(obj)
        return obj

    def _delete(self, resource: str, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        obj = self.store[resource].pop((namespace, name), None)
        if obj is None:
            return None
        if resource == "pods" and (namespace, name) in self.running:
            self.running.pop((namespace, name)).kill()
        uid = obj["metadata"]["uid"]
        for key, pod in list(self.store["pods"].items()):  # garbage collection of owned pods
            if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences", [])):
                self._delete("pods", key[0], key[1])
        if resource == "namespaces":
            for res, (_, _, namespaced, _) in RESOURCES.items():
                if namespaced:
                    for key in [k for k in self.store[res] if k[0] == name]:
                        self._delete(res, key[0], key[1])
        return obj

    def _daemonset(self, ds: Dict[str, Any]) -> None:
        """One pod per node, named <ds>-<node>, owned by the DaemonSet; status counts its Ready pods."""
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        template = ds["spec"]["template"]
        for (_, node), _n in list(self.store["nodes"].items()):
            pod_name = "%s-%s" % (name, node)
            pod = {"metadata": {"name": pod_name, "labels": dict(template["metadata"].get("labels", {})),
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                                                     "uid": ds["metadata"]["uid"], "controller": True}]},
                   "spec": dict(copy.deepcopy(template["spec"]), nodeName=node), "status": {}}
            self.rv += 1
            self._put("pods", ns, pod)
            self._refresh_pod(pod)
        self._ds_status(ds)

    def _job(self, job: Dict[str, Any]) -> None:
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
                self._put("pods", ns, pod)
                continue
            used.add(node)
            pod["spec"]["nodeName"] = node
            self._put("pods", ns, pod)
            self._start(ns, pod, job)

    def _start(self, ns: str, pod: Dict[str, Any], job: Dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        command = list(container.get("command") or []) + list(container.get("args") or [])
        key = (ns, pod["metadata"]["name"])
        proc = self.spawn(pod, command)
        pod["status"] = {"phase": "Running", "hostIP": self._node_ip(pod["spec"]["nodeName"]),
                         "conditions": [{"type": "Ready", "status": "True"}],
                         "containerStatuses": [{"name": container["name"], "ready": True, "restartCount": 0,
                                                "state": {"running": {"startedAt": _now()}}}]}
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
                    self._bump(current)
                owner = self.store["jobs"].get((ns, job["metadata"]["name"]))
                if owner is not None:
                    owner["status"]["active"] -= 1
                    owner["status"]["succeeded" if rc == 0 else "failed"] += 1
                    self._bump(owner)

        self.running[key] = kubestream.PodProcess(proc, command, bool(container.get("stdinOnce")), exited)

    def _ds_status(self, ds: Dict[str, Any]) -> None:
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        pods = [p for p in self.store["pods"].values() if p["metadata"]["namespace"] == ns and
                any(o.get("name") == name for o in p["metadata"].get("ownerReferences", []))]
        ready = sum(1 for p in pods if _ready(p))
        ds["status"] = {"desiredNumberScheduled": len(pods), "currentNumberScheduled": len(pods),
                        "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": len(pods),
                        "numberMisscheduled": 0, "observedGeneration": 1}

    def _refresh_pod(self, pod: Dict[str, Any]) -> None:
        dead = pod["spec"].get("nodeName") in self.dead
        pod["status"] = {"phase": "Running", "hostIP": self._node_ip(pod["spec"].get("nodeName")),
                         "conditions": [{"type": "Ready", "status": "False" if dead else "True",
                                         **({"reason": "NodeNotReady"} if dead else {})}],
                         "containerStatuses": [{"name": c["name"], "ready": not dead, "restartCount": 0,
                                                "image": c.get("image", ""), "state": {"running": {"startedAt": _now()}}}
                                               for c in pod["spec"].get("containers", [])]}

    def _node_ip(self, name: Optional[str]) -> str:
        node = self.store["nodes"].get(("", name or ""))
        return node["status"]["addresses"][0]["address"] if node else ""

    def _refresh(self, name: str) -> None:
        node = self.store["nodes"][("", name)]
        node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown" if name in self.dead else "True",
                                         "reason": "NodeStatusUnknown" if name in self.dead else "KubeletReady"}]
        self._bump(node)
        for pod in self.store["pods"].values():
            if pod["spec"].get("nodeName") == name:
                self._refresh_pod(pod)
                self._bump(pod)
        for ds in self.store["daemonsets"].values():
            self._ds_status(ds)

    # ---- exec
    def spawn(self, pod: Dict[str, Any], command: List[str]) -> subprocess.Popen:
        """The exec'd command in its node's network namespace, with the node's environment."""
        node = self.cluster.node(pod["spec"]["nodeName"])
        env = {"PATH": "%s:%s" % (node.bin_dir, SESSION_PATH_TAIL), "PREFLIGHT_SYSFS_ROOT": node.sys_dir,
               "PREFLIGHT_HOST_ROOT": node.root_dir, "HOSTNAME": pod["metadata"]["name"], "HOME": "/root"}
        for container in pod["spec"].get("containers", [])[:1]:
            for item in container.get("env", []):
                if "value" in item:
                    env[item["name"]] = self._host_path(node, pod, container, item["value"])
                elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                    env[item["name"]] = node.name
        argv = ["ip", "netns", "exec", node.ns, "env", "-i"] + ["%s=%s" % kv for kv in env.items()] + list(command)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.execs.append(proc)
        return proc

    @staticmethod
    def _host_path(node: Any, pod: Dict[str, Any], container: Dict[str, Any], value: str) -> str:
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


def _ready(pod: Dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions", []))


class _Handler(http.server.BaseHTTPRequestHandler):
    kube: KubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet; requests are kept in kube.requests
        return

    # ---- plumbing
    def _send(self, code: int, doc: Any, ctype: str = "application/json") -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, code: int, reason: str, message: str, **extra: Any) -> None:
        self._send(code, _status(code, reason, message, **extra))

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        ctype = self.headers.get("Content-Type", "")
        if "protobuf" in ctype:
            raise ValueError("protobuf bodies are not served by the simulator")
        if "yaml" in ctype:
            import yaml

            return yaml.safe_load(raw)
        return json.loads(raw)

    def _route(self) -> Optional[Tuple[str, str, str, str, Dict[str, List[str]]]]:
        """(resource, namespace, name, subresource, query) for a resource path, else None."""
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [p for p in url.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            rest = parts[3:]
        else:
            return None
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":  # .../namespaces/NS/<resource>[/name[/sub]]
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES:
            return None
        return rest[0], namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", query

    # ---- verbs
    def do_GET(self) -> None:
        self.kube.requests.append(("GET", self.path))
        path = urllib.parse.urlsplit(self.path).path.rstrip("/")
        if path.startswith("/openapi/v3"):
            return self._openapi_v3(path)
        if path in ("/version", "/api", "/apis") or (path.startswith("/api") and path.count("/") <= 3 and self._route() is None):
            return self._discovery(path)
        route = self._route()
        if route is None:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resource, ns, name, sub, query = route
        if sub in ("exec", "attach"):
            return self._exec(ns, name, query) if sub == "exec" else self._attach(ns, name)
        with self.kube.lock:
            if not name:
                if query.get("watch", ["false"])[0] in ("true", "1"):
                    return self._fail(405, "MethodNotAllowed", "watch is not served by the simulator")
                items = [copy.deepcopy(o) for (ons, _), o in sorted(self.kube.store[resource].items())
                         if (not ns or ons == ns)
                         and match_labels(o["metadata"].get("labels") or {}, query.get("labelSelector", [""])[0])
                         and match_fields(o, query.get("fieldSelector", [""])[0])]
                gv, kind = RESOURCES[resource][:2]
                return self._send(200, {"apiVersion": gv, "kind": kind + "List", "items": items,
                                        "metadata": {"resourceVersion": str(self.kube.rv)}})
            obj = self.kube.store[resource].get((ns, name))
            if obj is None:
                return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name),
                                  details={"name": name, "kind": resource})
            if sub == "log":
                running = self.kube.running.get((ns, name))
                return self._send(200, bytes(running.log) if running else b"", "text/plain")
            return self._send(200, obj)

    def do_POST(self) -> None:
        self.kube.requests.append(("POST", self.path))
        route = self._route()
        if route is None:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resource, ns, name, sub, query = route
        if sub in ("exec", "attach"):
            return self._exec(ns, name, query) if sub == "exec" else self._attach(ns, name)
        obj = self._body()
        name = (obj or {}).get("metadata", {}).get("name")
        if not name:
            return self._fail(422, "Invalid", "metadata.name: Required value")
        with self.kube.lock:
            if RESOURCES[resource][2] and ("", ns) not in self.kube.store["namespaces"]:
                return self._fail(404, "NotFound", 'namespaces "%s" not found' % ns)
            if (ns, name) in self.kube.store[resource]:
                return self._fail(409, "AlreadyExists", '%s "%s" already exists' % (resource, name))
            if query.get("dryRun"):
                return self._send(201, obj)
            return self._send(201, self.kube._put(resource, ns, obj))

    def do_PUT(self) -> None:
        self.kube.requests.append(("PUT", self.path))
        route = self._route()
        if route is None or not route[2]:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resource, ns, name, _, _ = route
        obj = self._body()
        with self.kube.lock:
            old = self.kube.store[resource].get((ns, name))
            if old is None:
                return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name))
            rv = obj.get("metadata", {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                return self._conflict(resource, name)
            obj["metadata"]["uid"] = old["metadata"]["uid"]
            return self._send(200, self.kube._put(resource, ns, obj))

    def do_PATCH(self) -> None:
        self.kube.requests.append(("PATCH", self.path))
        route = self._route()
        if route is None or not route[2]:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resource, ns, name, _, _ = route
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return self._fail(415, "UnsupportedMediaType", "the body of the request was in an unknown format: " + ctype)
        patch = self._body()
        if ctype == "application/strategic-merge-patch+json":
            patch = _strip_directives(patch)
        with self.kube.lock:
            old = self.kube.store[resource].get((ns, name))
            if old is None:
                return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name))
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                return self._conflict(resource, name)
            new = merge_patch(old, patch)
            new["metadata"]["uid"] = old["metadata"]["uid"]
            new["metadata"]["name"] = name
            return self._send(200, self.kube._put(resource, ns, new))

    def do_DELETE(self) -> None:
        self.kube.requests.append(("DELETE", self.path))
        route = self._route()
        if route is None or not route[2]:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resource, ns, name, _, _ = route
        self._body()  # DeleteOptions (propagationPolicy): read, so the connection's next request parses
        with self.kube.lock:
            obj = self.kube._delete(resource, ns, name)
        if obj is None:
            return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name))
        return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]}})

    def _conflict(self, resource: str, name: str) -> None:
        self._fail(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the object has been modified; please '
                   "apply your changes to the latest version and try again" % (resource, name))

    # ---- discovery
    def _discovery(self, path: str) -> None:
        if path == "/version":
            return self._send(200, SERVER_VERSION)
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        groups: Dict[str, List[str]] = {}
        for plural, (gv, _, _, _) in RESOURCES.items():
            groups.setdefault(gv, []).append(plural)
        if path == "/apis":
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                 "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                for gv in groups if "/" in gv]})
        gv = path[len("/api/"):] if path.startswith("/api/") else path[len("/apis/"):]
        if gv not in groups:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        resources = []
        for plural in groups[gv]:
            kind, namespaced, short = RESOURCES[plural][1:]
            resources.append({"name": plural, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                              "verbs": VERBS, **({"shortNames": short} if short else {})})
            if plural == "pods":
                resources += [{"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
                              {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]}]
        return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})

    def _openapi_v3(self, path: str) -> None:
        """Just enough OpenAPI v3 for kubectl's field-validation probe: every PATCH operation takes
        fieldValidation, so kubectl leaves validation to the server (which the real one does; the
        manifests preflight renders are validated against the real schemas offline, in the tests)."""
        gvs = sorted({gv for gv, _, _, _ in RESOURCES.values()})
        prefix = lambda gv: "api/" + gv if "/" not in gv else "apis/" + gv  # noqa: E731
        if path == "/openapi/v3":
            return self._send(200, {"paths": {prefix(gv): {"serverRelativeURL": "/openapi/v3/%s?hash=sim" % prefix(gv)}
                                              for gv in gvs}})
        gv = path[len("/openapi/v3/"):].split("/", 1)[1] if path.count("/") >= 4 else ""
        paths = {}
        for plural, (rgv, kind, namespaced, _) in RESOURCES.items():
            if rgv != gv:
                continue
            group, _, version = rgv.rpartition("/")
            url = "/%s/%s%s/{name}" % (prefix(rgv), "namespaces/{namespace}/" if namespaced else "", plural)
            paths[url] = {"patch": {"parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                                    "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": kind}}}
        if not paths:
            return self._fail(404, "NotFound", "the server could not find the requested resource")
        return self._send(200, {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.4"}, "paths": paths,
                                "components": {"schemas": {}}})

    # ---- exec over WebSocket
    def _attach(self, ns: str, name: str) -> None:
        kube = self.kube
        with kube.lock:
            running = kube.running.get((ns, name))
            pod = kube.store["pods"].get((ns, name))
        if pod is None:
            return self._fail(404, "NotFound", 'pods "%s" not found' % name)
        if running is None:
            return self._fail(400, "BadRequest", "pod %s is not running (phase %s)" % (name, pod["status"].get("phase")))
        proto = kubestream.upgrade(self)
        if proto is not None:
            running.attach(self, proto)

    def _exec(self, ns: str, name: str, query: Dict[str, List[str]]) -> None:
        kube = self.kube
        with kube.lock:
            pod = copy.deepcopy(kube.store["pods"].get((ns, name)))
        if pod is None:
            return self._fail(404, "NotFound", 'pods "%s" not found' % name)
        if pod["spec"].get("nodeName") in kube.dead | kube.no_exec:
            node = pod["spec"]["nodeName"]
            return self._fail(500, "InternalError", "error dialing backend: dial tcp %s:10250: connect: no route to host"
                              % kube._node_ip(node))
        proto = kubestream.upgrade(self)
        if proto is None:
            return
        try:
            proc = kube.spawn(pod, query.get("command", []))
        except OSError as exc:
            return kubestream.Stream(self).end(_status(500, "InternalError", str(exc)))
        kubestream.exec_stream(self, proc, proto, query.get("command", []))

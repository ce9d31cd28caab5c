"""The REST half of the API-server double (tests/sim/kubeapi.py): routing, discovery, CRUD and patches.

What kubectl 1.32 asks of an API server for preflight's calls, on the wire: /version, the legacy discovery
documents (/api, /api/v1, /apis, /apis/<group>/<version>; kubectl asks for the aggregated v2 form and
falls back when the reply is plain application/json), a minimal /openapi/v3 (every PATCH takes
fieldValidation, so `kubectl apply` leaves validation to the server), GET/LIST (labelSelector,
fieldSelector)/POST/PUT/DELETE of the RESOURCES below, merge and strategic-merge PATCH with
metadata.resourceVersion as a precondition (409 Conflict when stale), pod logs, and the upgrade of
.../exec and .../attach to the streams of tests/sim/kubestream.py. Bodies are JSON (or YAML); protobuf,
which kubectl's typed `create namespace` sends, is refused.
"""

from __future__ import annotations

import copy
import datetime
import http.server
import json
import urllib.parse
import uuid
from typing import Any, Dict, List, Optional, Tuple

from . import kubestream

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
ACCESS_REVIEW = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def _protobuf_fields(data: bytes) -> Dict[int, List[bytes]]:
    """The length-delimited fields of one protobuf message ({field number: [bytes]}); varints skipped."""
    out: Dict[int, List[bytes]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = varint()
        if key & 7 == 2:
            size = varint()
            out.setdefault(key >> 3, []).append(data[i:i + size])
            i += size
        elif key & 7 == 0:
            varint()
        else:
            raise ValueError("protobuf wire type %d is not served by the simulator" % (key & 7))
    return out


def access_review_attributes(body: bytes) -> Dict[str, str]:
    """spec.resourceAttributes of a protobuf SelfSubjectAccessReview (the k8s\\0 envelope, runtime.Unknown
    field 2 the object; generated.proto of authorization/v1: spec = 2, resourceAttributes = 1, and in it
    namespace 1, verb 2, group 3, version 4, resource 5, subresource 6, name 7)."""
    if not body.startswith(b"k8s\x00"):
        raise ValueError("not a Kubernetes protobuf envelope")
    obj = _protobuf_fields(body[4:])[2][0]
    spec = _protobuf_fields(_protobuf_fields(obj).get(2, [b""])[0])
    attrs = _protobuf_fields(spec.get(1, [b""])[0])
    names = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource", 6: "subresource", 7: "name"}
    return {names[k]: v[0].decode() for k, v in attrs.items() if k in names}


def pinned(pod: Dict[str, Any]) -> Optional[str]:
    """The one node a pod's required node affinity on metadata.name names (a DaemonSet pod's), else None."""
    terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    names = [v for t in terms for e in t.get("matchFields", []) if e.get("key") == "metadata.name" for v in e.get("values", [])]
    return names[0] if len(names) == 1 else None


def rbac_allows(store: Dict[str, Any], user: str, groups: List[str], attrs: Dict[str, Any]) -> bool:
    """The RBAC authorizer's answer for one request: a ClusterRoleBinding's rules hold everywhere, a
    RoleBinding's only in its own namespace; a rule matches on apiGroups, resources (with the
    subresource as resource/sub), verbs and, when it lists any, resourceNames ("*" matches all)."""
    ns, group = attrs.get("namespace") or "", attrs.get("group") or ""
    resource = attrs.get("resource") or ""
    if attrs.get("subresource"):
        resource += "/" + attrs["subresource"]

    def subject(s: Dict[str, Any]) -> bool:
        return (s.get("kind") == "User" and s.get("name") == user) or (s.get("kind") == "Group" and s.get("name") in groups)

    def rules(ref: Dict[str, Any], where: str) -> List[Dict[str, Any]]:
        role = store["clusterroles" if ref.get("kind") == "ClusterRole" else "roles"].get(
            ("" if ref.get("kind") == "ClusterRole" else where, ref.get("name")))
        return (role or {}).get("rules") or []

    found = [r for b in store["clusterrolebindings"].values() if any(subject(s) for s in b.get("subjects") or [])
             for r in rules(b["roleRef"], "")]
    found += [r for (bns, _), b in store["rolebindings"].items() if ns and bns == ns
              and any(subject(s) for s in b.get("subjects") or []) for r in rules(b["roleRef"], bns)]
    hit = lambda have, want: "*" in have or want in have  # noqa: E731
    return any(hit(r.get("apiGroups") or [], group) and hit(r.get("resources") or [], resource)
               and hit(r.get("verbs") or [], attrs.get("verb") or "")
               and (not r.get("resourceNames") or attrs.get("name") in r["resourceNames"]) for r in found)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_doc(code: int, reason: str, message: str, **extra: Any) -> Dict[str, Any]:
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


def strip_directives(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: strip_directives(v) for k, v in doc.items() if not k.startswith("$setElementOrder/")}
    if isinstance(doc, list):
        return [strip_directives(v) for v in doc]
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


def field_of(obj: Dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def match_fields(obj: Dict[str, Any], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if (str(field_of(obj, key) or "") == value) == neg:
            return False
    return True


# --- the server -----------------------------------------------------------------------------------


class Handler(http.server.BaseHTTPRequestHandler):
    kube: Any  # the KubeAPI it serves (a subclass per server: KubeAPI.start)
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
        self._send(code, status_doc(code, reason, message, **extra))

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
        if urllib.parse.urlsplit(self.path).path.rstrip("/") == ACCESS_REVIEW:
            return self._access_review()
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
            return self._send(201, self.kube.put(resource, ns, obj))

    def _named(self, method: str) -> Optional[Tuple[str, str, str]]:
        """(resource, namespace, name) of a request on one object, else None (answered 404)."""
        self.kube.requests.append((method, self.path))
        route = self._route()
        if route is None or not route[2]:
            self._fail(404, "NotFound", "the server could not find the requested resource")
            return None
        return route[0], route[1], route[2]

    def _update(self, resource: str, ns: str, name: str, rv: Optional[str], make: Any) -> None:
        """PUT and PATCH: the stored object becomes make(old); a stale resourceVersion is a 409 Conflict."""
        with self.kube.lock:
            old = self.kube.store[resource].get((ns, name))
            if old is None:
                return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name))
            if rv and rv != old["metadata"]["resourceVersion"]:
                return self._conflict(resource, name)
            new = make(old)
            new["metadata"]["uid"], new["metadata"]["name"] = old["metadata"]["uid"], name
            return self._send(200, self.kube.put(resource, ns, new))

    def do_PUT(self) -> None:
        named = self._named("PUT")
        if named is not None:
            obj = self._body()
            self._update(*named, obj.get("metadata", {}).get("resourceVersion"), lambda old: obj)

    def do_PATCH(self) -> None:
        named = self._named("PATCH")
        if named is None:
            return
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return self._fail(415, "UnsupportedMediaType", "the body of the request was in an unknown format: " + ctype)
        patch = self._body()
        if ctype == "application/strategic-merge-patch+json":
            patch = strip_directives(patch)
        held = self.kube.held_patches.get(named[2]) if named[0] == "nodes" else None
        if held is not None:  # the request has arrived; the server applies it once the test lets go
            held.wait(120)
        if named[0] == "nodes" and named[2] in self.kube.racing:
            self.kube.racing.discard(named[2])
            self.kube.cordon_by_hand(named[2])
        self._update(*named, (patch.get("metadata") or {}).get("resourceVersion"), lambda old: merge_patch(old, patch))

    def do_DELETE(self) -> None:
        named = self._named("DELETE")
        if named is None:
            return
        resource, ns, name = named
        self._body()  # DeleteOptions (propagationPolicy): read, so the connection's next request parses
        with self.kube.lock:
            obj = self.kube.delete(resource, ns, name)
        if obj is None:
            return self._fail(404, "NotFound", '%s "%s" not found' % (resource, name))
        return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]}})

    def _access_review(self) -> None:
        """`kubectl auth can-i` (a SelfSubjectAccessReview, which kubectl sends as protobuf), answered by
        evaluating the stored RBAC objects for the impersonated user and groups (--as, --as-group: the
        Impersonate-* headers). The answer is JSON, which kubectl's client decodes by its Content-Type."""
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if "protobuf" in self.headers.get("Content-Type", ""):
            attrs = access_review_attributes(raw)
        else:
            attrs = ((json.loads(raw or b"{}").get("spec") or {}).get("resourceAttributes") or {})
        review: Dict[str, Any] = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                  "metadata": {}, "spec": {"resourceAttributes": attrs}}
        user = self.headers.get("Impersonate-User") or "sim"
        groups = self.headers.get_all("Impersonate-Group") or []
        with self.kube.lock:
            allowed = rbac_allows(self.kube.store, user, groups, attrs)
        self.kube.reviews.append((user, groups, attrs, allowed))
        review["status"] = {"allowed": allowed}
        self._send(201, review)

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
                              % kube.node_ip(node))
        proto = kubestream.upgrade(self)
        if proto is None:
            return
        try:
            proc = kube.spawn(pod, query.get("command", []))
        except OSError as exc:
            return kubestream.Stream(self).end(status_doc(500, "InternalError", str(exc)))
        kubestream.exec_stream(self, proc, proto, query.get("command", []))

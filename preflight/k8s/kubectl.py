"""Talking to Kubernetes through the `kubectl` CLI: argv lists, JSON out, one error type.

kubectl, not a client library: it brings the user's kubeconfig, contexts and exec auth plugins (EKS,
GKE, AKS) for free, and keeps the process / deadline / kill model ssh and srun have. No shell is ever
involved: node names and selectors travel as argv items. Written against kubectl and API servers 1.30
to 1.32 (exec over WebSocket, `v5.channel.k8s.io`; older servers: kubectl falls back to SPDY itself).

The parsers read the API's JSON (`kubectl get -o json`: a v1 List of Node / Pod objects, as in the
Kubernetes API reference, core/v1 Node and Pod) and are pure.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preflight.errors import PreflightError

KUBECTL = "kubectl"

#: the agent DaemonSet's pods carry this label; its container is named CONTAINER
AGENT_LABEL = "app.kubernetes.io/name=preflight-agent"
CONTAINER = "agent"
NAMESPACE = "preflight"
GPU_RESOURCE = "nvidia.com/gpu"


class KubeError(PreflightError):
    """kubectl could not be run or the API server said no."""


@dataclass
class Kubectl:
    """How to run kubectl: an optional --context and the namespace of preflight's agent."""

    context: Optional[str] = None
    namespace: str = NAMESPACE
    binary: str = KUBECTL

    def argv(self, *args: str, namespaced: bool = False) -> List[str]:
        out = [self.binary]
        if self.context:
            out += ["--context", self.context]
        if namespaced:
            out += ["-n", self.namespace]
        return out + list(args)

    def run(self, *args: str, namespaced: bool = False, stdin: Optional[str] = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess:
        argv = self.argv(*args, namespaced=namespaced)
        try:
            return subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=timeout,
                                  stdin=None if stdin is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise KubeError("kubectl not found", "install kubectl (1.30 or newer) or put it on PATH") from None
        except subprocess.TimeoutExpired:
            raise KubeError("kubectl %s did not answer within %g s" % (" ".join(args[:2]), timeout),
                            "check the API server (kubectl cluster-info)") from None

    def json(self, *args: str, namespaced: bool = False, timeout: float = 60.0) -> Dict[str, Any]:
        out = self.run(*args, "-o", "json", namespaced=namespaced, timeout=timeout)
        if out.returncode != 0:
            raise KubeError("kubectl %s failed: %s" % (" ".join(args[:2]), said(out.stderr)),
                            "check the context and your access (kubectl auth can-i)")
        try:
            return json.loads(out.stdout)
        except ValueError:
            raise KubeError("kubectl %s printed no JSON: %r" % (" ".join(args[:2]), out.stdout[:120])) from None


def said(stderr: str) -> str:
    """kubectl's last error line, one line, bounded."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


# --- parsers (pure) ------------------------------------------------------------------------------


@dataclass
class NodeState:
    """What preflight needs of one Kubernetes Node."""

    name: str
    address: Optional[str]
    gpus: int
    ready: bool
    unschedulable: bool
    resource_version: str
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    taints: List[Dict[str, Any]] = field(default_factory=list)


def parse_nodes(doc: Dict[str, Any]) -> Dict[str, NodeState]:
    """`kubectl get nodes -o json` -> {name: NodeState}. Address: InternalIP, else the first address."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a Kubernetes List (no items)")
    out: Dict[str, NodeState] = {}
    for item in doc["items"]:
        meta, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
        name = meta.get("name")
        if not name:
            raise ValueError("a Node without metadata.name")
        addresses = status.get("addresses") or []
        internal = [a.get("address") for a in addresses if a.get("type") == "InternalIP"]
        address = (internal or [a.get("address") for a in addresses] or [None])[0]
        gpus = str((status.get("capacity") or {}).get(GPU_RESOURCE) or "0")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        out[name] = NodeState(name=name, address=address, gpus=int(gpus) if gpus.isdigit() else 0, ready=ready,
                              unschedulable=bool(spec.get("unschedulable")), resource_version=str(meta.get("resourceVersion") or ""),
                              labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
                              taints=list(spec.get("taints") or []))
    return out


@dataclass
class NodePod:
    """preflight's pod on one node (an agent pod, or an all-reduce Job's): its name, or why it cannot be
    used (not_ready); stuck: the reason cannot resolve by itself (waiting longer changes nothing)."""

    node: str
    name: str
    not_ready: Optional[str] = None
    stuck: bool = False


#: a container waiting for one of these reasons does not start by waiting (the kubelet retries a bad image
#: name, a missing Secret/ConfigMap or a crashing command with back-off, forever); ContainerCreating and
#: PodInitializing (an image pull under way) are progress
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                 "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")


def pinned_node(spec: Dict[str, Any]) -> Optional[str]:
    """The node a not yet scheduled pod is pinned to (required node affinity on metadata.name with one
    value, as the DaemonSet controller writes it), else None."""
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    names = [v for t in terms for e in t.get("matchFields") or [] if e.get("key") == "metadata.name"
             and e.get("operator") == "In" for v in e.get("values") or []]
    return names[0] if len(names) == 1 else None


def stuck_reason(status: Dict[str, Any]) -> Optional[str]:
    """'REASON: message' when a pod waits for what cannot resolve by itself: a container in STUCK_REASONS,
    or the scheduler's Unschedulable (no node fits: resources, taints, the node gone)."""
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return "%s: %s" % (waiting["reason"], waiting.get("message") or "no message")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return "Unschedulable: %s" % (cond.get("message") or "no message")
    return None


def owned_by(meta: Dict[str, Any], kind: str, uid: str) -> bool:
    """Whether an object's controller (its ownerReferences entry with controller: true) is the `kind` of that uid."""
    return any(o.get("controller") and o.get("kind") == kind and o.get("uid") == uid for o in meta.get("ownerReferences") or [])


def parse_node_pods(doc: Dict[str, Any], owner: Optional[Tuple[str, str]] = None) -> Dict[str, NodePod]:
    """`kubectl get pods -l LABEL -o json` (the agent's pods, or a Job's) -> {node: NodePod}; a Ready pod
    wins over others on a node. owner (kind, uid): only pods that controller owns count (a label is
    anyone's to set: a pod that only carries it is never exec'd into).

    Ready means phase Running, condition Ready True and no deletionTimestamp (a terminating pod)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a Kubernetes List (no items)")
    out: Dict[str, NodePod] = {}
    for item in doc["items"]:
        meta, spec, status = item.get("metadata") or {}, item.get("spec") or {}, item.get("status") or {}
        node = spec.get("nodeName") or pinned_node(spec)
        if not node or (owner is not None and not owned_by(meta, *owner)):
            continue  # not scheduled yet (nor pinned), or not preflight's
        phase = status.get("phase") or "Unknown"
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        why, stuck = None, None if meta.get("deletionTimestamp") else stuck_reason(status)
        if stuck:
            why = stuck
        elif meta.get("deletionTimestamp"):
            why = "terminating"
        elif phase != "Running":
            why = "phase %s" % phase
        elif not ready or ready[0].get("status") != "True":
            why = "not Ready%s" % (" (%s)" % ready[0]["reason"] if ready and ready[0].get("reason") else "")
        pod = NodePod(node, meta.get("name") or "?", why, stuck is not None)
        if node not in out or (out[node].not_ready and not why):
            out[node] = pod
    return out

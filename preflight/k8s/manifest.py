"""The Kubernetes objects preflight needs, rendered as data: `preflight k8s manifest` prints them.

    Namespace            preflight
    ServiceAccount       preflight-agent: the agent pods' identity; it holds no API rights and mounts no token
    DaemonSet            preflight-agent: one privileged, sleeping pod per node, the target of `kubectl exec`
    ClusterRole          preflight-operator: what is cluster-scoped, and no more: nodes get/list/patch
                         (cordon, taint, label, annotate), namespaces create, and get/patch of the agent's
                         namespace only (resourceNames; create cannot be limited by name)
    ClusterRoleBinding   preflight-operator to the group preflight:operators (bind your users or CI account to it)
    Role                 preflight-operator, in the agent's namespace only: pods get/list, pods/exec and
                         pods/attach create+get (WebSocket exec is a GET upgraded; 1.31+ authorizes it as
                         create), jobs get/list/create/delete (the all-reduce's Job, deleted after the run),
                         daemonsets/serviceaccounts get/create/patch for --k8s-deploy
    RoleBinding          preflight-operator to the same group, in that namespace

pods/exec, pods/attach, Jobs, DaemonSets and ServiceAccounts are each a path to cluster-admin where they
are granted (exec into a privileged pod, or create one), so they are granted in the agent's namespace and
nowhere else; that namespace itself is worth cluster-admin (its pods are privileged, share the host's PID
namespace and mount its /): only the operators may write to it. preflight execs only into pods whose
controller (ownerReferences) is its DaemonSet, by uid, and attaches only to pods owned by the Job it
created, never into another pod that merely carries the label. The default image is pinned by digest
(the same bytes on every node, whatever the tag points to later); --k8s-image takes NAME@sha256:DIGEST.

The agent runs no code of its own: it sleeps, and each check run execs the probe bundle into it. It needs
the host's view of the node: hostNetwork (interfaces, MTU, the rendezvous port), hostPID (process
groups and the node's kernel log), privileged (device files, sysfs writes are never made but reads of
/sys/class/infiniband need it on some kernels), and the host's /dev, /sys, /proc, /dev/infiniband and /
(read-only, at /host: PREFLIGHT_HOST_ROOT points the probes at the node's /etc files). It requests no
GPU (the checks look at the GPUs without holding them: NVIDIA_VISIBLE_DEVICES=all with
NVIDIA_DRIVER_CAPABILITIES=utility lets the NVIDIA container runtime inject nvidia-smi and NVML, as for
monitoring agents) and tolerates every NoSchedule/NoExecute taint, the GPU operator's and `unschedulable`
included, so a cordoned or tainted node can still be checked — and resumed.

Objects follow the Kubernetes API reference for v1.30-1.32 (core/v1, apps/v1, rbac.authorization.k8s.io/v1);
tests/transport/test_k8s_unit.py validates them against the published OpenAPI schemas where kubernetes-validate
is installed.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from preflight.k8s.kubectl import AGENT_LABEL, CONTAINER, NAMESPACE

AGENT = "preflight-agent"
OPERATOR = "preflight-operator"
OPERATOR_GROUP = "preflight:operators"
#: the agent image: any image with python3 (3.8+), sh, setsid and kill (util-linux, procps), iproute2 and
#: iputils-ping for the network checks. Air-gapped clusters mirror it and pass --k8s-image.
#: The default is a tag: no digest could be verified where this was written (a digest of one platform's
#: manifest, not the multi-arch index, would fail to pull on arm64 nodes). `preflight k8s manifest` notes it;
#: pin the image you mirror with --k8s-image NAME@sha256:DIGEST so every node runs the same bytes.
IMAGE = "docker.io/library/python:3.12-bookworm"

_LABEL_KEY, _LABEL_VALUE = AGENT_LABEL.split("=", 1)


def _meta(name: str, namespace: Optional[str] = None) -> Dict[str, Any]:
    meta: Dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "preflight"}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def agent_objects(namespace: str = NAMESPACE, image: str = IMAGE) -> List[Dict[str, Any]]:
    """Namespace, ServiceAccount and the agent DaemonSet, in the order `kubectl apply` needs them."""
    host = [("dev", "/dev", "/dev", False), ("sys", "/sys", "/sys", False), ("proc", "/proc", "/host/proc", True),
            ("infiniband", "/dev/infiniband", "/dev/infiniband", False), ("root", "/", "/host", True)]
    volumes = [{"name": n, "hostPath": dict({"path": p}, **({"type": "DirectoryOrCreate"} if n == "infiniband" else {}))}
               for n, p, _, _ in host]
    mounts = [dict({"name": n, "mountPath": m}, **({"readOnly": True} if ro else {})) for n, _, m, ro in host]
    labels = {_LABEL_KEY: _LABEL_VALUE}
    pod_spec = {
        "serviceAccountName": AGENT,
        "automountServiceAccountToken": False,
        "hostNetwork": True,
        "hostPID": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "priorityClassName": "system-node-critical",
        "terminationGracePeriodSeconds": 1,
        # every taint: GPU nodes are tainted (nvidia.com/gpu), and a node preflight (or anyone) cordoned
        # or tainted must stay checkable
        "tolerations": [{"operator": "Exists"}],
        "containers": [{
            "name": CONTAINER,
            "image": image,
            "command": ["sleep", "infinity"],
            "securityContext": {"privileged": True},
            "env": [{"name": "PREFLIGHT_HOST_ROOT", "value": "/host"},
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "1Gi"}},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    daemonset = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": _meta(AGENT, namespace),
                 "spec": {"selector": {"matchLabels": labels},
                          "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
                          "template": {"metadata": {"labels": dict(labels, **{"app.kubernetes.io/part-of": "preflight"})},
                                       "spec": pod_spec}}}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(namespace)},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(AGENT, namespace),
             "automountServiceAccountToken": False},
            daemonset]


def operator_rbac(namespace: str = NAMESPACE) -> List[Dict[str, Any]]:
    """The least rights the preflight command needs: cluster-scoped ones in the ClusterRole, the rest in a
    Role bound in the agent's namespace only (see the module docstring)."""
    rbac = "rbac.authorization.k8s.io/v1"
    cluster_rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": [namespace], "verbs": ["get", "patch"]},
    ]
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/exec", "pods/attach"], "verbs": ["create", "get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create", "patch"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "create", "patch"]},
    ]
    group = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": OPERATOR_GROUP}]
    return [{"apiVersion": rbac, "kind": "ClusterRole", "metadata": _meta(OPERATOR), "rules": cluster_rules},
            {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": _meta(OPERATOR),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR},
             "subjects": group},
            {"apiVersion": rbac, "kind": "Role", "metadata": _meta(OPERATOR, namespace), "rules": rules},
            {"apiVersion": rbac, "kind": "RoleBinding", "metadata": _meta(OPERATOR, namespace),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR},
             "subjects": group}]


def everything(namespace: str = NAMESPACE, image: str = IMAGE) -> List[Dict[str, Any]]:
    """The agent's Namespace first (the Role and RoleBinding live in it), then the RBAC, then the agent."""
    agent = agent_objects(namespace, image)
    return agent[:1] + operator_rbac(namespace) + agent[1:]


def pinned(image: str) -> bool:
    """Whether an image reference names its bytes (NAME@sha256:<64 hex>), not a tag that can move."""
    digest = image.rpartition("@")[2]
    return digest.startswith("sha256:") and len(digest) == 71 and all(c in "0123456789abcdef" for c in digest[7:])


def bench_job(name: str, namespace: str, nodes: List[str], gpus: int, image: str, command: List[str],
              deadline_s: float, ttl_s: int = 300) -> Dict[str, Any]:
    """The all-reduce's Indexed Job: one pod per node (required node affinity on metadata.name to exactly
    these nodes, as the DaemonSet controller pins its pods; one per node by anti-affinity), each holding all of its node's GPUs so nothing else uses them meanwhile,
    waiting for the bundle on its stdin (stdinOnce: the end of preflight's attach closes it). hostNetwork:
    the rendezvous is at the first node's data address, as preflight planned it, so no Service is needed.
    backoffLimitPerIndex 0 (a failed rank is a finding, not a retry, and fails its own index only: with
    a Job-wide backoffLimit 0 the first pod to exit non-zero fails the Job and Kubernetes terminates the
    other ranks' pods before their results are read; Indexed Jobs, beta and on by default since 1.29),
    activeDeadlineSeconds from preflight's deadline and a TTL: the Job also goes away if preflight is
    killed before it can delete it."""
    labels = {"app.kubernetes.io/name": "preflight-bench", "app.kubernetes.io/part-of": "preflight", "preflight/run": name}
    container: Dict[str, Any] = {
        "name": "bench", "image": image, "command": command, "stdin": True, "stdinOnce": True,
        "securityContext": {"privileged": True},  # /dev/infiniband and locked memory for NCCL's IB transport
        "volumeMounts": [{"name": "infiniband", "mountPath": "/dev/infiniband"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    spec = {
        "completionMode": "Indexed", "completions": len(nodes), "parallelism": len(nodes), "backoffLimitPerIndex": 0,
        "activeDeadlineSeconds": max(1, int(deadline_s + 0.999)), "ttlSecondsAfterFinished": ttl_s,
        "template": {"metadata": {"labels": labels}, "spec": {
            "restartPolicy": "Never", "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],  # a cordoned node being rechecked (--resume) included
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(nodes)}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"preflight/run": name}}, "topologyKey": "kubernetes.io/hostname"}]}},
            "containers": [container],
            "volumes": [{"name": "infiniband", "hostPath": {"path": "/dev/infiniband", "type": "DirectoryOrCreate"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}}],
        }},
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": dict(_meta(name, namespace), labels=labels), "spec": spec}


#: left out of the ConfigMap: on Kubernetes the launcher (the Job's headless Service, the PyTorchJob/JobSet
#: operator) owns the rendezvous; the env file's MASTER_ADDR is a node address from preflight's own run
LAUNCHER_OWNED = ("MASTER_ADDR", "MASTER_PORT")


def env_configmap(variables: Dict[str, str], name: str = "preflight-nccl-env", namespace: str = "default") -> Dict[str, Any]:
    """The recommended NCCL env as a ConfigMap, for a PyTorchJob/JobSet container's `envFrom: [{configMapRef}]`
    (a variable the container's own `env:` sets wins over envFrom, as a user's setting does)."""
    data = {k: v for k, v in variables.items() if k not in LAUNCHER_OWNED}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, namespace), "data": data}


def dump(objects: List[Dict[str, Any]]) -> str:
    """YAML documents separated by ---, keys in the order written (JSON strings: safe for any value)."""
    import yaml

    return "".join("---\n" + yaml.safe_dump(json.loads(json.dumps(o)), sort_keys=False, default_flow_style=False)
                   for o in objects)

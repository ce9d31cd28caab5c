"""Kubernetes pieces without a cluster: parsers of the API's JSON, the node-action plan and patches, the
rendered manifests (validated against the Kubernetes OpenAPI schemas where kubernetes-validate is
installed: it bundles them, no network), and the CLI's usage errors."""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from preflight.k8s import manifest, nodes
from preflight.k8s.kubectl import NodeState, parse_node_pods, parse_nodes
from preflight.model import Finding, Status
from tests.paths import REPO

ROOT = REPO

# shaped as `kubectl get nodes -o json` prints a v1 NodeList (core/v1 Node, API reference v1.32)
NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "gpu-01", "resourceVersion": "4711", "labels": {"nvidia.com/gpu.present": "true"}},
    "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    "status": {"addresses": [{"type": "Hostname", "address": "gpu-01"}, {"type": "InternalIP", "address": "10.0.0.11"}],
               "capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
               "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]},
}


def _pod(node, name, phase="Running", ready="True", reason=None, deleting=False):
    cond = {"type": "Ready", "status": ready}
    if reason:
        cond["reason"] = reason
    meta = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase, "conditions": [cond]}}


def test_parse_nodes_reads_address_gpus_taints_and_readiness():
    cordoned = copy.deepcopy(NODE)
    cordoned["metadata"]["name"] = "gpu-02"
    cordoned["spec"]["unschedulable"] = True
    cordoned["status"]["conditions"][1]["status"] = "Unknown"
    del cordoned["status"]["capacity"]["nvidia.com/gpu"]
    got = parse_nodes({"kind": "NodeList", "items": [NODE, cordoned]})
    assert got["gpu-01"].address == "10.0.0.11" and got["gpu-01"].gpus == 8 and got["gpu-01"].ready
    assert not got["gpu-01"].unschedulable and got["gpu-01"].resource_version == "4711"
    assert got["gpu-02"].unschedulable and not got["gpu-02"].ready and got["gpu-02"].gpus == 0


def test_parse_nodes_rejects_what_is_not_a_list():
    with pytest.raises(ValueError):
        parse_nodes({"kind": "Node", "metadata": {"name": "x"}})


def test_parse_node_pods_names_why_a_pod_cannot_be_used():
    doc = {"items": [_pod("a", "agent-a"), _pod("b", "agent-b", ready="False", reason="NodeNotReady"),
                     _pod("c", "agent-c", phase="Pending", ready="False"), _pod("d", "agent-d", deleting=True),
                     _pod("e", "agent-e-old", deleting=True), _pod("e", "agent-e"),
                     {"metadata": {"name": "unscheduled"}, "spec": {}, "status": {"phase": "Pending"}}]}
    got = parse_node_pods(doc)
    assert got["a"].not_ready is None
    assert got["b"].not_ready == "not Ready (NodeNotReady)"
    assert got["c"].not_ready == "phase Pending"
    assert got["d"].not_ready == "terminating"
    assert got["e"].name == "agent-e" and got["e"].not_ready is None  # the Ready one of a rollout wins
    assert "unscheduled" not in {p.name for p in got.values()}


def _state(name, unschedulable=False, annotation=None, taints=()):
    return NodeState(name=name, address=None, gpus=8, ready=True, unschedulable=unschedulable, resource_version="7",
                     annotations={nodes.ANNOTATION: annotation} if annotation else {}, taints=list(taints))


def _fail(node, check="mtu"):
    return Finding(check, node, Status.FAIL, "eth1: jumbo frames black-holed")


def _pass(node):
    return Finding("ssh", node, Status.PASS, "ok")


OURS = [{"key": nodes.TAINT_KEY, "value": "mtu", "effect": "NoSchedule"}]


def test_plan_drains_failing_leaves_someone_elses_cordon_and_resumes_only_ours():
    state = {"a": _state("a"), "b": _state("b", unschedulable=True),  # b: cordoned by an admin, passing
             "c": _state("c", unschedulable=True, annotation="preflight: mtu: old", taints=OURS),  # ours, passing now
             "d": _state("d", unschedulable=True, annotation="preflight: mtu: old", taints=OURS)}  # ours, still failing
    state.update({n: _state(n) for n in "efghijkl"})
    findings = [_fail("a"), _fail("d"), _pass("b"), _pass("c")] + [_pass(n) for n in "efghijkl"]
    acts = nodes.plan(findings, state, drain=True, resume=True)
    assert acts.plan.drain == {"a": "preflight: mtu: eth1: jumbo frames black-holed"}
    assert acts.plan.resume == ["c"]
    assert list(acts.plan.left_alone) == ["b"]
    assert acts.lines()[-1] == "left alone: b (cordoned by someone else: unschedulable without preflight's preflight/drained annotation)"
    assert "b" not in acts.labels and acts.labels["a"] == "fail" and acts.labels["c"] == "pass"


def test_resume_needs_preflights_cordon_annotation_and_taint_all_in_place():
    """An admin who took preflight's taint off but kept the node cordoned made the cordon theirs; a node
    uncordoned by hand keeps no stale mark (cleared in its label patch), so a later admin cordon is theirs."""
    state = {"t": _state("t", unschedulable=True, annotation="preflight: mtu: old"),  # taint removed by hand
             "u": _state("u", annotation="preflight: mtu: old", taints=OURS),  # uncordoned by hand
             "v": _state("v", taints=OURS)}  # uncordoned by hand, annotation removed, taint kept
    state.update({n: _state(n) for n in "efghijkl"})
    acts = nodes.plan([_pass(n) for n in state], state, drain=True, resume=True)
    assert acts.plan.resume == [] and "t" in acts.plan.left_alone
    assert "without its preflight/unhealthy taint" in acts.plan.left_alone["t"]
    assert acts.cleared == ["u", "v"] and "cleared preflight's annotation and taint from u,v" in acts.lines()[-1]
    patch = nodes.patch_for(state["u"], None, False, "pass", "s")
    assert patch["metadata"]["annotations"] == {nodes.ANNOTATION: None} and patch["spec"] == {"taints": None}
    assert "spec" not in nodes.patch_for(state["e"], None, False, "pass", "s")  # a plain node: labels only


def test_plan_refuses_to_drain_a_cluster_wide_failure():
    state = {n: _state(n) for n in "abcde"}
    acts = nodes.plan([_fail(n) for n in "abc"] + [_pass(n) for n in "de"], state, drain=True, resume=False)
    assert acts.plan.drain == {} and "drained nothing" in acts.plan.refused


def test_drain_patch_keeps_other_taints_and_carries_the_precondition():
    node = _state("a", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    patch = nodes.patch_for(node, "preflight: mtu: x", False, "fail", "20261125T100000Z", "mtu")
    assert patch["metadata"]["resourceVersion"] == "7"
    assert patch["metadata"]["annotations"] == {nodes.ANNOTATION: "preflight: mtu: x"}
    assert patch["metadata"]["labels"] == {nodes.STATUS_LABEL: "fail", nodes.CHECKED_LABEL: "20261125T100000Z"}
    assert patch["spec"] == {"unschedulable": True, "taints": [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"}, {"key": nodes.TAINT_KEY, "value": "mtu", "effect": "NoSchedule"}]}


def test_resume_patch_removes_only_preflights_taint():
    node = _state("a", True, "preflight: mtu: x", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                                                   {"key": nodes.TAINT_KEY, "value": "mtu", "effect": "NoSchedule"}])
    patch = nodes.patch_for(node, None, True, "pass", "s")
    assert patch["spec"] == {"unschedulable": None, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    assert patch["metadata"]["annotations"] == {nodes.ANNOTATION: None}
    alone = nodes.patch_for(_state("b", True, "preflight: x", [{"key": nodes.TAINT_KEY, "effect": "NoSchedule"}]),
                            None, True, None, "s")
    assert alone["spec"]["taints"] is None  # the last taint gone: the field is removed, not left []


@pytest.mark.parametrize("check,value", [("mtu", "mtu"), ("ib_hca", "ib_hca"), ("a b/c", "a_b_c"), ("--", "failed"),
                                         ("x" * 80, "x" * 63)])
def test_taint_value_is_a_valid_label_value(check, value):
    assert nodes.taint_value(check) == value


def test_agent_manifest_is_privileged_host_wide_and_requests_no_gpu():
    ds = [o for o in manifest.agent_objects() if o["kind"] == "DaemonSet"][0]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] and spec["hostPID"] and spec["automountServiceAccountToken"] is False
    assert {"operator": "Exists"} in spec["tolerations"]
    container = spec["containers"][0]
    assert container["securityContext"]["privileged"] is True
    assert "nvidia.com/gpu" not in str(container["resources"])
    paths = {v["hostPath"]["path"] for v in spec["volumes"]}
    assert {"/dev", "/sys", "/proc", "/dev/infiniband", "/"} <= paths
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"].startswith("/host"))


def test_operator_rbac_has_the_least_verbs():
    cluster_role, _, role, _ = manifest.operator_rbac()
    assert cluster_role["kind"] == "ClusterRole" and role["kind"] == "Role"
    cluster = {(r["apiGroups"][0], res, tuple(r.get("resourceNames", ()))): set(r["verbs"])
               for r in cluster_role["rules"] for res in r["resources"]}
    assert cluster == {("", "nodes", ()): {"get", "list", "patch"},  # cordon/taint/label: patch, never update/delete
                       ("", "namespaces", ()): {"create"},  # create cannot be limited by name
                       ("", "namespaces", ("preflight",)): {"get", "patch"}}
    verbs = {(r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]}
    assert verbs[("", "pods/exec")] == verbs[("", "pods/attach")] == {"create", "get"}
    assert [k for k, v in verbs.items() if "delete" in v] == [("batch", "jobs")]  # only what preflight creates
    assert not any("*" in v or "update" in v for v in verbs.values())


def test_manifests_validate_against_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    objects = manifest.everything() + [manifest.env_configmap({"NCCL_SOCKET_IFNAME": "eth1"}),
                                       manifest.bench_job("preflight-bench-1", "preflight", ["a", "b"], 8, "img", ["sh"], 200.5)]
    for version in ("1.30", "1.32"):
        for obj in objects:
            kv.validate(obj, version, strict=True)
    broken = copy.deepcopy(manifest.agent_objects()[-1])
    broken["spec"]["template"]["spec"]["hostNetwrok"] = True  # the validator is not a rubber stamp
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.32", strict=True)


def test_manifest_command_prints_yaml_documents():
    import yaml

    out = subprocess.run([sys.executable, "-m", "preflight", "k8s", "manifest", "--k8s-namespace", "gpu-health"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [d["kind"] for d in docs] == ["Namespace", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                         "ServiceAccount", "DaemonSet"]
    assert docs[-1]["metadata"]["namespace"] == docs[3]["metadata"]["namespace"] == "gpu-health"
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == manifest.IMAGE
    assert "digest" in out.stderr  # the default is a tag: the note says to pin the mirrored image by digest
    pinned = manifest.IMAGE + "@sha256:" + "ab" * 32
    assert manifest.pinned(pinned) and not manifest.pinned(manifest.IMAGE)
    tagged = subprocess.run([sys.executable, "-m", "preflight", "k8s", "manifest", "--k8s-image", "python:3.12"],
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert tagged.returncode == 0 and "not pinned by digest" in tagged.stderr


@pytest.mark.parametrize("argv,says", [
    (["--selector", "a=b"], "apply only with --k8s"),
    (["--k8s"], "--k8s needs the nodes to check"),
    (["--k8s", "--slurm", "--selector", "a=b"], "not from --slurm"),
    (["--k8s", "--partition", "p", "--nodes", "2"], "are Slurm's"),
])
def test_cli_usage_errors_are_one_line_exit_2(argv, says, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, KUBECONFIG=str(tmp_path / "none"))
    out = subprocess.run([sys.executable, "-m", "preflight", "check"] + argv, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_unreachable_api_server_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "kubeconfig"
    cfg.write_text('{"apiVersion":"v1","kind":"Config","current-context":"x","clusters":[{"name":"x","cluster":'
                   '{"server":"http://127.0.0.1:9"}}],"users":[{"name":"x","user":{}}],"contexts":[{"name":"x",'
                   '"context":{"cluster":"x","user":"x"}}]}')
    env = dict(os.environ, PYTHONPATH=ROOT, KUBECONFIG=str(cfg), KUBECACHEDIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "preflight", "check", "--k8s", "--selector", "a=b"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert "kubectl get nodes failed" in out.stderr and "Traceback" not in out.stderr


def test_training_job_example_validates():
    kv = pytest.importorskip("kubernetes_validate")
    import yaml

    with open(os.path.join(ROOT, "inventory", "k8s-training-job.yaml")) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    for doc in docs:
        kv.validate(doc, "1.32", strict=True)
    cm = manifest.env_configmap({"NCCL_SOCKET_IFNAME": "eth1"})
    env_from = docs[1]["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
    assert env_from == cm["metadata"]["name"]


def test_dry_run_prints_one_patch_per_node_and_runs_nothing():
    from preflight.k8s.kubectl import Kubectl

    class NoRun(Kubectl):
        def run(self, *args, **kw):  # a dry run must not call kubectl
            raise AssertionError("kubectl run during a dry run: %s" % (args,))

    state = {"a": _state("a"), "b": _state("b", unschedulable=True)}
    findings = [_fail("a"), _pass("b")]
    acts = nodes.plan(findings, state, drain=True, resume=True, max_fraction=1.0)
    shown = nodes.apply(acts, NoRun(context="prod"), state, findings, dry_run=True)
    assert len(shown) == 1 and shown[0].startswith("kubectl --context prod patch node a --type=merge -p ")
    argv = shlex.split(shown[0])  # pastes back into a shell as the same argv
    assert json.loads(argv[-1])["spec"]["unschedulable"] is True


def test_dry_run_quotes_a_reason_that_holds_quotes():
    from preflight.k8s.kubectl import Kubectl

    state = {n: _state(n) for n in "abcdef"}
    findings = [Finding("nic", "a", Status.FAIL, "eth1 'down'; $(reboot)")] + [_pass(n) for n in "bcdef"]
    acts = nodes.plan(findings, state, drain=True, resume=False)
    shown = nodes.apply(acts, Kubectl(), state, findings, dry_run=True)
    patch = json.loads(shlex.split(shown[0])[-1])
    assert patch["metadata"]["annotations"][nodes.ANNOTATION] == "preflight: nic: eth1 'down'; $(reboot)"


def test_bench_job_holds_every_gpu_of_exactly_the_given_nodes():
    job = manifest.bench_job("preflight-bench-1", "preflight", ["gpu-01", "gpu-02"], 8, "img", ["sh"], 200.5)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert "backoffLimit" not in spec and spec["backoffLimitPerIndex"] == 0 and spec["activeDeadlineSeconds"] == 201 and spec["ttlSecondsAfterFinished"] > 0
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert container["stdin"] and container["stdinOnce"] and pod["hostNetwork"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-01", "gpu-02"]}]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    cpu = manifest.bench_job("preflight-bench-2", "preflight", ["cpu-01"], 0, "img", ["sh"], 10)
    assert "resources" not in cpu["spec"]["template"]["spec"]["containers"][0]  # CPU nodes: no GPU request


def test_a_jobs_owner_is_judged_gone_only_on_this_host():
    """A killed run's Job is deleted only when its owner was a process here that is gone (the pid reused by
    another process counts as gone: the start time differs); a live run's, or another host's, is not."""
    from preflight.k8s import benchjob

    me = benchjob.owner()
    assert benchjob.owner_gone(me) is False
    proc = subprocess.Popen(["true"])
    proc.wait()
    host, _, start = me.split()
    assert benchjob.owner_gone("%s %d %s" % (host, proc.pid, start)) is True
    assert benchjob.owner_gone("%s %d 1" % (host, os.getpid())) is True  # same pid, another start: reused
    assert benchjob.owner_gone("elsewhere.example 1 1") is None and benchjob.owner_gone("") is None

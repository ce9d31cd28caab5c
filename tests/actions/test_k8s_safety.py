"""Acting on a Kubernetes fleet safely (issue 39), through the real kubectl against the API-server double.

Never undo an admin's decision (a hand uncordon, then a maintenance cordon, survives --resume), name a
stuck agent pod at once, keep every rank's all-reduce result when one rank exits, and fail closed when
the controller is SIGKILLed: the next run names and cleans what a dead run left.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

import pytest

from preflight.transport import bundle
from tests.transport.test_k8s_e2e import ONLY_NET, ROOT, SELECT, _MISSING, _env, _run, deployed, kube  # noqa: F401 - the fixtures

pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING)
SSH = ["--only", "ssh", "--no-progress"]


def _kubectl(api, *argv):
    out = subprocess.run(["kubectl", *argv], env=_env(api), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _marks(api, name):
    node = api.get("nodes", name)
    return (bool(node["spec"].get("unschedulable")), (node["metadata"].get("annotations") or {}).get("preflight/drained"),
            [t["key"] for t in node["spec"].get("taints") or []])


def test_resume_never_undoes_an_admins_cordon_made_after_a_hand_uncordon(deployed):
    """preflight cordons n004; an admin uncordons it by hand; a nightly --drain run passes it and clears
    preflight's marks; the admin cordons it for maintenance; --resume leaves it cordoned."""
    cluster, api = deployed
    api.dead_node("n004")
    out = _run(api, SELECT + SSH + ["--drain"])
    assert out.returncode == 1 and _marks(api, "n004")[0] is True, out.stdout
    api.revive("n004")
    _kubectl(api, "uncordon", "n004")  # the admin: back to service by hand, preflight's marks still on it
    assert _marks(api, "n004")[0] is False and _marks(api, "n004")[2] == ["preflight/unhealthy"]
    out = _run(api, SELECT + SSH + ["--drain"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n004") == (False, None, [])  # the hand-uncordoned node keeps no stale taint
    said = " ".join(out.stdout.split())
    assert "cleared preflight's annotation and taint from n004" in said, out.stdout
    _kubectl(api, "cordon", "n004")  # the admin: maintenance, not preflight's
    out = _run(api, SELECT + SSH + ["--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n004") == (True, None, []), out.stdout
    assert "left alone: n004" in out.stdout


def test_a_cordon_whose_taint_an_admin_removed_is_not_resumed(deployed):
    """The healthy-but-unusual twin: preflight's annotation on a cordoned node whose taint an admin took
    off is no longer preflight's whole cordon; a cordon that is whole is resumed."""
    cluster, api = deployed
    for name in ("n002", "n003"):
        api.dead_node(name)
    out = _run(api, SELECT + SSH + ["--drain", "--max-drain-fraction", "0.5"])
    assert out.returncode == 1 and _marks(api, "n002")[0] and _marks(api, "n003")[0], out.stdout
    for name in ("n002", "n003"):
        api.revive(name)
    _kubectl(api, "taint", "node", "n002", "preflight/unhealthy-")
    out = _run(api, SELECT + SSH + ["--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n002")[0] is True and "left alone: n002" in out.stdout
    assert _marks(api, "n003") == (False, None, [])


def _apply_manifest(api):
    text = subprocess.run([sys.executable, "-m", "preflight", "k8s", "manifest"], env=_env(api), capture_output=True,
                          text=True, timeout=60, check=True).stdout
    out = subprocess.run(["kubectl", "apply", "-f", "-"], input=text, env=_env(api), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def _can(api, verb, what, namespace=None):
    """`kubectl auth can-i` as a member of preflight:operators; WHAT is RESOURCE[/SUBRESOURCE] or TYPE/NAME."""
    sub = []
    if what.startswith("pods/"):
        what, sub = "pods", ["--subresource", what.split("/", 1)[1]]
    argv = ["kubectl", "auth", "can-i", verb, what, *sub, "--as", "ci-bot", "--as-group", "preflight:operators"]
    where = ["--all-namespaces"] if namespace == "*" else ["-n", namespace] if namespace else []
    out = subprocess.run(argv + where, env=_env(api), capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
    return out.stdout.strip() == "yes"


def test_the_operator_can_exec_nowhere_but_the_agent_namespace(deployed):
    """`preflight k8s manifest` applied, then `kubectl auth can-i` as a member of preflight:operators: every
    right that leads to cluster-admin (exec, attach, Jobs, DaemonSets, ServiceAccounts, a namespace's
    labels) holds in the agent's namespace and nowhere else; the cluster-scoped node rights hold."""
    cluster, api = deployed
    _apply_manifest(api)
    for verb, what in (("create", "pods/exec"), ("get", "pods/exec"), ("create", "pods/attach"), ("create", "jobs"),
                       ("create", "daemonsets"), ("create", "serviceaccounts"), ("list", "pods")):
        assert _can(api, verb, what, "preflight"), (verb, what)
        for elsewhere in ("kube-system", "default"):
            assert not _can(api, verb, what, elsewhere), (verb, what, elsewhere)
    assert _can(api, "patch", "nodes") and _can(api, "list", "nodes") and not _can(api, "delete", "nodes")
    assert _can(api, "patch", "namespace/preflight") and not _can(api, "patch", "namespace/kube-system")
    assert not _can(api, "create", "pods/exec", "*") and not _can(api, "create", "jobs", "*")  # no cluster-wide grant
    assert not _can(api, "create", "clusterrolebindings") and not _can(api, "create", "rolebindings", "preflight")


def test_a_pod_that_only_carries_the_agent_label_is_never_exec_d_into(deployed):
    """A pod that is not the agent DaemonSet's (whoever may create pods in the namespace set the label on
    it) is not an agent: its node is named without one, and nothing is exec'd into the decoy."""
    cluster, api = deployed
    with api.lock:
        real = api.get("pods", "preflight-agent-n003", "preflight")
        api.delete("pods", "preflight", "preflight-agent-n003")
        decoy = {"metadata": {"name": "decoy-n003", "labels": real["metadata"]["labels"]}, "spec": real["spec"]}
        api.refresh_pod(api.put("pods", "preflight", decoy))
    try:
        out = _run(api, SELECT + SSH)
        said = " ".join(out.stdout.split())
        assert out.returncode == 1 and "no preflight agent pod on n003" in said, out.stdout
        assert not any("decoy-n003" in p for _, p in api.requests if "/exec" in p)
    finally:
        with api.lock:
            api.delete("pods", "preflight", "decoy-n003")
            api.delete("daemonsets", "preflight", "preflight-agent")  # the next test deploys it again, whole


def test_agent_pods_that_cannot_start_are_named_at_once_with_their_reason(deployed):
    """--k8s-deploy with a wait far longer than the test's own timeout: the pods stuck on a bad image, a
    missing Secret or no room end the wait at once, each node named with its kubelet's or scheduler's reason."""
    cluster, api = deployed
    api.agent_pod_fault("n002", "ImagePullBackOff", 'Back-off pulling image "registry.local/python:3.12-bookworm"')
    api.agent_pod_fault("n005", "CreateContainerConfigError", 'secret "registry-creds" not found')
    api.agent_pod_fault("n007", "Unschedulable", "0/8 nodes are available: 1 Insufficient memory, 7 node(s) didn't "
                        "match Pod's node affinity/selector.")
    out = _run(api, SELECT + SSH + ["--k8s-deploy", "--k8s-wait", "3600"], timeout=150)
    assert out.returncode == 1, out.stdout + out.stderr
    said = " ".join((out.stdout + out.stderr).split())
    assert "agent pod on n002 cannot start: ImagePullBackOff: Back-off pulling image" in said, said
    assert "n005 cannot start: CreateContainerConfigError: secret \"registry-creds\" not found" in said, said
    assert "n007 cannot start: Unschedulable: 0/8 nodes are available: 1 Insufficient memory" in said, said
    assert "fix the image name or pull secret" in said
    assert "drain" not in out.stdout  # nothing is known of the nodes themselves: an error to fix, not a fault


def test_a_pull_under_way_is_waited_for_up_to_the_bound_the_user_set(deployed):
    """The twin: ContainerCreating (an image pull in progress) is progress, waited for until --k8s-wait,
    then named as not Ready after that bound; a pull that ends within it leaves a healthy run."""
    cluster, api = deployed
    api.agent_pod_fault("n003", "ContainerCreating", "")
    out = _run(api, SELECT + SSH + ["--k8s-deploy", "--k8s-wait", "2"], timeout=150)
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 1 and "agent pod on n003 not Ready after --k8s-wait 2 s" in said, said
    threading.Timer(1.0, api.revive, ["n003"]).start()  # the pull ends
    out = _run(api, SELECT + SSH + ["--k8s-deploy", "--k8s-wait", "3600"], timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_rank_whose_stdin_closes_right_after_its_result_exits_0():
    """The race of issue 39 item 8, where it lives (the bootstrap every Job pod runs): a Kubernetes attach
    closes the rank's stdin (stdinOnce) the moment its result is read; the watchdog that wakes on that
    EOF must not SIGKILL its own group before the main thread's exit 0 (a pod exiting 9 failed its Job).
    16 bootstraps at once, 4 rounds: before the fix about one in eleven died by SIGKILL here."""
    from tests.transport.test_bundle_phases import PROBE

    rcs = []
    for _ in range(4):
        procs = [subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
                 for _ in range(16)]
        try:
            for proc in procs:
                proc.stdin.write(bundle.stdin_payload(PROBE))
                proc.stdin.flush()
            readers = {proc.stdout.fileno(): (proc, bundle.ResultReader()) for proc in procs}
            while readers:
                ready, _, _ = select.select(list(readers), [], [], 60)
                assert ready, "no result within 60 s"
                for fd in ready:
                    proc, reader = readers[fd]
                    data = os.read(fd, 65536)
                    reader.feed(data)
                    if not data or reader.has_result():
                        proc.stdin.close()  # what the end of a stdinOnce attach does, at once
                        del readers[fd]
            rcs += [proc.wait(timeout=60) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for proc in procs:
                proc.stdout.close()
    assert rcs.count(0) == len(rcs), sorted(set(rcs))


def _bench_python(node, tail):
    """The node's all-reduce pod's first python3 (HOSTNAME preflight-bench-*; the bootstrap, not the ranks it
    starts, which inherit WRAPPED=1) becomes `python3 ARGS TAIL`."""
    path = os.path.join(node.bin_dir, "python3")
    saved = path + ".saved"
    os.rename(path, saved)
    with open(path, "w") as fh:
        fh.write('#!/bin/sh\nif [ -n "$WRAPPED" ] || [ "${HOSTNAME#preflight-bench-}" = "$HOSTNAME" ]; then exec %s "$@"; fi\n'
                 'export WRAPPED=1\n%s "$@" %s\n' % (saved, saved, tail))
    os.chmod(path, 0o755)
    return lambda: os.replace(saved, path)


def test_one_ranks_exit_does_not_end_the_all_reduce_for_the_others(deployed, tmp_path):
    """n002's rank prints its result, then its pod exits 9 (the race above, or any exit after a result);
    n001's result is still on its way (held in a pipe until the Job controller has seen n002's pod fail).
    The Job fails n002's index alone; n001's pod is not terminated, its result is read, the all-reduce passes."""
    cluster, api = deployed
    flag = tmp_path / "n002-failed"
    undo = [_bench_python(cluster.node("n002"), "; exit 9"),
            _bench_python(cluster.node("n001"), "| { until [ -e %s ]; do sleep 0.1; done; cat; }" % flag)]
    done = threading.Event()

    def release():  # n001's output goes on once the Job has counted n002's pod failed (or nothing happened)
        while not done.wait(0.1) and not any(j["status"].get("failed") for j in api.items("jobs")):
            pass
        flag.touch()

    threading.Thread(target=release, daemon=True).start()
    try:
        out = _run(api, ["--k8s", "--nodelist", "n[001-002]", "--only", "allreduce", "--no-progress",
                         "--json", str(tmp_path / "r.json")], timeout=300)
    finally:
        done.set()
        for fn in undo:
            fn()
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["allreduce"] and doc["allreduce"]["busbw_gbps"] > 0, doc["allreduce"]
    assert flag.exists() and api.items("jobs") == []


def _orphans(api):
    """kubectl processes on this machine talking to this double (KUBECONFIG in their environment)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                cmd = fh.read().split(b"\0")
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if cmd and os.path.basename(cmd[0]) == b"kubectl" and ("KUBECONFIG=%s" % api.kubeconfig()).encode() in env:
            out.append(int(pid))
    return out


def _sigkill_at(api, argv, ready):
    """Run preflight check ARGV and SIGKILL it once ready() holds; its stderr so far."""
    from tests.sim.kubeapi import controller_turn

    with controller_turn():
        return _sigkilled(api, argv, ready)


def _sigkilled(api, argv, ready):
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "check"] + argv, env=_env(api), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        until = time.monotonic() + 120
        while time.monotonic() < until and not ready() and proc.poll() is None:
            time.sleep(0.1)
        assert ready(), "the run never reached the point to kill it at"
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.stderr.read()


def _settled(cluster, api):
    """What a SIGKILLed run leaves by itself settles: its kubectl processes end (their stdin closed with the
    controller, so each probe's watchdog ends it and the stream ends), no probe stays on a node."""
    until = time.monotonic() + 60
    while _orphans(api) and time.monotonic() < until:
        time.sleep(0.2)
    assert _orphans(api) == []
    assert cluster.leftover_processes(timeout=30) == {}


def _whole_or_untouched(api):
    """Every node is either not cordoned by preflight, or wholly: cordon, annotation and taint together."""
    for node in api.items("nodes"):
        cordoned, why, taints = _marks(api, node["metadata"]["name"])
        assert (cordoned, bool(why), "preflight/unhealthy" in taints) in ((False, False, False), (True, True, True)), node


def test_sigkill_during_phase_2_leaves_no_process_and_no_mark(deployed):
    """Killed while n004's pings hang under the probe: the kubectl exec processes it started see their stdin
    end, the node's bootstrap watchdog kills the probe's group, the streams end; no node is marked."""
    cluster, api = deployed
    ping = cluster.node("n004").install_executable("ping", "#!/bin/sh\nexec sleep 100000\n")
    try:
        _sigkill_at(api, SELECT + ONLY_NET + ["--timeout", "60", "--drain"],
                    lambda: any("sleep 100000" in cmd for _, cmd in cluster.processes("n004")))
        _settled(cluster, api)
    finally:
        os.unlink(ping)
    _whole_or_untouched(api)
    assert not any(_marks(api, n.name)[0] for n in cluster.nodes)


def test_sigkill_while_cordoning_leaves_each_node_whole_and_the_next_run_finishes(deployed):
    """Killed with n003's patch at the API server and n005's done or not: each node is cordoned wholly or
    not at all (one patch a node), so the next --drain finishes the job and --resume knows them as its own."""
    cluster, api = deployed
    for name in ("n003", "n005"):
        api.dead_node(name)
    release, seen = api.hold_patches("n003"), len(api.requests)
    try:
        _sigkill_at(api, SELECT + SSH + ["--drain", "--max-drain-fraction", "0.5"],
                    lambda: any(m == "PATCH" and "/nodes/n003?" in p for m, p in api.requests[seen:]))
    finally:
        release.set()
        api.held_patches.clear()
    _settled(cluster, api)
    _whole_or_untouched(api)
    assert _marks(api, "n003")[0]  # the patch that reached the server is applied, whole
    out = _run(api, SELECT + SSH + ["--drain", "--max-drain-fraction", "0.5"])
    assert out.returncode == 1 and _marks(api, "n003")[0] and _marks(api, "n005")[0], out.stdout
    _whole_or_untouched(api)
    for name in ("n003", "n005"):
        api.revive(name)
    out = _run(api, SELECT + SSH + ["--resume"])
    assert out.returncode == 0 and not _marks(api, "n003")[0] and not _marks(api, "n005")[0], out.stdout


@pytest.mark.parametrize("point", ["job created", "ranks attached"])
def test_sigkill_during_the_all_reduce_job_is_named_and_cleaned_by_the_next_run(deployed, point):
    """The dead run's Job stays (its TTL and deadline are minutes away), and its pods with it: waiting for
    their bundle (killed before attaching) or ended with their attach streams. The next Kubernetes run
    names the Job and deletes it, with its pods: nothing is left."""
    cluster, api = deployed
    seen = len(api.requests)
    if point == "job created":
        ready = lambda: bool(api.items("jobs"))  # noqa: E731
    else:
        ready = lambda: any(m == "GET" and "/attach?" in p for m, p in api.requests[seen:])  # noqa: E731
    _sigkill_at(api, ["--k8s", "--nodelist", "n[001-002]", "--only", "allreduce", "--no-progress"], ready)
    left = [j["metadata"]["name"] for j in api.items("jobs")]
    assert len(left) == 1
    out = _run(api, SELECT + SSH)
    assert out.returncode == 0, out.stdout + out.stderr
    said = " ".join(out.stderr.split())
    assert "all-reduce Job %s" % left[0] in said and "left by a killed run" in said and "deleted" in said, said
    assert api.items("jobs") == [] and not [p for p in api.items("pods") if "bench" in p["metadata"]["name"]]
    _settled(cluster, api)

"""preflight over the real kubectl against the API-server double (tests/sim/kubeapi.py), 8 simulated nodes.

The agent pods' execs run in the nodes' network namespaces, so phase 1 and phase 2 run for real; faults
are the simulator's (MTU black hole on the switch port, python3 that hangs) plus a dead kubelet.
One cluster for the module; every test heals what it broke and puts the nodes back.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from tests.paths import REPO

ROOT = REPO
N = 8
SELECT = ["--k8s", "--selector", "sim/pool=gpu"]
FAST = ["--skip", "allreduce", "--no-progress"]
ONLY_NET = ["--only", "mtu", "--no-progress"]  # ssh, nic and mtu: what the faults below touch

def _kubectl_missing() -> str:
    """Why the real kubectl cannot drive these tests here ('' when it can): none, or one older than 1.30
    (before 1.30 kubectl execs over SPDY, which the double does not serve)."""
    if shutil.which("kubectl") is None:
        return "kubectl not installed (1.30 or newer: the Kubernetes apt repository's kubectl package)"
    try:
        out = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30)
        minor = int("".join(c for c in json.loads(out.stdout)["clientVersion"]["minor"] if c.isdigit()))
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return "cannot read kubectl's version"
    return "" if minor >= 30 else "kubectl 1.%d is older than 1.30 (SPDY exec)" % minor


_MISSING = _kubectl_missing()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING)


@pytest.fixture(scope="module")
def kube(module_cluster):
    """(cluster, api): the module's simulated nodes and the API-server double over them, stopped before the nodes."""
    from tests.sim.kubeapi import KubeAPI

    cluster = module_cluster(N)
    api = KubeAPI(cluster).start()
    try:
        yield cluster, api
    finally:
        api.stop()


@pytest.fixture
def deployed(kube):
    """The agent DaemonSet applied (through the product's --k8s-deploy path once), every fault healed after."""
    cluster, api = kube
    if api.get("daemonsets", "preflight-agent", "preflight") is None:
        out = _run(api, SELECT + ["--k8s-deploy", "--only", "ssh"] + FAST)
        assert out.returncode == 0, out.stdout + out.stderr
    yield cluster, api
    cluster.heal()
    api.racing.clear()
    for node in cluster.nodes:
        api.revive(node.name)
        with api.lock:  # back to a clean node object for the next test
            doc = api.store["nodes"][("", node.name)]
            doc["spec"] = {}
            doc["metadata"].pop("annotations", None)
            doc["metadata"]["labels"] = {k: v for k, v in doc["metadata"]["labels"].items() if not k.startswith("preflight/")}
            api.bump(doc)


def _env(api):
    env = api.env()
    env["PYTHONPATH"] = ROOT
    return env


def _run(api, argv, timeout=180):
    from tests.sim.kubeapi import controller_turn

    with controller_turn():
        return subprocess.run([sys.executable, "-m", "preflight", "check"] + argv, env=_env(api), capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)


def _report(api, argv, tmp_path):
    path = str(tmp_path / "report.json")
    out = _run(api, argv + ["--json", path])
    assert out.returncode in (0, 1), out.stdout + out.stderr
    with open(path) as fh:
        return out, json.load(fh)


def _findings(doc, node, status=("fail", "error")):
    return [f for f in doc["results"] if f.get("node") == node and f["status"] in status]


def _interrupt(api, argv, signum, ready):
    """Run preflight check ARGV, send it `signum` once ready() holds (or after 60 s); (exit code, stderr)."""
    from tests.sim.kubeapi import controller_turn

    with controller_turn():
        return _interrupted(api, argv, signum, ready)


def _interrupted(api, argv, signum, ready):
    proc = subprocess.Popen([sys.executable, "-m", "preflight", "check"] + argv, env=_env(api), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ready():
            time.sleep(0.1)
        assert ready(), "the run never reached the point to interrupt"
        time.sleep(0.5)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _no_leftovers(cluster, api):
    assert cluster.leftover_processes(timeout=10) == {}
    alive = [p.args for p in api.execs if p.poll() is None]
    assert alive == []


def test_no_agent_deployed_is_named_per_node(kube):
    cluster, api = kube
    with api.lock:  # whatever an earlier test deployed is gone (the next test deploys again)
        api.delete("namespaces", "", "preflight")
    out = _run(api, SELECT + ["--only", "ssh", "--no-progress"])
    assert out.returncode == 1
    said = " ".join(out.stdout.split())  # the console wraps long findings
    assert "no preflight agent pod on" in said and "--k8s-deploy" in said, out.stdout
    assert not any(m == "GET" and "/exec?" in p for m, p in api.requests)


def test_the_double_speaks_kubectls_exec_protocol(deployed):
    """The simulator's own contract, through the real kubectl: stdin in (its end delivered: v5's close of
    channel 0), stdout and stderr apart, the exit code from the final status frame, the node's namespace."""
    cluster, api = deployed
    out = subprocess.run(["kubectl", "exec", "-i", "-n", "preflight", "preflight-agent-n004", "-c", "agent", "--", "sh", "-c",
                          "cat; echo to-stderr >&2; ip -o -4 addr show eth0; exit 3"], input="from-stdin\n",
                         env=api.env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert out.stdout.startswith("from-stdin\n") and cluster.node("n004").mgmt_ip in out.stdout
    assert "to-stderr" in out.stderr and "to-stderr" not in out.stdout


def test_deploy_creates_one_ready_agent_per_node(deployed):
    cluster, api = deployed
    pods = [p for p in api.items("pods") if p["metadata"]["namespace"] == "preflight"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == [n.name for n in cluster.nodes]
    ds = api.get("daemonsets", "preflight-agent", "preflight")
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is True


def test_healthy_run_exits_0_over_kubectl_exec_and_writes_the_env_configmap(deployed, tmp_path):
    cluster, api = deployed
    env_file = tmp_path / "nccl.env"
    out, doc = _report(api, SELECT + FAST + ["--env-file", str(env_file)], tmp_path)
    assert out.returncode == 0, out.stdout
    import yaml

    cm = yaml.safe_load((tmp_path / "nccl.configmap.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "preflight-nccl-env"
    exported = dict(shlex.split(line[len("export "):])[0].split("=", 1) for line in env_file.read_text().splitlines()
                    if line.startswith("export "))
    assert exported["NCCL_SOCKET_IFNAME"] == cm["data"]["NCCL_SOCKET_IFNAME"] == "=eth1"
    assert "MASTER_ADDR" not in cm["data"]  # the launcher's on Kubernetes
    assert doc["transport"]["kind"] == "k8s"
    assert doc["transport"]["execs"] == N  # one exec a node: phase 2 goes down the stream phase 1 kept open
    assert sorted(n["name"] for n in doc["nodes"]) == [n.name for n in cluster.nodes]
    assert any(m == "GET" and "/exec?" in p for m, p in api.requests)
    _no_leftovers(cluster, api)


def test_faults_named_and_drain_cordons_only_the_failing_nodes(deployed, tmp_path):
    cluster, api = deployed
    cluster.mtu_blackhole("n003")
    api.dead_node("n005")
    cluster.hang_commands("n007")
    api.cordon_by_hand("n002")  # someone else's cordon on a healthy node: its healthy-but-unusual twin
    with api.lock:  # a GPU-operator taint preflight must keep
        api.store["nodes"][("", "n003")]["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    out, doc = _report(api, SELECT + ONLY_NET + ["--timeout", "8", "--drain", "--max-drain-fraction", "0.5"], tmp_path)
    assert out.returncode == 1
    mtu = _findings(doc, "n003")
    assert {f["check"] for f in mtu} == {"mtu"} and any("black-holed" in f["message"] for f in mtu), mtu
    dead = [f for f in _findings(doc, "n005") if f["check"] == "ssh"]
    assert dead and "not Ready" in dead[0]["message"] and "preflight-agent-n005" in dead[0]["message"]
    hung = [f for f in _findings(doc, "n007") if f["check"] == "ssh"]
    assert hung and "timed out" in hung[0]["message"] and "8 s" in hung[0]["message"]
    assert {f["node"] for f in doc["results"] if f["status"] in ("fail", "error") and f.get("node")} == {"n003", "n005", "n007"}

    for name in ("n003", "n005", "n007"):
        node = api.get("nodes", name)
        assert node["spec"]["unschedulable"] is True
        ours = [t for t in node["spec"]["taints"] if t["key"] == "preflight/unhealthy"]
        assert ours == [{"key": "preflight/unhealthy", "value": "mtu" if name == "n003" else "ssh", "effect": "NoSchedule"}]
        assert node["metadata"]["annotations"]["preflight/drained"].startswith("preflight: ")
        assert node["metadata"]["labels"]["preflight/status"] == "fail"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in api.get("nodes", "n003")["spec"]["taints"]
    hand = api.get("nodes", "n002")
    assert hand["spec"] == {"unschedulable": True} and "annotations" not in hand["metadata"]
    assert not any(k.startswith("preflight/") for k in hand["metadata"]["labels"])
    assert "left alone: n002" in out.stdout
    said = " ".join(out.stdout.split())  # the console wraps; the fix for an unreachable node is Kubernetes'
    assert "kubectl auth can-i create pods --subresource=exec" in said and "sshd" not in said
    for name in ("n001", "n004", "n006", "n008"):
        node = api.get("nodes", name)
        assert not node["spec"].get("unschedulable") and node["metadata"]["labels"]["preflight/status"] == "pass"
    cluster.heal()  # the hung python3 was killed through a second exec; nothing of the run is left
    _no_leftovers(cluster, api)

    # healed and back: --resume returns exactly preflight's nodes, never the hand-cordoned one
    api.revive("n005")
    out = _run(api, SELECT + ONLY_NET + ["--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("n003", "n005", "n007"):
        node = api.get("nodes", name)
        assert not node["spec"].get("unschedulable")
        assert [t["key"] for t in node["spec"].get("taints") or []] == (["nvidia.com/gpu"] if name == "n003" else [])
        assert "preflight/drained" not in (node["metadata"].get("annotations") or {})
    assert api.get("nodes", "n002")["spec"] == {"unschedulable": True}


def test_drain_refused_when_too_many_fail(deployed):
    cluster, api = deployed
    for name in ("n001", "n002", "n003"):
        api.dead_node(name)
    out = _run(api, SELECT + ["--only", "ssh", "--no-progress", "--drain"])
    assert out.returncode == 1
    assert "drain: refused" in out.stdout
    assert not any(n["spec"].get("unschedulable") for n in api.items("nodes"))


def test_a_node_an_admin_cordons_while_preflight_patches_it_is_left_alone(deployed):
    """preflight's patch carries the resourceVersion it read; the admin's cordon in between makes the API
    server answer 409 Conflict, and preflight re-reads the node and leaves it alone instead of overwriting."""
    cluster, api = deployed
    api.dead_node("n006")
    api.cordon_before_next_patch("n006")
    out = _run(api, SELECT + ["--only", "ssh", "--no-progress", "--drain"])
    assert out.returncode == 1
    node = api.get("nodes", "n006")
    assert node["spec"] == {"unschedulable": True} and "annotations" not in node["metadata"]
    assert "left alone: n006" in out.stdout and "drain: failed" not in out.stdout, out.stdout
    assert any(m == "PATCH" and "/nodes/n006" in p for m, p in api.requests)


def test_exec_refused_by_the_api_server_is_named(deployed):
    cluster, api = deployed
    api.kubelet_unreachable("n006")
    out = _run(api, SELECT + ["--only", "ssh", "--no-progress"])
    assert out.returncode == 1
    said = " ".join(out.stdout.split())  # the console wraps long findings
    assert "n006" in said and "error dialing backend" in said, out.stdout
    _no_leftovers(cluster, api)


def test_interrupted_run_leaves_nothing(deployed):
    cluster, api = deployed
    cluster.hang_commands("n004")
    before = {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in api.items("nodes")}
    # interrupted while phase 1 waits on the hung node
    rc, err = _interrupt(api, SELECT + FAST + ["--timeout", "60", "--drain"], signal.SIGINT,
                         lambda: any("sleep 100000" in cmd for _, cmd in cluster.processes("n004")))
    assert rc == 130, err
    _no_leftovers(cluster, api)
    after = {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in api.items("nodes")}
    assert after == before  # no node changed: no half-done cordon


def test_node_files_are_read_through_the_agents_host_mount(deployed, tmp_path):
    """The agent reads the node's /etc through / mounted at /host (PREFLIGHT_HOST_ROOT=/host in its pod spec)."""
    cluster, api = deployed
    cluster.node("n002").write_host_file("/etc/nccl.conf", "NCCL_SOCKET_IFNAME=eth0\n")
    try:
        out, doc = _report(api, SELECT + ["--only", "nccl_env", "--no-progress"], tmp_path)
    finally:
        os.unlink(os.path.join(cluster.node("n002").root_dir, "etc", "nccl.conf"))
    assert out.returncode == 1
    failed = _findings(doc, "n002")
    assert [f["check"] for f in failed] == ["nccl_env"] and "/etc/nccl.conf:1" in failed[0]["message"]
    assert {f["node"] for f in doc["results"] if f["status"] in ("fail", "error") and f.get("node")} == {"n002"}


def test_allreduce_runs_as_an_indexed_job_and_leaves_nothing(deployed, tmp_path):
    cluster, api = deployed
    out, doc = _report(api, ["--k8s", "--nodelist", "n[001-002]", "--only", "allreduce", "--no-progress"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert doc["transport"]["jobs"] >= 1
    assert doc["allreduce"] and doc["allreduce"]["busbw_gbps"] > 0, doc["allreduce"]
    created = [p for m, p in api.requests if m == "POST" and "/jobs" in p]
    assert len(created) == doc["transport"]["jobs"]
    assert any(m == "GET" and "/attach?" in p for m, p in api.requests)
    assert api.items("jobs") == []
    assert [p["metadata"]["name"] for p in api.items("pods") if "bench" in p["metadata"]["name"]] == []
    _no_leftovers(cluster, api)


def test_allreduce_interrupted_deletes_its_job(deployed):
    cluster, api = deployed
    rc, err = _interrupt(api, ["--k8s", "--nodelist", "n[001-002]", "--only", "allreduce", "--no-progress"],
                         signal.SIGTERM, lambda: bool(api.items("jobs")))
    assert rc == 143, err
    assert api.items("jobs") == []
    assert not [p for p in api.items("pods") if "bench" in p["metadata"]["name"]]
    _no_leftovers(cluster, api)


# --- the drain policy on Kubernetes: the same N-in-W, circuit breaker and --shadow as Slurm's drains ---------


def _decided(db):
    from preflight.history.db import History

    with History(db) as h:
        return h.conn.execute("SELECT a.run_id, n.name, a.kind, a.shadow FROM actions a JOIN nodes n ON n.id = a.node_id"
                              " ORDER BY a.run_id, a.kind").fetchall()


def test_cordons_obey_the_history_policy_and_resumes_are_recorded(deployed, tmp_path):
    """A config-class fault (mtu black hole: fix_config) is held the first run, shadowed the second, kept by
    the circuit breaker the third (--drain-limit 0.1/1h: one node of eight is past 10%), cordoned the fourth,
    and resumed once healed; the database says each decision with Kubernetes' word for it."""
    cluster, api = deployed
    db = str(tmp_path / "audit.sqlite")
    argv = SELECT + ONLY_NET + ["--drain", "--history", db]

    def cordoned(name):
        return bool(api.get("nodes", name)["spec"].get("unschedulable"))

    cluster.mtu_blackhole("n003")
    first = _run(api, argv)
    said = " ".join(first.stdout.split())
    assert first.returncode == 1, first.stdout + first.stderr
    assert "not drained yet: n003: mtu seen in 1 of the 2 runs needed within 7 d (not a decided hardware fault)" in said, said
    assert not cordoned("n003")

    shadow = _run(api, argv + ["--shadow"])
    assert "shadow: would have cordoned n003; cordoned nothing" in " ".join(shadow.stdout.split()), shadow.stdout
    assert not cordoned("n003")

    tripped = _run(api, argv + ["--drain-limit", "0.1/1h"])
    assert "drain: circuit breaker: 1 nodes cordoned by preflight within 3600 s" in " ".join(tripped.stdout.split()), tripped.stdout
    assert not cordoned("n003")

    last = _run(api, argv)
    assert cordoned("n003") and api.get("nodes", "n003")["metadata"]["annotations"]["preflight/drained"].startswith("preflight: mtu:")
    assert not any(cordoned(n.name) for n in cluster.nodes if n.name != "n003"), last.stdout
    cluster.heal()
    back = _run(api, SELECT + ONLY_NET + ["--resume", "--history", db])
    assert back.returncode == 0, back.stdout + back.stderr
    assert not cordoned("n003")
    assert _decided(db) == [(1, "n003", "hold", 0), (2, "n003", "cordon", 1), (3, "n003", "breaker", 0),
                            (4, "n003", "cordon", 0), (5, "n003", "resume", 0)]


def test_drain_after_one_cordons_at_once_under_a_breaker_it_does_not_trip(deployed, tmp_path):
    """The twin: with --drain-after 1/1d the same config-class fault cordons on its first run, under a circuit
    breaker it does not trip (one node of eight, within --drain-limit 0.5/1h)."""
    cluster, api = deployed
    db = str(tmp_path / "audit.sqlite")
    cluster.mtu_blackhole("n004")
    out = _run(api, SELECT + ONLY_NET + ["--drain", "--history", db, "--drain-after", "1/1d", "--drain-limit", "0.5/1h"])
    assert out.returncode == 1, out.stdout + out.stderr
    assert api.get("nodes", "n004")["spec"].get("unschedulable") is True, out.stdout
    assert "not drained yet" not in out.stdout and "circuit breaker" not in out.stdout
    assert _decided(db) == [(1, "n004", "cordon", 0)]


def test_resume_with_a_tier_returns_a_cordoned_node_only_after_that_tier_passed_on_it(deployed, tmp_path):
    """n002, cordoned by preflight for an MTU black hole and since repaired, is rechecked with --resume --tier
    standard: with the compute check left out it stays cordoned (held, not cordoned again for it); with it, it
    returns. The node in service beside it is never touched by the gate."""
    cluster, api = deployed
    pair = ["--k8s", "--nodelist", "n[001-004]", "--no-progress"]  # 4: a black hole is blamed on one end
    cluster.mtu_blackhole("n002")
    out = _run(api, pair + ["--only", "mtu", "--drain", "--max-drain-fraction", "0.5"])
    assert out.returncode == 1 and api.get("nodes", "n002")["spec"]["unschedulable"] is True, out.stdout + out.stderr
    reason = api.get("nodes", "n002")["metadata"]["annotations"]["preflight/drained"]
    cluster.heal()
    pair = ["--k8s", "--nodelist", "n[001-002]", "--no-progress"]  # the recheck: n002 beside one node in service
    out, doc = _report(api, pair + ["--resume", "--tier", "standard", "--skip", "gpu_compute"], tmp_path)
    held = [f for f in doc["results"] if (f.get("data") or {}).get("tier_gate")]
    assert out.returncode == 1 and [f["node"] for f in held] == ["n002"], out.stdout + out.stderr
    assert "n002 not returned to service: --resume --tier standard needs allreduce, gpu_compute" in held[0]["message"]
    node = api.get("nodes", "n002")
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["preflight/drained"] == reason
    assert not api.get("nodes", "n001")["spec"].get("unschedulable")
    out = _run(api, pair + ["--resume", "--tier", "standard"], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    node = api.get("nodes", "n002")
    assert not node["spec"].get("unschedulable") and "preflight/drained" not in (node["metadata"].get("annotations") or {})
    _no_leftovers(cluster, api)

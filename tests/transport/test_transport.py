"""Transport pieces that need no node: known_hosts parsing, fingerprints, the probe bundle locally."""

from __future__ import annotations

import time

import paramiko
from paramiko.hostkeys import HostKeys

from preflight.inventory import NodeSpec
from preflight.transport.known_hosts import KnownHosts, fingerprint
from preflight.transport.local import LocalSession


def test_known_hosts_plain_hashed_and_port_entries(tmp_path):
    a, b, c = (paramiko.ECDSAKey.generate() for _ in range(3))
    path = tmp_path / "known_hosts"
    path.write_text(
        "# comment\n"
        "10.0.0.1 %s %s\n" % (a.get_name(), a.get_base64())
        + "%s %s %s\n" % (HostKeys.hash_host("gpu-002"), b.get_name(), b.get_base64())
        + "[10.0.0.3]:2222 %s %s\n" % (c.get_name(), c.get_base64())
        + "garbage-without-key\n"
    )
    known = KnownHosts.of(str(path))
    assert [k.get_base64() for k in known.keys_for("10.0.0.1")] == [a.get_base64()]
    assert [k.get_base64() for k in known.keys_for("gpu-002")] == [b.get_base64()]
    assert [k.get_base64() for k in known.keys_for("[10.0.0.3]:2222")] == [c.get_base64()]
    assert known.keys_for("10.0.0.3") == [] and known.keys_for("gpu-003") == []
    assert KnownHosts.of(str(path)) is known  # parsed once per file version
    time.sleep(0.01)
    with open(path, "a") as handle:
        handle.write("10.0.0.9 %s %s\n" % (a.get_name(), a.get_base64()))
    assert KnownHosts.of(str(path)).keys_for("10.0.0.9")  # a changed file is read again


def test_fingerprint_is_openssh_sha256():
    key = paramiko.ECDSAKey.generate()
    fp = fingerprint(key)
    assert fp.startswith("SHA256:") and "=" not in fp and len(fp) == 7 + 43


def test_local_session_runs_the_bundle_in_its_own_process_group():
    import sys

    spec = NodeSpec(name="local", host="localhost", line=0, python=sys.executable, local=True)
    run = LocalSession(spec).run_bundle({"mode": "probe", "checks": {"ssh": {}}}, deadline_s=60)
    assert run.rc == 0
    facts = run.result["facts"]["ssh"]
    assert facts["python"][:2] == list(map(str, sys.version_info[:2]))
    assert abs(run.clock - time.time()) < 60 and run.clock_received_at >= run.sent_at


def test_local_result_counts_when_the_process_cannot_exit(tmp_path):
    """Issue 26 item 8 on this machine (`preflight node`): the process printed its result, then does not end
    (a thread stuck in a driver call; here an interpreter wrapper that ignores SIGTERM and stays). Its result
    counts, not a timeout; its process group is killed."""
    import os
    import subprocess
    import sys

    stuck = tmp_path / "python3-stuck"
    stuck.write_text("#!/bin/sh\ntrap '' TERM\n%s \"$@\"\necho $$ > %s\nexec sleep 600\n" % (sys.executable, tmp_path / "pid"))
    os.chmod(str(stuck), 0o755)
    spec = NodeSpec(name="local", host="localhost", line=0, python=str(stuck), local=True)
    run = LocalSession(spec).run_bundle({"mode": "probe", "checks": {"ssh": {}}}, deadline_s=30)
    assert run.result is not None and "ssh" in run.result["facts"]
    pid = int((tmp_path / "pid").read_text())
    assert subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], stdout=subprocess.PIPE).stdout.strip() in (b"", b"Z")


def test_every_fleet_implements_the_written_contract():
    """contract.Fleet is what the engine and the bench call: every backend's fleet has its methods, with
    run's parameters in the same order (a new backend is added to this list)."""
    import inspect

    from preflight.k8s.fleet import KubeFleet
    from preflight.slurm.fleet import SlurmFleet
    from preflight.transport import contract
    from preflight.transport.pool import SessionPool

    wanted = [n for n in ("run", "cancel", "close", "describe", "__enter__", "__exit__") if n in vars(contract.Fleet)]
    assert len(wanted) == 6
    params = list(inspect.signature(contract.Fleet.run).parameters)
    for backend in (SessionPool, SlurmFleet, KubeFleet):
        for name in wanted:
            assert callable(getattr(backend, name, None)), "%s lacks %s" % (backend.__name__, name)
        assert list(inspect.signature(backend.run).parameters) == params, backend.__name__


def test_a_fleet_with_a_local_node_starts_no_rank_ahead():
    """LocalSession starts a process per run, so ranks warmed in phase 1 would die unused (a torch import per
    rank thrown away on `preflight check` with no inventory): keeps_ranks is False. Its twin: the same names
    over SSH, where one kept process carries every phase, keep them (whatever the ranks a node)."""
    from preflight.transport.pool import SessionPool

    local = SessionPool([NodeSpec(name="n001", host="localhost", line=0, local=True),
                          NodeSpec(name="n002", host="h2", line=0)])
    remote = SessionPool([NodeSpec(name="n001", host="h1", line=0), NodeSpec(name="n002", host="h2", line=0)])
    try:
        assert local.keeps_ranks(1) is False and local.keeps_ranks(8) is False
        assert remote.keeps_ranks(1) is True and remote.keeps_ranks(8) is True
    finally:
        local.close()
        remote.close()

"""Hangs past every deadline, on the simulated cluster: each run ends within its deadlines and leaves
nothing running on any node (processes counted in the node namespaces)."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time

import pytest
from tests.paths import REPO



def preflight(cluster, *args, timeout=90):
    """The CLI in the controller namespace; a run that overruns `timeout` fails the test (it hung)."""
    proc = cluster.ctl([sys.executable, "-m", "preflight", *args], cwd=REPO, timeout=timeout)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None), proc.stderr


def ssh_results(doc):
    return {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}


def wait_for_processes(cluster, node, timeout=30):
    deadline = time.monotonic() + timeout
    while not cluster.processes(node) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.processes(node), "the remote command never started"


def test_shell_rc_output_without_newline_keeps_pid_and_clock(sim_cluster):
    cluster = sim_cluster(3)
    cluster.shell_rc_prints(2, "Welcome to node 2")
    cluster.shell_rc_prints(3, "motd")
    cluster.hang_commands(3)
    inv = cluster.inventory(command_timeout=5, connect_timeout=5)
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress")
    ssh = ssh_results(doc)
    assert ssh["n002"]["status"] == "pass", ssh["n002"]
    assert ssh["n003"]["status"] == "fail" and "killed the remote process group" in ssh["n003"]["message"], ssh["n003"]
    assert cluster.leftover_processes() == {}


def test_shell_rc_output_without_newline_keeps_the_clock(sim_cluster):
    """The transport in-process: the clock line is read (the clock-skew check has its data)."""
    from preflight import inventory
    from preflight.transport.ssh import SSHSession

    cluster = sim_cluster(1)
    cluster.shell_rc_prints(1, "Last login: somewhere")
    spec = inventory.load(cluster.inventory()).nodes[0]
    with cluster.in_ctl():
        session = SSHSession(spec)
        session.open()
        try:
            run = session.run_bundle({"mode": "probe", "checks": {"ssh": {}}}, deadline_s=30)
        finally:
            session.close()
    assert run.result is not None and run.clock is not None and run.clock_received_at is not None


def test_background_job_holding_stdout_does_not_hold_the_run(sim_cluster):
    cluster = sim_cluster(2)
    cluster.shell_rc_background_job(2)
    inv = cluster.inventory(command_timeout=10, connect_timeout=5)
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", timeout=60)
    assert rc == 0, err
    assert ssh_results(doc)["n002"]["status"] == "pass"
    assert cluster.leftover_processes() == {}  # the rc's background job went with the run's process group


def test_kill_whose_login_shell_hangs_is_bounded(sim_cluster):
    cluster = sim_cluster(2)
    cluster.hang_login_mid_run(2)
    inv = cluster.inventory(command_timeout=4, connect_timeout=3)
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", timeout=60)
    assert rc == 1
    ssh = ssh_results(doc)
    assert ssh["n001"]["status"] == "pass"
    assert ssh["n002"]["status"] == "fail" and "timed out" in ssh["n002"]["message"]
    assert "Traceback" not in err
    assert cluster.leftover_processes() == {}


def test_proxyjump_from_ssh_config_keeps_connect_timeout(sim_cluster, tmp_path):
    cluster = sim_cluster(3)
    bastion, dead, alive = cluster.node(1), cluster.node(2), cluster.node(3)
    # the bastion's SYNs to the dead node vanish (a permanent neighbour entry to a MAC nobody has)
    cluster.node_exec(1, ["ip", "neigh", "replace", dead.mgmt_ip, "lladdr", "02:00:00:00:00:99", "dev", "eth0",
                          "nud", "permanent"], check=True)
    config = tmp_path / "ssh_config"
    config.write_text("Host %s %s\n    ProxyJump root@%s\n" % (dead.mgmt_ip, alive.mgmt_ip, bastion.mgmt_ip))
    inv = cluster.inventory(connect_timeout=3, ssh_config=str(config), nodes=[2, 3])
    started = time.monotonic()
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", timeout=60)
    assert rc == 1, err
    assert ssh_results(doc)["n002"]["status"] == "fail"
    assert ssh_results(doc)["n003"]["status"] == "pass", ssh_results(doc)["n003"]  # hops get the node's key and policy
    print("dead node behind ssh_config ProxyJump: %.1f s (connect_timeout 3 s): %s"
          % (time.monotonic() - started, ssh_results(doc)["n002"]["message"]))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_are_like_ctrl_c(sim_cluster, signum):
    cluster = sim_cluster(2)
    cluster.hang_commands(2)
    inv = cluster.inventory(command_timeout=120)
    master, slave = pty.openpty()  # a terminal, so the progress display (and its hidden cursor) is live
    proc = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh"], cwd=REPO,
                             stdout=slave, stderr=subprocess.PIPE, env=dict(os.environ, TERM="xterm", COLUMNS="80"))
    os.close(slave)
    try:
        wait_for_processes(cluster, 2)
        time.sleep(0.5)
        proc.send_signal(signum)
        err = proc.communicate(timeout=30)[1].decode()
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    assert proc.returncode == 128 + signum, err
    assert "terminated (%s)" % signal.Signals(signum).name in err and "Traceback" not in err
    assert out.rfind(b"\x1b[?25h") > out.rfind(b"\x1b[?25l") >= 0, out[-300:]  # cursor shown again
    assert cluster.leftover_processes() == {}


def test_ctrl_c_while_connecting_stops_and_a_second_one_is_quiet(sim_cluster):
    cluster = sim_cluster(3)
    cluster.freeze_sshd(3)  # its connect waits for a banner until connect_timeout
    cluster.hang_commands(2)
    inv = cluster.inventory(connect_timeout=60, command_timeout=120)
    proc = cluster.ctl_popen([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh", "--no-progress"],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_processes(cluster, 2)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=20)[1].decode()  # not connect_timeout (60 s)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert cluster.leftover_processes(timeout=15) == {}


def test_connection_dropping_mid_result_line_is_that_nodes_failure(sim_cluster):
    cluster = sim_cluster(2)
    # the node's python sends the start of a result line, then the connection goes away
    cluster.node(2).install_executable(
        "python3", "#!/bin/sh\nprintf 'preflight-clock 1.0\\npreflight-result {\"facts\": {\"ssh\": {\"py'\nsleep 1\nkill -9 $PPID\n"
    )
    inv = cluster.inventory(command_timeout=10, connect_timeout=5)
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", timeout=60)
    assert "Traceback" not in err
    ssh = ssh_results(doc)
    assert rc == 1 and ssh["n001"]["status"] == "pass"
    assert ssh["n002"]["status"] in ("fail", "error"), ssh["n002"]
    assert cluster.leftover_processes() == {}


def test_result_that_arrived_counts_when_the_process_cannot_exit(sim_cluster):
    """Issue 26 item 8: a thread stuck in an uninterruptible driver call keeps the process (and its output)
    alive after the result was printed. The node answered: its result counts, it is not a timeout.

    The stuck process is the node's interpreter wrapped (the inventory's `python`): after the bundle's
    process printed its result, its process does not end and ignores SIGTERM, holding the channel open.
    """
    cluster = sim_cluster(2)
    stuck = cluster.node(2).install_executable(
        "python3-stuck", "#!/bin/sh\ntrap '' TERM\npython3 \"$@\"\nexec sleep 600\n")
    inv = cluster.inventory(command_timeout=8, connect_timeout=5, node_overrides={"n002": {"python": stuck}})
    rc, doc, err = preflight(cluster, "check", inv, "--only", "ssh", "--json", "-", "--no-progress", timeout=60)
    ssh = ssh_results(doc)
    assert ssh["n002"]["status"] == "pass", ssh["n002"]
    assert rc == 0, err
    assert cluster.leftover_processes() == {}  # the process that would not exit was killed with its group

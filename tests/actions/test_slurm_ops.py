"""What an admin's Ctrl-C, Prolog and nightly cron really do, on a real Slurm (tests/sim/slurm.py).

One 4-node cluster for the module; every test heals what it broke and returns every node to service.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.report_schema import assert_valid
from tests.paths import PREFLIGHT, REPO

N = 4
ALL = "n[001-%03d]" % N
OLD = "preflight: mtu: jumbo pings lost (old run)"


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster(N)


pytestmark = pytest.mark.usefixtures("slurm_healed")  # every test leaves the shared cluster as it found it


@contextlib.contextmanager
def _reaped(proc):
    """proc, killed and waited for on the way out if it still runs: a failed wait leaves no preflight behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _wait(what, ok, timeout=60.0):
    until = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > until:
            raise AssertionError("no %s within %g s" % (what, timeout))
        time.sleep(0.2)


# --- 1. an interrupted --resume leaves no reservation and every unchecked node drained ---------------


def _start_resume(cluster, extra, **kw):
    argv = ["check", "--slurm", "--nodelist", ALL, "--resume"] + extra
    return cluster.slurm.preflight(argv, popen=True, stdin=subprocess.DEVNULL, **kw)


def _signal_kind(kind, proc):
    if kind == "EPIPE":  # the reader of --json - went away: a write error, not a signal
        proc.stdout.close()
    else:
        proc.send_signal(kind)


@pytest.mark.parametrize("kind", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_while_salloc_waits(cluster, kind):
    """n002 runs someone's job, so the allocation waits; n003 (drained by preflight) was resumed into the
    recheck reservation. Interrupted there: the waiting request is cancelled, n003 is drained again
    with its old reason, the reservation is gone, and the run says so."""
    s = cluster.slurm
    s.drain("n003", OLD)
    blocker = s.run(["salloc", "--no-shell", "-N1", "-w", "n002", "-t", "5"])
    assert "Granted" in blocker.stderr + blocker.stdout, blocker.stderr
    proc = _start_resume(cluster, ["--only", "ssh", "--alloc-wait", "120"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait("waiting preflight allocation", lambda: any(" preflight-" in j and "PENDING" in j for j in s.jobs()))
    assert s.reservations() and "n003" not in s.reasons()  # resumed inside the reservation: the hazard
    _signal_kind(kind, proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + kind, err
    assert s.reservations() == [], err
    assert s.reasons() == {"n003": OLD}, err
    assert [j for j in s.jobs() if "preflight" in j] == [], s.jobs()
    assert "cancelled the waiting allocation" in err and "n003 drained again" in err, err
    assert "deleted the recheck reservation" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_run(cluster, kind):
    """n003 (drained by preflight, resumed for its recheck) hangs: interrupted while the step runs, the
    step and the job end, n003 is drained again with its old reason, no reservation is left."""
    s = cluster.slurm
    s.drain("n003", OLD)
    cluster.hang_commands("n003")
    proc = _start_resume(cluster, ["--only", "ssh,driver", "--timeout", "90"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait("preflight step", lambda: any("preflight-" in st for st in s.leftover_steps()))
    assert "n003" not in s.reasons()
    time.sleep(1)
    _signal_kind(kind, proc)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + kind, err
    assert s.reservations() == [] and s.reasons() == {"n003": OLD}, err
    assert "n003 drained again" in err, err
    _wait("the job and its step to end", lambda: not [j for j in s.jobs() if "preflight" in j] and not s.leftover_steps(), 60)


@pytest.mark.parametrize("kind", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL, "EPIPE"], ids=["SIGINT", "SIGTERM", "SIGKILL", "EPIPE"])
def test_interrupt_while_writing_outputs(cluster, kind):
    """The verdict is acted on before any file is written: n003 passed and is back in service, n004
    (drained by preflight, still failing) is drained with this run's reason; an interrupt, a SIGKILL or a
    write error while the JSON goes out (a 4 KiB pipe nobody reads) changes neither and leaves no
    reservation (nor a job: the transport released it when the checks ended)."""
    s = cluster.slurm
    s.drain("n003", OLD)
    s.drain("n004", OLD)
    cluster.mtu_blackhole("n004")
    proc = _start_resume(cluster, ["--skip", "allreduce", "--json", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fcntl.fcntl(proc.stdout.fileno(), 1031, 4096)  # F_SETPIPE_SZ: the JSON report does not fit
    said = b""
    until = time.monotonic() + 120
    while b"resume: n003" not in said:  # the console (stderr with --json -) says what was done
        left = until - time.monotonic()
        if left <= 0 or not select.select([proc.stderr], [], [], left)[0]:
            proc.kill()
            raise AssertionError("no 'resume: n003' before the report was written: %s" % said.decode()[-2000:])
        data = os.read(proc.stderr.fileno(), 65536)
        assert data, said.decode()
        said += data
    time.sleep(0.5)
    assert proc.poll() is None, "preflight wrote its whole report: the test needs a bigger one"
    _signal_kind(kind, proc)
    if kind == "EPIPE":
        proc.wait(60)
        rest = proc.stderr.read()
    else:
        _, rest = proc.communicate(timeout=60)
    err = (said + rest).decode()
    expected = 2 if kind == "EPIPE" else -kind if kind == signal.SIGKILL else 128 + kind
    assert proc.returncode == expected, err
    assert s.reservations() == [], err  # deleted when the verdict was acted on, before the report went out
    reasons = s.reasons()
    assert "n003" not in reasons and reasons["n004"].startswith("preflight: mtu: ") and reasons["n004"] != OLD, (reasons, err)
    if kind == "EPIPE":
        assert "cannot write the standard output" in err and "Traceback" not in err


def test_the_job_lasts_the_wait_plus_the_run_the_reservation_until_a_run_decides(cluster):
    """The job preflight makes ends at the wait plus the run's longest (3 minutes here, not 30); the recheck
    reservation covers only the node resumed for its recheck (FLEX: the job takes the others outside it)
    and has no end a run could outlive: only a run that decided deletes it."""
    s = cluster.slurm
    s.drain("n003", OLD)
    cluster.hang_commands("n003")
    proc = _start_resume(cluster, ["--only", "ssh", "--timeout", "20", "--alloc-wait", "30"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait("the job", lambda: any(" preflight-" in j and "RUNNING" in j for j in s.jobs()))
    shown = s.run(["scontrol", "-o", "show", "reservation"]).stdout
    limit = s.run(["squeue", "-h", "-o", "%j %l"]).stdout
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    # 30 s wait + 3 phases x 20 s + 60 s = 150 s: 3 minutes, not 30
    assert any(line.startswith("preflight-") and line.endswith(" 3:00") for line in limit.splitlines()), limit
    assert "Nodes=n003 " in shown and "Duration=365-00:00:00" in shown and "FLEX" in shown, shown


def test_a_node_that_goes_down_mid_run_does_not_end_the_run_for_the_others(cluster):
    """n003 hangs, then Slurm sets it DOWN while the step runs (as slurmctld does when its slurmd stops
    answering for SlurmdTimeout). By default Slurm would end the step and the job for every node (at 1,000
    simulated nodes: 999 nodes 'Slurm job 1 has expired'); with --no-kill the others' verdicts stand and
    n003 is named by its own timeout."""
    s = cluster.slurm
    cluster.hang_commands("n003")
    proc = s.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh", "--timeout", "25", "--json", "-"],
                       popen=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _reaped(proc):
        _wait("the step running", lambda: s.leftover_steps(), timeout=60)
        time.sleep(2)  # the other nodes' tasks are under way
        down = s.run(["scontrol", "update", "nodename=n003", "state=down", "reason=preflight-test: slurmd lost"])
        assert down.returncode == 0, down.stderr
        out, err = proc.communicate(timeout=150)
    doc = json.loads(out)
    ssh = {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}
    assert {n: ssh[n]["status"] for n in ("n001", "n002", "n004")} == dict.fromkeys(("n001", "n002", "n004"), "pass"), err
    assert ssh["n003"]["status"] in ("fail", "error") and "has expired" not in ssh["n003"]["message"], ssh["n003"]
    assert "has expired" not in err
    assert s.leftover_steps() == []
    assert not s.run(["squeue", "-h"]).stdout.strip()


def test_a_node_whose_task_dies_is_named_from_srun_at_once_not_at_its_deadline(cluster):
    """n002's python3 is killed as it starts (as the OOM killer would). srun says so ("n002: task 1:
    Killed") while the other tasks wait for the next phase in the same step: the phase ends then, n002
    named by what srun said, not 'timed out' after --timeout."""
    cluster.crash_commands("n002")
    proc = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--skip", "allreduce", "--timeout", "120",
                                    "--json", "-"])
    doc = json.loads(proc.stdout)
    ssh = {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}
    assert ssh["n002"]["status"] == "fail" and "Killed" in ssh["n002"]["message"], ssh["n002"]
    assert "timed out" not in ssh["n002"]["message"]
    assert all(ssh[n]["status"] == "pass" for n in ("n001", "n003", "n004")), proc.stderr[-2000:]
    assert cluster.slurm.leftover_steps() == []


def test_a_launch_that_times_out_twice_is_retested_not_drained(cluster):
    """n002's slurmd is frozen (SIGSTOP): srun's launch there times out ("Socket timed out on send/recv
    operation"), which Slurm also reports for every node under a forwarder that answered late (408 healthy
    nodes in runs of 50 at 1,000 simulated nodes). So n002 is tried once more, then reported as not checked
    (error, retest) and not drained; the other nodes pass. Its twin, a slurmd that is not running at all
    ("Communication connection failure", tests/transport/test_slurm_e2e.py), is a FAIL that drains."""
    s = cluster.slurm
    s.freeze_slurmd("n002")
    proc = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh", "--drain", "--timeout",
                                    "60", "--json", "-", "--debug"])
    doc = json.loads(proc.stdout)
    ssh = {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}
    assert ssh["n002"]["status"] == "error" and ssh["n002"]["action"] == "retest", ssh["n002"]
    assert "could not start the task on n002, twice (Socket timed out" in ssh["n002"]["message"], ssh["n002"]
    assert all(ssh[n]["status"] == "pass" for n in ("n001", "n003", "n004")), proc.stderr[-2000:]
    assert "task launch on n002 failed (Socket timed out on send/recv operation): retried once" in proc.stderr
    assert doc["transport"]["step_tasks"] == [4, 4, 3], doc["transport"]  # the first launch, again, then without n002
    assert s.reasons() == {}, s.reasons()  # nobody drained
    assert proc.returncode == 1


def test_a_step_srun_aborts_for_an_io_error_is_run_again_not_a_verdict_on_its_nodes(cluster, tmp_path):
    """n003 and n004 are still in phase 2 (their first `ping` sleeps) when srun's I/O connection to n003's
    slurmstepd is reset. Slurm 22.05's srun then aborts the whole step ("step_launch_notify_io_failure:
    aborting, io error with slurmstepd on node 2") and reports every unfinished task "Killed", n004's too: no
    evidence against either node. The nodes that had answered keep their results; the other two run again
    in a new step, and every node passes. Its twin, a task really killed on its node (as the OOM killer does),
    stays a FAIL (test_a_node_whose_task_dies_is_named_from_srun_at_once_not_at_its_deadline)."""
    planted = []
    for name in ("n003", "n004"):
        flag = tmp_path / name
        planted.append(cluster.node(name).install_executable(
            "ping", "#!/bin/sh\n[ -e %s ] || { touch %s; sleep 40; }\nexec %s \"$@\"\n" % (flag, flag, shutil.which("ping"))))
    try:
        proc = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh,nic,mtu", "--timeout",
                                        "120", "--json", "-", "--debug"], popen=True, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait("the slow pings", lambda: (tmp_path / "n003").exists() and (tmp_path / "n004").exists(), timeout=120)
        time.sleep(1)  # n001 and n002 answer phase 2 and end
        reset = cluster.slurm.break_step_io("n003")
        if not reset:
            proc.kill()
            proc.communicate()
            pytest.skip("could not reset a slurmstepd connection here (ss -K needs CONFIG_INET_DIAG_DESTROY)")
        out, err = proc.communicate(timeout=180)
    finally:
        for path in planted:
            os.unlink(path)
    err = err.decode()
    doc = json.loads(out)
    bad = {(r["check"], r["node"]): r["message"] for r in doc["results"] if r["status"] != "pass"}
    assert not bad and len(doc["results"]) == 12, (bad, err[-3000:])
    assert "aborting, io error with slurmstepd" in err and "n[003-004] run again in a new step" in err, err[-3000:]
    assert doc["transport"]["step_tasks"] == [4, 2], doc["transport"]
    assert proc.returncode == 0
    assert cluster.slurm.leftover_steps() == []


_RELEASE = ("import logging, sys\n"
            "logging.basicConfig(format='%(message)s')\n"
            "from preflight.slurm.allocation import Allocation\n"
            "a = Allocation(sys.argv[1], [], owned=True, minutes=3)\n"
            "a.CANCEL_WAITS_S = tuple(float(w) for w in sys.argv[2:])\n"
            "a.release_job()\n")


def test_a_cancel_slurmctld_does_not_answer_is_a_warning_and_the_job_ends_at_its_limit(cluster):
    """The release of preflight's own job, when slurmctld answers no scancel (stopped here with SIGSTOP;
    at 1,000 nodes a busy one): two tries, then a warning naming the job, its time limit and the command,
    and no error exit (the run's verdict stands); awake, the same release cancels it."""
    s = cluster.slurm
    granted = s.run(["salloc", "--no-shell", "-N", "1", "-t", "3", "-J", "preflight-test"], timeout=60)
    job = granted.stderr.split("Granted job allocation ")[1].split()[0]
    env = dict(s.env(), PYTHONPATH=REPO)
    limit = s.run(["squeue", "-h", "-j", job, "-o", "%l"]).stdout.strip()
    assert limit == "3:00", limit  # what the warning promises: Slurm ends it then
    os.kill(s.ctld.pid, signal.SIGSTOP)
    try:
        stuck = cluster.ctl([sys.executable, "-c", _RELEASE, job, "1", "2"], env=env, timeout=60)
    finally:
        os.kill(s.ctld.pid, signal.SIGCONT)
    assert stuck.returncode == 0, stuck.stderr
    assert ("could not cancel job %s (scancel %s did not answer within 2 s" % (job, job)) in stuck.stderr, stuck.stderr
    assert "ends it at its 3-minute time limit; cancel it now: scancel %s" % job in stuck.stderr, stuck.stderr
    # awake, the release cancels it (or says nothing if the unanswered scancel was taken after all)
    awake = cluster.ctl([sys.executable, "-c", _RELEASE, job, "30"], env=env, timeout=60)
    assert awake.returncode == 0 and "could not cancel" not in awake.stderr, awake.stderr
    _wait("job %s cancelled" % job, lambda: not any(line.split()[0] == job for line in s.jobs()))


# --- 3. the root cause names the drain, not its consequence -------------------------------------------


def test_data_link_down_drains_for_the_nic_not_for_mtu(cluster):
    cluster.data_link_down("n003")
    out = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--skip", "allreduce", "--drain",
                                   "--max-drain-fraction", "0.5", "--json", "-"])
    doc = json.loads(out.stdout)
    assert_valid(doc)
    assert out.returncode == 1
    assert doc["results"][0]["check"] == "nic" and doc["results"][0]["node"] == "n003", doc["results"][:3]
    reasons = cluster.slurm.reasons()
    assert list(reasons) == ["n003"] and reasons["n003"].startswith("preflight: nic: "), (reasons, out.stderr[-2000:])


# --- 5. others' drains and DOWN nodes are unavailable, not this run's failures -------------------------


def test_hand_drained_and_down_nodes_are_unavailable_not_failures(cluster):
    s = cluster.slurm
    s.drain("n004", "disk replaced by hand")
    # n003 is off (its PSU out), so its slurmd cannot register again: with ReturnToService=2 a registration
    # would return an admin's DOWN node to service in the middle of the test (seen under load)
    s.stop_slurmd("n003")
    s.run(["scontrol", "update", "nodename=n003", "state=down", "reason=PSU swapped"])
    argv = ["check", "--slurm", "--nodelist", ALL, "--only", "ssh,driver", "--drain"]
    out = cluster.slurm.preflight(argv + ["--json", "-"])
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert_valid(doc)
    assert {n["name"]: n["status"] for n in doc["nodes"]} == {"n001": "pass", "n002": "pass", "n003": "unavailable",
                                                              "n004": "unavailable"}
    assert doc["node_summary"] == {"pass": 2, "warn": 0, "fail": 0, "unavailable": 2}
    said = {r["node"]: r["message"] for r in doc["results"] if r.get("data", {}).get("unavailable")}
    assert said["n004"] == "Slurm reports it IDLE+DRAIN (reason: disk replaced by hand); not checked", said
    assert said["n003"].startswith("Slurm marked it DOWN") and "PSU swapped" in said["n003"], said
    assert "left alone: n003 (Slurm marked it DOWN" in out.stderr and "drained by someone else: disk replaced" in out.stderr
    assert cluster.slurm.reasons() == {"n003": "PSU swapped", "n004": "disk replaced by hand"}
    text = cluster.slurm.preflight(argv[:-1])
    assert "nodes: 2 pass · 0 warn · 0 fail · 2 unavailable" in text.stdout, text.stdout
    assert "n004: Slurm reports it IDLE+DRAIN (reason: disk replaced by hand); not checked" in text.stdout
    strict = cluster.slurm.preflight(argv[:-1] + ["--count-unavailable"])
    assert strict.returncode == 1 and "nodes: 2 pass · 0 warn · 2 fail · 0 unavailable" in strict.stdout, strict.stdout
    assert "drain (isolate)" not in strict.stdout and "out of service already) 2 nodes: n[003-004]" in strict.stdout


# --- 7. scontrol that cannot load its configuration ----------------------------------------------------


def test_unloadable_slurm_conf_is_one_line_with_its_fix(cluster, tmp_path):
    bad = tmp_path / "slurm.conf"
    with open(cluster.slurm.conf) as fh:
        bad.write_text(fh.read() + "this is not a slurm.conf line\n")
    for conf, words in ((str(tmp_path / "missing.conf"), ["cannot be read: No such file", "SLURM_CONF names it"]),
                        (str(bad), ["line %d cannot be parsed" % (len(bad.read_text().splitlines())), "slurm.conf(5)"])):
        # read before any Slurm command runs: not Slurm's 60 s of retries, nor a "check slurmctld" timeout
        # (a hang would end at this call's timeout)
        out = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL],
                                      env=dict(cluster.slurm.env(), SLURM_CONF=conf), timeout=60)
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert all(w in line for w in words) and conf in line, line


# --- 2. the guide's Prolog: fail -> drained with a preflight: reason -> fix -> --resume returns it -----


def _guide_wrapper():
    """The Prolog wrapper exactly as docs/node.md prints it."""
    with open(os.path.join(REPO, "docs", "node.md")) as fh:
        text = fh.read()
    start = text.index("# /usr/local/bin/preflight-node (root:root 0755)")
    start = text.rindex("```sh\n", 0, start) + len("```sh\n")
    return text[start:text.index("```", start)]


def test_prolog_from_the_guide_drains_with_a_reason_resume_returns(cluster, tmp_path):
    s = cluster.slurm
    inv = cluster.inventory(str(tmp_path / "hosts.yaml"), node_overrides={n.name: {"data_interface": "eth1"} for n in cluster.nodes})
    wrapper = _guide_wrapper().replace("/opt/preflight/bin/preflight", PREFLIGHT).replace("/etc/preflight/hosts.yaml", inv)
    path = tmp_path / "preflight-node"
    path.write_text(wrapper)
    prolog = tmp_path / "prolog"
    # the simulated node's tools and sysfs, as the TaskProlog gives tasks (tests/sim/slurm.py), then the
    # guide's wrapper, run as Slurm runs a Prolog: without arguments
    prolog.write_text("#!/bin/sh\nexport PATH=%s/$SLURMD_NODENAME/bin:/usr/sbin:/usr/bin:/sbin:/bin PREFLIGHT_SYSFS_ROOT=%s/$SLURMD_NODENAME/sys "
                      "PYTHONPATH=%s SLURM_CONF=%s\nexec sh %s\n" % (cluster.root, cluster.root, REPO, s.conf, path))
    os.chmod(path, 0o755)
    os.chmod(prolog, 0o755)
    os.chmod(tmp_path, 0o755)
    s.set_prolog(str(prolog))
    try:
        cluster.data_link_down("n002")
        job = s.run(["sbatch", "--parsable", "-w", "n002", "-o", "/dev/null", "--wrap", "true"]).stdout.strip()
        _wait("drain by the prolog", lambda: "n002" in s.reasons(), 90)
        reason = s.reasons()["n002"]
        assert reason.startswith("preflight: FAIL nic: "), reason  # the wrapper's reason, kept by Slurm
        _wait("held requeue", lambda: any(j.startswith(job + " ") and "launch failed requeued held" in j for j in s.jobs()), 60)
        cluster.heal()
    finally:
        s.set_prolog(None)
    out = cluster.slurm.preflight(["check", "--slurm", "--nodelist", "n[001-002]", "--only", "ssh,nic", "--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "n002" not in s.reasons() and "resume: n002" in out.stdout, out.stdout + out.stderr
    assert s.run(["scontrol", "release", job]).returncode == 0  # the guide's release of the held job
    # released: no longer held (a requeued job may wait for its BeginTime before it runs on n002)
    _wait("the job released", lambda: not any(j.startswith(job + " ") and "held" in j.lower() for j in s.jobs()), 60)


# --- 8. an admin's drain made during a run is theirs (issue 39 item 3) --------------------------------

RMA = "RMA bad DIMM, do not return"


def _gate(cluster, tmp_path, node, tool="ping"):
    """The node's `tool` stops at a gate until opened: returns (reached, opened, planted) paths. While it
    waits the run is mid-step, with the bundle (and its stdin watchdog) running on the node."""
    reached, opened = tmp_path / ("%s-reached" % node), tmp_path / ("%s-open" % node)
    planted = cluster.node(node).install_executable(
        tool, "#!/bin/sh\ntouch %s\nwhile [ ! -e %s ]; do sleep 0.2; done\nexec %s \"$@\"\n" % (reached, opened, shutil.which(tool)))
    return reached, opened, planted


def _drain_mid_run(cluster, tmp_path, argv, node, reason):
    """Run preflight with argv; when `node`'s ping is at its gate (the step runs), drain it by hand with
    `reason`, then open the gate. Returns the finished run (stdout, stderr, rc)."""
    reached, opened, planted = _gate(cluster, tmp_path, node)
    try:
        proc = cluster.slurm.preflight(argv, popen=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        with _reaped(proc):
            _wait("%s's ping at the gate" % node, reached.exists, timeout=150)
            cluster.slurm.drain(node, reason)
            opened.touch()
            out, err = proc.communicate(timeout=180)
    finally:
        os.unlink(planted)
    return out, err, proc.returncode


def test_an_admins_drain_during_the_run_is_not_overwritten(cluster, tmp_path):
    """n003 fails mtu; while the run checks it an admin drains it ("RMA bad DIMM, do not return"). --drain
    re-reads n003 just before its `scontrol update`: the admin's reason stays and the run says so. Its twin,
    n004 failing too with no one touching it, is drained with preflight's reason."""
    cluster.mtu_blackhole("n003")
    cluster.mtu_blackhole("n004")
    out, err, rc = _drain_mid_run(cluster, tmp_path, ["check", "--slurm", "--nodelist", ALL, "--only", "ssh,nic,mtu",
                                                      "--drain", "--max-drain-fraction", "0.5"], "n003", RMA)
    reasons = cluster.slurm.reasons()
    assert reasons["n003"] == RMA, (reasons, err[-2000:])
    assert reasons["n004"].startswith("preflight: mtu: "), reasons
    assert "left alone: n003 (drained by someone else during this run: %s)" % RMA in " ".join(out.split()), out
    assert "drain: n004" in out and rc == 1, out


def test_an_admins_drain_of_a_node_under_recheck_is_never_resumed(cluster, tmp_path):
    """n003 and n004 were drained by preflight; --resume rechecks both. n003 still fails, and while the run
    checks it an admin drains it for an RMA: the run's re-drain of its held node re-reads it and keeps the
    admin's reason, and the next --resume (n003 healed) leaves it drained. The twin: n004 passes and is
    returned to service."""
    s = cluster.slurm
    s.drain("n003", OLD)
    s.drain("n004", OLD)
    cluster.mtu_blackhole("n003")
    argv = ["check", "--slurm", "--nodelist", ALL, "--only", "ssh,nic,mtu", "--resume", "--drain", "--max-drain-fraction", "0.5"]
    out, err, rc = _drain_mid_run(cluster, tmp_path, argv, "n003", RMA)
    assert s.reasons() == {"n003": RMA}, (s.reasons(), out, err[-2000:])
    assert "left alone: n003 (drained by someone else during this run: %s)" % RMA in " ".join(out.split()), out
    assert "resume: n004" in out and s.reservations() == [], out
    cluster.heal()
    again = cluster.slurm.preflight(argv)
    assert s.reasons() == {"n003": RMA}, (again.stdout, again.stderr[-2000:])
    assert "left alone: n003 (drained by someone else: %s)" % RMA in " ".join(again.stdout.split()), again.stdout


# --- 9. SIGKILL of the controller: nothing it resumed takes user work; the next run cleans (item 5) -----


def _refused_to_users(cluster, node):
    """A user's job cannot start on `node` now (salloc gives up at once)."""
    got = cluster.slurm.run(["salloc", "--no-shell", "-N1", "-w", node, "-t", "1", "--immediate=3", "-J", "user-job"],
                            timeout=60)
    if "Granted job allocation" in got.stderr:
        cluster.slurm.run(["scancel", "--name=user-job"])
        return False
    return True


def _sigkill(proc):
    """SIGKILL the real preflight process (ip netns exec execs it: proc.pid is preflight's)."""
    proc.kill()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err
    return err


def _next_run_cleans(cluster, left_node):
    """The next plain run names the dead run's job and reservation, drains `left_node` again (resumed for a
    recheck never decided), deletes the reservation and cancels the job."""
    s = cluster.slurm
    resv = [r for r in s.reservations() if r.startswith("preflight-")]
    assert len(resv) == 1, s.reservations()
    shown = s.run(["scontrol", "-o", "show", "reservation", resv[0]]).stdout
    assert "Duration=365-00:00:00" in shown and "Nodes=%s " % left_node in shown, shown  # no end a run outlives
    nxt = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh"])
    err = nxt.stderr
    assert "a killed preflight run (pid" in err and "reservation %s over %s" % (resv[0], left_node) in err, err
    assert "%s: resumed for a recheck that never ended: drained again" % left_node in err, err
    assert "reservation %s deleted" % resv[0] in err, err
    assert s.reservations() == [], err
    assert s.reasons()[left_node].startswith("preflight: recheck not finished: the run that resumed it (%s)" % resv[0])
    assert [j for j in s.jobs() if " preflight-" in j] == [], s.jobs()
    assert nxt.returncode == 0, nxt.stdout + err  # n003 is unavailable now (drained by preflight), the rest pass
    return err


def test_sigkill_while_salloc_waits_keeps_the_resumed_node_out_of_service(cluster):
    """--resume resumed n003 into its reservation, then waits for n002 (someone's job). SIGKILL there: the
    reservation stays (no end), so n003 takes no user job; the next run cancels the dead run's request,
    drains n003 again and deletes the reservation."""
    s = cluster.slurm
    s.drain("n003", OLD)
    blocker = s.run(["salloc", "--no-shell", "-N1", "-w", "n002", "-t", "5", "-J", "someones-job"])
    assert "Granted" in blocker.stderr, blocker.stderr
    proc = _start_resume(cluster, ["--only", "ssh", "--alloc-wait", "120"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait("waiting preflight allocation", lambda: any(" preflight-" in j and "PENDING" in j for j in s.jobs()))
    assert "n003" not in s.reasons()  # resumed inside the reservation
    _sigkill(proc)
    assert _refused_to_users(cluster, "n003")
    s.run(["scancel", "--name=someones-job"])
    err = _next_run_cleans(cluster, "n003")
    assert "job " in err.split("a killed preflight run", 1)[1], err


def test_sigkill_mid_step_keeps_the_resumed_node_out_of_service(cluster, tmp_path):
    """SIGKILL while n003 (resumed for its recheck) runs its checks: the step ends on its own (the bundle's
    stdin watchdog: srun's stdin closed with preflight), the job stays until its limit, the reservation
    keeps n003 from user jobs; the next run names and cleans both."""
    s = cluster.slurm
    s.drain("n003", OLD)
    reached, _, planted = _gate(cluster, tmp_path, "n003")
    try:
        proc = _start_resume(cluster, ["--only", "ssh,nic,mtu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait("n003's ping at the gate", reached.exists, timeout=150)
        _sigkill(proc)
        _wait("the orphaned step to end", lambda: not s.leftover_steps(), timeout=60)
        assert any(" preflight-" in j and "RUNNING" in j for j in s.jobs()), s.jobs()  # the job: until its limit
    finally:
        os.unlink(planted)
    assert "n003" not in s.reasons() and _refused_to_users(cluster, "n003")
    _next_run_cleans(cluster, "n003")


def test_sigkill_mid_step_of_drain_leaves_only_its_job_which_the_next_run_cancels(cluster, tmp_path):
    """--drain changes no node before its verdict: a SIGKILL mid-step leaves its job (the nodes held
    until its time limit) and no step; the next run names the job, cancels it and runs."""
    s = cluster.slurm
    cluster.mtu_blackhole("n003")
    reached, _, planted = _gate(cluster, tmp_path, "n003")
    try:
        proc = s.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh,nic,mtu", "--drain"], popen=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait("n003's ping at the gate", reached.exists, timeout=150)
        _sigkill(proc)
        _wait("the orphaned step to end", lambda: not s.leftover_steps(), timeout=60)
    finally:
        os.unlink(planted)
    left = [j.split()[0] for j in s.jobs() if " preflight-" in j]
    assert len(left) == 1 and s.reasons() == {} and s.reservations() == [], (s.jobs(), s.reasons())
    nxt = cluster.slurm.preflight(["check", "--slurm", "--nodelist", ALL, "--only", "ssh"])
    assert "a killed preflight run (pid" in nxt.stderr and "left job %s" % left[0] in nxt.stderr, nxt.stderr
    assert "job %s: cancelled" % left[0] in nxt.stderr and nxt.returncode == 0, nxt.stdout + nxt.stderr
    assert [j for j in s.jobs() if " preflight-" in j] == [], s.jobs()


def test_sigkill_over_ssh_leaves_no_process_on_the_nodes(cluster, tmp_path):
    """SSH has no scheduler state to leave: what a SIGKILL could leave is the node side. With n003's ping
    held at its gate (the bundle running there), the controller is killed; its connections drop and every
    node's bundle, its children included, ends (the stdin watchdog kills its process group)."""
    inv = cluster.inventory(str(tmp_path / "hosts.yaml"))
    reached, _, planted = _gate(cluster, tmp_path, "n003")
    try:
        proc = cluster.ctl_popen([PREFLIGHT, "check", inv, "--only", "ssh,nic,mtu", "--no-progress"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait("n003's ping at the gate", reached.exists, timeout=150)
        assert cluster.processes("n003"), "the bundle is not running on n003"
        _sigkill(proc)
        assert cluster.leftover_processes(timeout=60) == {}
    finally:
        os.unlink(planted)


def test_a_running_run_and_another_hosts_leftovers_are_not_cleaned(cluster, tmp_path):
    """The twins of a dead run's leftovers: a --resume run still running on this host (n003 resumed for its
    recheck, at its gate) keeps its job and reservation while a second run starts; a reservation whose
    owner ran on another host cannot be asked, so it is named with the commands that clean it and kept."""
    s = cluster.slurm
    s.drain("n003", OLD)
    foreign = "preflight-0123abcd-4242-99-login2.example"
    made = s.run(["scontrol", "create", "reservation", "ReservationName=%s" % foreign, "Nodes=n004", "StartTime=now",
                  "Duration=UNLIMITED", "Users=root", "Flags=maint,ignore_jobs,flex"])
    assert made.returncode == 0, made.stderr
    reached, opened, planted = _gate(cluster, tmp_path, "n003")
    try:
        proc = _start_resume(cluster, ["--only", "ssh,nic,mtu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with _reaped(proc):
            _wait("n003's ping at the gate", reached.exists, timeout=150)
            mine = [r for r in s.reservations() if r != foreign]
            second = s.preflight(["check", "--slurm", "--nodelist", "n001", "--only", "ssh", "--alloc-wait", "3"])
            assert "killed preflight run" not in second.stderr, second.stderr
            assert "left as is: reservation %s over n004 of a preflight run on login2.example (pid 4242)" % foreign in \
                " ".join(second.stderr.split()), second.stderr
            assert "scontrol delete reservation=%s" % foreign in second.stderr, second.stderr
            assert sorted(s.reservations()) == sorted(mine + [foreign]), s.reservations()
            opened.touch()
            out, err = proc.communicate(timeout=180)
    finally:
        os.unlink(planted)
    assert proc.returncode == 0 and "resume: n003" in out, out + err[-2000:]
    assert s.reservations() == [foreign] and s.reasons() == {}, (s.reservations(), s.reasons())

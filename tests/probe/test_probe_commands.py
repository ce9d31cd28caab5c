"""A probe's commands (preflight.probe.context): each runs in a process group of its own, killed whole when the
command returns, at its deadline, when the probe run ends and when the bootstrap dies, so a wrapper script whose
child hangs leaves nothing behind.

The programs are real scripts on PATH, as real tools are found: a `dcgmi` or `nvidia-smi` wrapper that forks a
sleeping child and then hangs (or answers at once, its child left running), writing the pids of both first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from preflight.probe import context, runner
from preflight.probe.context import NodeContext
from preflight.transport import bundle
from tests.paths import REPO


#: a wrapper that starts a child which outlives it unless its group is killed, then hangs (exec: the pid it
#: wrote is the hung process, so a failing test can still kill everything it started) or answers
WRAPPER = """#!/bin/sh
sleep 300 >/dev/null 2>&1 </dev/null &
echo "$$ $! $(cut -d' ' -f5 /proc/$$/stat)" > "{pids}"
{then}
"""


def wrapper(tmp_path, name, then="exec sleep 300"):
    """Install `name` on a bin dir under tmp_path; returns (bin dir, the file its pids are written to)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    pids = tmp_path / ("%s.pids" % name)
    script = bindir / name
    script.write_text(WRAPPER.format(pids=pids, then=then))
    script.chmod(0o755)
    return str(bindir), pids


def read_pids(path, wait_s=30.0):
    """(wrapper pid, its child's pid, the wrapper's process group), once the wrapper has written them."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return tuple(int(x) for x in text.split())
        time.sleep(0.02)
    raise AssertionError("the wrapper never started: %s" % path)


def alive(pid):
    """Whether pid is a live process (a zombie waiting for init to reap it counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgid):
    """The live processes of process group pgid."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(entry))
    return out


def gone(pids, wait_s=10.0):
    """The pids still alive after SIGKILL has had wait_s to take effect (an empty list: all gone)."""
    end = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def test_a_command_that_times_out_is_killed_with_its_children(tmp_path, monkeypatch, reaper):
    bindir, pids = wrapper(tmp_path, "dcgmi")
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ["PATH"])
    res = NodeContext().run(["dcgmi", "diag", "-r", "1"], timeout=1.0)
    leader, child, pgid = read_pids(pids)
    reaper.extend([leader, child])
    assert res.timed_out and res.rc == -1 and res.stderr == "timed out after 1s", res
    assert pgid == leader != os.getpgrp()  # its own group, not the probe's
    assert gone([leader, child]) == [] and group_members(pgid) == []


def test_a_command_that_answers_keeps_its_output_and_leaves_no_child(tmp_path, monkeypatch, reaper):
    """The healthy twin: the wrapper answers at once (rc 3, both streams), its background child is killed."""
    bindir, pids = wrapper(tmp_path, "ibstat", then="echo 'CA mlx5_0'; echo warn >&2; exit 3")
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ["PATH"])
    res = NodeContext().run(["ibstat"], timeout=30.0)
    leader, child, pgid = read_pids(pids)
    reaper.extend([leader, child])
    assert (res.rc, res.stdout, res.stderr, res.timed_out) == (3, "CA mlx5_0\n", "warn\n", False)
    assert gone([child]) == [] and group_members(pgid) == []


def test_input_output_and_missing_programs_read_as_before(tmp_path):
    ctx = NodeContext()
    assert ctx.run(["cat"], input="a\r\nb\n").stdout == "a\nb\n"  # text mode: universal newlines
    assert ctx.run(["cat"]).stdout == ""  # stdin is /dev/null, never the probe's (the controller's channel)
    missing = ctx.run(["no-such-program-%d" % os.getpid()])
    assert missing.rc == 127 and "command not found" in missing.stderr
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    assert ctx.run([str(plain)]).rc == 126


def test_a_probe_that_overruns_the_run_has_its_command_killed_and_starts_no_other(tmp_path, monkeypatch, reaper):
    """driver's nvidia-smi (60 s of its own) hangs past the probe run's 1 s: the run ends on time, the
    command's whole group is killed and named in the probe's error, and a later command is refused."""
    bindir, pids = wrapper(tmp_path, "nvidia-smi")
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("PREFLIGHT_NVML", "off")
    monkeypatch.setenv("PREFLIGHT_SYSFS_ROOT", str(tmp_path / "sys"))
    shared = {}
    real_shared = runner.Shared

    def keep(*a):
        shared["run"] = real_shared(*a)
        return shared["run"]

    monkeypatch.setattr(runner, "Shared", keep)
    facts = runner.run_probes({"driver": {}}, timeout_s=1.0)
    leader, child, pgid = read_pids(pids)
    reaper.extend([leader, child])
    assert facts["driver"]["probe_error"] == "did not finish within 1 s (killed with its children: nvidia-smi -q -x)"
    assert gone([leader, child]) == [] and group_members(pgid) == []
    later = NodeContext(shared=shared["run"]).run(["true"])
    assert later.timed_out and later.stderr == "not started: the probe run had ended"


def test_a_bootstrap_whose_controller_goes_away_kills_its_commands_groups(tmp_path, reaper):
    """The bootstrap's safety net (stdin closed: the controller died) also reaches the commands' own groups."""
    bindir, pids = wrapper(tmp_path, "nvidia-smi")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"], PREFLIGHT_NVML="off",
               PREFLIGHT_SYSFS_ROOT=str(tmp_path / "sys"), PYTHONPATH=REPO)
    config = {"mode": "probe", "checks": {"driver": {}}, "probe_timeout_s": 120, "deadline_s": 300}
    proc = subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    reaper.append(proc.pid)
    try:
        proc.stdin.write(bundle.stdin_payload(config))
        proc.stdin.flush()
        leader, child, pgid = read_pids(pids, wait_s=60.0)
        reaper.extend([leader, child])
        proc.stdin.close()  # the controller went away
        assert proc.wait(60) == -signal.SIGKILL  # the bootstrap's _die: its own group killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert gone([leader, child]) == [] and group_members(pgid) == []


def test_a_probe_process_killed_mid_command_leaves_no_process_of_the_command(tmp_path, reaper):
    """SIGKILL (a transport's kill, slurmd giving up) leaves no handler to run: the watchdog sees the probe
    process's pipe close and kills the command's group."""
    bindir, pids = wrapper(tmp_path, "dcgmi")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"], PYTHONPATH=REPO)
    code = "from preflight.probe.context import NodeContext; NodeContext().run(['dcgmi', 'diag'], timeout=300)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    reaper.append(proc.pid)
    try:
        leader, child, pgid = read_pids(pids, wait_s=60.0)
        reaper.extend([leader, child])
    finally:
        proc.kill()
        proc.wait()
    assert gone([leader, child]) == [] and group_members(pgid) == []


def test_the_watchdog_kills_only_the_groups_still_running():
    """Its twin: groups that ended are struck off its list (their numbers may be reused after the reap)."""
    script = context.WATCHDOG.replace("kill -9", "echo kill -9")
    lines = "+101\n+202\n-101\n+303\n-303\n-999\n"
    out = subprocess.run(["/bin/sh", "-c", script], input=lines, stdout=subprocess.PIPE, universal_newlines=True,
                         timeout=30).stdout
    assert out == "kill -9 -202\n"


def marked_sleep(mark):
    """A real process carrying the watchdog's mark, as a command started by Shared.start does."""
    env = dict(os.environ, **{context.MARK_ENV: mark}) if mark else dict(os.environ)
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)


def watchdog_eof(lines, mark):
    """Run the real watchdog on lines, then close its stdin (the probe process has died)."""
    subprocess.run(["/bin/sh", "-c", context.WATCHDOG, "preflight-watchdog", mark], input=lines,
                   universal_newlines=True, timeout=30, stdout=subprocess.DEVNULL)


def test_a_kill_before_the_command_is_listed_is_caught_by_its_mark(reaper):
    """The window the list cannot cover: the command runs before its "+PGID" line is sent (a probe killed on a
    loaded node while it waits for a CPU). The watchdog heard "?" and no "+": it kills what carries its mark,
    and nothing else (another probe's command, an unmarked process of the same user)."""
    mine, other, plain = marked_sleep("7-ab"), marked_sleep("8-cd"), marked_sleep("")
    procs = [mine, other, plain]
    reaper.extend(p.pid for p in procs)
    try:
        watchdog_eof("?\n+101\n-101\n?\n", "7-ab")
        assert mine.wait(10) == -signal.SIGKILL
        assert other.poll() is None and plain.poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_probe_whose_starts_were_all_listed_leaves_the_scan_out(reaper):
    """Its twin: every "?" was followed by "+PGID" (or "!", a start that failed), so the list is complete and
    /proc is not read at all; a process carrying the mark but not listed (here: a stand-in) is not touched."""
    mine = marked_sleep("7-ab")
    reaper.append(mine.pid)
    try:
        watchdog_eof("?\n+101\n-101\n?\n!\n", "7-ab")
        assert mine.poll() is None
    finally:
        mine.kill()
        mine.wait()


def test_a_command_carries_its_probe_process_mark(tmp_path, monkeypatch):
    """Shared.start gives each command the mark (its children inherit it), and keeps the rest of the
    environment, PATH included, as the probe has it now."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "showmark").write_text("#!/bin/sh\necho \"$%s|$PATH\"\n" % context.MARK_ENV)
    (bindir / "showmark").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    res = NodeContext().run(["showmark"], timeout=30.0)
    mark, _, path = res.stdout.strip().partition("|")
    assert mark == context._WATCH.tell("-0") and mark.startswith("%d-" % os.getpid())
    assert path.startswith(str(bindir))
    assert context.MARK_ENV not in os.environ

"""What a probe may touch on the node: commands, files under the sysfs root, and its configuration.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle.

Hardware is read through the interfaces real hardware uses: executables on PATH (nvidia-smi,
systemctl, ip), files under the sysfs root, and NVML. The sysfs root is /sys unless the environment
sets PREFLIGHT_SYSFS_ROOT (for a probe run inside a container that mounts the host's /sys elsewhere,
e.g. /host/sys). Likewise configuration files the jobs read (/etc/nccl.conf, ~/.nccl.conf) are read
under PREFLIGHT_HOST_ROOT when it is set (a container that mounts the host's / at /host), else from /.

Every command runs in a process group of its own (a new session), and the whole group is SIGKILLed when the
command returns, when its deadline passes, and when the probe run ends (Shared.stop: a probe that overran the
run's deadline): a wrapper script around dcgmi whose child hangs, or a shell that left `ibstat` running,
leaves nothing behind. The group is killed before its leader is reaped, so its number cannot have been given
to another process meanwhile. A group of its own no longer dies with the probe process's group (the
transports' kill, the bootstrap's safety nets, slurmd giving up on a HealthCheckProgram), so a watchdog
(`/bin/sh`, one per process, in a session of its own) is told each group as it starts and ends, and kills
those still running when the probe process's end of its pipe closes, whatever killed it, SIGKILL included.
A group's number is known only once the command runs, so a kill between the command's exec and its "+PGID"
line (a loaded node: the command runs while the probe waits for a CPU) would leave it unlisted: the probe
says "?" before each start, every command carries a mark in its environment (MARK_ENV, one value per
watchdog, inherited by the command's children), and a watchdog that sees EOF with a start still unconfirmed
kills every process that carries its mark (read from /proc/PID/environ).
What a group kill cannot reach: a process that started a session of its own (a daemon), and a process stuck
in the kernel (D state), which the kernel ends when it can.
"""

from __future__ import annotations

import locale
import os
import select
import selectors
import shutil
import signal
import subprocess
import threading
import time

from preflight.node_model import CommandResult

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Sequence, Tuple

SYSFS_ENV = "PREFLIGHT_SYSFS_ROOT"
#: How much of one raw output a failed probe sends back with its error (bytes of text, per item).
RAW_CAP = 4096
HOST_ENV = "PREFLIGHT_HOST_ROOT"
#: How long a killed command's leader gets to be reaped before it is left to the kernel (stuck in D state).
KILL_WAIT_S = 2.0
#: The environment variable that marks the commands of one probe process (and their children); its value is
#: that process's watchdog's, passed to the watchdog as $1.
MARK_ENV = "PREFLIGHT_PROBE_COMMAND_OF"
#: The watchdog: reads "?" (a command is about to start), "+PGID" (it started: its group) and "-PGID" (it
#: ended) lines; at EOF (this process has died, or exits) it kills the groups still running, and, when a start
#: was never confirmed, every process that carries the mark $1 (two passes: a child forked while the first
#: ran). Builtins only while the probe lives: no fork per line.
WATCHDOG = r"""
live=" "
pending=0
while IFS= read -r line; do
  g=${line#?}
  case $line in
    "?") pending=$((pending + 1)) ;;
    +*) live="$live$g " ; pending=$((pending - 1)) ;;
    -*) case $live in *" $g "*) live="${live%% $g *} ${live#* $g }" ;; esac ;;
    "!") pending=$((pending - 1)) ;;
  esac
done
for g in $live; do kill -9 -$g 2>/dev/null; done
if [ "$pending" -gt 0 ] && [ -n "$1" ]; then
  for pass in 1 2; do
    for f in $(grep -lsxzF -- "$MARK=$1" /proc/[0-9]*/environ); do
      p=${f#/proc/}; p=${p%/environ}
      kill -9 -$p 2>/dev/null; kill -9 $p 2>/dev/null
    done
  done
fi
""".replace("$MARK", MARK_ENV)


class RunEnded(Exception):
    """The probe run this command belongs to has ended (Shared.stop): it is not started."""


class Shared:
    """What the probes of one run share: a command's result computed once (the kernel log that xid and
    ib_errors both search), whichever probe asks first; the others wait for it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: Dict[Any, threading.Lock] = {}
        self._values: Dict[Any, Any] = {}
        self._groups: Dict[int, subprocess.Popen] = {}  # the commands running now, by process group id
        self._stopped = False

    def start(self, argv: List[str], stdin: bool) -> subprocess.Popen:
        """Start argv in a new session (its own process group), stdout and stderr piped; stdin a pipe when
        `stdin`, else /dev/null (never the probe's stdin, the controller's channel). Raises RunEnded after
        stop(), OSError when it cannot start."""
        with self._lock:
            if self._stopped:
                raise RunEnded()
        # the watchdog runs before the command does, and hears "?" first: a kill between the command's start and
        # its "+PGID" line finds the command by its mark (see the module's docstring)
        mark = _WATCH.tell("?")  # from here until "+PGID", a kill makes the watchdog look for the mark
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    env=dict(os.environ, **{MARK_ENV: mark}) if mark else None)
        except BaseException:
            _WATCH.tell("!")
            raise
        with self._lock:  # listed (or killed, when stop() came while it started) before anything else
            self._groups[proc.pid] = proc
            if self._stopped:
                _kill_group(proc.pid)
        _WATCH.tell("+%d" % proc.pid)
        return proc

    def finish(self, proc: subprocess.Popen) -> None:
        """Kill what is left of proc's process group, then reap its leader (never the other way round)."""
        _kill_group(proc.pid)
        _WATCH.tell("-%d" % proc.pid)  # before the reap: a group the watchdog still kills is never reused
        with self._lock:  # likewise for stop()
            self._groups.pop(proc.pid, None)
        try:
            proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # in the kernel (D state): SIGKILL takes effect when it returns
            pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        """End the run's commands: kill every group still running, and start no other."""
        with self._lock:  # a group still listed has its leader unreaped: its number is still its own
            self._stopped = True
            for proc in self._groups.values():  # their own threads reap them (finish)
                _kill_group(proc.pid)

    def once(self, key: Any, compute: Any) -> Any:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = compute()
            return self._values[key]


class NodeContext:
    """The probe's window on the node. One per check per probe run; cheap to build. The contexts of one run
    hold the same Shared (the runner passes it), so run_once() runs a command once for all of them."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, sysfs_root: Optional[str] = None,
                 shared: Optional[Shared] = None, deadline: Optional[float] = None) -> None:
        self.config: Dict[str, Any] = dict(config or {})
        self.sysfs_root = sysfs_root or os.environ.get(SYSFS_ENV) or "/sys"
        self.host_root = os.environ.get(HOST_ENV) or "/"
        self.shared = shared if shared is not None else Shared()
        self.deadline = deadline  # time.monotonic() by which the probe must have answered (None: no limit)
        self.running: Optional[List[str]] = None  # the command this probe waits on now (what an overrun killed)

    def remaining(self) -> Optional[float]:
        """Seconds left before the probe run's deadline (a long command must end before it); None: no limit."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def budget(self, want: float, slack: float, least: float) -> Tuple[Optional[float], Optional[str]]:
        """(seconds a long command may take, None) -- `want`, cut to end `slack` before the probe deadline --
        or (None, why not) when less than `least` would be left for it."""
        left = self.remaining()
        if left is None:
            return want, None
        if left - slack < least:
            return None, "only %.0f s left before the probe deadline" % max(left, 0.0)
        return min(want, left - slack), None

    def host_path(self, path: str) -> str:
        """A node's absolute path (/etc/nccl.conf) as this probe reaches it: under the host root."""
        return os.path.join(self.host_root, path.lstrip("/"))

    def sys_path(self, *parts: str) -> str:
        """An absolute path under the sysfs root: ctx.sys_path("class", "infiniband")."""
        return os.path.join(self.sysfs_root, *parts)

    def which(self, program: str) -> Optional[str]:
        return shutil.which(program)

    def run(self, argv: Sequence[str], timeout: float = 15.0, input: Optional[str] = None) -> CommandResult:
        """Run a program (never through a shell) in its own process group, killed whole when it returns or
        times out. rc 127 when it does not exist; timed_out on deadline (or when the probe run has ended)."""
        argv = [str(a) for a in argv]
        if _nowhere(argv[0]):  # what exec would find: a fork, a watchdog line and an execve per PATH entry saved
            return CommandResult(argv, 127, "", "%s: command not found" % argv[0])
        try:
            proc = self.shared.start(argv, input is not None)
        except FileNotFoundError:
            return CommandResult(argv, 127, "", "%s: command not found" % argv[0])
        except PermissionError as exc:
            return CommandResult(argv, 126, "", str(exc))
        except RunEnded:
            return CommandResult(argv, -1, "", "not started: the probe run had ended", timed_out=True)
        self.running = argv
        try:
            out, err, finished = _communicate(proc, input, time.monotonic() + timeout)
        finally:
            self.running = None
            self.shared.finish(proc)
        if not finished:
            return CommandResult(argv, -1, out, "timed out after %gs" % timeout, timed_out=True)
        return CommandResult(argv, proc.returncode, out, err)

    def run_once(self, argv: Sequence[str], timeout: float = 15.0) -> CommandResult:
        """run(), but once per probe run: a probe that asks for the same argv later gets the same result."""
        argv = [str(a) for a in argv]
        return self.shared.once(("run",) + tuple(argv), lambda: NodeContext.run(self, argv, timeout))

    def walk_once(self, key: Tuple[str, ...], walk: Any) -> Any:
        """walk(ctx)'s result computed once per probe run, for every probe that asks (the PCI bus that the pcie,
        topology, gpudirect, fabric_manager and xid probes all list); walk reads only through the ctx it is given.

        Each asking probe records the walk's reads as if it had made them, so its capture replays on its own."""
        def compute() -> Tuple[Any, List[Dict[str, Any]]]:
            walker = RecordingContext(self.config, self.sysfs_root, self.shared, self.deadline)
            return walk(walker), walker.events

        value, events = self.shared.once(("walk", self.sysfs_root) + tuple(key), compute)
        self._walked(events)
        return value

    def _walked(self, events: List[Dict[str, Any]]) -> None:
        """A shared walk's reads, made for this probe (walk_once): nothing to keep in a plain context."""

    @staticmethod
    def read(path: str) -> Optional[str]:
        """A small text file's content stripped of its trailing newline; None when it cannot be read. Decoded as
        open()'s text mode does (_text: the locale's encoding, errors replaced, universal newlines).

        sysfs attributes that the driver refuses to report (EINVAL on a virtual NIC's speed) read as None.
        """
        try:  # os.read, not open(): a text file object costs twice the CPU, times hundreds of reads on a GPU node
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        chunks = []  # type: List[bytes]
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:  # EINVAL, EIO from a driver's attribute; EISDIR
            return None
        finally:
            os.close(fd)
        return _text(chunks).rstrip("\n")

    @staticmethod
    def realpath(path: str) -> str:
        """os.path.realpath(path), resolved by the kernel where the path exists: opened with O_PATH (nothing is
        read, no permission but search is needed) and the descriptor's /proc link read back, three system calls
        where realpath lstat()s every component in Python (a GPU's sysfs directory: 10 or more). Measured on a
        sysfs device link here: 48 -> 11 us a call. Anything else (a dangling link, a missing path, no /proc, a
        directory removed meanwhile: its link ends in " (deleted)") is left to os.path.realpath."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (OSError, AttributeError):  # AttributeError: no O_PATH (not Linux)
            return os.path.realpath(path)
        try:
            real = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            real = ""
        finally:
            os.close(fd)
        return real if real.startswith("/") and not real.endswith(" (deleted)") else os.path.realpath(path)

    @staticmethod
    def listdir(path: str) -> List[str]:
        """Sorted directory entries; [] when the directory does not exist."""
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    @staticmethod
    def exists(path: str) -> bool:
        """Whether a path exists (a sysfs link such as class/net/IF/device)."""
        return os.path.exists(path)


class _Watchdog:
    """The process that kills this process's command groups after it has died (see WATCHDOG)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None  # never waited for: it ends when this process does
        self._pid: Optional[int] = None
        self._mark = ""

    def _ensure(self) -> None:
        """Start this process's watchdog if it has none yet (first use, or a forked child: one of its own)."""
        if self._pid != os.getpid():
            self._mark = "%d-%s" % (os.getpid(), os.urandom(8).hex())
            self._proc, self._pid = self._start(self._mark), os.getpid()

    def tell(self, line: str) -> str:
        """Send the watchdog a line; returns the mark its commands carry ("" when there is no watchdog)."""
        with self._lock:
            self._ensure()
            if self._proc is None or self._proc.stdin is None:
                return ""
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:  # it was killed: the groups are still killed on every path but this process's death
                self._proc = None
                return ""
            return self._mark

    @staticmethod
    def _start(mark: str) -> Optional[subprocess.Popen]:
        try:  # /bin/sh by its path: the probe's PATH may put a node's (or a test's) programs first
            return subprocess.Popen(["/bin/sh", "-c", WATCHDOG, "preflight-watchdog", mark], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:  # no /bin/sh: as above
            return None


_WATCH = _Watchdog()


def _nowhere(program: str) -> bool:
    """Whether exec would not find `program` (ENOENT): a bare name that no PATH entry holds. A file that is there
    but not executable is left to exec (126, as before), as is a path."""
    if not program or os.sep in program:
        return False
    return not any(os.path.lexists(os.path.join(d or ".", program))
                   for d in os.environ.get("PATH", os.defpath).split(os.pathsep))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left in it, or only members we may not signal (setuid)
        pass


def _communicate(proc: subprocess.Popen, input: Optional[str], deadline: float) -> Tuple[str, str, bool]:
    """(stdout, stderr, finished): proc's output, read until both pipes close and its leader exits, or
    until the deadline (finished False). The leader is left unreaped (waitid WNOWAIT) so that its process
    group id stays its own until Shared.finish has killed the group."""
    chunks: Dict[Any, List[bytes]] = {proc.stdout: [], proc.stderr: []}
    pending = memoryview((input or "").encode(locale.getpreferredencoding(False), "replace"))
    with selectors.DefaultSelector() as sel:
        for stream in chunks:
            sel.register(stream, selectors.EVENT_READ)
        if proc.stdin is not None:
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return _text(chunks[proc.stdout]), _text(chunks[proc.stderr]), False
            for key, _ in sel.select(left):
                if key.fileobj is proc.stdin:
                    pending = _feed(proc.stdin, pending, sel)
                    continue
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fileobj].append(data)
                else:
                    sel.unregister(key.fileobj)
    finished = _await_exit(proc.pid, deadline)
    return _text(chunks[proc.stdout]), _text(chunks[proc.stderr]), finished


def _feed(stdin: Any, pending: memoryview, sel: selectors.BaseSelector) -> memoryview:
    """Write what fits of the command's input; close its stdin once all is written (or it stopped reading)."""
    try:
        pending = pending[os.write(stdin.fileno(), pending[:select.PIPE_BUF]):]
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        sel.unregister(stdin)
        stdin.close()
    return pending


def _await_exit(pid: int, deadline: float) -> bool:
    """Whether the leader exited by the deadline; it stays a zombie (WNOWAIT) until Shared.finish reaps it."""
    pause = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # already reaped (cannot happen before finish(); count it as ended)
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _text(chunks: List[bytes]) -> str:
    """Bytes as subprocess's text mode gives them: the locale's encoding, errors replaced, universal newlines."""
    text = b"".join(chunks).decode(locale.getpreferredencoding(False), "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _cap(text: Optional[str], cap: int) -> Optional[str]:
    if text is None or len(text) <= cap:
        return text
    return text[:cap] + "\n[... %d more characters]" % (len(text) - cap)


class RecordingContext(NodeContext):
    """A NodeContext that keeps what the probe ran and read, in order.

    Every probe runs in one: when it fails, its error carries the raw outputs it was given (raw(), capped),
    and `preflight check --capture` sends all of them back (events), to be written as test fixtures.
    """

    def __init__(self, config: Optional[Dict[str, Any]] = None, sysfs_root: Optional[str] = None,
                 shared: Optional[Shared] = None, deadline: Optional[float] = None) -> None:
        super().__init__(config, sysfs_root, shared, deadline)
        self.events: List[Dict[str, Any]] = []

    def run_once(self, argv: Sequence[str], timeout: float = 15.0) -> CommandResult:
        res = NodeContext.run_once(self, argv, timeout)
        # recorded in every probe that used it, so each probe's capture replays on its own
        self.events.append({"kind": "run", "argv": list(res.argv), "rc": res.rc, "stdout": res.stdout,
                            "stderr": res.stderr, "timed_out": res.timed_out})
        return res

    def run(self, argv: Sequence[str], timeout: float = 15.0, input: Optional[str] = None) -> CommandResult:
        res = NodeContext.run(self, argv, timeout, input)
        self.events.append({"kind": "run", "argv": list(res.argv), "rc": res.rc, "stdout": res.stdout,
                            "stderr": res.stderr, "timed_out": res.timed_out})
        return res

    def _walked(self, events: List[Dict[str, Any]]) -> None:
        self.events.extend(events)

    def read(self, path: str) -> Optional[str]:  # type: ignore[override]
        text = NodeContext.read(path)
        self.events.append({"kind": "read", "path": path, "text": text})
        return text

    def listdir(self, path: str) -> List[str]:  # type: ignore[override]
        entries = NodeContext.listdir(path)
        self.events.append({"kind": "listdir", "path": path, "entries": entries})
        return entries

    def exists(self, path: str) -> bool:  # type: ignore[override]
        found = NodeContext.exists(path)
        self.events.append({"kind": "exists", "path": path, "found": found})
        return found

    def raw(self, cap: int = RAW_CAP, last: int = 4) -> List[Dict[str, Any]]:
        """The last commands run and files read (listings left out), each output capped at cap characters."""
        out = []
        for event in [e for e in list(self.events) if e["kind"] in ("run", "read")][-last:]:
            item = dict(event)
            for key in ("stdout", "stderr", "text"):
                if key in item:
                    item[key] = _cap(item[key], cap)
            out.append(item)
        return out

    def record(self) -> Dict[str, Any]:
        """Everything recorded, for --capture."""
        env = {k: os.environ[k] for k in ("SSH_CONNECTION",) if k in os.environ}
        return {"events": list(self.events), "sysfs_root": self.sysfs_root, "config": self.config, "env": env}

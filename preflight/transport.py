"""Run the probe bundle on a node: over SSH (fabric/paramiko) or, for this machine, as a local process.

The only module that touches fabric and paramiko. Every connection has a connect deadline, every run a
command deadline; when a run overruns, the remote process group is killed over a second channel, and
the bundle's own watchdog kills it if the connection is lost. Host keys are verified against
known_hosts unless the node says `host_key_checking: accept-new`. Failures are NodeFailure values
with a kind and a fix, never tracebacks.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from preflight import bundle
from preflight.inventory import NodeSpec

log = logging.getLogger(__name__)


def fingerprint(key: Any) -> str:
    """OpenSSH's form of a host key fingerprint: SHA256:base64 (as `ssh-keygen -lf` prints it)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class NodeFailure(Exception):
    """A node could not be used. kind: unreachable, host_key, auth, timeout, protocol."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass
class RunResult:
    """One bundle run: the parsed protocol lines plus timing."""

    rc: Optional[int]
    result: Optional[Dict[str, Any]]
    stderr: str
    sent_at: float
    clock: Optional[float]
    clock_received_at: Optional[float]
    elapsed_s: float


class _Run:
    """Incremental reader of a run's stdout: notes when the pid and clock lines arrive."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.pid: Optional[int] = None
        self.clock_at: Optional[float] = None

    def feed(self, data: bytes) -> None:
        before = self.out.count(b"\n")
        self.out += data
        if self.out.count(b"\n") != before and (self.pid is None or self.clock_at is None):
            seen = bundle.parse_output(bytes(self.out[: self.out.rfind(b"\n")]))
            if self.pid is None and "pid" in seen:
                self.pid = seen["pid"]
            if self.clock_at is None and "clock" in seen:
                self.clock_at = time.time()

    def finish(self, rc: Optional[int], sent_at: float, started: float) -> RunResult:
        seen = bundle.parse_output(bytes(self.out))
        return RunResult(
            rc=rc,
            result=seen.get("result"),
            stderr=self.err.decode("utf-8", "replace")[-4000:],
            sent_at=sent_at,
            clock=seen.get("clock"),
            clock_received_at=self.clock_at,
            elapsed_s=time.monotonic() - started,
        )


class Session:
    """A connection to one node that runs bundles. Subclasses: SSHSession, LocalSession."""

    spec: NodeSpec

    def open(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def run_bundle(self, config: Dict[str, Any], deadline_s: float) -> RunResult:  # pragma: no cover
        raise NotImplementedError

    def cancel(self) -> None:
        """Kill whatever this session is running now (Ctrl-C). Safe to call from another thread."""

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


# --- SSH -----------------------------------------------------------------------------------------

_known_hosts_lock = threading.Lock()


def _host_key_policy(accept_new: bool, known_hosts: Optional[str]) -> Any:
    import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            if known_hosts:
                with _known_hosts_lock:
                    os.makedirs(os.path.dirname(os.path.abspath(known_hosts)), exist_ok=True)
                    with open(known_hosts, "a") as handle:
                        handle.write("%s %s %s\n" % (hostname, key.get_name(), key.get_base64()))

    return AcceptNew() if accept_new else paramiko.RejectPolicy()


_fabric_configs: Dict[Optional[str], Any] = {}
_fabric_lock = threading.Lock()


def _fabric_config(ssh_config: Optional[str]) -> Any:
    """One fabric Config per ssh_config file (parsing it once, not once per node).

    The SSHConfig is handed to fabric as an explicit object: fabric's Config.clone() re-reads the
    ssh_config files *into the original* on every clone unless it was given one, so the rule list
    grew by a file's worth per connection and every clone deep-copied it (O(nodes^2) at 256 nodes).
    """
    import fabric
    import paramiko

    with _fabric_lock:
        if ssh_config not in _fabric_configs:
            parsed = paramiko.SSHConfig()
            files = [ssh_config] if ssh_config else ["/etc/ssh/ssh_config", os.path.expanduser("~/.ssh/config")]
            for path in files:
                if os.path.isfile(path):
                    with open(path) as handle:
                        parsed.parse(handle)
            _fabric_configs[ssh_config] = fabric.Config(ssh_config=parsed)
        return _fabric_configs[ssh_config].clone()


class KnownHosts:
    """A known_hosts file parsed once per version (path, mtime, size) and shared by every connection.

    paramiko's HostKeys.load() compares each line with every earlier one: at 256 nodes, loading the
    file once per connection was 57% of the controller's CPU. Here each line is parsed once, and a
    connection gets only its own host's keys (plain or hashed |1| entries).
    """

    _cache: Dict[Any, "KnownHosts"] = {}
    _lock = threading.Lock()

    def __init__(self, path: str) -> None:
        import paramiko

        self.entries = []
        with open(path) as handle:
            for lineno, line in enumerate(handle, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except paramiko.SSHException as exc:
                    log.warning("%s:%d: unreadable known_hosts line ignored: %s", path, lineno, exc)
                    continue
                if entry is not None:
                    self.entries.append(entry)

    @classmethod
    def of(cls, path: str) -> "KnownHosts":
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        with cls._lock:
            if key not in cls._cache:
                cls._cache = {k: v for k, v in cls._cache.items() if k[0] != path}
                cls._cache[key] = cls(path)
            return cls._cache[key]

    def keys_for(self, name: str) -> List[Any]:
        """The keys recorded for `name` (host, or [host]:port off port 22)."""
        from paramiko.hostkeys import HostKeys

        found = []
        for entry in self.entries:
            for recorded in entry.hostnames:
                if recorded == name or (recorded.startswith("|1|") and HostKeys.hash_host(name, recorded) == recorded):
                    found.append(entry.key)
                    break
        return found


class SSHSession(Session):
    """One SSH connection per node (through ProxyJump hops if configured), reused for every phase."""

    def __init__(self, spec: NodeSpec, accept_new_host_keys: bool = False) -> None:
        self.spec = spec
        self.accept_new = accept_new_host_keys or spec.host_key_checking == "accept-new"
        self.conn: Any = None
        self._pid: Optional[int] = None
        self._lock = threading.Lock()

    # connection ---------------------------------------------------------------------------------
    def _connection(self, host: str, user: Optional[str], port: Optional[int], gateway: Any) -> Any:
        import fabric

        spec = self.spec
        connect_kwargs: Dict[str, Any] = {
            "banner_timeout": spec.connect_timeout,
            "auth_timeout": spec.connect_timeout,
            "channel_timeout": spec.connect_timeout,
        }
        if spec.identity_file:
            connect_kwargs["key_filename"] = [spec.identity_file]
        conn = fabric.Connection(
            host,
            user=user,
            port=port,
            config=_fabric_config(spec.ssh_config),
            gateway=gateway,
            connect_timeout=max(1, int(math.ceil(spec.connect_timeout))),
            connect_kwargs=connect_kwargs,
        )
        # fabric defaults to AutoAddPolicy on every hop; preflight verifies host keys on every hop.
        hop = conn
        while hop is not None and not isinstance(hop, str):
            hop.client.set_missing_host_key_policy(_host_key_policy(self.accept_new, spec.known_hosts))
            if spec.known_hosts and os.path.isfile(spec.known_hosts):
                name = hop.host if hop.port == 22 else "[%s]:%d" % (hop.host, hop.port)
                for key in KnownHosts.of(spec.known_hosts).keys_for(name):
                    hop.client.get_host_keys().add(name, key.get_name(), key)
            hop = hop.gateway
        return conn

    def _gateway(self) -> Any:
        if not self.spec.proxy_jump:
            return None  # fabric then honours a ProxyJump from ssh_config
        gateway = None
        for hop in self.spec.proxy_jump.split(","):
            gateway = self._connection(hop, None, None, gateway)
        return gateway

    def open(self) -> None:
        import paramiko

        spec = self.spec
        where = "%s:%s" % (spec.host, spec.port or 22)
        try:
            self.conn = self._connection(spec.host, spec.user, spec.port, self._gateway())
            self.conn.open()
            self.conn.transport.set_keepalive(max(1, int(spec.connect_timeout)))
        except paramiko.BadHostKeyException as exc:
            raise NodeFailure(
                "host_key",
                "host key for %s CHANGED (got %s %s); if the node was reinstalled, verify the new key and run "
                "`ssh-keygen -R %s` before reconnecting" % (spec.host, exc.key.get_name(), fingerprint(exc.key), spec.host),
            ) from None
        except paramiko.AuthenticationException as exc:
            raise NodeFailure("auth", "authentication failed as %s@%s: %s; check identity_file/agent and authorized_keys" % (spec.user or "(default user)", spec.host, exc)) from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            reasons = {e.strerror or str(e) for e in exc.errors.values()}
            raise NodeFailure("unreachable", "unreachable: %s (%s)" % (", ".join(sorted(reasons)).lower(), where)) from None
        except ConnectionRefusedError:
            raise NodeFailure("unreachable", "unreachable: connection refused (%s); is sshd running?" % where) from None
        except (socket.timeout, TimeoutError):
            raise NodeFailure("unreachable", "unreachable: no answer within %g s (%s)" % (spec.connect_timeout, where)) from None
        except socket.gaierror as exc:
            raise NodeFailure("unreachable", "unreachable: cannot resolve %s (%s)" % (spec.host, exc.strerror)) from None
        except OSError as exc:
            raise NodeFailure("unreachable", "unreachable: %s (%s)" % (exc.strerror or exc, where)) from None
        except paramiko.SSHException as exc:
            text = str(exc)
            if "not found in known_hosts" in text:
                raise NodeFailure(
                    "host_key",
                    "host key of %s is not in %s; verify it and add it (ssh-keyscan -H %s >> %s), or pass "
                    "--accept-new-host-keys" % (spec.host, spec.known_hosts or "known_hosts", spec.host, spec.known_hosts or "~/.ssh/known_hosts"),
                ) from None
            if "banner" in text.lower() or "no existing session" in text.lower():
                # paramiko reports a server that accepted TCP but never spoke SSH either way
                raise NodeFailure("unreachable", "hung: TCP connects but sshd sent no SSH banner within %g s (%s)" % (spec.connect_timeout, where)) from None
            raise NodeFailure("unreachable", "SSH failed: %s (%s)" % (text, where)) from None

    # running ------------------------------------------------------------------------------------
    def run_bundle(self, config: Dict[str, Any], deadline_s: float) -> RunResult:
        import paramiko

        started = time.monotonic()
        run = _Run()
        # The payload is built before the remote command starts: until its pid arrives a Ctrl-C cannot
        # kill it, so nothing slow (the first bundle build) may sit between the two.
        payload = bundle.stdin_payload(dict(config, deadline_s=deadline_s + 5))
        try:
            chan = self.conn.transport.open_session(timeout=self.spec.connect_timeout)
            sent_at = time.time()
            chan.exec_command(bundle.remote_command(self.spec.python))
            chan.sendall(payload)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeFailure("unreachable", "connection lost while starting the probe: %s" % (exc or type(exc).__name__)) from None
        end = started + deadline_s
        try:
            while True:
                if run.pid is not None and self._pid is None:
                    with self._lock:
                        self._pid = run.pid
                remaining = end - time.monotonic()
                if remaining <= 0:
                    self._kill(run.pid)
                    raise NodeFailure(
                        "timeout",
                        "timed out: no answer within %g s%s" % (deadline_s, "; killed the remote process group" if run.pid else ""),
                    )
                select.select([chan], [], [], min(remaining, 1.0))
                got = False
                while chan.recv_ready():
                    run.feed(chan.recv(65536))
                    got = True
                while chan.recv_stderr_ready():
                    run.err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not got and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
            rc = chan.recv_exit_status() if chan.exit_status_ready() else None
            while True:  # drain what is left after the exit status
                data = chan.recv(65536)
                if not data:
                    break
                run.feed(data)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeFailure("unreachable", "connection lost during the probe: %s" % (exc or type(exc).__name__)) from None
        finally:
            with self._lock:
                self._pid = None
            chan.close()
        return run.finish(rc, sent_at, started)

    def _kill(self, pid: Optional[int]) -> None:
        """Kill the remote process group over a fresh channel (the pid came from our own echo $$)."""
        if pid is None or self.conn is None or self.conn.transport is None or not self.conn.transport.is_active():
            return
        try:
            chan = self.conn.transport.open_session(timeout=self.spec.connect_timeout)
            chan.settimeout(10)
            chan.exec_command("kill -TERM -- -%d 2>/dev/null; sleep 0.5; kill -KILL -- -%d 2>/dev/null; exit 0" % (pid, pid))
            chan.recv_exit_status()
            chan.close()
        except Exception as exc:  # noqa: BLE001 - best effort, and said so
            # The bundle's watchdog kills its process group when our connection closes, so a lost
            # kill channel still ends the remote run once close() drops the connection.
            log.warning("%s: could not send the kill for process group %d: %s", self.spec.name, pid, exc)

    def cancel(self) -> None:
        with self._lock:
            pid = self._pid
        self._kill(pid)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None


# --- this machine --------------------------------------------------------------------------------


class LocalSession(Session):
    """Runs the bundle on this machine with the same protocol, in its own process group."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self._proc: Optional[subprocess.Popen] = None

    def open(self) -> None:
        return None

    def run_bundle(self, config: Dict[str, Any], deadline_s: float) -> RunResult:
        started = time.monotonic()
        python = self.spec.python or sys.executable
        payload = bundle.stdin_payload(dict(config, deadline_s=deadline_s + 5))  # before the process starts
        sent_at = time.time()
        try:
            proc = subprocess.Popen(
                [python, "-c", bundle.BOOTSTRAP],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise NodeFailure("protocol", "cannot start %s: %s" % (python, exc.strerror)) from None
        self._proc = proc
        run = _Run()
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(payload)
        proc.stdin.flush()
        streams = {proc.stdout.fileno(): run.feed, proc.stderr.fileno(): run.err.extend}
        end = started + deadline_s
        try:
            while streams:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    self._killpg(proc)
                    raise NodeFailure("timeout", "timed out: no answer within %g s; killed the process group" % deadline_s)
                ready, _, _ = select.select(list(streams), [], [], min(remaining, 1.0))
                for fd in ready:
                    data = os.read(fd, 65536)
                    if data:
                        streams[fd](data)
                    else:
                        del streams[fd]
            rc = proc.wait()
        finally:
            self._proc = None
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        return run.finish(rc, sent_at, started)

    @staticmethod
    def _killpg(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait()

    def cancel(self) -> None:
        proc = self._proc
        if proc is not None:
            self._killpg(proc)

    def close(self) -> None:
        return None


def session_for(spec: NodeSpec, accept_new_host_keys: bool = False) -> Session:
    return LocalSession(spec) if spec.local else SSHSession(spec, accept_new_host_keys)

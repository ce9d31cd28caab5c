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
import json
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
from typing import Any, Dict, List, Optional, Tuple

from preflight.transport import bundle
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
            seen = bundle.parse_output(bytes(self.out[: self.out.rfind(b"\n") + 1]))
            if self.pid is None and "pid" in seen:
                self.pid = seen["pid"]
            if self.clock_at is None and "clock" in seen:
                self.clock_at = time.time()

    def has_result(self) -> bool:
        """The result line (the run's last) has arrived whole."""
        at = self.out.rfind(b"preflight-result ")
        return at >= 0 and self.out.find(b"\n", at) >= 0

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
    cancelled: bool = False  # set by Fleet.cancel(): a run in progress kills itself and stops

    def open(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:  # pragma: no cover
        """Run the bundle once. then=True: another phase follows; a session may keep the node's process,
        waiting for the next config on its stdin, instead of starting a new one (SSHSession does)."""
        raise NotImplementedError

    def end_kept(self) -> None:
        """Let a process kept for a next phase that will not come exit (nothing kept: nothing to do)."""

    def cancel(self) -> None:
        """Kill whatever this session is running now (Ctrl-C). Safe to call from another thread."""

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


# --- SSH -----------------------------------------------------------------------------------------

_known_hosts_lock = threading.Lock()


class RevokedHostKey(Exception):
    """The server presented a key that known_hosts marks @revoked."""

    def __init__(self, hostname: str, key: Any, where: str) -> None:
        super().__init__("host key of %s (%s %s) is revoked at %s" % (hostname, key.get_name(), fingerprint(key), where))


def _host_key_policy(accept_new: bool, known_hosts: Optional[str]) -> Any:
    import paramiko

    revoked: Dict[bytes, str] = {}
    if known_hosts and os.path.isfile(known_hosts):
        revoked = KnownHosts.of(known_hosts).revoked

    class Reject(paramiko.RejectPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            if key.asbytes() in revoked:
                raise RevokedHostKey(hostname, key, revoked[key.asbytes()])
            super().missing_host_key(client, hostname, key)

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys; changed keys still fail."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            if key.asbytes() in revoked:  # OpenSSH refuses a revoked key even with accept-new
                raise RevokedHostKey(hostname, key, revoked[key.asbytes()])
            client.get_host_keys().add(hostname, key.get_name(), key)
            if known_hosts:
                with _known_hosts_lock:
                    os.makedirs(os.path.dirname(os.path.abspath(known_hosts)), exist_ok=True)
                    with open(known_hosts, "a") as handle:
                        handle.write("%s %s %s\n" % (hostname, key.get_name(), key.get_base64()))

    return AcceptNew() if accept_new else Reject()


class SSHConfigError(Exception):
    """An ssh_config file preflight cannot read the way OpenSSH would; the message names file:line."""


_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH


def read_ssh_config(path: str, system: bool = False, depth: int = 0) -> str:
    """The text of an ssh_config file with its `Include` directives expanded, for paramiko's parser.

    paramiko's SSHConfig ignores Include, so hosts defined in included files silently "cannot resolve"
    where OpenSSH reaches them. Expanded as ssh_config(5) says: several paths per line, glob(7)
    wildcards in lexical order, `~` expanded, relative paths under ~/.ssh (a user file) or /etc/ssh (the
    system file), nesting up to 16 deep. An Include inside a Host or Match block is conditional in
    OpenSSH: the included lines are inlined in that block, and when the included file opened blocks
    of its own, the enclosing block's Host/Match line is repeated after it so the lines that follow
    stay under the condition they were written under.
    """
    import glob
    import shlex

    if depth > _MAX_INCLUDE_DEPTH:
        raise SSHConfigError("%s: Include nested more than %d deep" % (path, _MAX_INCLUDE_DEPTH))
    with open(path, errors="replace") as handle:
        lines = handle.read().splitlines()
    out: List[str] = []
    block = None  # the Host/Match line the lines are under (None: the top, before any block)
    for lineno, line in enumerate(lines, 1):
        words = line.strip().replace("=", " ", 1).split(None, 1) if line.strip() and not line.strip().startswith("#") else []
        keyword = words[0].lower() if words else ""
        if keyword in ("host", "match"):
            block = line.strip()
        if keyword != "include":
            out.append(line)
            continue
        try:
            patterns = shlex.split(words[1]) if len(words) > 1 else []
        except ValueError as exc:
            raise SSHConfigError("%s:%d: cannot read Include: %s" % (path, lineno, exc)) from None
        if not patterns:
            raise SSHConfigError("%s:%d: Include without a file name" % (path, lineno))
        opened = False
        for pattern in patterns:
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join("/etc/ssh" if system else os.path.expanduser("~/.ssh"), pattern)
            for included in sorted(glob.glob(pattern)):
                if os.path.isdir(included):
                    continue
                try:
                    text = read_ssh_config(included, system, depth + 1)
                except OSError as exc:
                    raise SSHConfigError("%s:%d: cannot read included %s: %s" % (path, lineno, included, exc.strerror)) from None
                out.append("# --- Include %s (from %s:%d)" % (included, path, lineno))
                out.extend(text.splitlines())
                opened = opened or any(l.strip().lower().split(None, 1)[:1] in (["host"], ["match"]) for l in text.splitlines())
        if opened:
            out.append(block or "Host *")
    return "\n".join(out) + "\n"


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
            import io

            parsed = paramiko.SSHConfig()
            files = [(ssh_config, False)] if ssh_config else [(os.path.expanduser("~/.ssh/config"), False), ("/etc/ssh/ssh_config", True)]
            for path, system in files:  # the user's file first: for each option the first value wins
                if os.path.isfile(path):
                    parsed.parse(io.StringIO(read_ssh_config(path, system)))
            _fabric_configs[ssh_config] = fabric.Config(ssh_config=parsed)
        return _fabric_configs[ssh_config].clone()


def load_ssh_configs(paths: Any) -> None:
    """Parse every ssh_config the nodes use, before any connection. Raises SSHConfigError (file:line)."""
    for path in sorted(set(paths), key=str):
        try:
            _fabric_config(path)
        except OSError as exc:
            raise SSHConfigError("cannot read ssh_config %s: %s" % (exc.filename or path, exc.strerror)) from None


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
        self.revoked: Dict[bytes, str] = {}  # key blob -> "file:line" of its @revoked line
        with open(path, errors="replace") as handle:
            for lineno, line in enumerate(handle, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                marker = None
                if line.startswith("@"):  # OpenSSH markers (sshd(8) SSH_KNOWN_HOSTS FILE FORMAT)
                    marker, _, line = line.partition(" ")
                    line = line.strip()
                    if marker not in ("@revoked", "@cert-authority"):
                        log.warning("%s:%d: unknown known_hosts marker %s; line ignored", path, lineno, marker)
                        continue
                    if marker == "@cert-authority":
                        log.warning("%s:%d: @cert-authority (host certificates) is not supported; line ignored", path, lineno)
                        continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except Exception as exc:  # InvalidHostKey, SSHException, a truncated base64 blob, ...
                    log.warning("%s:%d: unreadable known_hosts line ignored: %s", path, lineno, getattr(exc, "exc", exc))
                    continue
                if entry is None:
                    log.warning("%s:%d: unreadable known_hosts line ignored (incomplete or unknown key type)", path, lineno)
                elif marker == "@revoked":
                    self.revoked[entry.key.asbytes()] = "%s:%d" % (path, lineno)
                else:
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
            if entry.key.asbytes() in self.revoked:
                continue  # a revoked key is never trusted, whatever other line lists it
            for recorded in entry.hostnames:
                if recorded == name or (recorded.startswith("|1|") and HostKeys.hash_host(name, recorded) == recorded):
                    found.append(entry.key)
                    break
        return found


class SSHSession(Session):
    """One SSH connection per node (through ProxyJump hops if configured), reused for every phase."""

    #: how long the kill command (kill -TERM, 0.5 s, kill -KILL) may take beyond the connect timeout
    KILL_WAIT_S = 3.0
    #: how long output may keep coming after the exit status (a background job of the node's shell rc
    #: that holds stdout open would otherwise keep the run waiting forever)
    DRAIN_S = 2.0
    #: after Ctrl-C, how long a run just started may take to send its pid line (then it is killed)
    PID_WAIT_S = 3.0

    def __init__(self, spec: NodeSpec, accept_new_host_keys: bool = False) -> None:
        self.spec = spec
        self.accept_new = accept_new_host_keys or spec.host_key_checking == "accept-new"
        self.kill_hung = False
        self.cancelled = False
        self._kill_lock = threading.Lock()
        self._killed: set = set()
        self.conn: Any = None
        self._pid: Optional[int] = None
        self._lock = threading.Lock()
        self._kept: Optional[Tuple[Any, Optional[int]]] = None  # (channel, pid) waiting for a next phase

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
        while hop and not isinstance(hop, str):
            hop.client.set_missing_host_key_policy(_host_key_policy(self.accept_new, spec.known_hosts))
            if spec.known_hosts and os.path.isfile(spec.known_hosts):
                name = hop.host if hop.port == 22 else "[%s]:%d" % (hop.host, hop.port)
                for key in KnownHosts.of(spec.known_hosts).keys_for(name):
                    hop.client.get_host_keys().add(name, key.get_name(), key)
            hop = hop.gateway
        return conn

    def _gateway(self) -> Any:
        """The ProxyJump chain: the inventory's proxy_jump, else the ssh_config's ProxyJump for this host.

        Both are built here, hop by hop, so every hop gets the node's connect timeout and host-key
        policy (fabric's own ssh_config ProxyJump hops have no connect timeout: ~135 s for one dead node).
        """
        jump = self.spec.proxy_jump
        if not jump:
            probe = _fabric_config(self.spec.ssh_config)
            import fabric

            found = fabric.Connection(self.spec.host, config=probe).ssh_config.get("proxyjump")
            if not found or found.strip().lower() == "none":
                return None
            jump = found.strip()
        gateway: Any = False  # the first hop connects directly (not through fabric's own, untimed, chain)
        for hop in jump.split(","):
            user, _, hostport = hop.strip().rpartition("@")
            host, port = hostport, None
            if hostport.startswith("["):
                host, _, rest = hostport[1:].partition("]")
                port = int(rest[1:]) if rest[1:].isdigit() else None
            elif hostport.count(":") == 1:
                host, _, text = hostport.partition(":")
                port = int(text) if text.isdigit() else None
            if host == self.spec.host:  # a wildcard Host block naming the bastion itself
                return None if gateway is False else gateway
            gateway = self._connection(host, user or None, port, gateway)
        return gateway

    def open(self) -> None:
        import paramiko

        spec = self.spec
        where = "%s:%s" % (spec.host, spec.port or 22)
        try:
            self.conn = self._connection(spec.host, spec.user, spec.port, self._gateway())
            self.conn.open()
            self.conn.transport.set_keepalive(max(1, int(spec.connect_timeout)))
        except RevokedHostKey as exc:
            raise NodeFailure("host_key", "%s; refusing it as OpenSSH does (verify the node's new key and replace the entry)" % exc) from None
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
    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:
        """Run the bundle on the node. then=True: after its result the process stays, waiting on the
        same channel for the next phase's config (one line of JSON), so the next run_bundle costs no new
        channel, login shell, Python start or bundle transfer."""
        import paramiko

        started = time.monotonic()
        run = _Run()
        # a kept process waits for the next phase as long as this phase may last on the slowest node
        config = dict(config, deadline_s=deadline_s + 5, more=then, wait_s=deadline_s + bundle.NEXT_PHASE_SLACK_S)
        kept, self._kept = self._kept, None
        if kept is not None and (kept[0].closed or kept[0].exit_status_ready()):
            kept = None  # the kept process is gone (its wait for this phase ran out): start anew
        try:
            if kept is not None:
                chan, run.pid = kept
                sent_at = time.time()
                chan.sendall(json.dumps(config, separators=(",", ":")).encode() + b"\n")
            else:
                # The payload is built before the remote command starts: until its pid arrives a Ctrl-C
                # cannot kill it, so nothing slow (the first bundle build) may sit between the two.
                payload = bundle.stdin_payload(config)
                chan = self.conn.transport.open_session(timeout=self.spec.connect_timeout)
                sent_at = time.time()
                chan.exec_command(bundle.remote_command(self.spec.python))
                chan.sendall(payload)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeFailure("unreachable", "connection lost while starting the probe: %s" % (exc or type(exc).__name__)) from None
        end = started + deadline_s
        cancel_at: Optional[float] = None
        keep = False
        try:
            while True:
                if run.pid is not None and self._pid is None:
                    with self._lock:
                        self._pid = run.pid
                remaining = end - time.monotonic()
                if self.cancelled:
                    cancel_at = cancel_at or time.monotonic()
                    if run.pid is None and time.monotonic() - cancel_at < self.PID_WAIT_S and not chan.closed:
                        pass  # the pid line is on its way: wait for it, so the group can be killed
                    else:
                        self._kill_once(run.pid)
                        raise NodeFailure("cancelled", "interrupted; killed the remote process group")
                if remaining <= 0:
                    self._kill(run.pid)
                    if self.kill_hung:
                        self.close()  # the node's stdin watchdog ends the run when the connection drops
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
                if then and run.has_result() and not chan.exit_status_ready():
                    keep = True  # the process waits for the next phase's config
                    break
                if chan.exit_status_ready() and not got and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
            if keep:
                self._kept = (chan, run.pid)
                return run.finish(None, sent_at, started)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else None
            # drain what is left after the exit status, within a bound: a background job started by the
            # node's shell start-up file may hold stdout open for ever
            drain_end = min(end, time.monotonic() + self.DRAIN_S)
            held = False
            while not chan.eof_received:
                remaining = drain_end - time.monotonic()
                if remaining <= 0:
                    held = True
                    break
                select.select([chan], [], [], min(remaining, 0.5))
                while chan.recv_ready():
                    run.feed(chan.recv(65536))
                while chan.recv_stderr_ready():
                    run.err += chan.recv_stderr(65536)
                if chan.closed:
                    break
            if held and run.pid is not None:
                # the process group lives on (that background job): it was started by our command, so
                # it does not outlive the run
                log.info("%s: output still open %g s after the exit status; killing process group %d",
                         self.spec.name, self.DRAIN_S, run.pid)
                self._kill(run.pid)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeFailure("unreachable", "connection lost during the probe: %s" % (exc or type(exc).__name__)) from None
        finally:
            with self._lock:
                self._pid = run.pid if keep else None  # a kept process is still ours to kill on Ctrl-C
            if not keep:
                chan.close()
        return run.finish(rc, sent_at, started)

    def end_kept(self) -> None:
        """The kept process gets an empty config (it exits 0), then its channel is closed (were it not
        to exit, the channel's EOF would make its watchdog kill its process group)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return
        chan, _pid = kept
        try:
            if not chan.closed:
                chan.sendall(b"{}\n")
                chan.status_event.wait(self.DRAIN_S)
        except Exception as exc:  # noqa: BLE001 - closing below ends it either way
            log.debug("%s: ending the kept probe process: %s", self.spec.name, exc)
        finally:
            chan.close()
            with self._lock:
                self._pid = None

    def _kill(self, pid: Optional[int]) -> None:
        """Kill the remote process group over a fresh channel (the pid came from our own echo $$)."""
        if pid is None or self.conn is None or self.conn.transport is None or not self.conn.transport.is_active():
            return
        try:
            chan = self.conn.transport.open_session(timeout=self.spec.connect_timeout)
            try:
                chan.settimeout(self.spec.connect_timeout)
                # the last kill takes this shell's own group: a background job its start-up file began
                # (the same rc that may have started one in the run) must not outlive the kill either
                chan.exec_command(
                    "kill -TERM -- -%d 2>/dev/null; sleep 0.5; kill -KILL -- -%d 2>/dev/null; "
                    "trap '' TERM; kill -TERM -- -$$ 2>/dev/null; exit 0" % (pid, pid)
                )
                # The kill's own login shell may hang too (a lost NFS home): wait a bounded time, then
                # drop the connection (close()), which ends the run through the bundle's stdin watchdog.
                if not chan.status_event.wait(self.KILL_WAIT_S + self.spec.connect_timeout):
                    log.warning("%s: the kill for process group %d did not answer within %g s; closing the connection",
                                self.spec.name, pid, self.KILL_WAIT_S + self.spec.connect_timeout)
                    self.kill_hung = True
            finally:
                chan.close()
        except Exception as exc:  # noqa: BLE001 - best effort, and said so
            # The bundle's watchdog kills its process group when our connection closes, so a lost
            # kill channel still ends the remote run once close() drops the connection.
            log.warning("%s: could not send the kill for process group %d: %s", self.spec.name, pid, exc)

    def _kill_once(self, pid: Optional[int]) -> None:
        """One kill per process group, whichever thread asks first; a second caller waits for it to end
        (Ctrl-C's cancel() must not return while the run's own thread is still sending the kill)."""
        with self._kill_lock:
            if pid is None or pid in self._killed:
                return
            self._killed.add(pid)
            self._kill(pid)

    def cancel(self) -> None:
        with self._lock:
            pid = self._pid
        self._kill_once(pid)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.end_kept()
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

    def run_bundle(self, config: Dict[str, Any], deadline_s: float, then: bool = False) -> RunResult:
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

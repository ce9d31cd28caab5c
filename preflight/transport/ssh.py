"""Run the probe bundle on a node over SSH (fabric/paramiko): SSHSession, the contract's Session for SSH.

With transport/known_hosts.py and transport/ssh_config.py, the only code that touches fabric and paramiko.
Every connection has a connect deadline, every run a command deadline; when a run overruns, the remote
process group is killed over a second channel, and the bundle's own watchdog kills it if the connection
is lost. Host keys are verified on every hop (known_hosts.host_key_policy). Failures are NodeFailure
values with a kind and a fix, never tracebacks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from preflight.inventory import NodeSpec
from preflight.transport import bundle
from preflight.transport.contract import NodeFailure, RunResult, Session
from preflight.transport.known_hosts import KnownHosts, RevokedHostKey, fingerprint, host_key_policy
from preflight.transport.ssh_config import fabric_config, host_options

log = logging.getLogger(__name__)


#: How often each connection's paramiko reader thread wakes while nothing arrives (paramiko: every 0.1 s,
#: Transport._active_check_timeout). A wake costs 25-50 us of controller CPU: 256 idle connections at
#: 0.1 s cost 0.07 CPU-s per second of the run (benchmarks/README.md, "Idle connections"), a quarter of
#: the controller's CPU in a 40 s 256-node run; at 1 s still 1 ms per node in a 60 s run. Closing is not
#: delayed: hang_up() shuts the socket down, which ends the thread's recv() at once. Keepalives (every
#: connect_timeout of silence) are sent from these wakes, so they go out up to READER_WAKE_S late: still
#: far inside any NAT or firewall idle timeout.
READER_WAKE_S = 5.0


def quiet(transport: Any) -> None:
    """Let an open connection's reader thread sleep READER_WAKE_S between empty reads, not 0.1 s."""
    sock = getattr(transport, "sock", None)
    if sock is not None and hasattr(sock, "settimeout"):
        sock.settimeout(READER_WAKE_S)


#: Ciphers offered first, before paramiko's own order (aes*-ctr with hmac-sha2 first): AES-GCM is an
#: AEAD, one C call per packet where CTR+HMAC costs a cipher call, an HMAC and a MAC comparison in Python
#: (paramiko.util.constant_time_bytes_eq, a loop over the MAC's bytes) per packet. OpenSSH offers both
#: (its default list: chacha20-poly1305, aes*-ctr, aes*-gcm); a server that accepts neither still gets
#: paramiko's whole list after these. benchmarks/ssh_session_cost.py compares them.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def transport(*args: Any, **kwargs: Any) -> Any:
    """paramiko's Transport offering PREFERRED_CIPHERS first (SSHClient.connect's transport_factory)."""
    import paramiko

    made = paramiko.Transport(*args, **kwargs)
    options = made.get_security_options()
    offered = tuple(options.ciphers)
    first = tuple(c for c in PREFERRED_CIPHERS if c in offered)
    options.ciphers = first + tuple(c for c in offered if c not in first)
    return made


_identities: Dict[Any, Any] = {}
_identities_lock = threading.Lock()


def identity(path: str) -> Any:
    """The private key in `path` (with its `-cert.pub` certificate when one exists), parsed once per run
    and file version; None when it cannot be loaded without help (a passphrase, an unknown type):
    paramiko then tries the file itself as before, and says why it failed.

    Handed to paramiko as a file name, the key was parsed up to three times per connection (paramiko
    tries RSA, ECDSA, then Ed25519 on every key_filename).
    """
    import paramiko

    if path.startswith("~"):
        return None  # as before: paramiko opens key files by the name given, unexpanded
    try:
        st = os.stat(path)
        cert = os.stat(path + "-cert.pub") if os.path.exists(path + "-cert.pub") else None
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size, cert and (cert.st_mtime_ns, cert.st_size))
    with _identities_lock:
        if key not in _identities:
            try:
                loaded = paramiko.PKey.from_path(path)
            except Exception as exc:  # noqa: BLE001 - paramiko loads it itself below, and reports what fails
                log.debug("%s: not preloaded (%s: %s); paramiko reads it per connection", path, type(exc).__name__, exc)
                loaded = None
            for older in [k for k in _identities if k[0] == path]:  # one version of each file
                del _identities[older]
            _identities[key] = loaded
        return _identities[key]


class ShellStarts:
    """How many login shells this controller lets start at once: every one the fan-out asks for, until a
    start turns slow; then fewer (halved, at least FLOOR), growing back by one per fast start.

    A login shell runs the node's start-up files before preflight's command (~/.bashrc, /etc/profile.d):
    on clusters whose home directories are shared (NFS), `pyenv init` or `conda init` there take a lock
    or read the same files on every node at once, and 64 shells starting together take longer than 128
    started 16 at a time (healthy nodes then run past their deadline). The wait here is the controller's
    own queue: it counts against no node's bound.
    """

    #: a shell start slower than this many seconds narrows the gate; one faster than a fifth of it widens it
    SLOW_S = 5.0
    FLOOR = 4

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.limit: Optional[int] = None  # None: as many as the fan-out runs
        self.starting = 0
        self._cut_at = -math.inf

    def enter(self, cancelled: Callable[[], bool]) -> bool:
        """Wait for a place (False: cancelled while waiting, no place taken)."""
        with self._cond:
            while self.limit is not None and self.starting >= self.limit:
                if cancelled():
                    return False
                self._cond.wait(0.5)
            self.starting += 1
            return True

    def leave(self, took_s: Optional[float]) -> None:
        """A shell started after took_s seconds (None: it never got that far for a reason of its own)."""
        with self._cond:
            self.starting -= 1
            now = time.monotonic()
            if took_s is not None and took_s > self.SLOW_S:
                if now - self._cut_at > self.SLOW_S:  # one cut per slow spell, not one per slow shell in it
                    self.limit = max(self.FLOOR, (self.starting + 1) // 2)
                    self._cut_at = now
                    log.info("login shells take %.0f s to start: starting at most %d at once", took_s, self.limit)
            elif took_s is not None and self.limit is not None and took_s < self.SLOW_S / 5:
                self.limit += 1
            self._cond.notify_all()


def _pump(chan: Any, run: bundle.ResultReader) -> bool:
    """Feed what the channel holds now (stdout to the result reader, stderr kept); whether anything came."""
    got = False
    while chan.recv_ready():
        run.feed(chan.recv(65536))
        got = True
    while chan.recv_stderr_ready():
        run.err += chan.recv_stderr(65536)
        got = True
    return got


class _ShellStart:
    """One login shell's start on a new channel: its own bound, and its place in the ShellStarts gate
    (given back once, when the pid line arrives or the run ends without it)."""

    def __init__(self, starts: ShellStarts, bound_s: float) -> None:
        self.starts = starts
        self.at = time.monotonic()
        self.end = self.at + bound_s
        self.open = True

    def done(self, reached: bool = True) -> float:
        """The shell started the command (reached) or will not; its start's seconds."""
        took = time.monotonic() - self.at
        if self.open:
            self.open = False
            self.starts.leave(took if reached or took >= self.end - self.at else None)
        return took


def login_shell_failure(waited_s: float, stderr: bytes) -> NodeFailure:
    """The node connected and authenticated, but its login shell had not started preflight's command
    (no `preflight-pid` line) after waited_s: its start-up files, not the node, are what is slow."""
    said = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] if stderr else []
    return NodeFailure(
        "login_shell",
        "login shell slow: connected and authenticated, but the shell's start-up files had not finished after "
        "%.0f s, so preflight's command never started%s; make them return early for non-interactive sessions "
        "(at the top of ~/.bashrc: [[ $- == *i* ]] || return; move pyenv/conda init from /etc/profile.d or a "
        "shared home behind that test), or retest with fewer nodes at once (-j)" % (
            waited_s, " (it printed: %s)" % ascii(said[0][:200])[1:-1] if said else ""))


class SSHSession(Session):
    """One SSH connection per node (through ProxyJump hops if configured), reused for every phase."""

    #: how long the kill command (kill -TERM, 0.5 s, kill -KILL) may take beyond the connect timeout
    KILL_WAIT_S = 3.0
    #: how long output may keep coming after the exit status (a background job of the node's shell rc
    #: that holds stdout open would otherwise keep the run waiting forever), and how long a process
    #: whose result arrived may take to exit (a thread stuck in an uninterruptible driver call keeps it
    #: alive: its result counts, then its group is killed)
    DRAIN_S = 2.0
    #: after Ctrl-C, how long a run just started may take to send its pid line (then it is killed)
    PID_WAIT_S = 3.0
    #: how long the login shell may take to start the command (its `preflight-pid` line), at least: the
    #: shell start has its own bound, max(this, the run's deadline), and the deadline counts from the pid
    SHELL_START_S = 60.0
    #: the login shells this process starts, throttled together when they turn slow
    starts = ShellStarts()

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
        #: the probe bundle on this node: None (not started yet), "kept" (the node's copy from an earlier
        #: run was used), "sent" (the zip went over this connection)
        self.bundle: Optional[str] = None

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
            config=fabric_config(spec.ssh_config),
            gateway=gateway,
            connect_timeout=max(1, int(math.ceil(spec.connect_timeout))),
            connect_kwargs=connect_kwargs,
        )
        # fabric merged the inventory's identity with the ssh_config's IdentityFile lines; paramiko tries
        # `pkey` first, then the files: the first one goes as its key, parsed once per run
        files = list(conn.connect_kwargs.get("key_filename") or [])
        first = identity(files[0]) if files else None
        if first is not None:
            conn.connect_kwargs["pkey"] = first
            conn.connect_kwargs["key_filename"] = files[1:]
        conn.connect_kwargs["transport_factory"] = transport
        # fabric defaults to AutoAddPolicy on every hop; preflight verifies host keys on every hop.
        hop = conn
        while hop and not isinstance(hop, str):
            hop.client.set_missing_host_key_policy(host_key_policy(self.accept_new, spec.known_hosts))
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
            found = host_options(self.spec.ssh_config, self.spec.host).get("proxyjump")
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
            quiet(self.conn.transport)
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
        run = bundle.ResultReader()
        # a kept process waits for the next phase as long as this phase may last on the slowest node
        config = dict(config, deadline_s=deadline_s + 5, more=then, wait_s=deadline_s + bundle.NEXT_PHASE_SLACK_S)
        chan, sent_at, blob, shell = self._start(config, deadline_s, run)
        end = started + deadline_s
        cancel_at: Optional[float] = None
        keep = False
        stuck = False  # the result arrived but the process does not exit
        result_at: Optional[float] = None
        try:
            while True:
                if run.pid is not None and self._pid is None:
                    with self._lock:
                        self._pid = run.pid
                if shell is not None and shell.open and run.pid is not None:
                    shell.done()
                    end = time.monotonic() + deadline_s
                remaining = (shell.end if shell is not None and shell.open else end) - time.monotonic()
                if self.cancelled:
                    cancel_at = cancel_at or time.monotonic()
                    if run.pid is None and time.monotonic() - cancel_at < self.PID_WAIT_S and not chan.closed:
                        pass  # the pid line is on its way: wait for it, so the group can be killed
                    else:
                        self._kill_once(run.pid)
                        raise NodeFailure("cancelled", "interrupted; killed the remote process group")
                if run.has_result() and not then:
                    if result_at is None:  # the node answered: from here it has DRAIN_S to exit
                        result_at = time.monotonic()
                        end = min(end, result_at + self.DRAIN_S)
                        remaining = end - result_at
                    if remaining <= 0:
                        stuck = True  # its result counts all the same
                        break
                if remaining <= 0 and shell is not None and shell.open:
                    raise login_shell_failure(shell.done(), run.err)  # no pid: nothing started to kill
                if remaining <= 0:
                    raise self._timed_out(run, deadline_s)
                select.select([chan], [], [], min(remaining, 1.0))
                got = _pump(chan, run)
                if run.wants_bundle is not None and blob is not None:
                    self._send_bundle(chan, run, blob)
                    blob = None
                if then and run.has_result() and not chan.exit_status_ready():
                    keep = True  # the process waits for the next phase's config
                    break
                if chan.exit_status_ready() and not got and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
            self._note_bundle(run)
            if keep:
                self._kept = (chan, run.pid)
                return run.finish(None, sent_at, started)
            if stuck:
                log.warning("%s: result received, but the process has not exited %g s later (a thread stuck in "
                            "the kernel?); killing process group %s", self.spec.name, self.DRAIN_S, run.pid)
                self._kill(run.pid)
                return run.finish(None, sent_at, started)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else None
            self._drain_tail(chan, run, end)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise NodeFailure("unreachable", "connection lost during the probe: %s" % (exc or type(exc).__name__)) from None
        finally:
            if shell is not None:
                shell.done(reached=False)  # ended before its pid line (cancelled, connection lost)
            with self._lock:
                self._pid = run.pid if keep else None  # a kept process is still ours to kill on Ctrl-C
            if not keep:
                chan.close()
        return run.finish(rc, sent_at, started)

    def _start(self, config: Dict[str, Any], deadline_s: float,
               run: bundle.ResultReader) -> Tuple[Any, float, Optional[bytes], Optional["_ShellStart"]]:
        """Send the config to the process kept from the last phase, or start a new one through the login
        shell: (channel, when the config was sent, the bundle zip to send when the node asks for it or
        None, the login shell's start until its pid line arrives or None)."""
        import paramiko

        blob: Optional[bytes] = None  # the zip, until the node asks for it (it has none kept) or finishes
        kept, self._kept = self._kept, None
        if kept is not None and (kept[0].closed or kept[0].exit_status_ready()):
            kept = None  # the kept process is gone (its wait for this phase ran out): start anew
        shell: Optional[_ShellStart] = None  # a new login shell starting, until its pid line arrives
        try:
            if kept is not None:
                chan, run.pid = kept
                sent_at = time.time()
                chan.sendall(json.dumps(config, separators=(",", ":")).encode() + b"\n")
                return chan, sent_at, blob, shell
            # The payload is built before the remote command starts: until its pid arrives a Ctrl-C
            # cannot kill it, so nothing slow (the first bundle build) may sit between the two.
            payload = bundle.stdin_payload(config, ask=True)
            blob = bundle.base_zip()
            if not self.starts.enter(lambda: self.cancelled):
                raise NodeFailure("cancelled", "interrupted before the probe started")
            # the login shell's start has its own bound: its start-up files may be slow on a healthy
            # node (a shared home), and the run's deadline then counts from the command's start
            shell = _ShellStart(self.starts, max(deadline_s, self.SHELL_START_S))
            chan = self.conn.transport.open_session(timeout=self.spec.connect_timeout)
            sent_at = time.time()
            chan.exec_command(bundle.remote_command(self.spec.python))
            chan.sendall(payload)
            self.bundle = self.bundle or "kept"  # until the node asks for the zip
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if shell is not None:
                shell.done(reached=False)
            raise NodeFailure("unreachable", "connection lost while starting the probe: %s" % (exc or type(exc).__name__)) from None
        return chan, sent_at, blob, shell

    def _timed_out(self, run: bundle.ResultReader, deadline_s: float) -> NodeFailure:
        """No answer within the deadline: the remote process group killed (and, with kill_hung, the
        connection closed: the node's stdin watchdog ends the run when it drops); the failure to raise."""
        self._kill(run.pid)
        if self.kill_hung:
            self.close()
        return NodeFailure("timeout", "timed out: no answer within %g s%s" % (
            deadline_s, "; killed the remote process group" if run.pid else ""))

    def _note_bundle(self, run: bundle.ResultReader) -> None:
        """What the node said of the bundle zip: damaged on arrival (the result's damage), or not kept."""
        if run.refused and run.damage is None:  # the zip it asked for failed its SHA-256 on arrival
            run.damage = "the probe bundle arrived damaged (%s)" % run.refused
        if run.unsaved:
            log.debug("%s: could not keep the probe bundle (%s): it is sent again next run", self.spec.name, run.unsaved)

    def _drain_tail(self, chan: Any, run: bundle.ResultReader, end: float) -> None:
        """Read what is left after the exit status, within a bound: a background job started by the node's
        shell start-up file may hold stdout open for ever; its process group, started by our command, is
        then killed so it does not outlive the run."""
        drain_end = min(end, time.monotonic() + self.DRAIN_S)
        held = False
        while not chan.eof_received:
            remaining = drain_end - time.monotonic()
            if remaining <= 0:
                held = True
                break
            select.select([chan], [], [], min(remaining, 0.5))
            _pump(chan, run)
            if chan.closed:
                break
        if held and run.pid is not None:
            log.info("%s: output still open %g s after the exit status; killing process group %d",
                     self.spec.name, self.DRAIN_S, run.pid)
            self._kill(run.pid)

    def _send_bundle(self, chan: Any, run: bundle.ResultReader, blob: bytes) -> None:
        """The node kept no usable copy of this bundle (`run.wants_bundle` says why): send the zip."""
        why = run.wants_bundle or ""
        # a missing copy is a first run (or a reboot); anything else was put there: said as the Slurm
        # transport says a refused broadcast file (another user's, a symlink, group-writable, a wrong digest)
        level = logging.DEBUG if why.endswith(": No such file or directory") else logging.WARNING
        log.log(level, "%s: no usable probe bundle kept on the node (%s): sent it", self.spec.name, why)
        self.bundle = "sent"
        # a view: paramiko's sendall re-slices what is left after every packet (s = s[sent:]), which
        # copied a 650 KB bundle about 20 times per node
        chan.sendall(memoryview(blob))

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
            finally:
                conn, self.conn = self.conn, None
                hang_up(conn)


def hang_up(conn: Any) -> None:
    """Close a fabric connection and then its ProxyJump hops (fabric closes only the connection itself),
    each socket shut down first: paramiko's close() only closes the socket, and while its reader thread
    sits in recv() on it the kernel keeps the connection up (no FIN) until that read times out
    (READER_WAKE_S); the node would see its controller leave that much later."""
    hop = conn
    while hop is not None and hasattr(hop, "client"):  # a gateway may also be False or a ProxyCommand string
        sock = getattr(hop.transport, "sock", None)
        if sock is not None and hasattr(sock, "shutdown"):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:  # already down: close() below is all there is left to do
                log.debug("shutting down the connection to %s: %s", getattr(hop, "host", "?"), exc)
        hop.close()
        hop = hop.gateway

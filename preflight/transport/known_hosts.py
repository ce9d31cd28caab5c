"""Host keys: known_hosts read as OpenSSH reads it, and the policy every SSH hop verifies keys with.

Host keys are verified against known_hosts unless the node says `host_key_checking: accept-new`
(OpenSSH's StrictHostKeyChecking=accept-new: unknown keys are recorded, changed ones still fail).
Format: sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT" (plain and hashed |1| host names, @revoked markers;
@cert-authority is not supported and said so).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
from typing import Any, Dict, List, Optional

log = logging.getLogger(__name__)


def fingerprint(key: Any) -> str:
    """OpenSSH's form of a host key fingerprint: SHA256:base64 (as `ssh-keygen -lf` prints it)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

_known_hosts_lock = threading.Lock()


class RevokedHostKey(Exception):
    """The server presented a key that known_hosts marks @revoked."""

    def __init__(self, hostname: str, key: Any, where: str) -> None:
        super().__init__("host key of %s (%s %s) is revoked at %s" % (hostname, key.get_name(), fingerprint(key), where))


_policies: Dict[Any, Any] = {}
_policies_lock = threading.Lock()


def host_key_policy(accept_new: bool, known_hosts: Optional[str]) -> Any:
    """The policy for keys known_hosts does not list: reject (or record, with accept_new), and refuse a
    key it marks @revoked. One policy object per (mode, file version), shared by every connection."""
    table = KnownHosts.of(known_hosts) if known_hosts and os.path.isfile(known_hosts) else None
    key = (accept_new, known_hosts, table)
    with _policies_lock:
        policy = _policies.get(key)
        if policy is None:
            if len(_policies) > 16:  # versions of a file accept-new keeps appending to
                _policies.clear()
            policy = _policies[key] = _policy(accept_new, known_hosts, table.revoked if table is not None else {})
        return policy


def _policy(accept_new: bool, known_hosts: Optional[str], revoked: Dict[bytes, str]) -> Any:
    import paramiko

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
        # A revoked key is never trusted, whatever other line lists it. Plain names are indexed; hashed
        # |1| names (salted per line) can only be tried one by one, as OpenSSH does.
        self._plain: Dict[str, List[Any]] = {}
        self._hashed: List[Any] = []  # (position, entry) of the lines with a hashed name
        for position, entry in enumerate(self.entries):
            if entry.key.asbytes() in self.revoked:
                continue
            if any(recorded.startswith("|1|") for recorded in entry.hostnames):
                self._hashed.append((position, entry))
            for recorded in entry.hostnames:
                if not recorded.startswith("|1|"):
                    self._plain.setdefault(recorded, []).append((position, entry))

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
        """The keys recorded for `name` (host, or [host]:port off port 22), in file order."""
        from paramiko.hostkeys import HostKeys

        found = {position: entry.key for position, entry in self._plain.get(name, ())}
        for position, entry in self._hashed:
            if position not in found and any(recorded.startswith("|1|") and HostKeys.hash_host(name, recorded) == recorded
                                             for recorded in entry.hostnames):
                found[position] = entry.key
        return [found[position] for position in sorted(found)]

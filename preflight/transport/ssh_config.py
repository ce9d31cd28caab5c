"""ssh_config read as OpenSSH reads it (Include expanded), parsed once per file for every connection.

ssh_config(5): Include takes several paths, glob(7) wildcards in lexical order, `~`, relative paths under
~/.ssh (user file) or /etc/ssh (system file), nesting up to 16 deep, and is conditional inside Host/Match.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional


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


def _base_config(ssh_config: Optional[str]) -> Any:
    """The fabric Config of an ssh_config file (None: ~/.ssh/config then /etc/ssh/ssh_config), built once."""
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
        return _fabric_configs[ssh_config]


def fabric_config(ssh_config: Optional[str]) -> Any:
    """A fabric Config for one connection, cloned from the one parsed per ssh_config file.

    The SSHConfig is handed to fabric as an explicit object: fabric's Config.clone() re-reads the
    ssh_config files *into the original* on every clone unless it was given one, so the rule list
    grew by a file's worth per connection and every clone deep-copied it (O(nodes^2) at 256 nodes).
    Each connection gets its own clone (0.25 ms): fabric.Connection writes into the Config it is given
    (its inline_ssh_env setting goes through invoke's config merge), which a Config shared by 64
    threads connecting at once would see half-merged.
    """
    return _base_config(ssh_config).clone()


def host_options(ssh_config: Optional[str], host: str) -> Dict[str, Any]:
    """The ssh_config options for `host` (lower-case keys: "proxyjump", "hostname", ...), as fabric's
    Connection looks them up, without building a Connection (1.5 ms of CPU each)."""
    return _base_config(ssh_config).base_ssh_config.lookup(host)


def load_ssh_configs(paths: Any) -> None:
    """Parse every ssh_config the nodes use, before any connection. Raises SSHConfigError (file:line)."""
    for path in sorted(set(paths), key=str):
        try:
            _base_config(path)
        except OSError as exc:
            raise SSHConfigError("cannot read ssh_config %s: %s" % (exc.filename or path, exc.strerror)) from None

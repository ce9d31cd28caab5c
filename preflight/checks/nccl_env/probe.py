"""The nccl_env check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy
from preflight.probe.ncclconf import CONF_ENV, relevant

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

SYSTEM_CONF = "/etc/nccl.conf"
USER_CONF = ".nccl.conf"
_NAME = lazy(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_nccl_conf(text: str, path: str = SYSTEM_CONF) -> Dict[str, Any]:
    """An nccl.conf file → {"entries": [{key, value, line}], "malformed": [{line, text}]}, as NCCL reads it.

    Every `KEY=VALUE` line is an entry (all keys, as NCCL sets them all); a key that is not a variable
    name ('export NCCL_DEBUG', 'NCCL_DEBUG ') is listed under malformed instead. A file with NUL bytes is
    not a text file: ParseError.
    """
    if "\x00" in text:
        raise ParseError("%s: not a text file (NUL bytes)" % path)
    entries: List[Dict[str, Any]] = []
    malformed: List[Dict[str, Any]] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if _NAME.match(key):
            entries.append({"key": key, "value": value, "line": number})
        else:
            malformed.append({"line": number, "text": line[:200]})
    return {"entries": entries, "malformed": malformed}


def _read_conf(ctx: Any, path: str, role: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {"path": path, "role": role, "exists": False, "error": None, "entries": [], "malformed": []}
    real = ctx.host_path(path)
    try:
        with open(real, "r", errors="replace") as handle:
            text = handle.read(1 << 20)
    except FileNotFoundError:
        return out
    except OSError as exc:  # unreadable for this user: NCCL (same user) cannot read it either
        out.update(exists=True, error=exc.strerror or str(exc))
        return out
    out["exists"] = True
    out.update(parse_nccl_conf(text, path))
    return out


def _home() -> Tuple[str, Optional[str]]:
    """(user name, home directory) the way NCCL finds it: getpwuid(getuid()), not $HOME."""
    import pwd

    try:
        entry = pwd.getpwuid(os.getuid())
    except KeyError:
        return str(os.getuid()), None
    return entry.pw_name, entry.pw_dir


def probe(ctx: Any) -> Dict[str, Any]:
    """The NCCL-related variables of this (non-interactive) session and the conf files NCCL would read:
    the user file through the account's home directory and through $HOME (one file when they agree)."""
    environ = {k: v for k, v in os.environ.items() if relevant(k)}
    user, home = _home()
    home_env = os.environ.get("HOME") or None
    files = []
    conf_file = os.environ.get(CONF_ENV)
    if conf_file:
        files.append(dict(_read_conf(ctx, conf_file, "user"), via=[CONF_ENV]))
    else:
        paths: Dict[str, List[str]] = {}
        for via, base in (("passwd", home), ("HOME", home_env)):
            if base:
                paths.setdefault(os.path.join(base, USER_CONF), []).append(via)
        for path, via in paths.items():
            files.append(dict(_read_conf(ctx, path, "user"), via=via))
    files.append(_read_conf(ctx, SYSTEM_CONF, "system"))
    return {"environ": environ, "user": user, "home": home, "home_env": home_env, "files": files}

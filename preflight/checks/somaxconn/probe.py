"""The somaxconn check's node half: the two listen-queue sysctls of the probe's network namespace."""

from __future__ import annotations

import re

from preflight.node_model import ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional

#: {fact: file}; per network namespace, so read as the probe's own (where the store will listen), not under
#: PREFLIGHT_HOST_ROOT (a /proc mounted elsewhere still shows the reader's namespace)
SYSCTLS = (("somaxconn", "/proc/sys/net/core/somaxconn"),
           ("tcp_max_syn_backlog", "/proc/sys/net/ipv4/tcp_max_syn_backlog"))


def probe(ctx: Any) -> Dict[str, Any]:
    """{fact: the sysctl's value, or None when its file cannot be read}."""
    return {key: parse_sysctl(ctx.read(path), path) for key, path in SYSCTLS}


def parse_sysctl(text: Optional[str], path: str = "/proc/sys file") -> Optional[int]:
    """A one-integer /proc/sys file's text ("4096\n") -> 4096; None for None (unreadable); else ParseError."""
    if text is None:
        return None
    value = text.strip()
    if not re.fullmatch(r"[0-9]+", value):  # both are non-negative (somaxconn's minimum is 0)
        raise ParseError("%s: expected one integer, got %.40r" % (path, text))
    return int(value)

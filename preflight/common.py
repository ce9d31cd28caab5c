"""Small shared helpers every rule and report uses: folding names, plurals, sizes, the majority.

Standard library only at import time (this module travels to the nodes in the probe bundle, because
check modules import it). `fold` imports ClusterShell when called; it is only called on the controller.

Group resolution is always off: ClusterShell would resolve `@group` through the shell upcalls of its
groups.conf, so a node name holding `@` could run a command. preflight never resolves groups.
"""

from __future__ import annotations

import re
from collections import Counter

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, TypeVar

    T = TypeVar("T", bound=Hashable)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def _nodeset(pattern: Any = None) -> Any:
    """A ClusterShell NodeSet that never resolves groups (no upcall, no shell)."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    return NodeSet(pattern, resolver=RESOLVER_NOGROUP)


def expand(pattern: str) -> List[str]:
    """gpu-[001-003] -> [gpu-001, gpu-002, gpu-003], with group resolution off.

    Raises ValueError with ClusterShell's reason for a pattern it cannot expand.
    """
    from ClusterShell.NodeSet import NodeSetException

    if "@" in pattern:
        raise ValueError("'@' (a ClusterShell group) is not allowed in a node name")
    try:
        return list(_nodeset(pattern))
    except (NodeSetException, ValueError) as exc:
        raise ValueError(str(exc)) from None


def fold(names: Iterable[Optional[str]]) -> str:
    """Node names folded: n001 n002 n003 n005 -> n[001-003,005]. None and duplicates are dropped.

    Names that do not fold (or anything ClusterShell refuses) come back as a sorted comma list, so a
    report never fails on a strange name.
    """
    real = sorted({n for n in names if n})
    if not real:
        return ""
    try:
        from ClusterShell.NodeSet import NodeSetException

        ns = _nodeset()
        for name in real:
            if "@" in name or "," in name:
                raise ValueError(name)
            ns.update(_nodeset(name))
        folded = str(ns)
    except (ImportError, NodeSetException, ValueError):
        return ",".join(real)
    return folded


def fold_ints(values: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    out: List[str] = []
    ordered = sorted(set(values))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else "%d-%d" % (ordered[i], ordered[j]))
        i = j + 1
    return ",".join(out)


def version_key(text: Any) -> Optional[Tuple[int, int, int]]:
    """(2, 21, 5) from '2.21.5' or '2.21.5+cuda12.2'; the oldest of 'A + B' (several system libraries); None if none."""
    keys = []
    for part in str(text or "").split("+ "):
        match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", part)
        if match:
            keys.append((int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)))
    return min(keys) if keys else None


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """plural(1, 'node') -> '1 node'; plural(3, 'node') -> '3 nodes'; plural(2, 'is', 'are')."""
    return "%d %s" % (n, word if n == 1 else (many or word + "s"))


def human_bytes(n: int) -> str:
    """1024 -> '1 KiB', 4294967296 -> '4 GiB', 1536 -> '1.5 KiB', 100 -> '100 B' (binary units)."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit:
            value = n / unit
            return ("%d %s" % (value, name)) if n % unit == 0 else ("%.1f %s" % (value, name))
    return "%d B" % n


def majority(values: Sequence[T]) -> Tuple[Optional[T], int, bool]:
    """(the most common value, how many hold it, whether it is a strict majority: more than half).

    The one tie rule: when several values are equally common there is no reference value, and
    (None, count, False) comes back; callers then judge every differing node (or report the tie)
    rather than silently preferring the larger value. An empty sequence gives (None, 0, False).
    """
    if not values:
        return None, 0, False
    counts = Counter(values).most_common()
    top, count = counts[0]
    if len(counts) > 1 and counts[1][1] == count:
        return None, count, False
    return top, count, count * 2 > len(values)


def nccl_list(spec: str) -> Tuple[bool, bool, List[str]]:
    """NCCL's device-list syntax (NCCL_SOCKET_IFNAME, NCCL_IB_HCA): (exclude '^', exact '=', entries).

    Entries are taken literally, as NCCL takes them (no white space is stripped).
    """
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    return exclude, exact, [e for e in spec.split(",") if e]


def nccl_selects(spec: str, name: str, port: Optional[int] = None) -> bool:
    """Whether an NCCL list spec selects interface `name` (or HCA `name`, port `port`): prefix match unless
    '=', inverted by '^'; an entry's ':port' must match when both name a port."""
    exclude, exact, entries = nccl_list(spec)
    hit = False
    for entry in entries:
        dev, _, want_port = entry.partition(":")
        if (dev == name) if exact else name.startswith(dev):
            if port is None or not want_port or (want_port.isdigit() and int(want_port) == port):
                hit = True
                break
    return hit != exclude


#: What a terminal (or a log viewer, or `scontrol show node`) would act on instead of showing: the C0 controls
#: (ESC starts CSI/OSC sequences: clear the screen, set the clipboard, retitle the window), DEL, the C1
#: controls (0x9b is a one-byte CSI on many terminals), and the Unicode bidirectional overrides and isolates
#: that reorder what is shown ("Trojan Source", CVE-2021-42574).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r"}


def printable(text: Any, keep_newlines: bool = True) -> str:
    r"""Text read from a node, safe to show a person or Slurm: each control character written as an escape.

    ESC ] 52 ; c ; ... BEL (OSC 52: set the clipboard) comes out as the visible text `\x1b]52;c;...\x07`;
    a C1 or bidi control as `\x9b` / `\u202e`. Tab and (unless keep_newlines is False) newline stay: they
    move the cursor only within the text. Everything else is unchanged, so plain text prints as before.
    """
    text = str(text)
    if not keep_newlines:
        text = text.replace("\n", "\\n")
    return _UNPRINTABLE.sub(_escape, text)


def one_line(text: Any) -> str:
    """Text read from a node as one line where no escape may appear (a shell comment, a short message):
    whitespace runs become one space and every other unprintable character a '?'."""
    return "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split()))


def _escape(match: Any) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return "\\x%02x" % ord(ch) if ord(ch) < 0x100 else "\\u%04x" % ord(ch)


def clock_offset(facts: Dict[str, Any]) -> Any:
    """(offset, uncertainty) of the node clock against the controller's, in seconds, or None, from the ssh check's
    facts (the ssh rule judges the skew; the ports rule compares times taken on two nodes).

    The controller stamps the window in which the node read its clock ("window": [sent, received]);
    the offset is measured from the window's midpoint, with half the window as its uncertainty.
    """
    window = facts.get("window")
    if not window or facts.get("time") is None:
        return None
    sent, received = window
    return facts["time"] - (sent + received) / 2.0, (received - sent) / 2.0

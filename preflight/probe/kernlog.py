"""The node's kernel log of the current boot, read once per probe run for every check that searches it.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle (xid searches the log
for Xid/SXid events, ib_errors for InfiniBand/RoCE link flaps). The log is read with
``journalctl -k -b 0 -o short-monotonic`` (timestamps are seconds since boot, so a window needs no wall clock),
else ``dmesg``; through ``ctx.run_once`` so that when both checks run, the node runs the command once.

    [ 1843.308145] node07 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.   (journalctl)
    [ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.                  (dmesg)

read(ctx) says which source answered, or why neither did (never an empty log passed off as a quiet one);
messages(text, source) yields each message line's (line number, seconds since boot or None, message).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator, Optional, Tuple

from preflight.model import ParseError, Setting

JOURNALCTL = ("journalctl", "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q")
DMESG = ("dmesg",)
TIMEOUT_S = 30.0
_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def _why(res: Any) -> str:
    if res.timed_out:
        return "timed out"
    first = next((l.strip() for l in (res.stderr + "\n" + res.stdout).splitlines() if l.strip()), "")
    return "rc %d%s" % (res.rc, ": " + first if first else "")


def _has_messages(text: str) -> bool:
    return any(l.strip() and not l.startswith("-- ") and l[:1] not in (" ", "\t") for l in text.splitlines())


def read(ctx: Any) -> Dict[str, Any]:
    """{"source": "journalctl"|"dmesg"|None, "text": str|None, "error": why no log (None when one was read)}."""
    tried = []
    for source, label, argv, empty in (
        ("journalctl", "journalctl -k", JOURNALCTL, "no kernel messages (journal not kept or no permission)"),
        ("dmesg", "dmesg", DMESG, "empty (ring buffer cleared)"),
    ):
        res = ctx.run_once(argv, timeout=TIMEOUT_S)
        if res.ok and _has_messages(res.stdout):
            return {"source": source, "text": res.stdout, "error": None}
        tried.append("%s: %s" % (label, empty if res.ok else "not found" if res.rc == 127 else _why(res)))
    return {"source": None, "text": None, "error": "; ".join(tried)}


def uptime(ctx: Any) -> Optional[float]:
    """Seconds since boot (/proc/uptime): a log line's age is uptime - its stamp."""
    text = ctx.read("/proc/uptime")
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def messages(text: str, source: str) -> Iterator[Tuple[int, Optional[float], str]]:
    """(line number, seconds since boot or None, message) of every kernel message line.

    journalctl lines must carry the monotonic stamp and "HOST IDENT:" ("[ 1843.308145] host kernel: ...");
    journalctl's own markers ("-- Boot ... --", "-- No entries --") and indented continuation lines are
    skipped. dmesg lines carry the stamp unless printk.time is off (then the time is None). A journalctl line
    in another format raises ParseError naming the line.
    """
    if source not in ("journalctl", "dmesg"):
        raise ParseError("kernel log: unknown source %r" % source)
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.startswith("-- ") or raw[:1] in (" ", "\t"):
            continue
        stamp = _STAMP.match(raw)
        if stamp:
            ts: Optional[float] = float(stamp.group(1))
            body = stamp.group(2)
            if source == "journalctl":
                host_ident = body.split(" ", 2)
                if len(host_ident) < 3 or not host_ident[1].endswith(":"):
                    raise ParseError("journalctl -o short-monotonic line %d: expected '[ SECONDS] HOST IDENT: MESSAGE', got %.80r" % (number, raw))
                body = host_ident[2]
        elif source == "journalctl":
            raise ParseError("journalctl -o short-monotonic line %d: expected a '[ SECONDS.MICROS]' stamp, got %.80r" % (number, raw))
        else:
            ts, body = None, raw
        yield number, ts, body


# ------------------------------------------------------------- the window, as the rules on the controller judge it


def age(uptime_s: Optional[float], ts: Optional[float]) -> Optional[float]:
    """Seconds since a line was logged; None when either time is unknown (then it counts as inside any window)."""
    return None if uptime_s is None or ts is None else max(0.0, uptime_s - ts)


#: cluster.xid_window_s, the window xid and ib_errors judge kernel-log events in (default: since boot)
WINDOW = Setting("xid_window_s", "number", "judge only kernel-log events this recent (default: since boot)",
                 low=1, high=10 * 365 * 86400, unit="seconds")


def in_window(age_s: Optional[float], window_s: Optional[float]) -> bool:
    return window_s is None or age_s is None or age_s <= window_s


def ago(seconds: Optional[float]) -> str:
    if seconds is None:
        return "at an unknown time"
    if seconds < 120:
        return "%d s ago" % seconds
    if seconds < 7200:
        return "%d min ago" % (seconds // 60)
    if seconds < 172800:
        return "%.1f h ago" % (seconds / 3600.0)
    return "%.1f days ago" % (seconds / 86400.0)


def window_text(window_s: Optional[float]) -> str:
    return "since boot" if window_s is None else "in the last %s" % ago(window_s).replace(" ago", "")

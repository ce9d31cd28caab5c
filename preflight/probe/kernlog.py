"""The node's kernel log of the current boot, read once per probe run for every check that searches it.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle (xid searches the log
for Xid/SXid events, ib_errors for InfiniBand/RoCE link flaps). The log is read with
``journalctl -k -b 0 -o short-monotonic`` (timestamps are seconds since boot, so a window needs no wall clock),
else ``dmesg``; through ``ctx.run_once`` so that when both checks run, the node runs the command once.

    [ 1843.308145] node07 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.   (journalctl)
    [ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.                  (dmesg)

read(ctx) says which source answered, or why neither did (never an empty log passed off as a quiet one);
messages(text, source) yields each message line's (line number, seconds since boot or None, message), in any
of FORMATS (dmesg -T/-d/iso/-x, journal short/short-iso, lines cut to "kernel: ...", as real captures show:
leptonai/gpud pull requests #46 and #338, ublue-os/bazzite issue #4449, open-gpu-kernel-modules issue #1150):
only the monotonic stamp gives a time.
A long log (a GPU that logged a million Xid lines) is read without a Python step per line: survey() counts
the lines and checks their stamps, lines_with() and line_at() read only the lines a check looks for, found
by the regex engine; chunks() cuts the text for passes that keep what they find.

Facts do not grow with the log: fold(events, key) folds the events a check finds per key (kind, GPU or
port, code or state) into one entry each: the last event's fields, with count, first_ts, last_ts and recent
(the stamps of its last RECENT events, so the controller can count the events inside a window:
count_in_window). A node that logged 1M Xid lines sends a few dozen entries.
"""

from __future__ import annotations

import re

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

JOURNALCTL = ("journalctl", "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q")
DMESG = ("dmesg",)
TIMEOUT_S = 30.0
#: What may stand before a kernel message, by format (FORMATS): a priority ("<4>", dmesg -r) or a facility/level
#: ("kern  :err   : ", dmesg -x),
#: one stamp (monotonic "[ 1843.308145]"; dmesg -T "[Fri Aug 30 11:11:22 2024]"; dmesg -d/-H "[  +0.000421]";
#: ISO with or without brackets, dmesg --time-format iso; the journal's "Mar 05 23:33:35"), then "HOST kernel:"
#: or "kernel:" (journalctl -o short / short-iso / short-monotonic, or lines cut to "kernel: ..."), in syslog files
#: (/var/log/kern.log, nvidia-bug-report.log) followed by the monotonic stamp.
_LINE = lazy(
    r"(?:<\d{1,3}>|[a-z]+ *: *[a-z]+ *: )?"
    r"(?:\[ *(?P<mono>\d+\.\d+)\]:? ?"
    r"|\[(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}|[<+ ]*[+-]?\d+\.\d+|[A-Z][a-z]{2}\d\d \d\d:\d\d"
    r"|\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?)\]:? ?"
    r"|\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)? "
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? )?"
    r"(?P<ident>(?:(?<= )[^\s:\[]+ )?kernel: (?:\[ *(?P<mono2>\d+\.\d+)\] ?)?)?")
#: The formats messages() reads (tests/fixtures/xid/formats_*): every one gives the same events.
FORMATS = ("dmesg", "dmesg (printk.time=0)", "dmesg -T", "dmesg -d", "dmesg --time-format iso", "dmesg -x", "dmesg -r",
           "journalctl -o short-monotonic", "journalctl -o short", "journalctl -o short-iso", "kernel: ... (stripped)",
           "syslog file (kern.log)")
#: (after a newline) a line messages() skips: empty or blank, journalctl's "-- ... --" markers, indented
#: continuations
_SKIPPED = lazy(r"\n(?:[ \t]|-- |[^\S\n]*(?=\n|$))")
#: (after a newline) a line that is neither stamped nor one messages() skips: not journalctl -o short-monotonic
_UNSTAMPED = lazy(r"\n(?![\[ \t]|-- |[^\S\n]*(?:\n|$))")
_FIRST_STAMP = lazy(r"\n\[[^\S\n]*(\d+\.\d+)\]")
#: how many of a folded group's latest stamps the facts keep (enough to count a window's events exactly
#: up to this many)
RECENT = 16


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


def messages(text: str, source: str, first_line: int = 1) -> Iterator[Tuple[int, Optional[float], str]]:
    """(line number, seconds since boot or None, message) of every kernel message line, in any format a node
    may hand back (FORMATS); only the monotonic stamp gives a time (a wall-clock or relative stamp: None).

    journalctl's own markers ("-- Boot ... --", "-- No entries --") and indented continuation lines are
    skipped. A journalctl line with the monotonic stamp must carry "HOST IDENT:" ("[ 1843.308145] host kernel:
    ..."); a journalctl line in no known format raises ParseError naming the line.
    """
    if source not in ("journalctl", "dmesg"):
        raise ParseError("kernel log: unknown source %r" % source)
    for number, raw in enumerate(text.splitlines(), first_line):
        if not raw.strip() or raw.startswith("-- ") or raw[:1] in (" ", "\t"):
            continue
        found = _LINE.match(raw)
        body = raw[found.end():]
        mono = found.group("mono") or found.group("mono2")
        ts: Optional[float] = float(mono) if mono else None
        if mono and source == "journalctl" and not found.group("ident"):
            host_ident = body.split(" ", 2)
            if len(host_ident) < 3 or not host_ident[1].endswith(":"):
                raise ParseError("journalctl -o short-monotonic line %d: expected '[ SECONDS] HOST IDENT: MESSAGE', got %.80r" % (number, raw))
            body = host_ident[2]
        elif source == "journalctl" and found.end() == 0:
            raise ParseError("journalctl line %d: expected a '[ SECONDS.MICROS]' stamp (or another kernel log format), got %.80r" % (number, raw))
        yield number, ts, body


def survey(text: str, source: str) -> Tuple[int, Optional[float]]:
    """(message lines, the first stamp) as messages() counts them; a journalctl line without its stamp raises
    ParseError naming the line (messages() does it). Each figure is one pass of the regex engine (every line
    starts after a newline, a literal it finds fast); the last log's answer is kept (xid and ib_errors
    read the same text)."""
    if source not in ("journalctl", "dmesg"):
        raise ParseError("kernel log: unknown source %r" % source)
    last = _surveyed[0]
    if last is not None and last[0] is text and last[1] == source:
        return last[2]
    if not text:
        return 0, None
    body = "\n" + text
    # the empty "line" after a final newline is skipped too, and is no line either
    lines = body.count("\n") - sum(1 for _ in _SKIPPED.finditer(body))
    if source == "journalctl" and _UNSTAMPED.search(body):
        for _ in messages(text, source):  # raises ParseError naming the first line not in the format
            pass
    first = _FIRST_STAMP.search(body)
    answer = (lines, float(first.group(1)) if first else None)
    _surveyed[0] = (text, source, answer)
    return answer


_surveyed: List[Any] = [None]  # (text, source, survey) of the last log surveyed


def line_at(text: str, pos: int, source: str) -> Optional[Tuple[Optional[float], str]]:
    """(stamp, message) of the line holding text[pos], read as messages() reads it; None for a line it skips."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start:len(text) if end < 0 else end]
    try:
        found = list(messages(line, source))
    except ParseError:  # said again with the line's number
        found = list(messages(line, source, text.count("\n", 0, start) + 1))
    return (found[0][1], found[0][2]) if found else None


def lines_with(text: str, source: str, literals: Sequence[str]) -> Iterator[Tuple[Optional[float], str]]:
    """(stamp, message) of each message line holding one of `literals`, in log order, as messages() reads
    them; the lines are found by searching the literals (fast), every other line is not looked at."""
    starts = sorted({text.rfind("\n", 0, m.start()) + 1 for literal in literals if literal in text
                     for m in re.finditer(re.escape(literal), text)})
    for start in starts:
        found = line_at(text, start, source)
        if found is not None:
            yield found


def chunks(text: str, size: int = 1 << 23) -> Iterator[Tuple[int, int]]:
    """(start, end) of consecutive slices of about `size` characters that end at a line's end."""
    start = 0
    while start < len(text):
        end = text.find("\n", min(len(text), start + size))
        end = len(text) if end < 0 else end + 1
        yield start, end
        start = end


def fold(events: Iterable[Dict[str, Any]], key: Sequence[str]) -> List[Dict[str, Any]]:
    """Events (dicts with "ts") folded per the values of `key`, in order of first appearance.

    Each entry holds its last event's fields (detail, line, severity, ...) but "ts", and count, first_ts,
    last_ts, recent (the stamps of its last RECENT events, oldest first).
    """
    groups: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for event in events:
        k = tuple(event[f] for f in key)
        entry = groups.get(k)
        ts = event.get("ts")
        if entry is None:
            entry = groups[k] = dict(event, count=0, first_ts=ts, recent=[])
        else:
            entry.update(event)
        entry["count"] += 1
        recent = entry["recent"]
        recent.append(ts)
        if len(recent) > RECENT:
            del recent[0]
    out = []
    for entry in groups.values():
        entry["last_ts"] = entry.pop("ts")
        out.append(entry)
    return out


# ------------------------------------------------------------- the window, as the rules on the controller judge it


def age(uptime_s: Optional[float], ts: Optional[float]) -> Optional[float]:
    """Seconds since a line was logged; None when either time is unknown (then it counts as inside any window)."""
    return None if uptime_s is None or ts is None else max(0.0, uptime_s - ts)


def in_window(age_s: Optional[float], window_s: Optional[float]) -> bool:
    return window_s is None or age_s is None or age_s <= window_s


def count_in_window(entry: Dict[str, Any], uptime_s: Optional[float], window_s: Optional[float]) -> Tuple[int, bool]:
    """(how many of a folded entry's events are inside the window, whether that count is exact).

    All of them when its first event is inside; else those of its recent stamps that are inside, exact
    unless every kept stamp is inside and more events were folded (then it is a lower bound).
    """
    if window_s is None or in_window(age(uptime_s, entry.get("first_ts")), window_s):
        return int(entry.get("count") or 0), True
    recent = entry.get("recent") or []
    inside = sum(1 for ts in recent if in_window(age(uptime_s, ts), window_s))
    return inside, not (inside == len(recent) and int(entry.get("count") or 0) > len(recent))


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

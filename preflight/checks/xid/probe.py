"""The xid check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from preflight.probe import kernlog

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?)(?:,\s*(.*))?$")
_SXID = re.compile(r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?)(?:,\s*(.*))?$")
#: How many Xid-looking lines the facts keep verbatim when their code cannot be read.
MAX_UNPARSED = 5
#: An Xid/SXid and its code where it starts, found by the regex engine from its literal start (a log may hold
#: a million): the text found, [the switch,] the PCI address, the code (as _XID/_SXID read them)
_XID_AT = re.compile(r"(NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?))(?=,|$)", re.M)
_SXID_AT = re.compile(r"((nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?))(?=,|$)", re.M)
#: Text that starts an Xid-looking line the patterns above cannot read (shown as unparsed, never a code)
_UNREAD = {
    "xid": re.compile(r"NVRM: Xid(?! \((?:PCI:)?[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?\): ?\S*?(?:,|$))", re.M),
    "sxid": re.compile(r"SXid \((?!PCI:[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?\): ?\S*?(?:,|$))", re.M),
}


def _nvidia_present(ctx: Any) -> bool:
    if os.path.isdir(ctx.sys_path("module", "nvidia")):
        return True
    devices = ctx.sys_path("bus", "pci", "devices")
    for bdf in ctx.listdir(devices):
        if (ctx.read(os.path.join(devices, bdf, "vendor")) or "").strip().lower() == "0x10de":
            return True
    return False


def probe(ctx: Any) -> Dict[str, Any]:
    """The current boot's Xid/SXid events from the shared kernel log reader (journalctl -k, else dmesg)."""
    facts: Dict[str, Any] = {"nvidia": _nvidia_present(ctx), "source": None, "log_error": None, "uptime_s": None, "log": None}
    if not facts["nvidia"]:
        return facts
    facts["uptime_s"] = kernlog.uptime(ctx)
    klog = kernlog.read(ctx)
    if klog["text"] is None:
        facts["log_error"] = klog["error"]
        return facts
    facts.update(source=klog["source"], log=parse_kernel_log(klog["text"], klog["source"]))
    return facts


def parse_kernel_log(text: str, source: str = "dmesg") -> Dict[str, Any]:
    """Xid and SXid events from `journalctl -k -o short-monotonic` or `dmesg` output, folded per (kind, pci, code).

    journalctl lines must carry the monotonic stamp ("[ 1843.308145] host kernel: ..."); journalctl's own
    markers ("-- Boot ... --", "-- No entries --") and indented continuation lines are skipped. dmesg lines
    carry the stamp unless printk.time is off (then ts is None: inside any window).

    Linear, and without a Python step per line (a GPU may log a million Xid lines): the regex engine
    counts each distinct Xid/SXid start; then only the first and the last RECENT lines of each are read.
    """
    lines, first_ts = kernlog.survey(text, source)
    entries: List[Tuple[int, Dict[str, Any]]] = []  # (position of the first, entry)
    unparsed: List[Tuple[int, str]] = []
    for kind, literal, pattern in (("xid", "NVRM: Xid", _XID_AT), ("sxid", "SXid (", _SXID_AT)):
        if literal not in text:
            continue
        counts: Counter = Counter()
        for start, end in kernlog.chunks(text):
            counts.update(pattern.findall(text, start, end))
        by_key: Dict[Tuple[str, str], List[str]] = {}
        for found in counts:
            by_key.setdefault((found[-2].lower(), found[-1]), []).append(found[0])
        for (pci, code), starts in by_key.items():
            entry = _folded(text, source, pattern, starts, sum(n for f, n in counts.items() if f[0] in starts))
            if entry is None:
                continue
            if entry[1] is None:  # its code is not a number: shown as read, never a code
                unparsed.append((entry[0], entry[2]))
            else:
                entries.append((entry[0], entry[1]))
        if text.count(literal) > sum(counts.values()):  # some start no pattern reads
            for match in _UNREAD[kind].finditer(text):
                line = kernlog.line_at(text, match.start(), source)
                if line is not None:
                    unparsed.append((match.start(), line[1].strip()[:200]))
    return {"lines": lines, "first_ts": first_ts, "events": [e for _, e in sorted(entries, key=lambda x: x[0])],
            "unparsed": [u for _, u in sorted(unparsed)][:MAX_UNPARSED]}


def _folded(text: str, source: str, pattern: Any, starts: List[str], count: int) -> Optional[Tuple[int, Optional[Dict[str, Any]], str]]:
    """(position of the first, the folded entry or None when the code is not a number, the last line) of the
    events whose lines hold one of `starts` (one event written one or more ways)."""
    places: List[int] = []
    for start in starts:  # the first and the last RECENT of each way it is written
        at = -1
        while True:
            at = text.find(start, at + 1)
            if at < 0 or _is(pattern, text, at, start):
                break
        if at >= 0:
            places.append(at)
        end, kept = len(text), 0
        while kept < kernlog.RECENT:
            end = text.rfind(start, 0, end)
            if end < 0:
                break
            if _is(pattern, text, end, start):
                places.append(end)
                kept += 1
    read = [(at, kernlog.line_at(text, at, source)) for at in sorted(set(places))]
    read = [(at, line) for at, line in read if line is not None]  # an indented continuation is not an event
    if not read:
        return None
    first_at, (first_ts, _first) = read[0]
    last_ts, last = read[-1][1]
    event = _event(last, last_ts)
    if event is None:
        return first_at, None, last.strip()[:200]
    stamps = [line[0] for _at, line in read if _at != first_at or len(read) <= kernlog.RECENT]
    event.update(count=count, first_ts=first_ts, recent=stamps[-kernlog.RECENT:], last_ts=event.pop("ts"))
    return first_at, event, last


def _is(pattern: Any, text: str, at: int, start: str) -> bool:
    """Whether an Xid/SXid start found by str.find is whole there (not the start of a longer code)."""
    match = pattern.match(text, at)
    return match is not None and match.group(1) == start


def _event(body: str, ts: Optional[float]) -> Optional[Dict[str, Any]]:
    m = _XID.search(body)
    if m:
        if not m.group(2).isdigit():
            return None
        return {"kind": "xid", "pci": m.group(1).lower(), "code": int(m.group(2)), "ts": ts,
                "detail": (m.group(3) or "").strip()[:200], "device": None, "severity": None}
    m = _SXID.search(body)
    if m:
        if not m.group(3).isdigit():
            return None
        rest = (m.group(4) or "").strip()
        severity, _, detail = rest.partition(",")
        severity = severity.strip()
        return {"kind": "sxid", "pci": m.group(2).lower(), "code": int(m.group(3)), "ts": ts,
                "detail": detail.strip()[:200], "device": m.group(1),
                "severity": severity if severity in ("Fatal", "Non-fatal") else None}
    return None

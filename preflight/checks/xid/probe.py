"""The xid check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import re
from collections import Counter

from preflight.probe import kernlog, nvrm
from preflight.probe.lazy_re import lazy
from preflight.probe.pci import devices as pci_devices

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

_XID = lazy(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?)(?:,\s*(.*))?$")
_SXID = lazy(r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?)(?:,\s*(.*))?$")
#: How many Xid-looking lines the facts keep verbatim when their code cannot be read.
MAX_UNPARSED = 5
#: An Xid/SXid and its code where it starts, found by the regex engine from its literal start (a log may hold
#: a million): the text found, [the switch,] the PCI address, the code (as _XID/_SXID read them)
_XID_AT = lazy(r"(NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?))(?=,|$)", re.M)
_SXID_AT = lazy(r"((nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\S*?))(?=,|$)", re.M)
#: Text that starts an Xid-looking line the patterns above cannot read (shown as unparsed, never a code)
_UNREAD = {
    "xid": lazy(r"NVRM: Xid(?! \((?:PCI:)?[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?\): ?\S*?(?:,|$))", re.M),
    "sxid": lazy(r"SXid \((?!PCI:[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?\): ?\S*?(?:,|$))", re.M),
}
#: An NVLink Xid (144-150) as R575+ drivers write it, up to its link: "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB
#: Nonfatal XC0 i0 Link 0 (0x...)" (leptonai/gpud pull requests #1160 and #1174): folded per link and severity
_NVLINK_AT = lazy(r"(NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(14[4-9]|150), \w+ "
                        r"(?:Fatal|Nonfatal|Non-fatal) [^\n(]*?\bLink (-?\d+))", re.M)
_NVLINK_DETAIL = lazy(r"^(\w+) (Fatal|Nonfatal|Non-fatal)\b[^(]*?\bLink (-?\d+)")
NVLINK_XIDS = range(144, 151)
#: "Xid (PCI:...): 45, pid=..., Ch 00000001 caused by previous Xid 149" (NVIDIA/open-gpu-kernel-modules issue #1150)
_CAUSE = lazy(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\d+),[^\n]*?caused by previous Xid (\d+)")


def _nvidia_present(ctx: Any) -> bool:
    if os.path.isdir(ctx.sys_path("module", "nvidia")):
        return True
    return any(vendor == "0x10de" for _, vendor, _ in pci_devices(ctx))


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
    has = {"xid": "NVRM: Xid" in text, "sxid": "SXid (" in text}  # each a pass over the text: once
    nvlink = _starts(text, _NVLINK_AT, lambda f: (f[1].lower(), f[2], f[0].split(", ", 1)[1].split(" ")[1], f[3])) if has["xid"] else {}
    done = {key[:2] for key in nvlink}
    for kind, literal, pattern in (("nvlink", "NVRM: Xid", _NVLINK_AT), ("xid", "NVRM: Xid", _XID_AT), ("sxid", "SXid (", _SXID_AT)):
        if not has["sxid" if kind == "sxid" else "xid"]:
            continue
        by_key = nvlink if kind == "nvlink" else _starts(text, pattern, lambda f: (f[-2].lower(), f[-1]))
        for key, (starts, count) in by_key.items():
            if kind == "xid" and key in done:  # read per link above
                continue
            entry = _folded(text, source, pattern, starts, count)
            if entry is None:
                continue
            if entry[1] is None:  # its code is not a number: shown as read, never a code
                unparsed.append((entry[0], entry[2]))
            else:
                if kind == "sxid":  # the severity word is on one of the lines an SXid writes, not on its Data line
                    entry[1].update(_sxid_severity(text, starts))
                entries.append((entry[0], entry[1]))
        total = sum(n for _starts_, n in by_key.values())
        if kind != "nvlink" and text.count(literal) > total:
            for match in _UNREAD[kind].finditer(text):  # some start no pattern reads
                line = kernlog.line_at(text, match.start(), source)
                if line is not None:
                    unparsed.append((match.start(), line[1].strip()[:200]))
    events = [e for _, e in sorted(entries, key=lambda x: x[0])]
    if has["xid"]:
        _add_causes(text, events)
    return {"lines": lines, "first_ts": first_ts, "events": events,
            "unparsed": [u for _, u in sorted(unparsed)][:MAX_UNPARSED], "nvrm": nvrm.parse(text, source)}


def _starts(text: str, pattern: Any, key: Any) -> Dict[Tuple[str, ...], Tuple[List[str], int]]:
    """{key(found): (the distinct starts found, how many lines)} of the pattern's matches, counted by the regex engine."""
    counts: Counter = Counter()
    for start, end in kernlog.chunks(text):
        counts.update(pattern.findall(text, start, end))
    out: Dict[Tuple[str, ...], Tuple[List[str], int]] = {}
    for found, n in counts.items():
        starts, total = out.get(key(found), ([], 0))
        out[key(found)] = (starts + [found[0]], total + n)
    return out


def _sxid_severity(text: str, starts: List[str]) -> Dict[str, Any]:
    """{"severity": "Fatal" when a line of this SXid says so, else "Non-fatal" when one does, else None (Data
    lines only: the rule takes it from the Fabric Manager guide's table), and "detail": that line's text}."""
    for word in ("Fatal", "Non-fatal"):
        for start in starts:
            at = text.find(start + ", " + word + ",")
            if at >= 0:
                end = text.find("\n", at)
                return {"severity": word, "detail": text[at + len(start) + len(word) + 4:len(text) if end < 0 else end].strip()[:200]}
    return {"severity": None}


def _add_causes(text: str, events: List[Dict[str, Any]]) -> None:
    """events[i]["causes"] = {"149": n}: the earlier Xids that an Xid 43/45 line says caused it, counted."""
    if "caused by previous Xid" not in text:
        return
    causes: Counter = Counter((pci.lower(), int(code), cause) for pci, code, cause in _CAUSE.findall(text))
    for event in events:
        if event["kind"] == "xid":
            mine = {cause: n for (pci, code, cause), n in causes.items() if (pci, code) == (event["pci"], event["code"])}
            if mine:
                event["causes"] = mine


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
        detail = (m.group(3) or "").strip()
        event = {"kind": "xid", "pci": m.group(1).lower(), "code": int(m.group(2)), "ts": ts,
                 "detail": detail[:200], "device": None, "severity": None, "link": None}
        nvlink = _NVLINK_DETAIL.match(detail) if event["code"] in NVLINK_XIDS else None
        if nvlink:
            event.update(severity="Fatal" if nvlink.group(2) == "Fatal" else "Non-fatal", link=int(nvlink.group(3)))
        return event
    m = _SXID.search(body)
    if m:
        if not m.group(3).isdigit():
            return None
        rest = (m.group(4) or "").strip()
        severity, _, detail = rest.partition(",")
        severity = severity.strip()
        if severity not in ("Fatal", "Non-fatal"):  # "Data {0x...}" or "Severity 0 ...": the whole text is the detail
            detail = rest
        return {"kind": "sxid", "pci": m.group(2).lower(), "code": int(m.group(3)), "ts": ts,
                "detail": detail.strip()[:200], "device": m.group(1), "link": None,
                "severity": severity if severity in ("Fatal", "Non-fatal") else None}
    return None

"""xid: no GPU or NVSwitch on a node logged a hardware Xid/SXid event inside the window (default: since boot).

The NVIDIA driver reports GPU faults to the kernel log as Xid events and the NVSwitch driver reports switch
faults as SXid events. Real lines (driver versions differ in the fields after the code)::

    [ 1843.308145] node07 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.      (journalctl -o short-monotonic)
    [ 7351.123456] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked ...        (dmesg, 470+: pid=)
    [ 9012.000001] NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s ... (535+: name=)
    [  269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff      (very old drivers: no "PCI:")
    [  123.456789] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error

The probe reads the kernel log of the current boot (preflight.probe.kernlog, shared with ib_errors: read once
per probe run) with ``journalctl -k -o short-monotonic`` (timestamps are
seconds since boot, so the window needs no wall clock), else ``dmesg``; when neither can be read it says why
(a missing log is an ERROR, never a pass). It only reads the log where an NVIDIA driver is loaded or an
NVIDIA PCI device is present.

Facts schema::

    nvidia      bool: NVIDIA driver loaded (module/nvidia in sysfs) or NVIDIA PCI device present
    source      "journalctl" | "dmesg" | None (not read)
    log_error   why no log could be read (None when one was)
    uptime_s    float | None  (/proc/uptime; ages are uptime - timestamp)
    log         {"lines": int, "first_ts": float|None, "events": [event], "unparsed": [str],
                 "nvrm": [GPU failures logged without an Xid line: preflight.probe.nvrm.parse]} | None
    event = {"kind": "xid"|"sxid", "pci": "0000:44:00"|"0000:c3:00.0", "code": int,
             "detail": str, "device": "nvidia-nvswitch0"|None, "severity": "Fatal"|"Non-fatal"|None,
             "link": int|None (NVLink Xids 144-150 as R575+ writes them: folded per link and severity),
             "causes": {"149": n} (only on an Xid whose text says "caused by previous Xid 149"),
             "count": int, "first_ts": float|None, "last_ts": float|None, "recent": [float|None]}
                the events folded on the node per (kind, pci, code) (preflight.probe.kernlog.fold): detail,
                device and severity of the last one, how many, the first and last stamps and the last
                RECENT stamps, so the facts stay small however many lines a GPU logged (1M Xid lines: a
                few dozen entries)

Rule (per GPU node; CPU-only nodes SKIP):

- no NVIDIA driver or device: ERROR (the log was not searched; the gpu check says why).
- log not readable: ERROR naming both attempts.
- events older than ``cluster.xid_window_s`` seconds are ignored (default: every event since boot).
- events are folded per (GPU, code): count (inside the window: kernlog.count_in_window; "×N+" when only a
  lower bound is known), last age; the GPU is named from the gpu check's facts (index and bus id), else by
  the PCI address in the line.
- Xid classes follow NVIDIA's Xid catalogue (XID_SOURCE): codes whose resolution is a GPU reset, a node reboot
  or service (hardware: HARDWARE_XIDS) FAIL with that action; codes an application usually causes
  (APPLICATION_XIDS) WARN with action check_app; codes not in either table WARN (look them up).
- Xid 154 (recovery action changed) FAILs with the action it names.
- NVLink Xids 144-150 with the driver's severity: Fatal FAILs (reset_gpu); Nonfatal WARNs, and FAILs when it
  repeats on one link inside the window.
- an Xid 43/45 that names its cause ("caused by previous Xid 149", open-gpu-kernel-modules issue #1150) is judged
  as that Xid, or told in that Xid's finding when it is logged on the same GPU.
- SXid: the severity word of any of its lines (never its "Data {...}" line, NVIDIA/nvtrust issue #124), else the
  Fabric Manager guide's tables (SXID_*): fatal FAILs (action reboot: the NVSwitch fabric must be reset with its
  GPUs; 20034 reset_gpu), non-fatal WARNs, the ones the guide says to ignore are named in the PASS.
- GPU failures without an Xid line (preflight.probe.nvrm: fallen off the bus, failed probe, GSP hangs) FAIL
  per GPU (reboot, fix_config for a GPU the driver does not support, reset_gpu for GSP); an Xid 79/119/120
  on the same GPU tells it instead.
- Xid lines whose code cannot be read WARN (the line is shown; no code is invented).
- otherwise PASS: "no Xid/SXid since boot in N kernel log lines (journalctl)", adding "the log only covers the
  last 5.2 h" when the oldest line left (dmesg ring buffer wrapped, journal rotated) is younger than the window.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, Status, per_gpu_node
from preflight.probe import kernlog, nvrm

NAME = "xid"

#: Where the classification comes from.
XID_SOURCE = (
    "NVIDIA, 'Xid Errors' (https://docs.nvidia.com/deploy/xid-errors/index.html) and its 'Xid Catalog' "
    "(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, resolution buckets RESET_GPU, "
    "RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, RESTART_APP); NVSwitch SXids: 'Fabric Manager User "
    "Guide', SXid errors (Fatal / Non-fatal)"
)

#: Hardware Xids: code -> (what it means, action). Resolution bucket RESET_GPU / RESTART_BM / workflows.
HARDWARE_XIDS: Dict[int, Tuple[str, str]] = {
    46: ("GPU stopped processing", "reset_gpu"),
    48: ("double-bit ECC error (DBE)", "reset_gpu"),
    61: ("internal micro-controller breakpoint/warning", "reset_gpu"),
    62: ("internal micro-controller halt", "reset_gpu"),
    63: ("ECC page retirement or row remapping recorded", "reset_gpu"),
    64: ("ECC page retirement or row remapping failure", "isolate"),
    74: ("NVLink error", "reset_gpu"),
    79: ("GPU has fallen off the bus", "reboot"),
    92: ("high single-bit ECC error rate", "reset_gpu"),
    94: ("contained ECC error", "reset_gpu"),
    95: ("uncontained ECC error", "reset_gpu"),
    110: ("security fault error", "reset_gpu"),
    119: ("GSP RPC timeout", "reset_gpu"),
    120: ("GSP error", "reset_gpu"),
    121: ("C2C link error", "reset_gpu"),
    136: ("link training failed", "reboot"),
    140: ("unrecovered ECC error", "reset_gpu"),
    143: ("GPU initialization failure", "reset_gpu"),
    144: ("NVLink SAW error", "reset_gpu"),
    145: ("NVLink RLW error", "reset_gpu"),
    146: ("NVLink TLW error", "reset_gpu"),
    147: ("NVLink TREX error", "reset_gpu"),
    148: ("NVLink NVLPW control error", "reset_gpu"),
    149: ("NVLink NETIR error", "reset_gpu"),
    150: ("NVLink MSE error", "reset_gpu"),
}
#: Xids an application usually causes (resolution bucket RESTART_APP): the GPU itself is fine.
APPLICATION_XIDS: Dict[int, str] = {
    8: "GPU stopped processing (channel idle timeout)",
    13: "graphics engine exception (illegal address or instruction in a kernel)",
    31: "GPU memory page fault (illegal address)",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing (reset channel verification)",
    45: "preemptive cleanup after a previous error",
    68: "NVDEC0 exception",
    69: "graphics engine class error",
    109: "context switch timeout",
}
#: Xid 154 names the recovery the driver now requires: text -> action.
XID154_ACTIONS = (("node reboot", "reboot"), ("drain and reset", "isolate"), ("gpu reset", "reset_gpu"), ("drain p2p", "reset_gpu"))

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
#: An NVLink Xid (144-150) as R575+ drivers write it, up to its link: "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB
#: Nonfatal XC0 i0 Link 0 (0x...)" (leptonai/gpud pull requests #1160 and #1174): folded per link and severity
_NVLINK_AT = re.compile(r"(NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(14[4-9]|150), \w+ "
                        r"(?:Fatal|Nonfatal|Non-fatal) [^\n(]*?\bLink (-?\d+))", re.M)
_NVLINK_DETAIL = re.compile(r"^(\w+) (Fatal|Nonfatal|Non-fatal)\b[^(]*?\bLink (-?\d+)")
NVLINK_XIDS = range(144, 151)
#: "Xid (PCI:...): 45, pid=..., Ch 00000001 caused by previous Xid 149" (NVIDIA/open-gpu-kernel-modules issue #1150)
_CAUSE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): ?(\d+),[^\n]*?caused by previous Xid (\d+)")
#: Events are folded on the node per these fields (kernlog.fold).
FOLD_KEY = ("kind", "pci", "code", "severity", "link")


# --------------------------------------------------------------------------------------------- probe


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


# --------------------------------------------------------------------------------------------- parse


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


# ---------------------------------------------------------------------------------------------- rule


#: The Fabric Manager User Guide's SXid tables (NVIDIA DU-09883-001 v1.3, appendix D: D.4 non-fatal, D.5 fatal,
#: D.6 always fatal, D.7 other notable), for SXid lines that carry no severity word ("SXid (PCI:...): 12028,
#: Data {...}", leptonai/gpud pull request #338); codes as transcribed in leptonai/gpud pkg/nvidia-query/sxid/sxid.go.
SXID_IGNORED = frozenset((11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059, 19062,
                          19065, 19068, 19071, 24001, 24002, 24003, 22013))  # single-bit ECC corrected; "safely ignored"
SXID_NON_FATAL = {11004: "ingress invalid ACL (validate the fabric partition routing)", 20001: "TX replay error",
                  12028: "egress non-posted PRIV error (traffic stalled: restart the jobs' VM or node)",
                  19084: "AN1 heartbeat timeout (usually beside a fatal SXid)", 20012: "broken or inconsistent connection "
                  "(check the link's mechanical connection)", 10001: "host PRIV error", 10002: "host PRIV timeout",
                  10004: "thermal event start (check the cooling)", 10005: "thermal event end (check the cooling)"}
SXID_FATAL = frozenset((11001, 11009, 11013, 11018, 11019, 11020, 12001, 12002, 12022, 12024, 12025, 12026, 12027, 12030,
                        12031, 12032, 14017, 15001, 15006, 15009, 15010, 15012, 15013, 19047, 19048, 19054, 19056, 19058,
                        19060, 19061, 19063, 19064, 19066, 19067, 19069, 19070, 20034, 22012, 24004, 24005, 24006, 24007))
SXID_ALWAYS_FATAL = frozenset((12020, 22003, 22011, 10003) + tuple(range(23001, 23018)))
#: SXid whose guide action is not a reboot: 20034 LTSSM fault on an H100 system: reset the GPU
SXID_ACTIONS = {20034: "reset_gpu"}


def classify(event: Dict[str, Any]) -> Tuple[Status, Optional[str], str]:
    """(status, action, meaning) of one event, from the tables above; PASS for an SXid the guide says to ignore."""
    code = event["code"]
    if event["kind"] == "sxid":
        return _classify_sxid(code, event.get("severity"))
    if code in NVLINK_XIDS and event.get("severity"):
        meaning = HARDWARE_XIDS[code][0]
        if event["severity"] == "Fatal":
            return Status.FAIL, "reset_gpu", "fatal " + meaning
        return Status.WARN, None, "non-fatal " + meaning + " (a FAIL if it repeats on this link)"
    if code in HARDWARE_XIDS:
        meaning, action = HARDWARE_XIDS[code]
        return Status.FAIL, action, meaning
    if code in APPLICATION_XIDS:
        return Status.WARN, "check_app", APPLICATION_XIDS[code]
    if code == 154:
        detail = event.get("detail", "").lower()
        for words, action in XID154_ACTIONS:
            if words in detail:
                return Status.FAIL, action, "GPU recovery action required"
        return Status.WARN, None, "GPU recovery action changed"
    return Status.WARN, None, "not in preflight's Xid table (see NVIDIA's Xid catalogue)"


def _classify_sxid(code: int, severity: Optional[str]) -> Tuple[Status, Optional[str], str]:
    action = SXID_ACTIONS.get(code, "reboot")
    if severity == "Fatal" or (severity is None and code in SXID_ALWAYS_FATAL):
        return Status.FAIL, action, "fatal NVSwitch error" + (" (always fatal to the fabric)" if code in SXID_ALWAYS_FATAL else "")
    if severity is None and code in SXID_FATAL:
        return Status.FAIL, action, "fatal NVSwitch error (the Fabric Manager guide's fatal table; the line has no severity word)"
    if code in SXID_IGNORED:
        return Status.PASS, None, "non-fatal NVSwitch event the Fabric Manager guide says to ignore"
    if severity == "Non-fatal" or code in SXID_NON_FATAL:
        return Status.WARN, None, "non-fatal NVSwitch error" + (": " + SXID_NON_FATAL[code] if code in SXID_NON_FATAL else "")
    return Status.WARN, None, "NVSwitch error of unknown severity (not in the Fabric Manager guide's tables)"


def _bus_key(address: Optional[str]) -> str:
    """00000000:4E:00.0 / 0000:4e:00 / 0000:4e:00.0 -> 0000:4e:00 (Xid lines carry no function)."""
    return (nvrm.bus(address) if address and address.count(":") in (1, 2) else None) or (address or "?").lower()


_ago = kernlog.ago
_window_text = kernlog.window_text


def _groups(log: Dict[str, Any], uptime: Optional[float], window: Optional[float]) -> Dict[Tuple[Any, ...], List[Dict[str, Any]]]:
    """The window's events per (kind, bus, code, link, severity of an NVLink Xid): one pci may be written two ways."""
    groups: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for entry in log.get("events") or []:  # folded on the node
        inside, exact = kernlog.count_in_window(entry, uptime, window)
        if inside:
            nvlink = entry["kind"] == "xid" and entry["code"] in NVLINK_XIDS
            key = (entry["kind"], _bus_key(entry["pci"]), entry["code"], entry.get("link") if nvlink else None,
                   entry.get("severity") if nvlink else None)
            groups.setdefault(key, []).append(dict(entry, inside=inside, exact=exact, age=kernlog.age(uptime, entry.get("last_ts"))))
    return groups


def _cause(last: Dict[str, Any], groups: Dict[Tuple[Any, ...], List[Dict[str, Any]]], bus: str) -> Optional[Tuple[int, bool]]:
    """(the Xid an Xid 43/45 says caused it, whether that Xid is itself in the window on this GPU), or None."""
    causes = [int(c) for c in (last.get("causes") or {})]
    if last["kind"] != "xid" or last["code"] not in (43, 45) or not causes:
        return None
    ranked = sorted(causes, key=lambda c: (classify({"kind": "xid", "code": c, "detail": ""})[0] is not Status.FAIL, c))
    present = [c for c in ranked if any(k[0] == "xid" and k[1] == bus and k[2] == c for k in groups)]
    return (present[0], True) if present else (ranked[0], False)


def _xid_findings(name: str, groups: Dict[Tuple[Any, ...], List[Dict[str, Any]]], gpus: Dict[str, Any],
                  window: Optional[float]) -> Tuple[List[Finding], List[str]]:
    """(one finding per Xid/SXid group, the SXids the guide says to ignore); an Xid 43/45 whose cause is logged
    on the same GPU is told in its cause's finding, not as a finding of its own (a consequence never heads)."""
    out: List[Tuple[Tuple[Any, ...], Finding]] = []
    ignored: List[str] = []
    followers: Dict[Tuple[str, int], List[str]] = {}
    for key, entries in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], str(kv[0][3]))):
        kind, bus, code, link = key[:4]
        last = max(entries, key=lambda e: e.get("last_ts") if e.get("last_ts") is not None else float("-inf"))
        total = sum(e["inside"] for e in entries)
        count = "" if total == 1 else " ×%d%s" % (total, "" if all(e["exact"] for e in entries) else "+")
        cause = _cause(last, groups, bus)
        status, action, meaning = classify(last)
        label = "%s %d" % ("SXid" if kind == "sxid" else "Xid", code)
        if cause and cause[1]:
            followers.setdefault((bus, cause[0]), []).append("%s%s caused by it" % (label, count))
            continue
        if cause:
            status, action, meaning = classify({"kind": "xid", "code": cause[0], "detail": ""})
            meaning = "caused by previous Xid %d, judged as Xid %d: %s" % (cause[0], cause[0], meaning)
        if link is not None and status is Status.WARN and total >= 2:
            status, action, meaning = Status.FAIL, "reset_gpu", meaning + ", repeated on link %d" % link
        if status is Status.PASS:
            ignored.append("%s%s" % (label, count))
            continue
        if kind == "sxid":
            where = "%s (%s)" % (last.get("device") or "NVSwitch", last["pci"])
        else:
            gpu = gpus.get(bus)
            where = "GPU %d (%s)" % (gpu.index, bus + ".0") if gpu else "GPU at %s (not listed by the driver now)" % bus
        ages = [e["age"] for e in entries if e["age"] is not None]
        detail = last.get("detail") or ""
        msg = "%s %s: %s%s%s %s (%s): %s%s" % (
            name, where, label, " link %d" % link if link is not None else "", count, _window_text(window),
            "last %s" % _ago(min(ages)) if ages else "time unknown", meaning,
            ("; " + detail[:120]) if detail and meaning.lower() not in detail.lower() else "")
        data: Dict[str, Any] = {"kind": kind, "code": code, "pci": bus, "count": total}
        if link is not None:
            data["link"] = link
        out.append((key, dict(status=status, message=msg, expected="no hardware Xid/SXid" if status is Status.FAIL else "no Xid/SXid",
                              actual="%s%s" % (label, count), data=data, action=action)))
    findings = []
    for key, fields in out:
        then = followers.get((key[1], key[2])) if key[0] == "xid" else None
        if then:
            fields["message"] += "; then %s" % ", ".join(then)
        if fields["action"]:
            fields["message"] += " (action: %s)" % fields["action"]
        findings.append(Finding(NAME, name, **fields))
    return findings, ignored


#: The non-Xid events (preflight.probe.nvrm): what each means and the action; fallen off the bus as Xid 79.
NVRM_KINDS = {
    "fallen_off_bus": ("GPU has fallen off the bus, judged as Xid 79 (reseat the GPU if it repeats)", "reboot"),
    "probe_failed": ("the driver failed to take the GPU at load", "reboot"),
    "gsp_timeout": ("GSP firmware RPC timed out: the GPU is wedged", "reset_gpu"),
    "gsp_heartbeat": ("GSP firmware heartbeat timed out: the GPU is wedged", "reset_gpu"),
    "memsys_error": ("memory subsystem error under GSP: the GPU is wedged", "reset_gpu"),
}
#: An Xid on the same GPU that already says what a non-Xid event says (then the Xid's finding is the one)
NVRM_SAME_AS = {"fallen_off_bus": (79,), "probe_failed": (79,), "gsp_timeout": (119, 120), "gsp_heartbeat": (119, 120), "memsys_error": (119, 120)}


def _nvrm_findings(name: str, log: Dict[str, Any], uptime: Optional[float], window: Optional[float], record: Any,
                   xid_buses: Dict[int, set]) -> List[Finding]:
    """One finding per GPU named by non-Xid failure lines (GPU<n> mapped by an Xid line, else taken as GPU n)."""
    by_gpu: Dict[str, List[Tuple[Dict[str, Any], int]]] = {}
    gpus = {_bus_key(g.pci_bus_id): g for g in record.gpus} if record is not None else {}
    by_index = {g.index: g for g in record.gpus} if record is not None else {}
    entries = log.get("nvrm") or []
    named = any(e.get("pci") and e["kind"] in ("fallen_off_bus", "probe_failed") for e in entries)
    for entry in entries:
        if named and entry["kind"] == "probe_failed" and not entry.get("pci"):
            continue  # "failed for N device(s)": the GPUs are named by the lines before it
        inside, _exact = kernlog.count_in_window(entry, uptime, window)
        if not inside or entry["kind"] not in NVRM_KINDS:
            continue
        bus = _bus_key(entry["pci"]) if entry.get("pci") else None
        where = None
        if bus is None and entry.get("gpu"):
            gpu = by_index.get(int(entry["gpu"][3:]))
            bus, where = (_bus_key(gpu.pci_bus_id), "GPU %d (%s.0, the driver's %s taken as GPU %d)" % (
                gpu.index, _bus_key(gpu.pci_bus_id), entry["gpu"], gpu.index)) if gpu else (None, "the driver's %s" % entry["gpu"])
        if where is None and bus is None and entry["kind"].startswith("gsp") and len(by_index) == 1:  # names no GPU
            gpu = next(iter(by_index.values()))
            bus, where = _bus_key(gpu.pci_bus_id), "GPU %d (%s.0, the node's only GPU)" % (gpu.index, _bus_key(gpu.pci_bus_id))
        if bus is not None and any(bus in xid_buses.get(code, ()) for code in NVRM_SAME_AS[entry["kind"]]):
            continue  # the Xid says it, with its own finding
        if where is None:
            gpu = gpus.get(bus) if bus else None
            where = ("GPU %d (%s.0)" % (gpu.index, bus) if gpu else "GPU at %s (not listed by the driver now)" % bus) if bus else "a GPU (the line names none)"
        by_gpu.setdefault(where, []).append((entry, inside))
    out = []
    for where, items in by_gpu.items():
        worst = min(items, key=lambda item: list(NVRM_KINDS).index(item[0]["kind"]))[0]
        meaning, action = NVRM_KINDS[worst["kind"]]
        if worst["kind"] == "probe_failed" and worst.get("reason") == "not supported by this driver":
            meaning, action = "the driver does not support this GPU (install a driver that does)", "fix_config"
        elif worst["kind"] == "probe_failed" and worst.get("reason"):
            meaning += ": " + worst["reason"]
        ages = [kernlog.age(uptime, e.get("last_ts")) for e, _n in items]
        ages = [a for a in ages if a is not None]
        said = "; ".join("%s%s" % (e["detail"], "" if n == 1 else " ×%d" % n) for e, n in items
                         if e["detail"] not in meaning or n > 1) or "the kernel log says so"
        msg = "%s %s: %s %s (%s): %s (action: %s)" % (name, where, meaning, _window_text(window),
                                                     "last %s" % _ago(min(ages)) if ages else "time unknown", said[:300], action)
        out.append(Finding(NAME, name, Status.FAIL, msg, expected="no GPU failure in the kernel log", actual=worst["kind"],
                           data={"kind": worst["kind"], "pci": worst.get("pci"), "gpu": worst.get("gpu")}, action=action))
    return out


def _judge(node: Any, facts: Dict[str, Any], record: Any, window: Optional[float]) -> List[Finding]:
    """One node's Xid findings; record: its preflight.gpus.NodeGpus (None without gpu facts) names the GPUs."""
    name = node.name
    if not facts.get("nvidia"):
        return [Finding(NAME, name, Status.ERROR, "%s: no NVIDIA driver or device found: kernel log not searched for Xid (see the gpu check)" % name)]
    if facts.get("log") is None:
        return [Finding(NAME, name, Status.ERROR, "%s: kernel log not readable, Xid events unknown: %s" % (name, facts.get("log_error") or "no log"),
                        expected="readable kernel log", actual="unreadable")]
    log = facts["log"]
    uptime = facts.get("uptime_s")
    gpus = {_bus_key(g.pci_bus_id): g for g in record.gpus} if record is not None else {}
    groups = _groups(log, uptime, window)
    out, ignored = _xid_findings(name, groups, gpus, window)
    xid_buses: Dict[int, set] = {}
    for key in groups:
        if key[0] == "xid":
            xid_buses.setdefault(key[2], set()).add(key[1])
    out += _nvrm_findings(name, log, uptime, window, record, xid_buses)
    for line in log.get("unparsed") or []:
        out.append(Finding(NAME, name, Status.WARN, "%s: kernel log line with an unreadable Xid code: %.160s" % (name, line),
                           expected="NVRM: Xid (PCI:...): CODE, ...", actual=line[:160]))
    if not out:
        covered = ""
        first = log.get("first_ts")
        if first is not None and first > 60 and uptime and (window is None or uptime - first < window):
            # dmesg's ring buffer wrapped, or the journal was rotated: earlier events are not in the log
            covered = "; the log only covers the last %s" % _ago(uptime - first).replace(" ago", "")
        if ignored:
            covered += "; ignored %s (the Fabric Manager guide: no impact)" % ", ".join(ignored)
        out.append(Finding(NAME, name, Status.PASS, "no Xid/SXid %s in %s (%s)%s" % (
            _window_text(window), plural(log.get("lines", 0), "kernel log line"), facts.get("source"), covered)))
    return out


def rule(view: ClusterView) -> List[Finding]:
    window = view.cluster.get("xid_window_s")
    from preflight.gpus import node_gpus  # controller side: not in the node bundle

    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, node_gpus(view, node.name), window))


CHECK = Check(
    name=NAME,
    claim="No GPU or NVSwitch logged a hardware Xid/SXid, or a GPU failure without one (fallen off the bus, failed "
    "probe, GSP firmware hang), in the kernel log since boot (or within cluster.xid_window_s)",
    why="A GPU that logged Xid 79, 48, 74, 94/95 or 119 is off the bus, corrupting memory or wedged: the next job "
    "on it crashes or hangs every rank. A GPU off the bus or with a hung GSP often logs no Xid at all. Application "
    "Xids (13, 31, 43, 45) usually point at the last job's code, unless their text names a hardware Xid as the cause.",
    fix="Act on each finding's action: reset_gpu (drain, then nvidia-smi -r -i N), reboot, or isolate (drain and "
    "open a hardware ticket with nvidia-bug-report.sh); check_app: inspect the job that ran. Make the kernel "
    "log readable (root, or the systemd-journal/adm group) for the check to run.",
    probe=probe,
    rule=rule,
    reads="the kernel log since boot (journalctl -k, else dmesg; shared with ib_errors), /proc/uptime",
    takes="< 1 s (one pass over the log, however long)",
    order=45,
    needs=("gpu",),
    settings=(kernlog.WINDOW,),
)

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
    log         {"lines": int, "first_ts": float|None, "events": [event], "unparsed": [str]} | None
    event = {"kind": "xid"|"sxid", "pci": "0000:44:00"|"0000:c3:00.0", "code": int,
             "detail": str, "device": "nvidia-nvswitch0"|None, "severity": "Fatal"|"Non-fatal"|None,
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
- SXid: "Fatal" FAILs (action reboot: the NVSwitch fabric must be reset with its GPUs), "Non-fatal" WARNs.
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
from preflight.probe import kernlog

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
#: Events are folded on the node per these fields (kernlog.fold).
FOLD_KEY = ("kind", "pci", "code")


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


# ---------------------------------------------------------------------------------------------- rule


def classify(event: Dict[str, Any]) -> Tuple[Status, Optional[str], str]:
    """(status, action, meaning) of one event, from the tables above."""
    code = event["code"]
    if event["kind"] == "sxid":
        if event.get("severity") == "Fatal":
            return Status.FAIL, "reboot", "fatal NVSwitch error"
        if event.get("severity") == "Non-fatal":
            return Status.WARN, None, "non-fatal NVSwitch error"
        return Status.WARN, None, "NVSwitch error of unknown severity"
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


def _bus_key(address: Optional[str]) -> str:
    """00000000:4E:00.0 / 0000:4e:00 / 0000:4e:00.0 -> 0000:4e:00 (Xid lines carry no function)."""
    if not address:
        return "?"
    parts = address.lower().split(":")
    if len(parts) != 3:
        return address.lower()
    return "%s:%s:%s" % (parts[0][-4:].rjust(4, "0"), parts[1], parts[2].split(".")[0])


_ago = kernlog.ago
_window_text = kernlog.window_text


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
    groups: Dict[Tuple[str, str, int], List[Dict[str, Any]]] = {}
    for entry in log.get("events") or []:  # folded on the node (one pci may be written two ways: merged here)
        inside, exact = kernlog.count_in_window(entry, uptime, window)
        if inside:
            groups.setdefault((entry["kind"], _bus_key(entry["pci"]), entry["code"]), []).append(
                dict(entry, inside=inside, exact=exact, age=kernlog.age(uptime, entry.get("last_ts"))))
    out: List[Finding] = []
    for (kind, bus, code), entries in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        last = max(entries, key=lambda e: e.get("last_ts") if e.get("last_ts") is not None else float("-inf"))
        status, action, meaning = classify(last)
        total = sum(e["inside"] for e in entries)
        if kind == "sxid":
            where = "%s (%s)" % (last.get("device") or "NVSwitch", last["pci"])
            label = "SXid %d" % code
        else:
            gpu = gpus.get(bus)
            where = "GPU %d (%s)" % (gpu.index, bus + ".0") if gpu else "GPU at %s (not listed by the driver now)" % bus
            label = "Xid %d" % code
        count = "" if total == 1 else " ×%d%s" % (total, "" if all(e["exact"] for e in entries) else "+")
        ages = [e["age"] for e in entries if e["age"] is not None]
        when = "last %s" % _ago(min(ages)) if ages else "time unknown"
        expected = "no hardware Xid/SXid" if status is Status.FAIL else "no Xid/SXid"
        msg = "%s %s: %s%s %s (%s): %s%s" % (
            name, where, label, count, _window_text(window), when, meaning,
            ("; " + last["detail"][:120]) if last.get("detail") and meaning.lower() not in last["detail"].lower() else "",
        )
        data: Dict[str, Any] = {"kind": kind, "code": code, "pci": bus, "count": total}
        if action:
            msg += " (action: %s)" % action
        out.append(Finding(NAME, name, status, msg, expected=expected, actual="%s%s" % (label, count), data=data,
                           action=action))
    for line in log.get("unparsed") or []:
        out.append(Finding(NAME, name, Status.WARN, "%s: kernel log line with an unreadable Xid code: %.160s" % (name, line),
                           expected="NVRM: Xid (PCI:...): CODE, ...", actual=line[:160]))
    if not out:
        covered = ""
        first = log.get("first_ts")
        if first is not None and first > 60 and uptime and (window is None or uptime - first < window):
            # dmesg's ring buffer wrapped, or the journal was rotated: earlier events are not in the log
            covered = "; the log only covers the last %s" % _ago(uptime - first).replace(" ago", "")
        out.append(Finding(NAME, name, Status.PASS, "no Xid/SXid %s in %s (%s)%s" % (
            _window_text(window), plural(log.get("lines", 0), "kernel log line"), facts.get("source"), covered)))
    return out


def rule(view: ClusterView) -> List[Finding]:
    window = view.cluster.get("xid_window_s")
    from preflight.gpus import node_gpus  # controller side: not in the node bundle

    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, node_gpus(view, node.name), window))


CHECK = Check(
    name=NAME,
    claim="No GPU or NVSwitch logged a hardware Xid/SXid in the kernel log since boot (or within cluster.xid_window_s)",
    why="A GPU that logged Xid 79, 48, 74, 94/95 or 119 is off the bus, corrupting memory or wedged: the next job "
    "on it crashes or hangs every rank. Application Xids (13, 31, 43, 45) usually point at the last job's code.",
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

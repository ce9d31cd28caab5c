"""The xid check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.xid import NAME
from preflight.checks.xid.probe import NVLINK_XIDS
from preflight.common import plural
from preflight.derived.gpus import node_gpus
from preflight.model import ClusterView, Finding, Status, per_gpu_node
from preflight.probe import kernlog, nvrm

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
#: Events are folded on the node per these fields (kernlog.fold).
FOLD_KEY = ("kind", "pci", "code", "severity", "link")
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
    """One node's Xid findings; record: its preflight.derived.gpus.NodeGpus (None without gpu facts) names the GPUs."""
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

    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, node_gpus(view, node.name), window))

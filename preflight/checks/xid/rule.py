"""The xid check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.common import plural
from preflight.model import ClusterView, Finding, Status, per_gpu_node
from preflight.probe import kernlog
from preflight.checks.xid import NAME

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
FOLD_KEY = ("kind", "pci", "code")


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
    from preflight.derived.gpus import node_gpus  # controller side: not in the node bundle

    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, node_gpus(view, node.name), window))

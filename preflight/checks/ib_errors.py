"""ib_errors: no InfiniBand/RoCE port is counting link errors at a rate that breaks or slows a job.

The probe reads every port's error counters from the sysfs tree the RDMA core publishes
(`class/infiniband/<hca>/ports/<n>/counters/`, under the sysfs root the probes honour), twice,
INTERVAL_S apart, and the rule judges the increase as a rate. With `--history`, the counters of the
previous run (kept in its report, in this check's finding data) give a second, longer interval.

Absolute values are never judged: the counters count since the last reboot or `perfquery -R`, and a
healthy node that has run for months carries old errors. A counter stuck at its maximum (the IBTA
PortCounters fields are 4, 8 or 16 bits wide and saturate instead of wrapping) can show no increase
at all: that is a WARN ("clear it"), never a silent pass.

Thresholds: the defaults of NVIDIA NVSentinel's NIC Health Monitor, "Default Counter Configuration" in
docs/configuration/nic-health-monitor.md (github.com/NVIDIA/NVSentinel, commit
07b82dc233ce70a4f9a9019c96aa79a12aa05ef3):

    link_downed, excessive_buffer_overrun_errors, local_link_integrity_errors   any increase: fatal
    symbol_error                                     > 120 / hour: fatal (the IBTA BER bound, 10^-12)
    symbol_error                                     > 10 / second: degradation
    link_error_recovery                              > 5 / minute: degradation
    port_rcv_errors                                  > 10 / second: degradation
    port_xmit_discards                               > 100 / second: degradation

Link flaps in the kernel log: on a node with HCAs the probe also searches this boot's kernel log (the reader
xid uses, preflight.probe.kernlog: read once per probe run) for the lines the drivers print when a port's link
changes, so a flap since boot is seen even when it is over before the probe reads the counters:

    mlx5_core 0000:08:00.0 mlx5_0: Port: 1 Link DOWN         ib_core cache.c, "IB/cache: Add log messages for IB
    mlx5_core 0000:08:00.0 mlx5_0: Port: 1 Link ACTIVE         device state changes" (linux-rdma, Feb 2025, Linux 6.15)
    mlx5_core 0000:19:00.0 ens1f0np0: Link down               mlx5e_update_carrier, en_main.c (RoCE/Ethernet netdev)
    mlx5_core 0000:19:00.0: Port module event: module 0, Cable unplugged          mlx5 core events.c port_module
    mlx5_core 0000:19:00.0: Port module event[error]: module 0, Error condition, High Temperature

The PCI address names the HCA through sysfs (class/infiniband/<hca>/device links to the PCI function; each mlx5
function is one port). A flap is a DOWN/down line for a port the log had shown up (ACTIVE/up) before it: ports
that come up at boot print DOWN/INIT first, which is not a flap. "Cable unplugged" counts as a flap; a module
error event FAILs. Only lines inside ``cluster.xid_window_s`` (the same kernel-log window as xid; default:
since boot) are judged: a port that flapped FLAP_FAIL or more times FAILs (action isolate), fewer WARN (the
flap may have been a switch reboot). A log that cannot be read is said in the finding (counters only); it is
not an ERROR here, xid reports the unreadable log on GPU nodes.

Rule decisions (fatal → FAIL with action `isolate`, degradation → WARN):
- during the probe's interval: any fatal increase, or a degradation rate above its threshold. A
  link_downed increase is a link flap and is named as one.
- since the previous run (`--history`): symbol_error above 120/hour FAILs; increases of the fatal
  counters WARN (an event in the past, e.g. a switch reboot, is evidence, not proof); a counter lower
  than before means it was cleared (reboot, perfquery -R) and is not compared.
- saturated counters WARN; no HCA: SKIP; a probe that could not read the counters: ERROR.

Facts: {"interval_s": float, "at": unix time of the second read,
        "ports": [{"hca", "port", "link_layer", "state", "before": {counter: int|None}, "after": {...}}],
        "hca_pci": {hca: "0000:19:00.0"|None}, "uptime_s": float|None,
        "kernel_log": {"source": "journalctl"|"dmesg"|None, "error": str|None, "lines": int, "first_ts": float|None,
                       "events": [{"kind": "ib_port"|"netdev"|"module", "pci", "hca": str|None, "netdev": str|None,
                                   "port": int|None, "state": "DOWN"|"ACTIVE"|"down"|"up"|"Cable unplugged"|...,
                                   "error": str|None, "after_up": bool, "line": str, "count": int,
                                   "first_ts": float|None, "last_ts": float|None, "recent": [float|None]}]}}
        events are folded on the node (preflight.probe.kernlog.fold) per every field but the stamps and
        the line: the line is the last one's; after_up says the port had been seen up (ACTIVE/up/Cable
        plugged) before this change, so a DOWN is a flap (the node reads the log in order; a fold does
        not keep it)
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, probe_error
from preflight.probe import kernlog

NAME = "ib_errors"
INTERVAL_S = 1.0
SOURCE = "NVIDIA NVSentinel nic-health-monitor defaults"

#: Width in bits of each IBTA PortCounters field (IBA spec vol. 1, PortCounters attribute): the value
#: a saturated counter stops at is 2**bits - 1.
WIDTH_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
COUNTERS = tuple(WIDTH_BITS)
#: Any increase fails (NVSentinel: thresholdType delta, threshold 0, fatal).
FATAL = ("link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors")
#: Increase per second above which a port is degraded (NVSentinel velocity thresholds, non-fatal).
DEGRADED_PER_S = {
    "symbol_error": 10.0,
    "link_error_recovery": 5.0 / 60.0,
    "port_rcv_errors": 10.0,
    "port_xmit_discards": 100.0,
}
#: symbol_error above this rate over a long interval violates the IBTA bit-error-rate bound: fatal.
SYMBOL_FATAL_PER_H = 120.0
_INT = re.compile(r"^\d+$")
NO_PMA = "N/A (no PMA)"
#: A port that went down this many times inside the kernel-log window FAILs (fewer: WARN).
FLAP_FAIL = 3
_BDF = r"([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
#: ib_core (drivers/infiniband/core/cache.c): "<driver> <pci> <ibdev>: Port: <n> Link <state>"
_IB_PORT = re.compile(r"^(\S+) %s (\S+): Port: (\d+) Link ([A-Z_]+)\s*$" % _BDF)
#: mlx5e_update_carrier: "mlx5_core <pci> <netdev>: Link up|down"
_NETDEV = re.compile(r"^mlx5_core %s (\S+): Link (up|down)\s*$" % _BDF)
#: mlx5 events.c port_module: "mlx5_core <pci>: Port module event[error]: module <n>, <status>[, <error>]"
_MODULE = re.compile(r"^mlx5_core %s: Port module event(\[error\])?: module (\d+), ([^,]+?)(?:, (.+?))?\s*$" % _BDF)
_UP = ("ACTIVE", "up", "Cable plugged")
_DOWN = ("DOWN", "down", "Cable unplugged")
#: The lines the parser reads (kernlog.lines_with): every other line is only counted.
_LITERALS = ("Link", "Port module event")
#: Link events are folded on the node per these fields (kernlog.fold).
FOLD_KEY = ("kind", "pci", "hca", "netdev", "port", "state", "error", "after_up")


# ----------------------------------------------------------------------------------------------- parse


def parse_counter(text: Optional[str], name: str) -> Optional[int]:
    """One counters/<name> file's text → its value, or None when unavailable.

    "N/A (no PMA)" (what the kernel's show_pma_counter in drivers/infiniband/core/sysfs.c prints for a
    device without a performance-management agent) and an absent file read as None: unavailable, never a
    fabricated 0. Any other value that is not a non-negative integer raises ParseError naming the counter.
    """
    value = None if text is None else text.strip()
    if value is None or value == NO_PMA:
        return None
    if not _INT.match(value):
        raise ParseError("counters/%s: expected a non-negative integer or %r, got %.40r" % (name, NO_PMA, text))
    return int(value)


def counters_from(files: Mapping[str, Optional[str]]) -> Dict[str, Optional[int]]:
    """{counter file name: its text (None = absent)} → {error counter: value or None}, for COUNTERS."""
    return {name: parse_counter(files.get(name), name) for name in COUNTERS}


def saturated(name: str, value: Optional[int]) -> bool:
    bits = WIDTH_BITS.get(name)
    return bits is not None and value is not None and value >= (1 << bits) - 1


def parse_link_events(text: str, source: str = "journalctl", hca_pci: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, Any]:
    """The HCA link changes in `journalctl -k -b 0 -o short-monotonic` or `dmesg` output (formats: module doc).

    {"lines": message lines read, "first_ts": the oldest stamp, "events": [folded event]} with events in
    order of first appearance; a journalctl line without its stamp or "HOST IDENT:" raises ParseError
    naming the line. hca_pci ({hca: its PCI function}) names the port of a line that gives only the PCI
    address (netdev and module lines), so that its after_up follows the same port as its ib_core lines.
    """
    lines, first_ts = kernlog.survey(text, source)
    by_pci = {pci: hca for hca, pci in (hca_pci or {}).items() if pci}
    up: Dict[Tuple[str, int], bool] = {}

    def events() -> Iterator[Dict[str, Any]]:
        for ts, body in kernlog.lines_with(text, source, _LITERALS):
            event = _link_event(body.strip())
            if event is None:
                continue
            key = (port_name(event, by_pci), int(event.get("port") or 1))
            event.update(ts=ts, line=body.strip()[:200], after_up=False)
            if event["kind"] == "module" and event["error"]:
                pass
            elif event["state"] in _UP:
                up[key] = True
            elif event["state"] in _DOWN:
                event["after_up"] = up.get(key, False)
                up[key] = False
            yield event

    return {"lines": lines, "first_ts": first_ts, "events": kernlog.fold(events(), FOLD_KEY)}


def port_name(event: Mapping[str, Any], by_pci: Mapping[str, str]) -> str:
    """The HCA a link event is about: its ib device, else the one on its PCI function, else the address."""
    return event.get("hca") or by_pci.get(event.get("pci")) or "HCA at %s" % event.get("pci")


def _link_event(body: str) -> Optional[Dict[str, Any]]:
    if "Link" not in body and "Port module event" not in body:
        return None
    m = _IB_PORT.match(body)
    if m:
        return {"kind": "ib_port", "pci": m.group(2).lower(), "hca": m.group(3), "netdev": None,
                "port": int(m.group(4)), "state": m.group(5), "error": None}
    m = _NETDEV.match(body)
    if m:
        return {"kind": "netdev", "pci": m.group(1).lower(), "hca": None, "netdev": m.group(2), "port": None,
                "state": m.group(3), "error": None}
    m = _MODULE.match(body)
    if m:
        return {"kind": "module", "pci": m.group(1).lower(), "hca": None, "netdev": None, "port": None,
                "state": m.group(4), "error": (m.group(5) or m.group(4)) if m.group(2) else None}
    return None


# ----------------------------------------------------------------------------------------------- probe


def _read_counters(ctx: Any, port_dir: str) -> Dict[str, Optional[int]]:
    cdir = os.path.join(port_dir, "counters")
    return counters_from({name: ctx.read(os.path.join(cdir, name)) for name in COUNTERS})


def probe(ctx: Any) -> Dict[str, Any]:
    """Every port's error counters, read twice interval_s apart (no sleep on a node without HCAs)."""
    root = ctx.sys_path("class", "infiniband")
    interval = float(ctx.config.get("interval_s", INTERVAL_S))
    ports: List[Dict[str, Any]] = []
    for hca in ctx.listdir(root):
        for entry in ctx.listdir(os.path.join(root, hca, "ports")):
            if not entry.isdigit():
                raise ParseError("%s: unexpected port entry %r" % (hca, entry))
            port_dir = os.path.join(root, hca, "ports", entry)
            layer = (ctx.read(os.path.join(port_dir, "link_layer")) or "").strip()
            state = (ctx.read(os.path.join(port_dir, "state")) or "").strip()
            ports.append(
                {
                    "hca": hca,
                    "port": int(entry),
                    "link_layer": {"InfiniBand": "ib", "Ethernet": "roce"}.get(layer, layer or None),
                    "state": state.split(": ", 1)[-1] or None,
                    "dir": port_dir,
                }
            )
    if not ports:
        return {"interval_s": 0.0, "at": time.time(), "ports": []}
    started = time.monotonic()
    for p in ports:
        p["before"] = _read_counters(ctx, p["dir"])
    time.sleep(interval)
    for p in ports:
        p["after"] = _read_counters(ctx, p.pop("dir"))
    facts = {"interval_s": round(time.monotonic() - started, 3), "at": time.time(), "ports": ports}
    facts["hca_pci"] = {hca: _hca_pci(ctx, hca) for hca in sorted({p["hca"] for p in ports})}
    facts["uptime_s"] = kernlog.uptime(ctx)
    klog = kernlog.read(ctx)
    log: Dict[str, Any] = {"source": klog["source"], "error": klog["error"], "lines": 0, "first_ts": None, "events": []}
    if klog["text"] is not None:
        log.update(parse_link_events(klog["text"], klog["source"], facts["hca_pci"]))
    facts["kernel_log"] = log
    return facts


def _hca_pci(ctx: Any, hca: str) -> Optional[str]:
    """The PCI function an HCA sits on: the name of the directory class/infiniband/<hca>/device links to."""
    real = os.path.basename(os.path.realpath(ctx.sys_path("class", "infiniband", hca, "device"))).lower()
    return real if re.match(_BDF + "$", real) else None


# ------------------------------------------------------------------------------------------------ rule


def label(p: Mapping[str, Any]) -> str:
    return "%s:%d" % (p["hca"], p["port"])


def _delta(before: Mapping[str, Any], after: Mapping[str, Any], name: str) -> Optional[int]:
    a, b = before.get(name), after.get(name)
    if a is None or b is None or b < a:
        return None
    return b - a


def _rate_text(per_s: float) -> str:
    if per_s >= 1:
        return "%.3g/s" % per_s
    if per_s * 60 >= 1:
        return "%.3g/min" % (per_s * 60)
    return "%.3g/h" % (per_s * 3600)


def judge_interval(before: Mapping[str, Any], after: Mapping[str, Any], seconds: float) -> List[Tuple[Status, str]]:
    """(status, what) for the increases over one probe interval. Pure."""
    out: List[Tuple[Status, str]] = []
    for name in FATAL:
        d = _delta(before, after, name)
        if d:
            what = "link went down %d time%s (link flap)" % (d, "" if d == 1 else "s") if name == "link_downed" else (
                "%s +%d" % (name, d)
            )
            out.append((Status.FAIL, "%s in %gs (any increase is fatal)" % (what, seconds)))
    for name, limit in DEGRADED_PER_S.items():
        d = _delta(before, after, name)
        if d and seconds > 0 and d / seconds > limit:
            out.append((Status.WARN, "%s +%d in %gs = %s (threshold %s)" % (name, d, seconds, _rate_text(d / seconds), _rate_text(limit))))
    return out


def judge_since(previous: Mapping[str, Any], now: Mapping[str, Any], seconds: float, since: str) -> List[Tuple[Status, str]]:
    """(status, what) for the increases since the previous run, `seconds` ago. Pure."""
    out: List[Tuple[Status, str]] = []
    if seconds <= 0:
        return out
    cleared = [n for n in COUNTERS if previous.get(n) is not None and now.get(n) is not None and now[n] < previous[n]]
    if cleared:
        return out  # cleared since (reboot or perfquery -R): nothing to compare
    d = _delta(previous, now, "symbol_error")
    if d and d * 3600.0 / seconds > SYMBOL_FATAL_PER_H:
        out.append(
            (
                Status.FAIL,
                "symbol_error +%d since %s = %.3g/h (above %g/h, the IBTA bit-error-rate bound)"
                % (d, since, d * 3600.0 / seconds, SYMBOL_FATAL_PER_H),
            )
        )
    for name in FATAL:
        d = _delta(previous, now, name)
        if d:
            what = "link went down %d time%s" % (d, "" if d == 1 else "s") if name == "link_downed" else "%s +%d" % (name, d)
            out.append((Status.WARN, "%s since %s" % (what, since)))
    return out


def _previous_counters(view: ClusterView, node: str) -> Tuple[Optional[Dict[str, Any]], Optional[float], Optional[str]]:
    """({port: counters}, unix time, started_at) this check recorded for the node in the previous run."""
    prev = view.cluster.get("previous") or {}
    for result in prev.get("results") or []:
        data = result.get("data") or {}
        if result.get("check") == NAME and result.get("node") == node and isinstance(data.get("counters"), dict):
            return data["counters"], data.get("at"), prev.get("started_at")
    return None, None, None


def judge_log(facts: Mapping[str, Any], window: Optional[float]) -> Tuple[List[Tuple[str, Status, str]], Dict[str, int], str]:
    """([(where, status, what)], {port label: flaps}, note on what was searched) from the kernel log's link
    events inside the window. Pure."""
    log = facts.get("kernel_log")
    if not isinstance(log, dict) or log.get("source") is None:
        why = (log or {}).get("error") if isinstance(log, dict) else "not in the probe's facts"
        return [], {}, "kernel log not read (%s): link flaps %s not checked" % (why or "no log", kernlog.window_text(window))
    by_pci = {pci: hca for hca, pci in (facts.get("hca_pci") or {}).items() if pci}
    uptime = facts.get("uptime_s")
    flaps: Dict[Tuple[str, int], Dict[str, List[Dict[str, Any]]]] = {}
    errors: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for entry in log.get("events") or []:  # folded on the node (kernlog.fold)
        key = (port_name(entry, by_pci), int(entry.get("port") or 1))
        inside, _exact = kernlog.count_in_window(entry, uptime, window)
        if not inside:
            continue
        entry = dict(entry, inside=inside)
        if entry.get("kind") == "module" and entry.get("error"):
            errors.setdefault(key, []).append(entry)
        elif entry.get("state") in _DOWN and (entry.get("after_up") or entry.get("state") == "Cable unplugged"):
            # a port coming up at boot logs DOWN first: only a port seen up before can flap (an unplug always counts)
            flaps.setdefault(key, {}).setdefault(entry["kind"], []).append(entry)
    out: List[Tuple[str, Status, str]] = []
    counts: Dict[str, int] = {}
    when = kernlog.window_text(window)
    for key in sorted(set(flaps) | set(errors)):
        where = "%s port %d" % key
        kinds = flaps.get(key) or {}
        if kinds:
            # one flap prints a line per layer (ib_core, the netdev, the module): count the layer with most
            count = max(sum(e["inside"] for e in events) for events in kinds.values())
            last = max((e for events in kinds.values() for e in events), key=lambda e: e.get("last_ts") or 0.0)
            counts["%s:%d" % key] = count
            status = Status.FAIL if count >= FLAP_FAIL else Status.WARN
            out.append((where, status, "link went down %s %s in the kernel log (last %s: %s)%s" % (
                plural(count, "time"), when, kernlog.ago(kernlog.age(uptime, last.get("last_ts"))), last.get("line"),
                "" if status is Status.FAIL else "; %d or more fail" % FLAP_FAIL)))
        for event in errors.get(key) or []:
            out.append((where, Status.FAIL, "transceiver module error%s %s in the kernel log (%s: %s)" % (
                " ×%d" % event["inside"] if event["inside"] > 1 else "", when,
                kernlog.ago(kernlog.age(uptime, event.get("last_ts"))), event.get("line"))))
    note = "no link flap %s in %s (%s)" % (when, plural(log.get("lines") or 0, "kernel log line"), log["source"])
    return out, counts, note


def _node(view: ClusterView, name: str, facts: Dict[str, Any]) -> Finding:
    ports = facts["ports"]
    seconds = float(facts.get("interval_s") or 0.0)
    prev, prev_at, prev_started = _previous_counters(view, name)
    problems: List[Tuple[Status, str]] = []
    for p in ports:
        where = "%s %s port %d" % (name, p["hca"], p["port"])
        found = judge_interval(p["before"], p["after"], seconds)
        old = (prev or {}).get(label(p))
        if old and prev_at is not None and facts.get("at") is not None:
            found += judge_since(old, p["after"], float(facts["at"]) - float(prev_at), "the last run (%s)" % (prev_started or "?"))
        missing = [n for n in ("symbol_error", "link_downed", "port_rcv_errors") if p["after"].get(n) is None]
        if missing:
            found.append((Status.WARN, "error counters unavailable (%s): the link cannot be judged" % ", ".join(missing)))
        full = [n for n in COUNTERS if saturated(n, p["after"].get(n))]
        if full:
            found.append(
                (
                    Status.WARN,
                    "%s saturated at %s: increases can no longer be seen (clear with perfquery -R)"
                    % (", ".join(full), ", ".join(str(p["after"][n]) for n in full)),
                )
            )
        problems.extend((status, "%s: %s" % (where, what)) for status, what in found)
    flapped, flaps, note = judge_log(facts, view.cluster.get("xid_window_s"))
    problems.extend((status, "%s %s: %s" % (name, where, what)) for where, status, what in flapped)
    data = {"counters": {label(p): p["after"] for p in ports}, "at": facts.get("at"), "interval_s": seconds, "flaps": flaps}
    if not problems:
        basis = "over %gs" % seconds + (" and since the last run" if prev else "")
        return Finding(
            NAME,
            name,
            Status.PASS,
            "%d port%s, no error counter rising %s; %s" % (len(ports), "" if len(ports) == 1 else "s", basis, note),
            data=data,
        )
    worst = max((s for s, _ in problems), key=lambda s: s.rank)
    return Finding(
        NAME,
        name,
        worst,
        "; ".join(m for _, m in sorted(problems, key=lambda sm: -sm[0].rank)),
        expected="no error counter rising (%s)" % SOURCE,
        data=data,
        action="isolate" if worst is Status.FAIL else None,
    )


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    valid: Dict[str, Dict[str, Any]] = {}
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("ports", "port list"))
        if err:
            out.append(err)
        else:
            valid[name] = facts
    for name, facts in valid.items():
        if not facts["ports"]:
            out.append(Finding(NAME, name, Status.SKIP, "no InfiniBand/RoCE HCA"))
        else:
            out.append(_node(view, name, facts))
    return out


CHECK = Check(
    name=NAME,
    claim="No InfiniBand/RoCE port's error counters rise during the probe (or since the last run) above "
    "NVSentinel's thresholds; no link flaps (counters, and the kernel log since boot or within cluster.xid_window_s)",
    why="A port that flaps or counts symbol/receive errors drops or retransmits packets: RDMA transfers "
    "stall, NCCL times out, and one bad cable slows or kills every job that spans the node.",
    fix="Reseat or replace the cable/transceiver on the named port and check the switch side (mlxlink -d DEV "
    "-m -c for BER and FEC, ibdiagnet for the fabric); drain the node until the counters stay flat; clear "
    "saturated counters with perfquery -R.",
    probe=probe,
    rule=rule,
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/counters, read twice; the kernel log (journalctl -k or dmesg, shared with xid)",
    takes="1 s window (none without HCAs)",
    order=65,
    settings=(kernlog.WINDOW,),
)

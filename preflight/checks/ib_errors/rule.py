"""The ib_errors check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.checks.ib_errors import NAME
from preflight.checks.ib_errors.probe import COUNTERS, DOWN, WIDTH_BITS, port_name
from preflight.common import plural
from preflight.model import ClusterView, Finding, Status, probe_error
from preflight.probe import kernlog

SOURCE = "NVIDIA NVSentinel nic-health-monitor defaults"
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
#: A port that went down this many times inside the kernel-log window FAILs (fewer: WARN).
FLAP_FAIL = 3


def saturated(name: str, value: Optional[int]) -> bool:
    bits = WIDTH_BITS.get(name)
    return bits is not None and value is not None and value >= (1 << bits) - 1


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
    data, started = view.previous(NAME, node, "counters")
    return (data["counters"], data.get("at"), started) if data else (None, None, None)


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
        elif entry.get("state") in DOWN and (entry.get("after_up") or entry.get("state") == "Cable unplugged"):
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
        if not facts["ports"] and facts.get("efa"):
            out.append(Finding(NAME, name, Status.SKIP, "only AWS EFA devices (%s): they have no InfiniBand error "
                               "counters (the efa driver publishes hw_counters/); ib_hca and cloud_fabric judge them"
                               % plural(len(facts["efa"]), "device")))
        elif not facts["ports"]:
            out.append(Finding(NAME, name, Status.SKIP, "no InfiniBand/RoCE HCA"))
        else:
            out.append(_node(view, name, facts))
    return out

"""EFA hw_counters judged: which of the efa driver's counters are faults, and their increase since the last reading.

The efa driver publishes two sets (amzn/amzn-drivers kernel/linux/efa/src/efa_verbs.c, EFA_DEFINE_PORT_STATS and
EFA_DEFINE_DEVICE_STATS, filled by efa_fill_port_stats / efa_fill_device_stats):
- ports/1/hw_counters: traffic (tx_/rx_bytes, _pkts, send_/recv_, rdma_read_/rdma_write_ _wrs/_bytes,
  rdma_read_resp_bytes, rdma_write_recv_bytes), retransmissions (retrans_bytes, retrans_pkts: SRD resends
  as part of its normal work) and the error events below;
- hw_counters (the device): the admin queue (submitted_cmds, completed_cmds, cmds_err, no_completion_cmds,
  keep_alive_rcvd) and the verbs calls that failed (alloc_pd_err, create_qp_err, reg_mr_err, ...: a program's
  resource limits, not the device).
Fault counters, as the driver fills them: no_completion_cmds counts admin commands the device never
completed (efa_com.c: "Wait for completion (polling) timeout"): the device stopped answering its driver, FAIL
(reboot: the driver resets the device on load). The others are the device's or the fabric's errors a job
feels, WARN: cmds_err (admin commands completed with an error), rx_drops (received packets dropped),
rdma_read_wr_err / rdma_write_wr_err (RDMA work requests completed in error), retrans_timeout_events,
unresponsive_remote_events, impaired_remote_conn_events (SRD gave up on, or degraded, a connection to a peer:
the fault may be the peer's).
No threshold is documented for any of them (neither the driver nor AWS's EFA guides give one), so a single
reading is never judged: the counters are kept in the finding's data and the increase since the previous run
(preflight --history) is judged, any increase counting. A counter lower than before means the driver was
reloaded (a reboot): nothing to compare.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.common import plural

#: {counter: (status word, what it means)}: "fail" or "warn" on any increase.
FAULTS = {
    "no_completion_cmds": ("fail", "admin commands the device never completed"),
    "cmds_err": ("warn", "admin commands completed with an error"),
    "rx_drops": ("warn", "received packets dropped"),
    "rdma_read_wr_err": ("warn", "RDMA reads completed in error"),
    "rdma_write_wr_err": ("warn", "RDMA writes completed in error"),
    "retrans_timeout_events": ("warn", "retransmission time-outs"),
    "unresponsive_remote_events": ("warn", "peers that stopped answering"),
    "impaired_remote_conn_events": ("warn", "connections to peers degraded"),
}
#: Shown beside the faults so a healthy device's reading says traffic went through it.
TRAFFIC = ("tx_bytes", "rx_bytes")


def kept(counters: Mapping[str, Any]) -> Dict[str, Dict[str, int]]:
    """{device: {counter: value}} of the fault and traffic counters, port and device sets merged: what the finding
    keeps for the next run to compare with."""
    out: Dict[str, Dict[str, int]] = {}
    for dev, sets in counters.items():
        merged = dict((sets or {}).get("device") or {})
        merged.update((sets or {}).get("port") or {})
        out[dev] = {k: v for k, v in merged.items() if k in FAULTS or k in TRAFFIC}
    return out


def previous(view: Any, check: str, node: str) -> Tuple[Optional[Dict[str, Any]], Optional[float], Optional[str]]:
    """({device: counters}, unix time, started_at) the check kept for the node in the previous run, else Nones."""
    data, started = view.previous(check, node, "efa_counters")
    return (data["efa_counters"], data.get("at"), started) if data else (None, None, None)


def judge(now: Mapping[str, Mapping[str, int]], before: Optional[Mapping[str, Any]], since: Optional[str]
          ) -> Tuple[List[Tuple[str, str]], str]:
    """([(status word, what)], what was seen) for one node's EFA devices: each fault counter that grew since
    `before` (the previous run's kept counters, or None). Pure."""
    if not now:
        return [], "hw_counters not published"
    errors = sorted("%s %s %d" % (dev, k, v) for dev, c in now.items() for k, v in c.items() if k in FAULTS and v)
    moved = sum(c.get(k, 0) for c in now.values() for k in TRAFFIC)
    seen = "hw_counters of %s: %s; %s in fault counters since the driver loaded" % (
        plural(len(now), "device"), "%.3g GB moved" % (moved / 1e9), ", ".join(errors[:4]) + (" ..." if len(errors) > 4 else "")
        if errors else "nothing")
    if before is None:
        return [], seen + " (no previous reading to compare with: no threshold is documented for one reading)"
    if any(k in FAULTS and isinstance(before.get(dev, {}).get(k), int) and v < before[dev][k]
           for dev, c in now.items() for k, v in c.items()):
        return [], seen + " (lower than at %s: the driver was reloaded, nothing to compare)" % (since or "the previous run")
    grew: Dict[Tuple[str, str], List[str]] = {}
    for dev, c in sorted(now.items()):
        for k, v in c.items():
            old = (before.get(dev) or {}).get(k)
            if k in FAULTS and isinstance(old, int) and v > old:
                grew.setdefault((FAULTS[k][0], k), []).append("%s +%d" % (dev, v - old))
    problems = [(word, "%s (%s) grew since %s: %s" % (k, FAULTS[k][1], since or "the previous run", ", ".join(devs)))
                for (word, k), devs in sorted(grew.items())]
    return problems, seen + ("" if problems else "; no fault counter grew since %s" % (since or "the previous run"))

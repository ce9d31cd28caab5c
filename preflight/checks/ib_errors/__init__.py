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
- AWS EFA devices (preflight.probe.rdma.is_efa) are not read: they have hw_counters/, not the IBTA counters/, so reading
  them would say "counters unavailable" on every healthy EFA device; a node with only EFA devices SKIPs
  naming them (ib_hca and cloud_fabric judge them).

Facts: {"interval_s": float, "at": unix time of the second read, "efa": [EFA device names, not read],
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

from preflight.model import Check, Setting

NAME = "ib_errors"

#: cluster.xid_window_s, xid's kernel-log window, declared alike here (the catalogue checks that they are)
WINDOW = Setting("xid_window_s", "number", "judge only kernel-log events this recent (default: since boot)",
                 low=1, high=10 * 365 * 86400, unit="seconds")

CHECK = Check(
    name=NAME,
    claim="No InfiniBand/RoCE port's error counters rise during the probe (or since the last run) above "
    "NVSentinel's thresholds; no link flaps (counters, and the kernel log since boot or within cluster.xid_window_s)",
    why="A port that flaps or counts symbol/receive errors drops or retransmits packets: RDMA transfers "
    "stall, NCCL times out, and one bad cable slows or kills every job that spans the node.",
    fix="Reseat or replace the cable/transceiver on the named port and check the switch side (mlxlink -d DEV "
    "-m -c for BER and FEC, ibdiagnet for the fabric); drain the node until the counters stay flat; clear "
    "saturated counters with perfquery -R.",
    action="isolate",
    reads="sysfs class/infiniband/*/ports/*/counters, read twice; the kernel log (journalctl -k or dmesg, shared with xid)",
    takes="1 s window (none without HCAs)",
    order=65,
    settings=(WINDOW,),
)

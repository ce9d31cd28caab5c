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

from preflight.model import Check, Setting

NAME = "xid"

#: cluster.xid_window_s, the window xid and ib_errors judge kernel-log events in (default: since boot)
WINDOW = Setting("xid_window_s", "number", "judge only kernel-log events this recent (default: since boot)",
                 low=1, high=10 * 365 * 86400, unit="seconds")

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
    reads="the kernel log since boot (journalctl -k, else dmesg; shared with ib_errors), /proc/uptime",
    takes="< 1 s (one pass over the log, however long)",
    order=45,
    needs=("gpu",),
    settings=(WINDOW,),
)

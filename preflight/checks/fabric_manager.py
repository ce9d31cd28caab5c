"""fabric_manager: on NVSwitch nodes, nvidia-fabricmanager is active, matches the driver, and every GPU joined the fabric.

Applies only where NVSwitches exist (HGX/DGX A100 and H100 baseboards). They are found in sysfs: PCI
functions under ``<sysfs>/bus/pci/devices`` with vendor 0x10de and class 0x068000 (bridge, other).

Facts schema::

    nvswitches       ["0000:05:00.0", ...]              NVSwitch PCI addresses (empty: not an NVSwitch system)
    service          {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed",
                      "Result": "exit-code", "ExecMainCode": "1", "ExecMainStatus": "1",
                      "UnitFileState": "enabled", "NRestarts": "0"} | None  (only on NVSwitch nodes)
    service_error    why the service state could not be read (systemctl missing or failing) | None,
                     on one line (systemctl's output lines joined with " / ")
    fm_version       "550.54.15" | None                 from `nv-fabricmanager --version`
    imex, imex_error the same for nvidia-imex, read only on GPU nodes without an NVSwitch
    driver_version   "550.54.15" | None                 from <sysfs>/module/nvidia/version

The fabric manager version is read from the binary systemd starts (``nv-fabricmanager --version``
prints "Fabric Manager version is : 550.54.15"): it is what must match the loaded kernel module, and it
reads the same on every distribution, where package names (nvidia-fabricmanager-550,
cuda-drivers-fabricmanager-550, nvidia-fabricmanager) and package managers differ. The driver version
is the loaded kernel module's (sysfs), the one fabric manager checks against at start; when sysfs lacks
it the rule falls back to the gpu check's driver_version.

Rule (reads the gpu check's facts for per-GPU fabric state, Hopper+):

- CPU-only node, or no NVSwitch and no GPU reporting fabric state: SKIP with the reason (a node of one
  GPU, e.g. a cloud VM given 1 H100/H200 SXM, says so: the fabric manager is not needed there).
- no NVSwitch PCI function but GPUs reporting fabric state: a GB200/GB300 compute tray (its NVSwitches
  sit in separate switch trays) or a VM whose NVSwitches are not passed through. Every GPU must be
  Completed/Success and the tray's GPUs in one clique and cluster (FAIL otherwise); where a GPU reports a
  non-zero cluster UUID (multi-node NVLink), nvidia-imex must be installed and active (FAIL; WARN when
  its state cannot be read).
- service not installed, or not active: FAIL ("nvidia-fabricmanager is failed (Result=exit-code); NCCL
  init will hang on this node").
- service state unreadable (no systemctl, e.g. in a container): judged by GPU fabric state alone where
  the GPUs report it (PASS noting it), else WARN.
- fabric manager version != driver version: FAIL; version unknown: WARN.
- any GPU whose fabric state is reported and is not Completed/Success: FAIL.
- GB200/GB300 fabric health (nvmlDeviceGetGpuFabricInfoV v3, else v2, health mask and summary, or the XML's
  <fabric><health>; read by the gpu probe, preflight.probe.gpu_health): bandwidth degraded, route
  unhealthy or summary Unhealthy: FAIL isolate; an incorrect configuration (sysguid, chassis serial,
  partition, NVLinks, firmware, location): FAIL fix_config; summary Limited Capacity: WARN (fabric_health).
- a tray in a multi-node NVLink cluster with nvidia-imex active but no IMEX channel under
  /dev/nvidia-caps-imex-channels: FAIL fix_config (CUDA cannot import memory across nodes; the driver
  creates channel0 with NVreg_CreateImexChannel0=1, or nvidia-modprobe -i 0).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node

NAME = "fabric_manager"
UNIT = "nvidia-fabricmanager"
#: The IMEX daemon: multi-node NVLink (GB200/GB300 NVL racks) shares GPU memory across trays through it.
IMEX_UNIT = "nvidia-imex"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "UnitFileState", "NRestarts")
NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS = "0x068000"
HANG = "NCCL init will hang on this node"


# --------------------------------------------------------------------------------------------- probe


def probe(ctx: Any) -> Dict[str, Any]:
    """NVSwitches from sysfs; on NVSwitch nodes, the service state and both versions; on GPU nodes
    without an NVSwitch PCI function (GB200/GB300 trays), the nvidia-imex service state."""
    switches = find_nvswitches(ctx)
    facts: Dict[str, Any] = {
        "nvswitches": switches,
        "service": None,
        "service_error": None,
        "fm_version": None,
        "driver_version": None,
        "imex": None,
        "imex_error": None,
    }
    module = ctx.read(ctx.sys_path("module", "nvidia", "version"))
    facts["driver_version"] = module.strip() if module and module.strip() else None
    if not switches:
        if facts["driver_version"]:
            facts["imex"], facts["imex_error"] = _unit(ctx, IMEX_UNIT)
            # the IMEX channels CUDA opens for multi-node NVLink memory (NVIDIA IMEX guide, "IMEX channels")
            facts["imex_channels"] = [n for n in ctx.listdir(ctx.host_path(IMEX_DIR)) if n.startswith("channel")]
        return facts
    facts["service"], facts["service_error"] = _unit(ctx, UNIT)
    ver = ctx.run(["nv-fabricmanager", "--version"], timeout=15.0)
    if ver.ok:
        facts["fm_version"] = parse_fm_version(ver.stdout + ver.stderr)
    return facts


def _unit(ctx: Any, unit: str) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """(properties, None) or (None, why they could not be read) for one systemd unit."""
    res = ctx.run(["systemctl", "show", unit, "--property=" + ",".join(PROPERTIES)], timeout=15.0)
    if res.rc == 127:
        return None, "systemctl not found"
    if not res.ok:
        return None, service_error(res.stdout, res.stderr, res.rc)
    return parse_systemctl_show(res.stdout), None


def service_error(stdout: str, stderr: str, rc: int) -> str:
    """One line saying why `systemctl show` failed: its output's lines joined with ' / ' (a finding
    message must not carry a raw line break, and systemctl prints two lines in a container)."""
    lines = [line.strip() for line in (stderr or stdout or "").splitlines() if line.strip()]
    return "systemctl show failed (rc %d): %s" % (rc, " / ".join(lines) if lines else "no output")


def find_nvswitches(ctx: Any) -> List[str]:
    """PCI addresses of NVIDIA functions whose class is 0x068000 (NVSwitch on HGX/DGX A100, H100)."""
    root = ctx.sys_path("bus", "pci", "devices")
    found = []
    for bdf in ctx.listdir(root):
        vendor = (ctx.read("%s/%s/vendor" % (root, bdf)) or "").strip().lower()
        klass = (ctx.read("%s/%s/class" % (root, bdf)) or "").strip().lower()
        if vendor == NVIDIA_VENDOR and klass == NVSWITCH_CLASS:
            found.append(bdf)
    return found


# ------------------------------------------------------------------------------------------- parsers


def parse_systemctl_show(text: str) -> Dict[str, str]:
    """{property: value} from `systemctl show UNIT --property=...` (KEY=VALUE lines, any order)."""
    out: Dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.match(r"^[A-Za-z][A-Za-z0-9]*$", key):
            raise ParseError("systemctl show line %d: %r is not KEY=VALUE" % (number, line))
        out[key] = value
    for required in ("LoadState", "ActiveState"):
        if required not in out:
            raise ParseError("systemctl show: no %s in %r" % (required, text[:200]))
    return out


def parse_fm_version(text: str) -> str:
    """'550.54.15' from `nv-fabricmanager --version` ("Fabric Manager version is : 550.54.15")."""
    match = re.search(r"Fabric Manager version is\s*:\s*(\d+\.\d+(?:\.\d+)?)", text)
    if not match:
        raise ParseError("nv-fabricmanager --version: no 'Fabric Manager version is : X' in %r" % text.strip()[:200])
    return match.group(1)


# ---------------------------------------------------------------------------------------------- rule


def _gpu_fabric(record: Any) -> Tuple[List[str], int]:
    """(problems, GPUs reporting Completed/Success) from the gpu check's facts (record: the node's
    preflight.gpus.NodeGpus, None without gpu facts)."""
    if record is None:
        return [], 0
    problems, good = [], 0
    for gpu in record.gpus:
        fabric = gpu.fabric
        if not fabric:
            continue
        if fabric.registered:
            good += 1
            continue
        bus = gpu.pci_bus_id or "?"
        domain, _, rest = bus.partition(":")
        short = "%s:%s" % (domain[-4:], rest) if rest else bus
        problems.append(
            "GPU %s (%s): fabric state %s, status %s (expected Completed/Success)"
            % (gpu.index, short, fabric.state, fabric.status)
        )
    return problems, good


def fabric_health(name: str, record: Any) -> List[Finding]:
    """GB200/GB300 NVLink fabric health (nvmlDeviceGetGpuFabricInfoV's health mask and summary, or the XML's
    <fabric><health>; the gpu probe's health facts): degraded bandwidth, an unhealthy route or an unhealthy
    summary FAIL isolate (NVLinks of the GPU lost: the rack's collectives run at its pace); an incorrect
    configuration FAILs fix_config (the GPU or tray is not where the fabric's configuration says);
    "Limited Capacity" WARNs."""
    out: List[Finding] = []
    for gpu in record.gpus if record is not None else ():
        fh = (gpu.health or {}).get("fabric_health")
        if not fh:
            continue
        wrong = [w for w, on in (("bandwidth degraded", fh.get("degraded_bw")), ("route unhealthy", fh.get("route_unhealthy"))) if on]
        if wrong or fh.get("summary") == "Unhealthy":
            what = ", ".join(wrong) or "summary Unhealthy"
            out.append(Finding(NAME, name, Status.FAIL, "%s: NVLink fabric %s (expected healthy): check the NVLink switch trays "
                               "and cables (nvidia-smi -q -i %s, the switch trays' fabric manager log)" % (gpu.label, what, gpu.index),
                               expected="healthy", actual=what, action="isolate"))
        if fh.get("incorrect_config"):
            out.append(Finding(NAME, name, Status.FAIL, "%s: NVLink fabric configuration incorrect: %s (expected none)" % (
                gpu.label, fh["incorrect_config"]), expected="none", actual=fh["incorrect_config"], action="fix_config"))
        elif not wrong and fh.get("summary") == "Limited Capacity":
            out.append(Finding(NAME, name, Status.WARN, "%s: NVLink fabric health summary Limited Capacity" % gpu.label,
                               expected="Healthy", actual="Limited Capacity"))
    return out


def _node(node: Any, facts: Dict[str, Any], record: Any) -> List[Finding]:
    name = node.name
    switches = facts.get("nvswitches") or []
    if not switches:
        if record is not None and any(g.fabric for g in record.gpus):
            return _tray(node, facts, record)
        if record is not None and len(record.gpus) == 1 and node.gpus_per_node <= 1:
            # a VM given one GPU of an NVSwitch board (cloud 1x H100/H200 SXM): NVML answers Not Supported
            # for its fabric state (leptonai/gpud PR 1140), and one GPU has no peer to reach over NVLink
            return [Finding(NAME, name, Status.SKIP, "one GPU, no NVSwitch visible and no NVLink fabric state "
                            "reported (a single GPU or a VM given one): fabric manager not needed")]
        return [Finding(NAME, name, Status.SKIP, "no NVSwitch on this node (PCIe/NVLink-bridge system): fabric manager not needed")]
    out: List[Finding] = []
    fabric_problems, fabric_good = _gpu_fabric(record)
    service = facts.get("service")
    if service is None:
        why = facts.get("service_error") or "service state not gathered"
        if fabric_good and not fabric_problems:
            note = " (nvidia-fabricmanager state unreadable: %s)" % why
        else:
            out.append(
                Finding(NAME, name, Status.WARN, "cannot verify nvidia-fabricmanager: %s" % why, expected="active", actual="unknown")
            )
            note = ""
    else:
        note = ""
        state = service.get("ActiveState")
        if service.get("LoadState") != "loaded":
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "nvidia-fabricmanager is not installed (LoadState=%s); %s" % (service.get("LoadState"), HANG),
                    expected="loaded, active",
                    actual="LoadState=%s" % service.get("LoadState"),
                )
            )
        elif state != "active":
            detail = "Result=%s" % service.get("Result", "?")
            if service.get("ExecMainStatus") not in (None, "", "0"):
                detail += ", exit status %s" % service["ExecMainStatus"]
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "nvidia-fabricmanager is %s (%s); %s" % (state, detail, HANG),
                    expected="active",
                    actual="%s/%s" % (state, service.get("SubState")),
                )
            )
    fm, driver = facts.get("fm_version"), facts.get("driver_version")
    if not driver and record is not None:
        driver = record.driver_version
    if fm is None:
        if service is not None and service.get("LoadState") == "loaded":
            out.append(
                Finding(NAME, name, Status.WARN, "fabric manager version unknown (nv-fabricmanager --version did not answer)", expected=driver, actual="unknown")
            )
    elif driver and fm != driver:
        out.append(
            Finding(
                NAME,
                name,
                Status.FAIL,
                "fabric manager %s does not match driver %s (expected the same version)" % (fm, driver),
                expected=driver,
                actual=fm,
            )
        )
    for problem in fabric_problems:
        out.append(Finding(NAME, name, Status.FAIL, problem, expected="Completed/Success"))
    out.extend(fabric_health(name, record))
    if not out:
        parts = ["%d NVSwitches" % len(switches)]
        if service is not None:
            parts.append("nvidia-fabricmanager %s (%s)" % (service.get("ActiveState"), service.get("SubState")))
        if fm:
            parts.append("version %s" % fm)
        if fabric_good:
            parts.append("fabric Completed on %d GPUs" % fabric_good)
        out.append(Finding(NAME, name, Status.PASS, ", ".join(parts) + note, actual=fm))
    return out


def _tray(node: Any, facts: Dict[str, Any], record: Any) -> List[Finding]:
    """A GPU node without an NVSwitch PCI function whose GPUs report NVLink fabric state: a GB200/GB300
    compute tray (the NVSwitches sit in separate switch trays, programmed by their own fabric manager).
    Judged here: every GPU registered (Completed/Success), one clique and cluster per tray, and the
    nvidia-imex service that multi-node NVLink memory sharing needs (NVIDIA IMEX guide)."""
    name = node.name
    out: List[Finding] = []
    problems, good = _gpu_fabric(record)
    gpus = [g for g in record.gpus if g.fabric]
    for what, key in (("cliques", "clique_id"), ("clusters", "cluster_uuid")):
        groups: Dict[Any, List[str]] = {}
        for g in gpus:
            value = getattr(g.fabric, key)
            if value is not None:
                groups.setdefault(value, []).append(str(g.index))
        if len(groups) > 1:
            parts = ", ".join("%s (GPU %s)" % (value, ", ".join(idx)) for value, idx in groups.items())
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "GPUs of this tray report different NVLink %s: %s (expected one)" % (what, parts),
                    expected="one",
                    actual=parts,
                )
            )
    multi_node = any(
        (g.fabric.cluster_uuid or "").strip("0-") for g in gpus
    )  # H100 HGX reports an all-zero cluster UUID: NVLink within the node only, no IMEX
    service = facts.get("imex")
    if not multi_node:
        pass
    elif service is None:
        why = facts.get("imex_error") or "service state not gathered"
        out.append(Finding(NAME, name, Status.WARN, "cannot verify nvidia-imex: %s" % why, expected="active", actual="unknown"))
    elif service.get("LoadState") != "loaded":
        out.append(
            Finding(
                NAME,
                name,
                Status.FAIL,
                "nvidia-imex is not installed (LoadState=%s); multi-node NVLink needs it (expected loaded, active)"
                % service.get("LoadState"),
                expected="loaded, active",
                actual="LoadState=%s" % service.get("LoadState"),
            )
        )
    elif service.get("ActiveState") != "active":
        out.append(
            Finding(
                NAME,
                name,
                Status.FAIL,
                "nvidia-imex is %s (Result=%s); multi-node NVLink needs it (expected active)"
                % (service.get("ActiveState"), service.get("Result", "?")),
                expected="active",
                actual="%s/%s" % (service.get("ActiveState"), service.get("SubState")),
            )
        )
    for problem in problems:
        out.append(Finding(NAME, name, Status.FAIL, problem, expected="Completed/Success"))
    out.extend(fabric_health(name, record))
    channels = facts.get("imex_channels")
    if multi_node and channels == [] and (service or {}).get("ActiveState") == "active":
        out.append(Finding(NAME, name, Status.FAIL, "no IMEX channel under %s: CUDA cannot share memory over multi-node "
                           "NVLink (expected channel0: load nvidia with NVreg_CreateImexChannel0=1, or "
                           "nvidia-modprobe -i 0)" % IMEX_DIR, expected="channel0", actual="none", action="fix_config"))
    if not out:
        first = gpus[0].fabric if gpus else None
        if not multi_node:
            msg = "no NVSwitch PCI function visible (fabric managed outside this OS): fabric Completed on %d GPUs" % good
        else:
            msg = "no NVSwitch PCI function (multi-node NVLink tray): fabric Completed on %d GPUs" % good
            if first is not None and first.clique_id is not None:
                msg += ", clique %s" % first.clique_id
            msg += " of cluster %s" % (first.cluster_uuid if first is not None else None)
            msg += ", nvidia-imex %s (%s)" % (service.get("ActiveState"), service.get("SubState"))
        out.append(Finding(NAME, name, Status.PASS, msg))
    return out


def rule(view: ClusterView) -> List[Finding]:
    from preflight.gpus import node_gpus  # controller side: not in the node bundle

    return per_gpu_node(NAME, view, lambda node, facts: _node(node, facts, node_gpus(view, node.name)))


CHECK = Check(
    name=NAME,
    claim="On NVSwitch nodes nvidia-fabricmanager is active, matches the driver version, and every GPU joined the fabric; on GB200/GB300 trays every GPU joined one NVLink clique and nvidia-imex is active",
    why="Without a running, version-matched fabric manager the NVSwitch fabric is never programmed: CUDA init "
    "fails with cudaErrorSystemNotReady or NCCL hangs at init on that node.",
    fix="Install nvidia-fabricmanager of exactly the driver's version, then systemctl enable --now "
    "nvidia-fabricmanager; read journalctl -u nvidia-fabricmanager for the cause of a failure. GB200/GB300 trays: "
    "systemctl enable --now nvidia-imex (with the rack's nodes_config.cfg); a GPU stuck registering points at "
    "the NVLink switch trays' fabric manager; fabric bandwidth degraded or route unhealthy: check the switch trays "
    "and NVLink cables; no IMEX channel: load nvidia with NVreg_CreateImexChannel0=1 (or nvidia-modprobe -i 0).",
    probe=probe,
    rule=rule,
    needs=("gpu",),
    action="fix_config",
    reads="sysfs NVSwitch PCI functions; systemctl show nvidia-fabricmanager (or nvidia-imex on GB200/GB300 trays), "
    "nv-fabricmanager --version, /dev/nvidia-caps-imex-channels",
    takes="< 0.5 s (none on nodes without NVSwitches or NVIDIA driver)",
    order=40,
)

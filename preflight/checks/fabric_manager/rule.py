"""The fabric_manager check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from preflight.checks.fabric_manager import NAME
from preflight.checks.fabric_manager.probe import IMEX_DIR
from preflight.derived.gpus import node_gpus
from preflight.model import ClusterView, Finding, Status, per_gpu_node

HANG = "NCCL init will hang on this node"


def _gpu_fabric(record: Any) -> Tuple[List[str], int]:
    """(problems, GPUs reporting Completed/Success) from the gpu check's facts (record: the node's
    preflight.derived.gpus.NodeGpus, None without gpu facts)."""
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
    """One node's fabric: without NVSwitch a GB200 tray (_tray) or a SKIP; with NVSwitches the service, its
    version against the driver, each GPU's fabric registration and health, else a PASS naming them."""
    name = node.name
    switches = facts.get("nvswitches") or []
    if not switches:
        return _without_nvswitch(node, facts, record)
    fabric_problems, fabric_good = _gpu_fabric(record)
    service = facts.get("service")
    out, note = _service_findings(name, facts, service, bool(fabric_good and not fabric_problems))
    out += _version_findings(name, facts, service, record)
    for problem in fabric_problems:
        out.append(Finding(NAME, name, Status.FAIL, problem, expected="Completed/Success"))
    out.extend(fabric_health(name, record))
    if not out:
        fm = facts.get("fm_version")
        parts = ["%d NVSwitches" % len(switches)]
        if service is not None:
            parts.append("nvidia-fabricmanager %s (%s)" % (service.get("ActiveState"), service.get("SubState")))
        if fm:
            parts.append("version %s" % fm)
        if fabric_good:
            parts.append("fabric Completed on %d GPUs" % fabric_good)
        out.append(Finding(NAME, name, Status.PASS, ", ".join(parts) + note, actual=fm))
    return out


def _without_nvswitch(node: Any, facts: Dict[str, Any], record: Any) -> List[Finding]:
    """A node with no NVSwitch PCI function: a tray of an NVLink rack when its GPUs report fabric state, else
    a SKIP (fabric manager not needed)."""
    if record is not None and any(g.fabric for g in record.gpus):
        return _tray(node, facts, record)
    if record is not None and len(record.gpus) == 1 and node.gpus_per_node <= 1:
        # a VM given one GPU of an NVSwitch board (cloud 1x H100/H200 SXM): NVML answers Not Supported
        # for its fabric state (leptonai/gpud PR 1140), and one GPU has no peer to reach over NVLink
        return [Finding(NAME, node.name, Status.SKIP, "one GPU, no NVSwitch visible and no NVLink fabric state "
                        "reported (a single GPU or a VM given one): fabric manager not needed")]
    return [Finding(NAME, node.name, Status.SKIP, "no NVSwitch on this node (PCIe/NVLink-bridge system): fabric manager not needed")]


def _service_findings(name: str, facts: Dict[str, Any], service: Any, fabric_up: bool) -> Tuple[List[Finding], str]:
    """(findings, a note for the PASS) on nvidia-fabricmanager's unit: not installed or not active FAILs; an
    unreadable state WARNs, or is only noted when every GPU's fabric registered (`fabric_up`)."""
    out: List[Finding] = []
    if service is None:
        why = facts.get("service_error") or "service state not gathered"
        if fabric_up:
            return out, " (nvidia-fabricmanager state unreadable: %s)" % why
        out.append(
            Finding(NAME, name, Status.WARN, "cannot verify nvidia-fabricmanager: %s" % why, expected="active", actual="unknown")
        )
        return out, ""
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
    return out, ""


def _version_findings(name: str, facts: Dict[str, Any], service: Any, record: Any) -> List[Finding]:
    """The fabric manager's version against the driver's: a mismatch FAILs, an installed service whose
    version did not answer WARNs."""
    fm, driver = facts.get("fm_version"), facts.get("driver_version")
    if not driver and record is not None:
        driver = record.driver_version
    if fm is None:
        if service is not None and service.get("LoadState") == "loaded":
            return [
                Finding(NAME, name, Status.WARN, "fabric manager version unknown (nv-fabricmanager --version did not answer)", expected=driver, actual="unknown")
            ]
    elif driver and fm != driver:
        return [
            Finding(
                NAME,
                name,
                Status.FAIL,
                "fabric manager %s does not match driver %s (expected the same version)" % (fm, driver),
                expected=driver,
                actual=fm,
            )
        ]
    return []


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

    return per_gpu_node(NAME, view, lambda node, facts: _node(node, facts, node_gpus(view, node.name)))

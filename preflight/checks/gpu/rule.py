"""The gpu check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Set, Tuple

from preflight.checks.gpu import NAME
from preflight.checks.gpu.probe import ACCESS_VARIABLES, HW_THROTTLE
from preflight.common import fold, majority, plural
from preflight.model import ClusterView, Finding, Status, per_gpu_node
from preflight.probe.gpu_facts import bus12, gpu_label
from preflight.probe.nvml import NVML_TOTAL_S

#: Reasons worth a warning: the driver is cooling the GPU down.
SW_THROTTLE = ("sw_thermal_slowdown",)
#: How nvidia-smi ("Failed to initialize NVML: Driver/library version mismatch") and NVML
#: (NVML_ERROR_LIB_RM_VERSION_MISMATCH, nvmlErrorString) say the loaded kernel module is not the installed driver.
VERSION_MISMATCH = ("Driver/library version mismatch", "NVML/RM version mismatch")


def _link(gen: Any, width: Any) -> str:
    return "Gen%s x%s" % ("?" if gen is None else gen, "?" if width is None else width)


#: NVLinks per GPU by model (product name as NVML / nvidia-smi print it). Sources: NVIDIA H100 Tensor Core
#: GPU datasheet and Hopper architecture whitepaper (H100 SXM5: 18 fourth-generation links, 900 GB/s);
#: H200 datasheet (SXM: 900 GB/s, the same 18 links); A100 datasheet and Ampere whitepaper (A100 SXM4: 12
#: third-generation links, 600 GB/s); Blackwell datasheets (B200 / GB200: 18 fifth-generation links,
#: 1.8 TB/s). PCIe and NVL boards (NVLink bridges, 0-4 links depending on how they are bridged) are not
#: listed: for them only the comparison across the node's GPUs applies.
MODEL_NVLINKS = (
    (re.compile(r"\bH100\b.*(HBM3|SXM)"), 18),
    (re.compile(r"\bH200\b(?!.*\bNVL\b)"), 18),
    (re.compile(r"\bA100-SXM"), 12),
    (re.compile(r"\bG?B[23]00\b(?!.*\bNVL\b)"), 18),
)
#: How a node's NVLinks are judged (nvlink_shape): each SXM GPU against its model's count and the node's
#: other GPUs; only against the node's other GPUs; not at all (one GPU: nothing to link to).
MODEL, PEERS, NO_PEER = "model", "peers", "no_peer"
#: The GPUs of a whole NVLink baseboard: HGX/DGX SXM boards carry 8 GPUs on NVSwitches, or 4 linked directly
#: (HGX A100/H100 4-GPU, DGX Station A100). A node with fewer SXM GPUs than a board is a VM or partition
#: given part of one (cloud 1x/2x/4x H100 and H200): its NVLinks are what the hypervisor or the fabric
#: manager's partition gave it (NVIDIA Fabric Manager user guide, shared NVSwitch and GPU passthrough
#: models; leptonai/gpud PR 1140: NVML answers Not Supported for fabric state on a single-GPU H100/H200 VM).
WHOLE_BOARD, SMALL_BOARD = 8, 4


def nvlink_shape(node_gpus: int, virtual: bool) -> str:
    """How a node of `node_gpus` GPUs (the inventory's or driver's count, not what a job's cgroup shows)
    judges its NVLinks: MODEL on a whole baseboard (8 GPUs, 4 on bare metal), NO_PEER for one GPU, else PEERS."""
    if node_gpus <= 1:
        return NO_PEER
    return MODEL if node_gpus >= WHOLE_BOARD or (node_gpus >= SMALL_BOARD and not virtual) else PEERS


def node_shape(node_gpus: int, facts: Dict[str, Any]) -> str:
    """nvlink_shape for a node whose inventory expects node_gpus and whose gpu facts are `facts`."""
    held = max(node_gpus, facts.get("attached_gpus") or 0, len(facts.get("gpus") or []))
    return nvlink_shape(held, bool(facts.get("virtual")))


def model_nvlinks(name: Optional[str]) -> Optional[int]:
    """How many NVLinks a GPU of this model has (None: not a model with a fixed count)."""
    for pattern, links in MODEL_NVLINKS:
        if name and pattern.search(name):
            return links
    return None


class GpuReference:
    """What the GPUs of every judged node share: the reference a design choice is measured against."""

    def __init__(self, nodes: List[Tuple[Any, Dict[str, Any]]]) -> None:
        self.nodes = nodes
        self.multi_node = len(nodes) > 1
        widths: Dict[Optional[str], List[int]] = {}
        ecc: Dict[Optional[str], List[bool]] = {}
        persistence: List[bool] = []
        self.mig: Dict[str, bool] = {}
        for node, facts in nodes:
            gpus = facts.get("gpus") or []
            for g in gpus:
                pcie = g.get("pcie") or {}
                if pcie.get("width") is not None:
                    widths.setdefault(g.get("name"), []).append(pcie["width"])
                if g.get("ecc_enabled") is not None:
                    ecc.setdefault(g.get("name"), []).append(g["ecc_enabled"])
                if g.get("persistence_mode") is not None:
                    persistence.append(g["persistence_mode"])
            modes = [g.get("mig_enabled") for g in gpus if g.get("mig_enabled") is not None]
            if modes:
                self.mig[node.name] = any(modes)
        self.width = {name: majority(v)[0] for name, v in widths.items()}
        self.ecc = {name: majority(v)[0] for name, v in ecc.items()}
        self.persistence = majority(persistence)[0]

    def mig_others(self, node: str) -> str:
        """'MIG disabled on node[02-03]' for the nodes whose MIG mode differs from this one's ('' if none)."""
        mine = self.mig.get(node)
        other = [n for n, on in self.mig.items() if n != node and on != mine]
        if not other:
            return ""
        return "MIG %s on %s" % ("disabled" if mine else "enabled", fold(other))


def _alone(node: Any, facts: Dict[str, Any]) -> GpuReference:
    return GpuReference([(node, facts)])


def topology_links(topology_facts: Any) -> Set[str]:
    """Bus addresses (0000:18:00.0) of the GPUs whose PCIe link the topology check read from sysfs this run.

    One fact, one owner: topology judges those links (against the device's slot and the fleet, FAIL); gpu
    judges the width nvidia-smi/NVML reports only for GPUs topology did not see (topology not run, its probe
    failed, or no sysfs link attributes), so a narrow link is reported once, not as a WARN here and a FAIL
    there. Coordinated through topology's facts only."""
    if not isinstance(topology_facts, dict) or topology_facts.get("probe_error"):
        return set()
    return {
        bus12(d.get("bdf"))
        for d in topology_facts.get("devices") or []
        if d.get("kind") == "gpu" and (d.get("link") or {}).get("cur_width") is not None
    }


def gpu_problems(
    gpu: Dict[str, Any], node_max_links: int, fleet: Optional[GpuReference] = None, node: str = "",
    topology_seen: Optional[Set[str]] = None, slow_open: bool = False, shape: str = MODEL,
) -> List[Tuple[Any, ...]]:
    """(status, message, expected, actual[, action]) for everything wrong with one GPU. topology_seen: the
    GPUs whose PCIe width the topology check judges (topology_links): their width is not judged here.
    slow_open: NVML measured this node's GPUs initialising on open (persistence off costs time here).
    shape: how the node's NVLinks are judged (nvlink_shape)."""
    label = gpu_label(gpu)
    out: List[Tuple[Any, ...]] = []
    if gpu.get("error"):
        return [(Status.FAIL, "%s: NVML cannot read this GPU: %s" % (label, gpu["error"]), "readable", gpu["error"])]
    for problem in gpu.get("query_errors") or []:
        out.append((Status.FAIL, "%s: %s (expected an answer)" % (label, problem), "an answer", problem))
    for denied in gpu.get("query_denied") or []:
        out.append((Status.WARN, "%s: %s to this user: that fact unknown (run preflight as root)" % (label, denied),
                    "an answer", denied))
    if gpu.get("mig_enabled") and fleet is not None and fleet.multi_node:
        others = fleet.mig_others(node)
        out.append(
            (
                Status.FAIL,
                "%s: MIG mode enabled (expected disabled for a multi-node NCCL job%s)" % (label, "; " + others if others else ""),
                "disabled",
                "enabled",
            )
        )
    vol = gpu.get("ecc_uncorrectable_volatile")
    if vol:
        out.append((Status.FAIL, "%s: %d uncorrectable ECC errors since boot (expected 0)" % (label, vol), "0", str(vol)))
    elif vol is None and gpu.get("ecc_enabled"):
        why = "N/A (MIG mode on)" if gpu.get("mig_enabled") else "unreadable"
        out.append(
            (
                Status.WARN,
                "%s: volatile ECC counters read %s: uncorrectable errors since boot unknown" % (label, why),
                "a count",
                "unknown",
            )
        )
    if gpu.get("remapped_rows_failure"):
        out.append((Status.FAIL, "%s: row remapping failed (expected none): replace the GPU" % label, "no", "yes"))
    if gpu.get("remapped_rows_pending") and not gpu.get("remapped_rows_failure"):
        # NVIDIA (A100/H100 memory error management): a remap pending takes effect at the next GPU reset;
        # until then the row is not used again and the work that runs is unaffected. Reset at convenience.
        out.append((Status.WARN, "%s: row remapping pending (expected none): reset the GPU when it is idle "
                    "(nvidia-smi -r); running work is unaffected" % label, "no", "yes", "reset_gpu"))
    if gpu.get("retired_pages_pending"):
        # pre-Ampere page retirement: the page is retired at the next reset/driver reload (NVIDIA's dynamic
        # page retirement guide); until then it may be used again: drain and reset, no hardware to replace
        out.append((Status.FAIL, "%s: page retirement pending (expected none): reset the GPU" % label, "no", "yes", "reset_gpu"))
    events = gpu.get("clock_events") or []
    hard = [e for e in HW_THROTTLE if e in events]
    if hard:
        active = ", ".join(hard)
        out.append((Status.FAIL, "%s: clocks throttled by %s (expected none active)" % (label, active), "none", active))
    soft = [e for e in SW_THROTTLE if e in events]
    if soft:
        active = ", ".join(soft)
        out.append((Status.WARN, "%s: clocks throttled by %s (expected none active)" % (label, active), "none", active))
    out.extend(_link_problems(gpu, label, node_max_links, shape))
    pcie = gpu.get("pcie") or {}
    width, max_width = pcie.get("width"), pcie.get("max_width")
    owned = bus12(gpu.get("pci_bus_id")) in (topology_seen or set())
    if width is not None and max_width is not None and width < max_width and not owned:
        # A width every GPU of this model in the fleet shares is the platform's (an x8 slot): not a fault
        # of this node. Below that, or below max with no shared width (a tie), the link trained narrow.
        shared = fleet.width.get(gpu.get("name")) if fleet is not None else None
        reference = max_width if shared is None else min(shared, max_width)
        if width < reference:
            actual = _link(pcie.get("gen"), width)
            expected = _link(pcie.get("max_gen"), reference)
            out.append((Status.WARN, "%s: PCIe link %s (expected %s)" % (label, actual, expected), expected, actual))
    if gpu.get("persistence_mode") is False and (fleet is None or fleet.persistence is True or slow_open):
        why = "; GPUs took seconds to open here" if slow_open else ""
        out.append((Status.WARN, "%s: persistence mode off (expected on: nvidia-smi -pm 1 or nvidia-persistenced%s)" % (label, why), "on", "off"))
    if gpu.get("ecc_enabled") is False and (fleet is None or fleet.ecc.get(gpu.get("name")) is True):
        out.append((Status.WARN, "%s: ECC disabled (expected enabled like the fleet's other %s)" % (label, gpu.get("name")), "enabled", "disabled"))
    return out


def _link_problems(gpu: Dict[str, Any], label: str, node_max_links: int, shape: str = MODEL) -> List[Tuple[Any, ...]]:
    links = gpu.get("nvlink")
    if not links or links.get("unreadable") or shape == NO_PEER:
        return []  # unknown, counts incomplete (warned once for the node), or no GPU to link to
    model = model_nvlinks(gpu.get("name")) if shape == MODEL else None
    total = links["active"] + links["inactive"]
    note = "; %s" % links["error"] if links.get("error") else ""
    if model and links["active"] < model:
        actual = "%d/%d" % (links["active"], total or model)
        msg = "%s: %s NVLinks active (expected %d on %s%s)" % (label, actual, model, gpu.get("name"), note)
        return [(Status.FAIL, msg, str(model), actual)]
    if node_max_links and links["active"] < node_max_links:
        actual = "%d/%d" % (links["active"], total)
        msg = "%s: %s NVLinks active (expected %d like the other GPUs%s)" % (label, actual, node_max_links, note)
        return [(Status.FAIL, msg, str(node_max_links), actual)]
    return []


def _notes(gpus: List[Dict[str, Any]], fleet: GpuReference) -> List[str]:
    """What the PASS message says about shared platform choices (not faults, but worth seeing)."""
    notes = []
    seen = set()
    for g in gpus:
        pcie = g.get("pcie") or {}
        name = g.get("name")
        shared = fleet.width.get(name)
        if shared is not None and pcie.get("max_width") and shared < pcie["max_width"] and name not in seen:
            seen.add(name)
            notes.append("PCIe x%d on every %s (max x%d)" % (shared, name, pcie["max_width"]))
    off = [g for g in gpus if g.get("persistence_mode") is False]
    if off:
        notes.append("persistence mode off on %s" % plural(len(off), "GPU"))
    no_ecc = [g for g in gpus if g.get("ecc_enabled") is False]
    if no_ecc:
        notes.append("ECC disabled on %s" % plural(len(no_ecc), "GPU"))
    mig = [g for g in gpus if g.get("mig_enabled")]
    if mig:
        notes.append("MIG enabled on %s" % plural(len(mig), "GPU"))
    return notes


def _node_findings(node: Any, facts: Dict[str, Any], fleet: Optional[GpuReference] = None,
                   topology_facts: Any = None) -> List[Finding]:
    name, expected = node.name, node.gpus_per_node
    fleet = fleet or _alone(node, facts)
    if facts.get("source") is None:
        error = facts.get("error") or "no NVIDIA driver answered"
        msg = "%s (expected %s)" % (error, plural(expected, "GPU"))
        # a driver upgraded under a loaded kernel module: the user-space library no longer matches it, and
        # only reloading the module (a reboot) fixes it; the GPUs are not at fault
        mismatch = any(words in error for words in VERSION_MISMATCH)
        return [Finding(NAME, name, Status.FAIL, msg + ("; reboot to load the installed driver" if mismatch else ""),
                        expected=str(expected), actual="0", action="reboot" if mismatch else None)]
    listed = facts.get("gpus") or []
    gpus = [g for g in listed if not g.get("inaccessible")]
    out: List[Finding] = _access_findings(name, facts, listed, gpus, expected)
    # GPUs the driver counts but NVML did not get to (slow) or may not open here are present, not missing
    present = (facts.get("attached_gpus") or len(listed)) if facts.get("nvml_slow") else len(listed)
    held = _job_gpus(facts)
    if held is not None and len(gpus) == held < expected:
        # a Slurm job holding some GPUs of the node: its cgroup hides the others from nvidia-smi (and from
        # NVML's count on some setups); the GPUs the job holds are all there
        present = expected
    count = dict(expected=str(expected), actual=str(len(gpus)))
    if present < expected:
        attached = facts.get("attached_gpus")
        extra = "" if attached in (None, len(gpus)) else "; the driver reports %d attached" % attached
        out.append(Finding(NAME, name, Status.FAIL, "%s visible (expected %d)%s" % (plural(len(gpus), "GPU"), expected, extra),
                           **count))
    elif present > expected:
        out.append(Finding(NAME, name, Status.WARN, "%s visible (expected %d): update gpus_per_node in the inventory"
                           % (plural(len(gpus), "GPU"), expected), **count))
    unreadable = facts.get("nvlink_unreadable") or []
    if unreadable:
        partial = [gpu_label(g) for g in gpus if (g.get("nvlink") or {}).get("unreadable")]
        out.append(Finding(NAME, name, Status.WARN, "nvidia-smi nvlink --status: %s not understood (%s)%s" % (
            plural(len(unreadable), "line"), "; ".join(unreadable[:3]) + ("; ..." if len(unreadable) > 3 else ""),
            "; NVLink counts of %s are incomplete" % ", ".join(partial) if partial else ""),
            expected="known link lines", actual=unreadable[0]))
    node_max_links = max([g["nvlink"]["active"] for g in gpus if g.get("nvlink")] or [0])
    seen = topology_links(topology_facts)
    slow = bool(facts.get("nvml_open_s") or facts.get("nvml_slow"))
    shape = node_shape(expected, facts)
    for gpu in gpus:
        for problem in gpu_problems(gpu, node_max_links, fleet, name, seen, slow, shape):
            status, msg, exp, act = problem[:4]
            out.append(Finding(NAME, name, status, msg, expected=exp, actual=act, action=problem[4] if len(problem) > 4 else None))
    if not out:
        notes = _notes(gpus, fleet) + _platform_notes(facts, gpus, expected)
        msg = "%s, healthy%s" % (summary(gpus), "; " + "; ".join(notes) if notes else "")
        out.append(Finding(NAME, name, Status.PASS, msg, actual=str(len(gpus))))
    return out


def _access_findings(name: str, facts: Dict[str, Any], listed: List[Dict[str, Any]], usable: List[Dict[str, Any]],
                     node_gpus: int) -> List[Finding]:
    """WARNs for what left GPUs unjudged without any GPU being at fault: NVML slow (not stuck), GPUs this
    process may not open (some or all: the node is not a PASS when part of it went unchecked), a
    controller that shipped no usable pynvml."""
    out = []
    slow = facts.get("nvml_slow")
    if slow:
        unread = (facts.get("attached_gpus") or 0) - len(listed)
        out.append(Finding(NAME, name, Status.WARN, "%s not read: %s" % (plural(unread, "GPU"), slow),
                           expected="NVML answers within %g s" % NVML_TOTAL_S, actual="slow"))
    if listed and not usable:
        out.append(Finding(NAME, name, Status.WARN, "none of the %s is accessible to this process (%s): %s; nothing "
                           "judged: run preflight outside the job or container" % (plural(len(listed), "GPU"),
                                                                                    listed[0]["inaccessible"], _held(facts)),
                           expected="GPUs to judge", actual="0 accessible", action="retest"))
    unchecked = _unchecked(facts, listed, usable, node_gpus)
    if unchecked:
        out.append(Finding(NAME, name, Status.WARN, "%s; %d of %s checked: run preflight where it may open every GPU "
                           "(outside the job or container, or in a job holding the whole node)"
                           % (unchecked, len(usable), plural(max(node_gpus, len(listed)), "GPU")),
                           expected="every GPU checked", actual="%d checked" % len(usable), action="retest"))
    why = facts.get("nvml_error") or ""
    if facts.get("source") == "nvidia-smi" and why.startswith("pynvml"):
        out.append(Finding(NAME, name, Status.WARN, "NVML not used: %s; read with nvidia-smi instead" % why,
                           expected="nvidia-ml-py's pynvml in the bundle", actual="none"))
    return out


def _unchecked(facts: Dict[str, Any], listed: List[Dict[str, Any]], usable: List[Dict[str, Any]], node_gpus: int) -> str:
    """What part of the node this process could not check, and why ('' when it checked every GPU): GPUs
    NVML counts but may not open (NO_PERMISSION: a Slurm cgroup with ConstrainDevices, a container given
    some devices; pynvml's NVMLError_NoPermission, as NVIDIA/nvidia-docker issue 393 shows for a cgroup
    denying 2 of 4 GPUs), or, on the nvidia-smi path inside a Slurm job, the GPUs its cgroup hides."""
    from ClusterShell.RangeSet import RangeSet  # controller side, as preflight.common.fold

    hidden = [g for g in listed if g.get("inaccessible")]
    if hidden and usable:
        return "GPU %s not checked: this process may not open %s (NVML: %s; %s)" % (
            RangeSet.fromlist([str(g["index"]) for g in hidden]), "it" if len(hidden) == 1 else "them",
            hidden[0]["inaccessible"], _held(facts))
    held = _job_gpus(facts)
    if held is not None and not hidden and held == len(usable) < node_gpus:
        return "%d of the node's %s not checked: the job holds %d (%s)" % (
            node_gpus - held, plural(node_gpus, "GPU"), held, _held(facts))
    return ""


def _job_gpus(facts: Dict[str, Any]) -> Optional[int]:
    """How many GPUs the Slurm job this probe ran in holds (SLURM_JOB_GPUS=0,1 -> 2), None outside a job."""
    value = (facts.get("access") or {}).get("SLURM_JOB_GPUS")
    if value is None:
        return None
    return len([v for v in str(value).split(",") if v.strip()])


def _held(facts: Dict[str, Any]) -> str:
    """'a cgroup or container device limit, not a GPU fault; SLURM_JOB_GPUS=0,1; cgroup /...'"""
    access = facts.get("access") or {}
    parts = ["%s=%s" % (k, access[k]) for k in ACCESS_VARIABLES if k in access]
    if access.get("cgroup"):
        parts.append("cgroup %s" % access["cgroup"])
    return "a cgroup or container device limit (Slurm ConstrainDevices, a container's --gpus), not a GPU fault%s" % (
        "; " + ", ".join(parts) if parts else "")


def _platform_notes(facts: Dict[str, Any], usable: List[Dict[str, Any]], node_gpus: int) -> List[str]:
    """PASS-message notes: NVLink a VM or partition was not given (no peer, or part of a baseboard)."""
    shape = node_shape(node_gpus, facts)
    if shape == MODEL or not usable or any((g.get("nvlink") or {}).get("active") != 0 for g in usable):
        return []
    where = "a VM: %s" % facts["virtual"] if facts.get("virtual") else "a VM or a partition of a baseboard"
    if shape == NO_PEER:
        return ["NVLink not judged: one GPU, no peer to link to (%s)" % where]
    return ["no NVLink between the node's %s (%s: NCCL uses PCIe)" % (plural(len(usable), "GPU"), where)]


def summary(gpus: List[Dict[str, Any]]) -> str:
    """'8× NVIDIA H100 80GB HBM3' (models counted in order of first appearance)."""
    counts: Dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.get("name") or "unknown GPU"] = counts.get(gpu.get("name") or "unknown GPU", 0) + 1
    return " + ".join("%d× %s" % (n, model) for model, n in counts.items())


def rule(view: ClusterView) -> List[Finding]:
    judged = []
    for node in view.live:
        facts = view.facts[node.name].get(NAME)
        if node.gpus_per_node and isinstance(facts, dict) and facts.get("source") is not None:
            judged.append((node, facts))
    fleet = GpuReference(judged)
    return per_gpu_node(
        NAME, view, lambda node, facts: _node_findings(node, facts, fleet,
                                                       view.facts[node.name].get("topology"))
    )

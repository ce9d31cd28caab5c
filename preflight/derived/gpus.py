"""A node's GPU facts as a typed record, derived once per cluster view: what rules outside the gpu check read.

Controller side (not shipped to the nodes). The gpu probe writes the facts schema of preflight.probe.gpu_facts;
the xid and fabric_manager rules, the JSON report's hardware section and the all-reduce's bandwidth profile
read node_gpus(view, node) instead of digging in the gpu check's dict, so the schema has one reader to change.
Checks import this module inside their rules (a check module's top level is what the nodes import).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.model import Finding, Status
from preflight.probe.gpu_facts import bus12, short_bus_id


@dataclass(frozen=True)
class GpuFabric:
    """One GPU's NVLink fabric registration (nvmlGpuFabricInfo_t / nvidia-smi's <fabric>, R535+)."""
    state: Optional[str]  # "Completed" | "In Progress" | "Not Started"
    status: Optional[str]  # "Success" | an NVML error string | "N/A"
    clique_id: Optional[int]
    cluster_uuid: Optional[str]

    @property
    def registered(self) -> bool:
        return self.state == "Completed" and self.status == "Success"


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver listed it. `facts` is its entry of the schema above (for the gpu rule)."""
    index: int
    name: Optional[str]
    pci_bus_id: Optional[str]  # as the driver prints it: 00000000:4E:00.0
    uuid: Optional[str]
    serial: Optional[str]
    fabric: Optional[GpuFabric]
    nvlinks_active: Optional[int]  # None: not reported
    facts: Mapping[str, Any]
    health: Optional[Mapping[str, Any]] = None  # preflight.probe.gpu_health's per-GPU entry (None: not read)

    @property
    def label(self) -> str:
        """GPU 3 (0000:5D:00.0)"""
        return "GPU %s (%s)" % (self.index, short_bus_id(self.pci_bus_id))

    @property
    def bus(self) -> str:
        """0000:5d:00.0, the form sysfs and the kernel log use."""
        return bus12(self.pci_bus_id)


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPU facts, typed: what every reader outside the gpu check uses."""
    source: Optional[str]  # "nvml" | "nvidia-smi" | None: no driver answered
    error: Optional[str]
    driver_version: Optional[str]
    cuda_version: Optional[str]
    attached: int
    gpus: Tuple[Gpu, ...]
    health_source: Optional[str] = None  # "nvml" | "nvidia-smi" | None: no health facts
    health_window_s: Optional[float] = None  # seconds between the corrected-error reads (NVML only)
    health_error: Optional[str] = None  # why the health reads stopped (a wedge or slow NVML)

    @classmethod
    def from_facts(cls, facts: Any) -> Optional["NodeGpus"]:
        """The record of one node's gpu facts; None when there are none (probe not run). A probe that
        failed gives a record without GPUs (its error is the gpu check's to report)."""
        if not isinstance(facts, dict):
            return None
        gpus = []
        health = facts.get("health") if isinstance(facts.get("health"), dict) else {}
        by_bus = health.get("gpus") or {}
        for g in facts.get("gpus") or []:
            fab = g.get("fabric")
            links = g.get("nvlink")
            gpus.append(Gpu(
                index=g.get("index"), name=g.get("name"), pci_bus_id=g.get("pci_bus_id"), uuid=g.get("uuid"),
                serial=g.get("serial"),
                fabric=GpuFabric(fab.get("state"), fab.get("status"), fab.get("clique_id"), fab.get("cluster_uuid")) if fab else None,
                nvlinks_active=links.get("active") if links else None,
                facts=g, health=by_bus.get(g.get("pci_bus_id")),
            ))
        return cls(
            source=facts.get("source"), error=facts.get("error") or facts.get("probe_error"),
            driver_version=facts.get("driver_version"), cuda_version=facts.get("cuda_version"),
            attached=int(facts.get("attached_gpus") or 0), gpus=tuple(gpus),
            health_source=health.get("source"), health_window_s=health.get("window_s"),
            health_error=health.get("error"),
        )

    @property
    def max_nvlinks(self) -> int:
        """The most NVLinks active on any of the node's GPUs (0 without NVLink facts)."""
        return max([g.nvlinks_active for g in self.gpus if g.nvlinks_active is not None] or [0])

    def by_bus(self) -> Dict[str, Gpu]:
        """{0000:5d:00.0: GPU}"""
        return {g.bus: g for g in self.gpus}

    def models(self) -> List[str]:
        """The GPU models, in order of first appearance."""
        out: List[str] = []
        for g in self.gpus:
            if g.name and g.name not in out:
                out.append(g.name)
        return out


#: {view: {node: record}}: computed once per cluster view (the view is built once per run and evaluated by
#: every rule), dropped with it.
_RECORDS: "weakref.WeakKeyDictionary[Any, Dict[str, Optional[NodeGpus]]]" = weakref.WeakKeyDictionary()


def node_gpus(view: Any, node: str) -> Optional[NodeGpus]:
    """The typed record of `node`'s gpu facts in this cluster view (None: the gpu probe did not run there)."""
    cache = _RECORDS.setdefault(view, {})
    if node not in cache:
        cache[node] = NodeGpus.from_facts((view.facts.get(node) or {}).get("gpu"))
    return cache[node]


def per_health_node(check: str, view: Any, judge_gpu: Any, summary: Any, report_stopped: bool = True) -> List[Any]:
    """The findings of a check judging the gpu probe's health facts (preflight.probe.gpu_health: gpu_memory,
    gpu_state) on every live GPU node. judge_gpu(gpu, record) gives (status, message, expected, actual,
    action) per problem and (None, note) for what the PASS message should say; summary(record, read GPUs)
    is that PASS message. CPU-only nodes SKIP; a node without health facts, or none of whose GPUs were
    read, is an ERROR naming why (the gpu check reports the cause itself); health reads that stopped part
    way (a wedged or slow NVML) are a WARN beside what was read, from the one check passing report_stopped."""

    out: List[Any] = []
    for node in view.live:
        if node.gpus_per_node == 0:
            out.append(Finding(check, node.name, Status.SKIP, "CPU-only node (gpus_per_node: 0)"))
            continue
        record = node_gpus(view, node.name)
        read = [g for g in record.gpus if g.health] if record is not None else []
        if record is None or record.source is None or record.health_source is None or not read:
            why = "the gpu probe did not run" if record is None else (
                record.error or record.health_error or "the gpu probe read no health facts")
            out.append(Finding(check, node.name, Status.ERROR, "GPU health not read: %s (see the gpu check)" % why,
                               expected="GPU health facts", actual="none", action="retest"))
            continue
        if record.health_error and report_stopped:
            out.append(Finding(check, node.name, Status.WARN, "GPU health reads stopped: %s" % record.health_error,
                               expected="every GPU read", actual="partial"))
        found: List[Any] = []
        notes: List[str] = []
        for gpu in record.gpus:
            for item in judge_gpu(gpu, record):
                if item[0] is None:
                    notes += [item[1]] if item[1] not in notes else []
                else:
                    status, msg, exp, act, action = item
                    found.append(Finding(check, node.name, status, msg, expected=exp, actual=act, action=action))
        hidden = [str(g.index) for g in record.gpus if g.facts.get("inaccessible")]
        if hidden:  # the gpu check's WARN names why; a PASS here must not read as the whole node checked
            from ClusterShell.RangeSet import RangeSet

            notes.append("GPU %s not read: this process may not open %s (see the gpu check)" % (
                RangeSet.fromlist(hidden), "it" if len(hidden) == 1 else "them"))
        if not found:
            found.append(Finding(check, node.name, Status.PASS, summary(record, read) + ("; " + "; ".join(notes) if notes else "")))
        out.extend(found)
    return out

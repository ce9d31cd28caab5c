"""The gpu probe's facts: their schema, the constructors both sources share, and the typed record rules read.

Standard library only, Python 3.8 compatible: the constructors run on the node (NVML and nvidia-smi
produce the same schema through them); the record (NodeGpus, read with node_gpus(view, node)) is what the
rules of other checks (xid, fabric_manager) and the controller (report, all-reduce profile) read instead
of digging in the gpu check's dict. It lives here, not in checks/gpu.py, because no check imports another.

Facts schema (both sources produce the same one)::

    source          "nvml" | "nvidia-smi" | None (no driver answered)
    error           why no source worked (None when one did)
    nvml_error      why NVML was not used, or the wedge that stopped it (None when it answered)
    driver_version  "550.54.15" | None
    cuda_version    "12.4" | None          (CUDA version the driver supports)
    attached_gpus   int                    (what the driver reports; may exceed len(gpus))
    gpus            [gpu, ...] in nvidia-smi index order (PCI bus order)
    nvlink_unreadable ["line 7: 'Link 5: ...'", ...]  (nvidia-smi path only: lines not understood)

    gpu = {
      index int, name str, pci_bus_id "00000000:4E:00.0", uuid str, serial str|None,
      persistence_mode bool|None, mig_enabled bool|None, mig_pending bool|None,
      ecc_enabled bool|None, ecc_pending bool|None,
      ecc_uncorrectable_volatile int|None, ecc_uncorrectable_aggregate int|None,
                                                        (sram/dram *_uncorrectable, or the legacy
                                                         double_bit total of Pascal-era drivers)
      retired_pages_pending bool|None,                  (pre-Ampere page retirement)
      remapped_rows_pending bool|None, remapped_rows_failure bool|None,  (Ampere+ row remapping)
      pcie {gen, max_gen, width, max_width: int|None},
      clock_events [active reason names]|None,          (gpu_idle, sw_power_cap, hw_slowdown,
                                                         hw_thermal_slowdown, sw_thermal_slowdown,
                                                         hw_power_brake_slowdown, ...)
      nvlink {active int, inactive int, [error str], [unreadable int]}|None,
                                                        (None: not reported; error: the driver's message
                                                         instead of links, "all links are inActive" or
                                                         NVML's error at link 0)
      fabric {state "Completed"|"In Progress"|"Not Started", status "Success"|...,
              clique_id int|None, cluster_uuid str|None}|None,  (R535+; None: not supported)
      query_errors [str],                               (NVML queries that failed with anything but
                                                         NotSupported / FunctionNotFound)
      error str|None                                     (NVML could not read this GPU at all, or a
                                                         call on it did not return)
    }

"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple


def no_gpu_facts(error: str, nvml_error: Optional[str]) -> Dict[str, Any]:
    return {
        "source": None,
        "error": error,
        "nvml_error": nvml_error,
        "driver_version": None,
        "cuda_version": None,
        "attached_gpus": 0,
        "gpus": [],
    }


def empty_gpu(index: int, error: Optional[str] = None) -> Dict[str, Any]:
    return {
        "index": index,
        "name": None,
        "pci_bus_id": None,
        "uuid": None,
        "serial": None,
        "persistence_mode": None,
        "mig_enabled": None,
        "mig_pending": None,
        "ecc_enabled": None,
        "ecc_pending": None,
        "ecc_uncorrectable_volatile": None,
        "ecc_uncorrectable_aggregate": None,
        "retired_pages_pending": None,
        "remapped_rows_pending": None,
        "remapped_rows_failure": None,
        "pcie": {"gen": None, "max_gen": None, "width": None, "max_width": None},
        "clock_events": None,
        "nvlink": None,
        "fabric": None,
        "query_errors": [],
        "error": error,
    }


def short_bus_id(bus_id: Optional[str]) -> str:
    """00000000:4E:00.0 -> 0000:4E:00.0 (the form lspci and sysfs use)."""
    if not bus_id:
        return "?"
    domain, _, rest = bus_id.partition(":")
    return "%s:%s" % (domain[-4:].rjust(4, "0"), rest) if rest else bus_id


def gpu_label(gpu: Dict[str, Any]) -> str:
    return "GPU %d (%s)" % (gpu["index"], short_bus_id(gpu.get("pci_bus_id")))


def bus12(address: Any) -> str:
    """00000000:4E:00.0 / 0000:4e:00.0 -> 0000:4e:00.0."""
    return str(address or "").lower()[-12:]



# ------------------------------------------------------------------------------ the record rules read


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

    @classmethod
    def from_facts(cls, facts: Any) -> Optional["NodeGpus"]:
        """The record of one node's gpu facts; None when there are none (probe not run). A probe that
        failed gives a record without GPUs (its error is the gpu check's to report)."""
        if not isinstance(facts, dict):
            return None
        gpus = []
        for g in facts.get("gpus") or []:
            fab = g.get("fabric")
            links = g.get("nvlink")
            gpus.append(Gpu(
                index=g.get("index"), name=g.get("name"), pci_bus_id=g.get("pci_bus_id"), uuid=g.get("uuid"),
                serial=g.get("serial"),
                fabric=GpuFabric(fab.get("state"), fab.get("status"), fab.get("clique_id"), fab.get("cluster_uuid")) if fab else None,
                nvlinks_active=links.get("active") if links else None,
                facts=g,
            ))
        return cls(
            source=facts.get("source"), error=facts.get("error") or facts.get("probe_error"),
            driver_version=facts.get("driver_version"), cuda_version=facts.get("cuda_version"),
            attached=int(facts.get("attached_gpus") or 0), gpus=tuple(gpus),
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

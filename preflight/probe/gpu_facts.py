"""The gpu probe's facts: their schema and the constructors both sources (NVML, nvidia-smi) share.

Standard library only, Python 3.8 compatible: runs on the node. On the controller, other checks and outputs
read these facts through the typed record in preflight.derived.gpus (node_gpus(view, node)), never the raw dict.

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
                                                         NotSupported / FunctionNotFound / NoPermission)
      [query_denied [str]],                             (NVML queries this user may not make)
      [inaccessible str],                               (NVML: NO_PERMISSION opening the GPU: a cgroup
                                                         or container keeps it from this process)
      [virtualization "Pass-Through"|"VGPU"],           (the driver runs in a VM: its GPU virtualization
                                                         mode; absent on bare metal and hypervisor hosts)
      error str|None                                     (NVML could not read this GPU at all, or a
                                                         call on it did not return)
    }

"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional


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


def guest_mode(facts: Dict[str, Any]) -> Optional[str]:
    """Why the driver says this node is a VM (a GPU in Pass-Through or vGPU mode), or None."""
    modes = [g["virtualization"] for g in facts.get("gpus") or [] if g.get("virtualization")]
    return "GPU virtualization mode %s" % modes[0] if modes else None


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

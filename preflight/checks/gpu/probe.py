"""The gpu check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os

from preflight.probe.gpu_facts import guest_mode, no_gpu_facts
from preflight.probe.gpu_health import health_from_nvml, parse_health_xml
from preflight.probe.gpu_nvml import facts_from_nvml, wedged_facts
# parse_nvlink_status is not called here: it is imported as this check's parser, the one tests/fixtures/gpu/*.nvlink.json name
from preflight.probe.nvidia_smi import (  # noqa: F401
    clock_events_by_bus, merge_nvlink, parse_nvidia_smi_xml, parse_nvlink_status, read_nvlink_status)
from preflight.probe.nvml import NvmlSlow, NvmlWedged, bounded_nvml, load_nvml, nvml_shutdown, nvml_wedged
from preflight.probe.pci import hypervisor

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict

#: Clock event reasons that cut clocks hard enough to make this GPU the straggler: FAIL.
HW_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def probe(ctx: Any) -> Dict[str, Any]:
    """GPU facts from NVML, else nvidia-smi, else a record that neither answered."""
    facts = _read_gpus(ctx)
    if any(g.get("inaccessible") for g in facts.get("gpus") or []) or os.environ.get("SLURM_JOB_GPUS") is not None:
        facts["access"] = _access(ctx)
    virtual = hypervisor(ctx) or guest_mode(facts)  # DMI may name no hypervisor; the driver knows
    if virtual:
        facts["virtual"] = virtual
    return facts


def _read_gpus(ctx: Any) -> Dict[str, Any]:
    nvml, nvml_error = load_nvml()
    if nvml is None and nvml_wedged():
        # nvmlInit itself did not return: nvidia-smi calls the same nvmlInit and would hang past the probe's
        # budget. Name the stuck call now instead.
        return no_gpu_facts(nvml_error or "NVML wedged", nvml_error)
    if nvml is not None:
        partial: Dict[str, Any] = {"gpus": []}
        try:
            facts = bounded_nvml(lambda: facts_from_nvml(nvml, partial), "GPU queries")
            facts["nvml_error"] = None
            facts["health"] = health_from_nvml(nvml, facts["gpus"], partial.get("handles") or {})
            return facts
        except NvmlSlow as exc:  # every call returned, the GPUs just take long to open: keep what was read
            return wedged_facts(partial, str(exc), slow=True)
        except NvmlWedged as exc:
            # The driver is stuck: nvidia-smi would hang the same way. Keep what NVML already answered.
            return wedged_facts(partial, str(exc))
        except Exception as exc:  # NVML answered init but not the queries: try nvidia-smi instead
            nvml_error = "NVML query failed: %s" % (exc,)
        finally:
            if not nvml_wedged():
                nvml_shutdown(nvml)
    smi = ctx.run(["nvidia-smi", "-q", "-x"], timeout=60.0)
    if smi.rc == 127:
        return no_gpu_facts("nvidia-smi not found and NVML unavailable", nvml_error)
    if not smi.ok:
        return no_gpu_facts("nvidia-smi failed (%s): %s" % (_why(smi), _first_line(smi)), nvml_error)
    facts = parse_nvidia_smi_xml(smi.stdout)
    facts["health"] = parse_health_xml(smi.stdout)
    _confirm_hw_reasons(ctx, facts)
    facts["nvlink_unreadable"] = []
    links = ctx.run(["nvidia-smi", "nvlink", "--status"], timeout=30.0)
    if links.ok and links.stdout.strip():
        counts, unreadable = read_nvlink_status(links.stdout)
        merge_nvlink(facts, counts)
        facts["nvlink_unreadable"] = unreadable
    facts["nvml_error"] = nvml_error
    return facts


def _confirm_hw_reasons(ctx: Any, facts: Dict[str, Any]) -> None:
    """A HW slowdown reason in one sample is re-read (`nvidia-smi -q -x -d PERFORMANCE`) and kept only where
    it is still active: the bits are also set for an instant during clock and P-state changes. Where the
    re-read does not answer, the one sample stands."""
    flagged = [g for g in facts["gpus"] if any(e in HW_THROTTLE for e in g.get("clock_events") or [])]
    if not flagged:
        return
    again = ctx.run(["nvidia-smi", "-q", "-x", "-d", "PERFORMANCE"], timeout=30.0)
    if not again.ok:
        return
    still = clock_events_by_bus(again.stdout)
    for g in flagged:
        now = still.get(g.get("pci_bus_id"))
        if now is not None:
            g["clock_events"] = [e for e in g["clock_events"] if e not in HW_THROTTLE or e in now]


def _access(ctx: Any) -> Dict[str, Any]:
    """What limits this process to some GPUs: the job's GPU variables and the process's cgroup (the v1
    devices controller's, else the v2 unified one: /proc/self/cgroup, cgroups(7))."""
    out: Dict[str, Any] = {k: os.environ[k][:120] for k in ACCESS_VARIABLES if os.environ.get(k) is not None}
    lines = [line.split(":", 2) for line in (ctx.read("/proc/self/cgroup") or "").splitlines() if line.count(":") >= 2]
    chosen = [p for p in lines if "devices" in p[1].split(",")] or [p for p in lines if p[0] == "0"] or lines
    if chosen:
        out["cgroup"] = chosen[0][2][:200]
    return out


#: The variables that say which GPUs a job or container holds (Slurm, CUDA, the NVIDIA container runtime).
ACCESS_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def _why(res: Any) -> str:
    return "timed out" if res.timed_out else "rc %d" % res.rc


def _first_line(res: Any) -> str:
    for text in (res.stdout, res.stderr):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "no output"

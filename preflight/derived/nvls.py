"""Whether NCCL's NVLS (NVLink SHARP, multicast over NVSwitch) can work on a node, derived once from its facts.

Controller side (not shipped to the nodes). The nvls check judges it and the env file writes
NCCL_NVLS_ENABLE=0 from it: one reading of the facts, so the finding and the file never disagree. It reads
what other probes already gather (nothing new runs on a node): the gpu facts (model, MIG, per-GPU NVLink
fabric state, driver), fabric_manager's (NVSwitch PCI functions, nvidia-fabricmanager and nvidia-imex
service state, IMEX channels), the driver check's NCCL version and nccl_env's NCCL_NVLS_ENABLE as a job
there gets it (environment, ~/.nccl.conf, /etc/nccl.conf).

What NCCL does (NVIDIA/nccl source, src/transport/nvls.cc, tags v2.17.1-1 to v2.30.7-1):

- NVLS exists since NCCL 2.17 ("Add new NVLS algorithm for allreduce using NVLink SHARP", v2.17.1-1).
  ncclNvlsInit: NCCL_NVLS_ENABLE=0, or fewer than 2 GPUs in the communicator: no NVLS. The default 2 asks
  CUDA: CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (cuda.h, value 132, CUDA 12.1 = driver R530; "Device
  supports switch multicast and reduction operations"): third-generation NVSwitch (Hopper and later on an
  HGX/DGX baseboard) or the NVL72 rack's NVLink switches (GB200/GB300). NCCL_NVLS_ENABLE=1 skips the
  question and turns NVLS on whatever the hardware.
- nvlsAllocateMem: cuMulticastCreate / cuMulticastAddDevice failures were always fatal; a failed
  cuMulticastBindMem ("This is where we normally see issues if the system NVLS/Multicast support is
  broken") fell back without NVLS under the default 2 up to v2.28.9 (an INFO line "Proceeding without NVLS
  support"); from v2.29.2 it fails the communicator with ncclUnhandledCudaError: "Failed to bind NVLink
  SHARP (NVLS) Multicast memory ... This is usually caused by a system or configuration error in the Fabric
  Manager or NVSwitches. Disable NVLS (NCCL_NVLS_ENABLE=0) if you wish to avoid this error in the future."
  (NCCL 2.29.2 release notes: "More prominent error when cuMulticastBind fails and NCCL_NVLS_ENABLE=2").
- Reports of the failure: NVIDIA/nccl#2077 (8x H200, NCCL 2.29.7, the bind fails where 2.28.9 fell back),
  pytorch/ao#3841 (H100 CI runners: "Failed to bind NVLink SHARP (NVLS) Multicast memory: CUDA error 401",
  fixed with NCCL_NVLS_ENABLE=0), NVIDIA/nccl#1788 (8x H100, NCCL 2.26.2: cuMulticastAddDevice error 401),
  NVIDIA/nccl#1338 (H800, NCCL 2.21.5, "invalid argument" in nvls.cc; NVIDIA: "typically ... the fabric
  manager not being restarted correctly"), NVIDIA/nccl#1672 (NVIDIA: "many system reasons for NVLink SHARP
  not working"; test with nvbandwidth/nvloom multicast). A healthy one: the realworld capture
  nccl_info/nccl1538_h100_nvls_available_nccl2.22.3 ("NVLS multicast support is available on dev N").
- MIG: "MIG does not support GPU to GPU P2P (either PCIe or NVLink)" (NVIDIA MIG user guide, "Application
  Considerations"): no NVLink between instances, so no NVLS.
- Multicast needs the NVSwitch fabric programmed: nvidia-fabricmanager active on HGX/DGX (NVIDIA Fabric
  Manager user guide), each GPU's fabric state Completed/Success (nvmlDeviceGetGpuFabricInfo, R535+), and
  across the trays of an NVL72 rack the IMEX daemon and an IMEX channel (multi-node memory is exported as
  fabric handles; NVIDIA IMEX guide, "IMEX channels").

States (NvlsState.kind), what the nvls check makes of them:

    cpu             CPU-only node
    no_facts        the gpu or fabric_manager probe gave nothing to judge (their checks say why)
    not_applicable  NCCL does not try NVLS here: no NVSwitch fabric (PCIe / NVLink-bridge parts, a VM
                    without NVLink), fewer than 2 GPUs, MIG, a GPU before Hopper (A100's NVSwitch has no
                    NVLink SHARP), a driver before R530 (no CUDA multicast), or NCCL_NVLS_ENABLE=0 set
    not_judged      an NVLS-capable fabric whose readiness the facts cannot tell (fabric manager state
                    unreadable and no GPU fabric state; driver version unknown; nvidia-imex state unreadable)
    ready           the prerequisites are met (NCCL uses NVLS, with the default 2)
    unusable        NVLS-capable hardware whose prerequisites are not met (unmet lists them)

forced (NCCL_NVLS_ENABLE=1 set on the node) and fatal (NCCL there fails at init instead of falling back:
forced, or a known NCCL >= 2.29) qualify the last ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from preflight.checks.driver import NAME as DRIVER
from preflight.common import version_key
from preflight.derived import versions
from preflight.derived.gpus import node_gpus
from preflight.probe.ncclconf import effective

#: From this NCCL a failed multicast bind fails the communicator under the default NCCL_NVLS_ENABLE=2.
NCCL_FATAL = (2, 29, 0)
#: NVLS arrived in NCCL 2.17.
NCCL_NVLS = (2, 17, 0)
#: CUDA 12.1's multicast API (cuMulticastCreate) needs the R530 driver.
MULTICAST_DRIVER = 530
#: GPUs with NVLink SHARP behind a third-generation (or later) NVSwitch: Hopper and Blackwell data-center parts.
#: A100/A800 sit on second-generation NVSwitches (no multicast). PCIe/NVL parts never reach the fabric
#: branch (they report no fabric state and have no NVSwitch).
NVLS_MODEL = re.compile(r"\b(?:G?H(?:100|200|800|20)|G?B(?:100|200|300))\b")


@dataclass
class NvlsState:
    kind: str
    reason: str = ""
    code: str = ""  # not_applicable: no_fabric | off | one_gpu | mig | model | driver | old_nccl
    unmet: List[str] = field(default_factory=list)
    unknown: List[str] = field(default_factory=list)
    nccl: Optional[str] = None  # the NCCL version a job loads there (driver check), None: unknown
    setting: Optional[Tuple[str, str]] = None  # (NCCL_NVLS_ENABLE value, where it is set) | None: unset (2)
    gpus: int = 0
    fabric_seen: bool = False  # some GPU reported its NVLink fabric state
    fabric: str = ""  # "4 NVSwitches" | "NVLink fabric managed outside this OS" | "multi-node NVLink fabric (cluster U)"

    @property
    def forced(self) -> bool:
        return self.setting is not None and self.setting[0].strip() == "1"

    def _from(self, version: Tuple[int, int, int]) -> Optional[bool]:
        """True when NVLS is forced or the node's NCCL is at least `version`; None: its version is unknown."""
        if self.forced:
            return True
        key = version_key(self.nccl)
        return None if key is None else key >= version

    @property
    def fatal(self) -> Optional[bool]:
        """Whether NCCL there fails at init when NVLS cannot work (None: its version is unknown)."""
        return self._from(NCCL_FATAL)

    @property
    def tried(self) -> Optional[bool]:
        """Whether NCCL there would try NVLS at all (None: its version is unknown)."""
        return self._from(NCCL_NVLS)


def _setting(view: Any, node: str, nccl: Optional[str]) -> Optional[Tuple[str, str]]:
    """(value, where) of NCCL_NVLS_ENABLE as a job on the node gets it (nccl_env's facts, NCCL's reading order)."""
    facts = (view.facts.get(node) or {}).get("nccl_env")
    if not isinstance(facts, dict) or "probe_error" in facts:
        return None
    return effective(facts, version_key(nccl)).get("NCCL_NVLS_ENABLE")


def _nccl(view: Any, node: str) -> Optional[str]:
    facts = (view.facts.get(node) or {}).get(DRIVER)
    return versions.nccl_version(facts) if isinstance(facts, dict) and "probe_error" not in facts else None


def assess(view: Any, node: Any) -> NvlsState:
    """The NVLS state of one live node (a NodeInfo) in this cluster view. Pure."""
    if node.gpus_per_node == 0:
        return NvlsState("cpu", "CPU-only node (gpus_per_node: 0)")
    nccl = _nccl(view, node.name)
    setting = _setting(view, node.name, nccl)
    record = node_gpus(view, node.name)
    fm = (view.facts.get(node.name) or {}).get("fabric_manager")
    if record is None or record.source is None or not record.gpus:
        why = "the gpu probe did not run" if record is None else (record.error or "no GPU read")
        return NvlsState("no_facts", "no GPU facts: %s (see the gpu check)" % why, nccl=nccl, setting=setting)
    if not isinstance(fm, dict) or "probe_error" in fm:
        return NvlsState("no_facts", "no fabric facts (see the fabric_manager check)", nccl=nccl, setting=setting)
    gpus = [g for g in record.gpus if g.name]
    state = NvlsState("not_applicable", nccl=nccl, setting=setting, gpus=len(gpus))
    switches = fm.get("nvswitches") or []
    on_fabric = [g for g in gpus if g.fabric]
    if not switches and not on_fabric:
        state.code = "no_fabric"
        state.reason = "no NVSwitch fabric (PCIe or NVLink-bridge GPUs, or a VM without NVLink): NCCL has no NVLS here"
        return state
    state.fabric_seen = bool(on_fabric)
    state.fabric = "%d NVSwitches" % len(switches) if switches else "NVLink fabric managed outside this OS"
    multi_node = any((g.fabric.cluster_uuid or "").strip("0-") for g in on_fabric)
    if multi_node:
        state.fabric = "multi-node NVLink fabric (cluster %s)" % on_fabric[0].fabric.cluster_uuid
    if setting is not None and setting[0].strip() == "0":
        state.code = "off"
        state.reason = "NCCL_NVLS_ENABLE=0 (%s): NCCL does not use NVLS" % setting[1]
        return state
    if len(gpus) < 2:
        state.code = "one_gpu"
        state.reason = "%d GPU: NCCL uses NVLS only with 2 or more GPUs on a node" % len(gpus)
        return state
    if any(g.facts.get("mig_enabled") for g in gpus):
        state.code = "mig"
        state.reason = "MIG enabled: MIG instances have no GPU-to-GPU NVLink (MIG user guide), so NCCL has no NVLS"
        return state
    models = record.models()  # not empty: 2 or more GPUs with a name
    if not any(NVLS_MODEL.search(m) for m in models):
        state.code = "model"
        state.reason = "%s on %s: NVLink SHARP needs a third-generation NVSwitch (Hopper or later)" % (
            "/".join(models), state.fabric)
        return state
    driver = record.driver_version or fm.get("driver_version")
    major = re.match(r"^(\d+)\.", driver or "")
    if major and int(major.group(1)) < MULTICAST_DRIVER:
        state.code = "driver"
        state.reason = "driver %s predates CUDA multicast (R%d): NCCL cannot use NVLS here" % (driver, MULTICAST_DRIVER)
        return state
    if state.tried is False:
        state.code = "old_nccl"
        state.reason = "NCCL %s predates NVLS (2.17)" % nccl
        return state
    unmet: List[str] = []
    unknown: List[str] = [] if major else ["driver version unknown"]
    stuck = ["GPU %s %s" % (g.index, g.fabric.state) for g in on_fabric if not g.fabric.registered]
    if stuck:
        unmet.append("NVLink fabric not Completed (%s)" % ", ".join(stuck))
    if switches:
        service = fm.get("service")
        if service is not None and (service.get("LoadState") != "loaded" or service.get("ActiveState") != "active"):
            unmet.append("nvidia-fabricmanager %s" % (service.get("ActiveState") if service.get("LoadState") == "loaded"
                                                       else "not installed"))
        elif service is None and not on_fabric:
            unknown.append("nvidia-fabricmanager state unreadable (%s) and no GPU fabric state"
                           % (fm.get("service_error") or "not gathered"))
    if multi_node:
        imex = fm.get("imex")
        if imex is None:
            unknown.append("nvidia-imex state unreadable (%s)" % (fm.get("imex_error") or "not gathered"))
        elif imex.get("LoadState") != "loaded" or imex.get("ActiveState") != "active":
            unmet.append("nvidia-imex %s" % (imex.get("ActiveState") if imex.get("LoadState") == "loaded" else "not installed"))
        elif fm.get("imex_channels") == []:
            unmet.append("no IMEX channel under /dev/nvidia-caps-imex-channels")
    return _judged(state, unmet, unknown)


def _judged(state: NvlsState, unmet: List[str], unknown: List[str]) -> NvlsState:
    state.unmet, state.unknown = unmet, unknown
    state.kind = "unusable" if unmet else "not_judged" if unknown else "ready"
    return state

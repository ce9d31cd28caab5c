"""The fabric_manager check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import re

from preflight.node_model import ParseError
from preflight.probe.pci import devices as pci_devices

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

UNIT = "nvidia-fabricmanager"
#: The IMEX daemon: multi-node NVLink (GB200/GB300 NVL racks) shares GPU memory across trays through it.
IMEX_UNIT = "nvidia-imex"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "UnitFileState", "NRestarts")
NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS = "0x068000"


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
    return [entry for entry, vendor, klass in pci_devices(ctx) if vendor == NVIDIA_VENDOR and klass == NVSWITCH_CLASS]


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

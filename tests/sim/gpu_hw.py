"""Simulated NVIDIA hardware for a simulated node: recorded nvidia-smi, NVSwitches in sysfs, fabric manager.

Everything is presented through the interfaces real hardware uses: small executables on the node's PATH
(``node.install_executable``) that print the recorded outputs under tests/fixtures, and files under the
node's sysfs root (``node.write_sys``). NVML cannot be faked that way, so on a host that has a real GPU the
node's sessions must set ``PREFLIGHT_NVML=off`` for the probes to read the simulated nvidia-smi.

    install_gpus(node, "h100", count=8, faults={3: "ecc", 5: ["pcie_width", "persistence_off"], 6: "missing"})
    install_nvswitches(node)                       # 4 NVSwitch PCI functions (6 for profile="a100")
    install_fabric_manager(node, active=False)     # failed service; H100 GPUs then report fabric In Progress
    install_gpus(node, "gb200", count=4); install_imex(node, "not_found")   # a GB200 tray without IMEX
    set_driver_version(node, "535.129.03")         # a driver outlier (fabric manager keeps its version)
    inject_kernel_log(node, "NVRM: Xid (PCI:0000:3a:00): 79, GPU has fallen off the bus.")   # journalctl -k line
    install_nccl(node, "2.21.5")                   # ldconfig -p listing libnccl.so.2 -> libnccl.so.2.21.5

Faults (per GPU position 0..count-1): missing, ecc, remap_failure, remap_pending, pcie_width, hw_slowdown,
sw_thermal, persistence_off, nvlink_down, nvlink_all_down (every link down: nvidia-smi prints NVML's message
on its own line under the GPU header, as it does), hw_slowdown_blip (HW slowdown in the first -q -x only,
gone when `-q -x -d PERFORMANCE` reads again: a clock change caught mid-way), leftover_process (a compute
process holding 60 GiB), retired_pages_limit (64 retired pages: the legacy retirement limit).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Dict, Iterable, List, Optional, Union

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")

PROFILES: Dict[str, Dict[str, Any]] = {
    "h100": {
        "xml": "gpu/h100_hgx_550.xml",
        "nvlink": "gpu/h100_hgx_550.nvlink.txt",
        "driver": "550.54.15",
        "gpu_device": "0x2330",
        "nvswitch_device": "0x22a3",
        "nvswitches": 4,
    },
    "gb200": {  # a GB200 compute tray: no NVSwitch PCI function, GPUs on the rack's NVLink fabric
        "xml": "gpu/gb200_tray_570.xml",
        "nvlink": "gpu/gb200_tray_570.nvlink.txt",
        "driver": "570.133.20",
        "gpu_device": "0x2941",
        "nvswitch_device": None,
        "nvswitches": 0,
    },
    "a100": {
        "xml": "gpu/a100_hgx_535.xml",
        "nvlink": "gpu/a100_hgx_535.nvlink.txt",
        "driver": "535.129.03",
        "gpu_device": "0x20b2",
        "nvswitch_device": "0x1af1",
        "nvswitches": 6,
    },
}

FAULTS = (
    "missing",
    "ecc",
    "remap_failure",
    "remap_pending",
    "pcie_width",
    "hw_slowdown",
    "sw_thermal",
    "persistence_off",
    "nvlink_down",
    "nvlink_all_down",
    "hw_slowdown_blip",
    "leftover_process",
    "retired_pages_limit",
)
#: the nvidia-smi message for a GPU whose links are all down (or that has none), on its own line
ALL_LINKS_DOWN = "\t NVML: Unable to retrieve NVLink information as all links are inActive\n"

_REASON = r"(<clocks_(?:event|throttle)_reason_%s>)Not Active(</)"
#: fault -> [(pattern, replacement)] applied to one GPU's <gpu> block
_EDITS = {
    "ecc": [(r"(<dram_uncorrectable>)0(</)", r"\g<1>2\2")],
    "remap_failure": [(r"(<remapped_row_failure>)No(</)", r"\1Yes\2"), (r"(<remapped_row_unc>)0(</)", r"\g<1>1\2")],
    "remap_pending": [(r"(<remapped_row_pending>)No(</)", r"\1Yes\2"), (r"(<remapped_row_unc>)0(</)", r"\g<1>1\2")],
    "pcie_width": [(r"(<current_link_width>)16x(</)", r"\g<1>8x\2")],
    "hw_slowdown": [(_REASON % "hw_slowdown", r"\1Active\2"), (_REASON % "hw_thermal_slowdown", r"\1Active\2")],
    "sw_thermal": [(_REASON % "sw_thermal_slowdown", r"\1Active\2")],
    "persistence_off": [(r"(<persistence_mode>)Enabled(</)", r"\1Disabled\2")],
    "nvlink_down": [],
    "nvlink_all_down": [],
    "hw_slowdown_blip": [],
    # a previous job's rank still holding memory, in the <process_info> layout of nvidia-smi 5xx (as in
    # ../shared/realworld telegraf_dual_a5000-v13.xml)
    "leftover_process": [(r"<processes>\s*</processes>",
                          "<processes>\n\t\t\t<process_info>\n\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>\n"
                          "\t\t\t\t<compute_instance_id>N/A</compute_instance_id>\n\t\t\t\t<pid>48213</pid>\n"
                          "\t\t\t\t<type>C</type>\n\t\t\t\t<process_name>python3 train.py</process_name>\n"
                          "\t\t\t\t<used_memory>61440 MiB</used_memory>\n\t\t\t</process_info>\n\t\t</processes>")],
    # the legacy page-retirement counts at their limit (32 single-bit + 32 double-bit = 64), the layout of
    # tests/fixtures/gpu/p100_legacy_ecc_510.xml's <retired_pages>
    "retired_pages_limit": [(r"(<retired_count>)N/A(</)", r"\g<1>32\2")],
}

# Node state, keyed by the node's bin directory (one per simulated node).
_STATE: Dict[str, Dict[str, Any]] = {}

FaultSpec = Optional[Dict[int, Union[str, Iterable[str]]]]


def _read(rel: str) -> str:
    with open(os.path.join(FIXTURES, rel)) as handle:
        return handle.read()


def _state(node: Any) -> Dict[str, Any]:
    if node.bin_dir not in _STATE:
        raise ValueError("install_gpus(node) first")
    return _STATE[node.bin_dir]


def install_gpus(node: Any, profile: str = "h100", count: int = 8, faults: FaultSpec = None,
                 passthrough: bool = False) -> None:
    """A fake nvidia-smi printing the recorded HGX output with `count` GPUs, plus the GPUs' sysfs entries.
    passthrough: the GPUs given to a VM: nvidia-smi says <virtualization_mode>Pass-Through, as the real
    VM captures in ../shared/realworld do (netdata's A100-SXM4 VM, telegraf's AWS A10G and T4)."""
    if profile not in PROFILES:
        raise ValueError("profile %r: expected one of %s" % (profile, ", ".join(sorted(PROFILES))))
    recorded = len(_GPU_BLOCK.findall(_read(PROFILES[profile]["xml"])))
    if not 0 < count <= recorded:
        raise ValueError("count %d: the recorded %s output holds 1 to %d GPUs" % (count, profile, recorded))
    normalised: Dict[int, List[str]] = {}
    for index, spec in (faults or {}).items():
        names = [spec] if isinstance(spec, str) else list(spec)
        unknown = [n for n in names if n not in FAULTS]
        if unknown or not 0 <= index < count:
            raise ValueError("fault %r on GPU %d: expected GPUs 0..%d and faults %s" % (spec, index, count - 1, FAULTS))
        normalised[index] = names
    old = _STATE.get(node.bin_dir, {})
    _STATE[node.bin_dir] = {
        "profile": profile,
        "count": count,
        "faults": normalised,
        "driver": PROFILES[profile]["driver"],
        "fabric_stuck": old.get("fabric_stuck", False),
        "gpu_bdfs": old.get("gpu_bdfs", []),
        "kernel_log": old.get("kernel_log", []),
        "passthrough": passthrough,
    }
    _render(node)
    _render_kernel_log(node)


#: The clean start of a GPU node's kernel log (journalctl -k -o short-monotonic), before injected lines.
BOOT_LOG = (
    (0.0, "Linux version 5.15.0-105-generic (buildd@lcy02-amd64-054) #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024"),
    (14.650646, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"),
    (15.101233, "mlx5_core 0000:19:00.0 mlx5_0: Port: 1 Link ACTIVE"),
)


def inject_kernel_log(node: Any, message: str, seconds_after_boot: float = 60.0) -> None:
    """Append a kernel message (e.g. an Xid line) to what the node's journalctl -k prints."""
    _state(node)["kernel_log"].append((seconds_after_boot, message))
    _render_kernel_log(node)


def _render_kernel_log(node: Any) -> None:
    lines = sorted(BOOT_LOG + tuple(_state(node)["kernel_log"]))
    host = getattr(node, "name", "gpu-node")
    text = "".join("[%12.6f] %s kernel: %s\n" % (ts, host, msg) for ts, msg in lines)
    node.install_executable(
        "journalctl",
        "#!/bin/sh\n"
        "# journalctl (preflight simulator): the kernel log of this boot in short-monotonic format\n"
        'case "$*" in\n'
        '  *-k*short-monotonic*) ;;\n'
        '  *) echo "journalctl (preflight simulator): only -k -o short-monotonic is recorded" >&2; exit 1 ;;\n'
        "esac\n"
        "cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n" % text,
    )


def set_driver_version(node: Any, version: str) -> None:
    """Make this node report another driver (nvidia-smi and sysfs); an installed fabric manager keeps its own."""
    _state(node)["driver"] = version
    _render(node)


def install_nvswitches(node: Any, count: Optional[int] = None, profile: Optional[str] = None) -> List[str]:
    """NVSwitch PCI functions (vendor 0x10de, class 0x068000) in the node's sysfs; returns their addresses."""
    profile = profile or _STATE.get(node.bin_dir, {}).get("profile", "h100")
    spec = PROFILES[profile]
    count = spec["nvswitches"] if count is None else count
    bdfs = ["0000:%02x:00.0" % (0x05 + i) for i in range(count)]
    for bdf in bdfs:
        _pci(node, bdf, spec["nvswitch_device"], "0x068000")
    return bdfs


def install_fabric_manager(node: Any, active: bool = True, version: Optional[str] = None) -> None:
    """Fake systemctl (show / is-active nvidia-fabricmanager) and nv-fabricmanager --version.

    A failed service leaves Hopper GPUs stuck registering with the fabric (state In Progress), as on
    real nodes; their nvidia-smi output is re-rendered to say so.
    """
    state = _STATE.get(node.bin_dir)
    version = version or (state["driver"] if state else PROFILES["h100"]["driver"])
    show = _read("fabric_manager/systemctl_show_%s.txt" % ("active" if active else "failed"))
    node.install_executable(
        "systemctl",
        "#!/bin/sh\n"
        "# systemctl (preflight simulator): answers for nvidia-fabricmanager only, from tests/fixtures\n"
        'case "$1 $2" in\n'
        '  "show nvidia-fabricmanager"|"show nvidia-fabricmanager.service")\n'
        "    cat <<'PREFLIGHT_EOF'\n%s"
        "PREFLIGHT_EOF\n"
        "    ;;\n"
        '  "is-active nvidia-fabricmanager"|"is-active nvidia-fabricmanager.service")\n'
        "    %s\n"
        "    ;;\n"
        "  *)\n"
        '    echo "systemctl (preflight simulator): no recorded answer for: $*" >&2\n'
        "    exit 1\n"
        "    ;;\n"
        "esac\n" % (show, "echo active; exit 0" if active else "echo failed; exit 3"),
    )
    node.install_executable(
        "nv-fabricmanager",
        "#!/bin/sh\n"
        "# nv-fabricmanager (preflight simulator): only --version\n"
        'case "$1" in\n'
        "  --version|-v) printf '\\nFabric Manager version is : %s\\n\\n' ;;\n"
        '  *) echo "nv-fabricmanager (preflight simulator): only --version is recorded" >&2; exit 1 ;;\n'
        "esac\n" % version,
    )
    if state is not None:
        state["fabric_stuck"] = not active
        _render(node)


def install_imex(node: Any, state: str = "active") -> None:
    """A systemctl answering `show nvidia-imex` (state "active" or "not_found": package missing), as on a
    GB200/GB300 tray; other units get systemctl's error."""
    show = _read("fabric_manager/imex_systemctl_show_%s.txt" % state)
    node.install_executable(
        "systemctl",
        "#!/bin/sh\n"
        "# systemctl (preflight simulator): answers for nvidia-imex only, from tests/fixtures\n"
        'case "$1 $2" in\n'
        '  "show nvidia-imex"|"show nvidia-imex.service")\n'
        "    cat <<'PREFLIGHT_EOF'\n%s"
        "PREFLIGHT_EOF\n"
        "    ;;\n"
        "  *)\n"
        '    echo "systemctl (preflight simulator): no recorded answer for: $*" >&2\n'
        "    exit 1\n"
        "    ;;\n"
        "esac\n" % show,
    )
    if state == "active" and hasattr(node, "write_host_file"):
        # the driver creates the IMEX channel device where IMEX is set up (NVreg_CreateImexChannel0=1): an
        # empty file stands for the character device under the node's host root
        node.write_host_file("/dev/nvidia-caps-imex-channels/channel0", "")


def install_nccl(node: Any, version: str = "2.21.5") -> str:
    """A fake `ldconfig -p` listing libnccl.so.2, a symlink to an (empty) libnccl.so.2.<version>."""
    libdir = os.path.join(os.path.dirname(node.bin_dir.rstrip("/")), "lib")
    os.makedirs(libdir, exist_ok=True)
    real = os.path.join(libdir, "libnccl.so." + version)
    open(real, "w").close()
    link = os.path.join(libdir, "libnccl.so.2")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.basename(real), link)
    node.install_executable(
        "ldconfig",
        "#!/bin/sh\n"
        "# ldconfig (preflight simulator): only -p\n"
        'if [ "$1" != "-p" ]; then echo "ldconfig (preflight simulator): only -p" >&2; exit 1; fi\n'
        "cat <<'PREFLIGHT_EOF'\n"
        "2 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibnccl.so.2 (libc6,x86-64) => %s\n"
        "\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6\n"
        "Cache generated by: ldconfig (Ubuntu GLIBC 2.35-0ubuntu3.6) stable release version 2.35\n"
        "PREFLIGHT_EOF\n" % link,
    )
    return real


# ------------------------------------------------------------------------------------------ rendering

_GPU_BLOCK = re.compile(r"\t<gpu id=\"[^\"]+\">\n.*?\n\t</gpu>\n", re.S)
_NVLINK_GPU = re.compile(r"^GPU \d+: ", re.M)


def _pci(node: Any, bdf: str, device: str, klass: str) -> None:
    node.write_sys("bus/pci/devices/%s/vendor" % bdf, "0x10de\n")
    node.write_sys("bus/pci/devices/%s/device" % bdf, device + "\n")
    node.write_sys("bus/pci/devices/%s/class" % bdf, klass + "\n")


def _render(node: Any) -> None:
    state = _STATE[node.bin_dir]
    spec = PROFILES[state["profile"]]
    xml = _read(spec["xml"])
    blocks = _GPU_BLOCK.findall(xml)
    head = xml[: xml.index(blocks[0])]
    tail = xml[xml.index(blocks[-1]) + len(blocks[-1]):]
    nvlink = _split_nvlink(_read(spec["nvlink"]))
    kept_xml: List[str] = []
    perf_xml: List[str] = []
    kept_links: List[str] = []
    present: List[str] = []
    for i, block in enumerate(blocks[: state["count"]]):
        faults = state["faults"].get(i, [])
        if "missing" in faults:
            continue
        for fault in faults:
            for pattern, repl in _EDITS[fault]:
                block = re.sub(pattern, repl, block)
        if state["fabric_stuck"]:
            block = block.replace("<state>Completed</state>", "<state>In Progress</state>").replace(
                "<status>Success</status>", "<status>N/A</status>"
            )
        block = re.sub(r"(<gsp_firmware_version>)\d[\d.]*(</)", r"\g<1>%s\2" % state["driver"], block)
        if state["passthrough"]:
            block = block.replace("<virtualization_mode>None<", "<virtualization_mode>Pass-Through<")
        links = nvlink[i]
        if "nvlink_down" in faults:
            links = re.sub(r"(Link [01]): \S+ GB/s", r"\1: <inactive>", links)
        if "nvlink_all_down" in faults:
            links = links.split("\n", 1)[0] + "\n" + ALL_LINKS_DOWN
        kept_links.append(re.sub(r"^GPU \d+:", "GPU %d:" % len(kept_xml), links))
        perf_xml.append(block)
        if "hw_slowdown_blip" in faults:
            block = re.sub(_REASON % "hw_slowdown", r"\1Active\2", block)
        kept_xml.append(block)
        present.append(re.search(r"<pci_bus_id>([^<]+)</", block).group(1))
    head = re.sub(r"(<driver_version>)[^<]*(</)", r"\g<1>%s\2" % state["driver"], head)
    head = re.sub(r"(<attached_gpus>)\d+(</)", r"\g<1>%d\2" % len(kept_xml), head)
    xml = head + "".join(kept_xml) + tail
    perf = head + "".join(perf_xml) + tail
    listing = "".join(
        "GPU %d: %s (UUID: %s)\n"
        % (n, re.search(r"<product_name>([^<]+)</", b).group(1), re.search(r"<uuid>([^<]+)</", b).group(1))
        for n, b in enumerate(kept_xml)
    )
    versions = "".join("%s\n" % state["driver"] for _ in kept_xml)
    node.install_executable(
        "nvidia-smi",
        "#!/bin/sh\n"
        "# nvidia-smi (preflight simulator): recorded %s output from tests/fixtures/gpu\n"
        'case "$*" in\n'
        '  "-q -x"|"-x -q"|"--query --xml-format"|"-q --xml-format"|"--query -x")\n'
        "    cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n    ;;\n"
        '  "-q -x -d PERFORMANCE"|"-q -d PERFORMANCE -x")\n'
        "    cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n    ;;\n"
        '  "nvlink --status"|"nvlink -s")\n'
        "    cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n    ;;\n"
        '  "-L"|"--list-gpus")\n'
        "    cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n    ;;\n"
        '  "--query-gpu=driver_version --format=csv,noheader")\n'
        "    cat <<'PREFLIGHT_EOF'\n%sPREFLIGHT_EOF\n    ;;\n"
        "  *)\n"
        '    echo "nvidia-smi (preflight simulator): no recorded output for: $*" >&2\n'
        "    exit 2\n"
        "    ;;\n"
        "esac\n" % (state["profile"], xml, perf, "".join(kept_links), listing, versions),
    )
    devices = os.path.join(node.sys_dir, "bus", "pci", "devices")
    for bdf in state["gpu_bdfs"]:
        shutil.rmtree(os.path.join(devices, bdf), ignore_errors=True)
    state["gpu_bdfs"] = [_sysfs_bdf(b) for b in present]
    for bdf in state["gpu_bdfs"]:
        _pci(node, bdf, spec["gpu_device"], "0x030200")
    node.write_sys("module/nvidia/version", state["driver"] + "\n")


def _split_nvlink(text: str) -> List[str]:
    starts = [m.start() for m in _NVLINK_GPU.finditer(text)] + [len(text)]
    return [text[a:b] for a, b in zip(starts, starts[1:])]


def _sysfs_bdf(bus_id: str) -> str:
    """00000000:4E:00.0 (nvidia-smi) -> 0000:4e:00.0 (sysfs)."""
    domain, rest = bus_id.split(":", 1)
    return ("%s:%s" % (domain[-4:], rest)).lower()


# ------------------------------------------------------------------------------------------ fake NVML
#
# The pynvml calls preflight/probe/gpu_nvml.py makes, answered from a recorded JSON (tests/fixtures/gpu/nvml_*.json).
# It behaves as pynvml over libnvidia-ml does where it matters to the probe:
#   - errors are NVMLError with .value = the nvmlReturn_t code (nvml.h), str() = nvmlErrorString's text;
#     a function the driver lacks raises NVML_ERROR_FUNCTION_NOT_FOUND (pynvml's _nvmlGetFunctionPointer);
#   - nvmlDeviceGetGpuFabricInfo writes raw bytes into the caller's buffer at nvml.h's offsets, as the C
#     library does, so a ctypes structure with another layout reads other values;
#   - an answer {"block": true} never returns (a call wedged in the kernel), until release().

import ctypes
import struct
import threading
import time

#: nvmlReturn_t (nvml.h) -> nvmlErrorString text
NVML_ERRORS = {
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    999: "Unknown Error",
}
_NAMES = {
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_UNKNOWN": 999,
}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return NVML_ERRORS.get(self.value, "Unknown Error")


class Pre13615FabricInfo(ctypes.Structure):
    """pynvml.c_nvmlGpuFabricInfo_t as nvidia-ml-py declared it before 13.615: clusterUuid 80 bytes (wrong)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_char * 80),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    ]


def fabric_bytes(answer: Dict[str, Any]) -> bytes:
    """nvmlGpuFabricInfo_t as the C library fills it (nvml.h, R535-R580):

        unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN /* 16 */];  offset 0
        nvmlReturn_t  status;                                          offset 16
        unsigned int  cliqueId;                                        offset 20
        nvmlGpuFabricState_t state;  /* unsigned char */               offset 24, then 3 bytes padding: 28
    """
    uuid = bytes.fromhex(answer.get("clusterUuid", "0" * 32).replace("-", ""))
    return struct.pack("<16sIIB3x", uuid, answer["status"], answer.get("cliqueId", 0), answer["state"])


#: nvidia-ml-py itself, for its return types (a test may put a FakeNVML in sys.modules["pynvml"]).
import pynvml as _pynvml  # noqa: E402


class FakeNVML:
    NVMLError = FakeNVMLError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_NVLINK_MAX_LINKS = 18
    c_nvmlGpuFabricInfo_t = Pre13615FabricInfo

    def __init__(self, answers: Dict[str, Any]) -> None:
        self.a = answers
        self.calls: List[str] = []
        self._released = threading.Event()

    def release(self) -> None:
        """Let every blocked call return (NVML_ERROR_UNKNOWN), so a test leaves no thread behind."""
        self._released.set()

    def _answer(self, value: Any) -> Any:
        """An answer is the value, or {"block": true}, {"error": NAME}, {"delay": s, "value": v} (returns v
        after s seconds: a GPU initialising on open without persistence mode), {"sequence": [v1, v2, ...]}
        (successive calls get successive values, the last repeating: a reading that changes)."""
        if isinstance(value, dict) and "sequence" in value:
            seq = value["sequence"]
            value = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(value, dict) and "delay" in value:
            time.sleep(value["delay"])
            value = value.get("value")
        if isinstance(value, dict) and value.get("block"):
            self._released.wait()
            raise FakeNVMLError(999)
        if isinstance(value, dict) and "error" in value:
            raise FakeNVMLError(_NAMES[value["error"]])
        return value

    def _top(self, key: str) -> Any:
        self.calls.append(key)
        return self._answer(self.a[key])

    def _get(self, handle: int, key: str) -> Any:
        self.calls.append(key)
        dev = self.a["devices"][handle]
        if key not in dev:  # not recorded: this driver has no such function
            raise FakeNVMLError(13)
        return self._answer(dev[key])

    def nvmlInit(self) -> None:
        if "nvmlInit" in self.a:
            self._top("nvmlInit")

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._top("nvmlSystemGetDriverVersion")

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._top("nvmlSystemGetCudaDriverVersion")

    def nvmlDeviceGetCount(self) -> int:
        if "nvmlDeviceGetCount" in self.a:
            return self._top("nvmlDeviceGetCount")
        return len(self.a["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        dev = self.a["devices"][index]
        if "nvmlDeviceGetHandleByIndex" in dev:
            self._get(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._get(h, "nvmlDeviceGetName").encode()  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        bus = self._get(h, "nvmlDeviceGetPciInfo.busId").encode()

        class Pci:
            busId = bus

        return Pci()

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return self._get(h, "nvmlDeviceGetTotalEccErrors(%s,%s)" % (("CORRECTED", "UNCORRECTED")[kind],
                                                                     ("VOLATILE", "AGGREGATE")[counter]))

    # --- the health queries (preflight.probe.gpu_health), answered in pynvml's own return types

    def nvmlDeviceGetRowRemapperHistogram(self, h: int) -> Any:
        """pynvml returns its c_nvmlRowRemapperHistogramValues structure."""
        return _pynvml.c_nvmlRowRemapperHistogramValues(**self._get(h, "nvmlDeviceGetRowRemapperHistogram"))

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> List[int]:
        """pynvml returns the page addresses of that cause (0: multiple single-bit, 1: double-bit)."""
        return self._get(h, "nvmlDeviceGetRetiredPages(%s)" % ("MULTIPLE_SINGLE_BIT", "DOUBLE_BIT")[cause])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> List[Any]:
        """pynvml returns nvmlFriendlyObjects of c_nvmlProcessInfo_v3_t (usedGpuMemory None when N/A)."""
        return [_pynvml.nvmlFriendlyObject(dict({"gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}, **p))
                for p in self._get(h, "nvmlDeviceGetComputeRunningProcesses")]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        names = self.a.get("processNames") or {}
        if str(pid) not in names:
            raise FakeNVMLError(6)  # NVML_ERROR_NOT_FOUND: another PID namespace
        return names[str(pid)]

    def nvmlDeviceGetApplicationsClock(self, h: int, clock: int) -> int:
        assert clock == 0  # NVML_CLOCK_GRAPHICS
        return self._get(h, "nvmlDeviceGetApplicationsClock(GRAPHICS)")

    def nvmlDeviceGetDefaultApplicationsClock(self, h: int, clock: int) -> int:
        assert clock == 0
        return self._get(h, "nvmlDeviceGetDefaultApplicationsClock(GRAPHICS)")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        """pynvml returns its c_nvmlUtilization_t (gpu, memory: percent)."""
        return _pynvml.c_nvmlUtilization_t(**self._get(h, "nvmlDeviceGetUtilizationRates"))

    def nvmlDeviceGetFieldValues(self, h: int, ids: List[int]) -> Any:
        """pynvml returns the c_nvmlFieldValue_t array the C library filled: a field this driver lacks has
        nvmlReturn NVML_ERROR_NOT_SUPPORTED (the call itself succeeds). Answers {"230": 0} (an unsigned int,
        as the recovery action is) or {"38": {"ull": n}} (an unsigned long long, as the NVLink counters are)."""
        fields = self._get(h, "nvmlDeviceGetFieldValues")
        values = (_pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            values[i].fieldId = fid
            answer = fields.get(str(fid))
            if isinstance(answer, dict):
                values[i].valueType = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = answer["ull"]
            elif answer is not None:
                values[i].valueType = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = answer
            else:
                values[i].nvmlReturn = 3
        return values

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        states = self._get(h, "nvmlDeviceGetNvLinkState")
        if isinstance(states, list) and link >= len(states):
            raise FakeNVMLError(2)  # past this GPU's last link
        return states[link]

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """The C entry point: returns an nvmlReturn_t instead of raising, writes into the caller's memory."""
        if name == "nvmlDeviceGetGpuFabricInfoV":
            return self._fabric_info_v
        if name != "nvmlDeviceGetGpuFabricInfo":
            raise AssertionError("the fake library has no raw entry point %s" % name)

        def c_function(h: int, pointer: Any) -> int:
            try:
                data = fabric_bytes(self._get(h, name))
            except FakeNVMLError as exc:
                return exc.value
            ctypes.memmove(pointer, data, len(data))  # exactly what libnvidia-ml writes: 28 bytes
            return 0

        return c_function

    def _fabric_info_v(self, h: int, pointer: Any) -> int:
        """nvmlDeviceGetGpuFabricInfoV as libnvidia-ml answers: reads the version word the caller set, answers
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25) for a version this driver lacks ("versions": [3, 2]), else
        writes nvmlGpuFabricInfo_v2_t / _v3_t (version, uuid[16], status, cliqueId, state, 3 pad, healthMask
        [, healthSummary, 3 pad])."""
        try:
            answer = self._get(h, "nvmlDeviceGetGpuFabricInfoV")
        except FakeNVMLError as exc:
            return exc.value
        word = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_uint))[0]
        version = word >> 24
        if version not in answer.get("versions", [3, 2]):
            return 25
        uuid = bytes.fromhex(answer.get("clusterUuid", "0" * 32).replace("-", ""))
        data = struct.pack("<I16sIIB3xI", word, uuid, answer.get("status", 0), answer.get("cliqueId", 0),
                           answer["state"], answer.get("healthMask", 0))
        if version == 3:
            data += struct.pack("<B3x", answer.get("healthSummary", 0))
        ctypes.memmove(pointer, data, len(data))
        return 0

    def nvmlDeviceGetGpuFabricInfo(self, h: int, pointer: Any) -> int:
        """pynvml's wrapper: the C function, raising on an error code."""
        ret = self._nvmlGetFunctionPointer("nvmlDeviceGetGpuFabricInfo")(h, pointer)
        if ret:
            raise FakeNVMLError(ret)
        return 0

    def nvmlErrorString(self, code: int) -> str:
        return NVML_ERRORS.get(code, "Unknown Error")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlDevice"):
            return lambda h: self._get(h, name)
        raise AttributeError(name)


for _name, _code in _NAMES.items():
    setattr(FakeNVML, _name, _code)

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

from preflight.model import Check

NAME = "fabric_manager"

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
    needs=("gpu",),
    action="fix_config",
    reads="sysfs NVSwitch PCI functions; systemctl show nvidia-fabricmanager (or nvidia-imex on GB200/GB300 trays), "
    "nv-fabricmanager --version, /dev/nvidia-caps-imex-channels",
    takes="< 0.5 s (none on nodes without NVSwitches or NVIDIA driver)",
    order=40,
)

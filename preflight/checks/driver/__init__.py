"""driver: every node runs the same NVIDIA driver, CUDA driver, NCCL and torch versions (or the ones expected).

Sources, first that answers wins:

- driver / CUDA version: NVML (nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion), else the
  header of ``nvidia-smi -q -x``, else ``<sysfs>/module/nvidia/version`` (the loaded kernel module),
  else ``/proc/driver/nvidia/version``. ``PREFLIGHT_NVML=off`` skips NVML, as in the gpu check.
- NCCL: every ``libnccl.so*`` in ``ldconfig -p``, its version read from the real file name the soname
  link resolves to (libnccl.so.2 -> libnccl.so.2.21.5); and the ``nvidia-nccl-cu11/12/13`` Python
  distribution (the NCCL torch wheels load): its dist-info folder's name.
- torch: ``torch/version.py`` located as importlib finds ``torch`` and read as text: importing torch
  costs seconds per node, and the controller must never need it.
- Both are looked for on the import path the node's python has with ``site`` (its venv's, the user's and the
  system's site-packages and the directories their .pth files name), computed without running ``site``: the
  probe runs as ``python3 -S``, so no .pth file's code (an ``import`` line) runs in it, and a package reachable
  only through such a line's import hook is not found (preflight.probe.sitedirs).

Facts schema::

    driver_version  "550.54.15" | None      driver_source  "nvml"|"nvidia-smi"|"sysfs"|"proc"|None
    cuda_version    "12.4" | None           (highest CUDA version the driver supports; NVML / nvidia-smi only)
    nccl_system     [{"soname": "libnccl.so.2", "path": "/usr/lib/...", "version": "2.21.5"|None}, ...]
    nccl_python     {"distribution": "nvidia-nccl-cu12", "version": "2.21.5"} | None
    torch           {"version": "2.3.0+cu121", "cuda": "12.1"|None, "path": ".../torch"} | None

Rule. The NCCL a job uses is the Python distribution's when there is one (torch wheels load it), else
the system library's. Each value is compared with ``expect:`` (keys driver_version, cuda_version,
nccl_version, torch_version) when given, else with the majority of the nodes it applies to; a node
that differs FAILs naming the majority value and how many nodes hold it, and one cluster-wide finding
folds every value's node set. With no majority (a tie) every differing node fails.

- GPU nodes: driver, CUDA, NCCL, torch. A GPU node without a driver FAILs. A torch built for a newer
  CUDA major version than the driver supports FAILs (CUDA minor-version compatibility covers minors).
- CPU-only nodes (gpus_per_node 0): driver, CUDA and NCCL do not apply (said in the PASS message);
  torch is still compared, on its public version only (2.3.0 for 2.3.0+cpu and 2.3.0+cu121), because
  the gloo all-reduce runs with torch there too. ``expect: torch_version`` with a local part (+cu121)
  is compared in full on GPU nodes and by its public part on CPU-only nodes.
- A value missing on some nodes but present on others is drift: the nodes lacking it fail ("torch not
  found (majority 2.3.0 on 63 nodes)"); "not found" is never the reference. Missing everywhere is not
  judged. A GPU node without a driver fails once for that, not again for CUDA drift.
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "driver"

CHECK = Check(
    name=NAME,
    claim="Every node runs the same NVIDIA driver, CUDA driver, NCCL and torch versions (or the expected ones)",
    why="Mixed driver or NCCL versions across nodes make NCCL hang or fail at init (protocol mismatch); a "
    "torch built for a newer CUDA than the driver cannot use the GPU.",
    fix="Install the expected driver (and the matching nvidia-fabricmanager) and reboot; pin the same torch "
    "and nvidia-nccl-cu12 in every node's environment (pip install torch==X nvidia-nccl-cu12==Y).",
    action="fix_config",
    reads="NVML driver and CUDA versions (else nvidia-smi -q -x, else /sys/module/nvidia/version), libnccl in "
    "ldconfig -p, the nvidia-nccl-cu* wheel's dist-info name and torch/version.py (torch is not imported)",
    takes="< 0.1 s (nvidia-smi, when NVML is absent, up to a few seconds)",
    order=30,
    settings=tuple(Setting("expect." + key, "version", "the %s every node runs (else the cluster majority)" % what)
                   for key, what in (("driver_version", "NVIDIA driver"), ("cuda_version", "CUDA driver version"),
                                     ("nccl_version", "NCCL"), ("torch_version", "torch"))),
)

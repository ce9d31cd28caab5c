"""limits: the node limits NCCL trips on fit it: a finite stack limit where multi-node NVLink is in use, and
/dev/shm with room for the GPUs' NCCL shared-memory segments.

Read where a job reads them: the probe's own limits (``/proc/self/limits``, the same limits the SSH session
or the srun step gives a job; Slurm propagates the submitting shell's by default), /dev/shm as the probe's
mount namespace sees it (a container's own), and the IMEX channel devices of the host
(``/dev/nvidia-caps-imex-channels/channel*``, under PREFLIGHT_HOST_ROOT), which exist where a GB200/GB300
tray is set up for multi-node NVLink (MNNVL).

Facts schema::

    stack         {"soft": int bytes | None (unlimited), "hard": int | None}
    shm           {"path": "/dev/shm", "total_bytes": int, "free_bytes": int} | {"path", "error": "..."}
    imex_channels ["channel0", ...]        (empty: no MNNVL on this node)

Rule (per GPU node; CPU-only nodes SKIP: neither limit matters to a job without GPUs):

- stack: ``ulimit -s unlimited`` crashes NCCL's MNNVL topology search (NVIDIA/nccl#2186: NCCL 2.27.5 on
  44 GB200 ranks, reproduced by NVIDIA only with the stack raised from 8192 KiB to unlimited; NCCL 2.30.4
  logs "Stack size limit (unlimited) is unsafe; will use 8192KB" instead; NCCL user guide,
  Troubleshooting, "Stack size"). Judged only where it matters: an unlimited stack on a node with an IMEX
  channel FAILs (fix_config) unless every NCCL the driver check found is 2.30 or newer; elsewhere it is
  harmless, and the PASS says so.
- /dev/shm: NCCL's SHM transport creates one segment of about 9.2 MiB (9637888 bytes: NVIDIA/nccl#342,
  #1518, pytorch/ci-infra#490) per GPU per channel, at least 2 channels (NVIDIA/nccl#1518's log), in
  /dev/shm; Docker's default 64 MiB fails from 4 GPUs on (#342, #1518). Below gpus x 2 x 9637888 bytes
  in total FAILs (fix_config: too small); enough in total but not free FAILs naming the space held
  (leftover segments of crashed jobs, #1518). One GPU: no local peer, not judged. A small /dev/shm that
  holds the GPUs' segments (a container's 256 MiB for 2 GPUs) passes. /dev/shm missing FAILs.
- The locked-memory limit RDMA needs is judged by ib_hca, on nodes with an active HCA port.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "limits"

CHECK = Check(
    name=NAME,
    claim="The stack limit is finite where multi-node NVLink is in use, and /dev/shm holds the GPUs' NCCL "
    "shared-memory segments",
    why="NCCL before 2.30 crashes at init on multi-node NVLink (GB200/GB300) when `ulimit -s` is unlimited; "
    "a /dev/shm too small or full of leftover segments (Docker's 64 MiB default) fails NCCL's shared-memory "
    "transport at init with 'Error while creating shared memory segment'.",
    fix="Stack: remove `ulimit -s unlimited` from the job's environment (limits.conf `stack`, the launcher, "
    "Slurm's PropagateResourceLimits) or use NCCL 2.30+. /dev/shm: run containers with --shm-size=1g or "
    "--ipc=host (Kubernetes: an emptyDir with medium: Memory at /dev/shm), remount it larger "
    "(mount -o remount,size=16G /dev/shm), or remove stale /dev/shm/nccl-* files.",
    needs=("driver",),
    reads="/proc/self/limits, statvfs(/dev/shm), /dev/nvidia-caps-imex-channels",
    takes="< 0.1 s",
    order=86,
)

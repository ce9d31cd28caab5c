"""gpu: every node shows the GPUs the inventory promises, each one healthy enough to join a collective.

Facts come from NVML when ``pynvml.nvmlInit()`` works, else from ``nvidia-smi -q -x`` (plus
``nvidia-smi nvlink --status`` for link states, which the XML does not carry), else they record that no
driver answered. Set ``PREFLIGHT_NVML=off`` in the node's environment to skip NVML and read nvidia-smi
(useful where a container's libnvidia-ml does not match the host driver).

Facts: the schema in preflight.probe.gpu_facts (other checks read them as a typed record:
preflight.derived.gpus.node_gpus), plus, from the probe: virtual (why the node is a VM: DMI, a GPU in Pass-Through),
access ({SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, ..., cgroup}: when some GPU may not be opened here, or in a
Slurm job), nvml_open_s (seconds spent opening GPUs, when slow), nvml_slow (NVML ran out of time while
still answering), health (preflight.probe.gpu_health: memory wear and GPU state, read in the same NVML
session or parsed from the same XML; judged by gpu_memory and gpu_state).

NVML runs bounded (preflight.probe.nvml): one call may take NVML_BUDGET_S, the sequence NVML_TOTAL_S
while calls keep returning. A call stuck in the kernel costs only the GPU facts (what was read before it
is kept, the GPU being read gets the error), nvidia-smi is not tried after it, nor after a stuck
nvmlInit (it would hang the same way), and the driver check falls back to sysfs for the version so the
torch and NCCL facts still arrive. A slow NVML (no persistence mode: every GPU initialises when opened)
is not a wedge: the GPUs read are judged, the others named as not read (WARN). A GPU whose open answers
NO_PERMISSION is one this process may not use (a Slurm cgroup with ConstrainDevices, a container given
some devices): named with the job's variables, never judged broken. HW slowdown reasons are re-read
(NVML after RESAMPLE_S; nvidia-smi -q -x -d PERFORMANCE) and judged only when still active: the bits are
also set for an instant during clock and P-state changes.

Rule (per node; gpus_per_node from the inventory; "the fleet" is every judged GPU node of the run):

- gpus_per_node 0: SKIP (CPU-only node).
- no driver answered, or fewer GPUs than expected: FAIL (action reboot when the driver says its library
  and kernel module differ: a driver upgraded under the loaded module); more than expected: WARN (fix
  the inventory). GPUs the driver counts that this process may not open, or that a slow NVML did not get
  to, are not missing; inside a Slurm job, the GPUs SLURM_JOB_GPUS lists are all nvidia-smi can see.
- per GPU, FAIL (action isolate): volatile uncorrectable ECC > 0, row-remap failure, HW slowdown / HW
  thermal slowdown / HW power brake active in two samples (clocks cut by half or more: the straggler
  every all-reduce waits for), an NVML query error (GPU lost, corrupted infoROM, unknown error: only
  NotSupported and FunctionNotFound mean "cannot say"; NoPermission on a query is a WARN, the fact
  unknown to this user), fewer NVLinks active than the model has (H100/H200/B200 SXM 18, A100 SXM 12:
  see MODEL_NVLINKS; only on a whole baseboard: 8 GPUs, or 4 on bare metal) or than the node's other
  GPUs, including every link down. A node of one GPU (a cloud 1x H100/H200 SXM VM) is not judged for
  NVLink; one holding part of a baseboard (2 GPUs, 4 in a VM) only against its other GPUs (nvlink_shape):
  links the hypervisor or partition did not give are said in the PASS message, never a FAIL; MIG enabled when the run has more than one GPU node (NCCL cannot use
  MIG instances for a multi-node job), naming the nodes whose MIG mode differs.
- per GPU, FAIL with action reset_gpu: retired pages pending (pre-Ampere: retired at the next reset).
- per GPU, WARN with action reset_gpu: row remap pending (NVIDIA: the remap takes effect at the next
  reset and running work is unaffected; reset when convenient, no drain).
- per GPU, WARN: SW thermal slowdown active; ECC enabled but the volatile counters unreadable (N/A under
  MIG); PCIe width below both its max and the width the fleet's GPUs of the same model train at (an x8
  slot every A10G/T4 node shares is the platform, said in the PASS message, not a warning), only for
  GPUs the topology check did not read from sysfs in this run (topology owns the link width and FAILs it
  against the slot and the fleet; see topology_links); persistence mode off where the fleet's majority
  has it on or where opening the GPUs was measurably slow (naming nvidia-smi -pm 1 or
  nvidia-persistenced), ECC disabled where the fleet's majority has it enabled (otherwise said in the PASS
  message: the cloud images' default is not a fault). A PCIe *generation* below max alone is not
  reported: idle GPUs downshift the link to save power.
- per node, WARN: nvidia-smi nvlink --status lines not understood (named; the rest is judged); NVML slow
  (GPUs not read named); GPUs this process may not open (NVML NO_PERMISSION for k of n, or a Slurm job's
  cgroup hiding the others from nvidia-smi), named with why and the job's variables, action retest: never
  a FAIL, never a PASS that checked part of the node; no GPU accessible to this process; NVML not used because the node's pynvml is
  not nvidia-ml-py's (the controller shipped none).
- /dev/shm is the limits check's (sized by the node's GPU count: a container's 256 MiB holds 2 GPUs' NCCL
  segments; a flat 1 GiB here warned on such healthy nodes and double-reported the small ones).
- otherwise one PASS: "8× NVIDIA H100 80GB HBM3, healthy" plus the shared platform choices.

GPU fabric state (NVSwitch registration; GB200/GB300 clique and cluster) is collected here and judged by
fabric_manager.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpu"

CHECK = Check(
    name=NAME,
    claim="Every GPU node shows its gpus_per_node GPUs, each without ECC/remap faults, NVML errors, HW throttling, "
    "a PCIe link narrower than its peers' (when the topology check did not read it from sysfs), or fewer NVLinks than its model has (18 on H100/H200/B200 SXM, 12 on "
    "A100 SXM); no MIG on a multi-node run",
    why="One missing, throttled or faulty GPU makes every collective wait for it or crash. "
    "Unusual but healthy nodes are not failed: GPUs a job's cgroup "
    "hides (a warning naming them: the node was not all checked), NVLink a VM given 1, 2 or 4 GPUs of a "
    "baseboard was not given, a pending row remap, a slow NVML without persistence mode.",
    fix="Uncorrectable ECC: drain the node and reset the GPU (nvidia-smi -r); remap failure: replace it; remap "
    "pending (warn, action reset_gpu): reset the GPU when it is idle. Missing GPU or narrow PCIe link: check dmesg "
    "for Xid 79, reseat. HW slowdown (seen twice): check cooling and power (nvidia-smi -q -d PERFORMANCE). "
    "Persistence mode off or NVML slow: nvidia-smi -pm 1 or enable nvidia-persistenced. NVML did not return: "
    "check dmesg for Xid, reset the GPU or reboot. Driver/library version mismatch (a driver upgraded under the "
    "loaded module): reboot. MIG: nvidia-smi -mig 0 and reset the GPU. GPUs not checked (warn, action retest): run "
    "preflight outside the job or container, or in a job holding every GPU of the node. 'NVML not used: pynvml': pip install "
    "'nvidia-ml-py>=12,<14' on the controller.",
    action="isolate",
    reads="NVML (pynvml): every GPU's identity, ECC and row-remap state, throttle reasons, PCIe link, NVLink "
    "state, MIG; else nvidia-smi -q -x; /proc/self/cgroup and SLURM_JOB_GPUS when GPUs look hidden",
    takes="< 1 s with persistence mode; NVML is bounded at 60 s without it",
    order=20,
)

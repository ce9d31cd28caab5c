"""gpu_state: no GPU is left in a state that stops or slows the next job: compute mode, leftover processes,
a lowered power cap or application clocks, a recovery action the driver asks for.

Rule only: the gpu probe reads the facts in its one NVML session or its nvidia-smi XML
(preflight.probe.gpu_health: nvmlDeviceGetComputeMode, nvmlDeviceGetComputeRunningProcesses,
nvmlDeviceGetPowerManagement[Default]Limit, nvmlDeviceGet[Default]ApplicationsClock, the field values
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R575+) and the older reset status; XML <compute_mode>, <processes>,
<power_readings>, <applications_clocks>, <gpu_recovery_action>, <gpu_reset_status>).

Per GPU:

- compute mode Prohibited: FAIL fix_config (no CUDA context can be created: every rank on it fails);
  Exclusive_Process: WARN fix_config (one context per GPU: a second process, an MPS client or a monitoring
  agent that opens a context, makes the job's rank fail). nvidia-smi -c DEFAULT.
- compute processes holding GPU memory (pid, command, MiB), this probe excluded: FAIL check_app (left by a
  previous job, or another job on the node: the all-reduce runs out of memory or shares the GPU). A
  process holding no memory that nvidia-smi can report (used_memory N/A, a WDDM or MPS-managed client) is
  named in the PASS message.
- the driver's recovery action (nvmlDeviceGpuRecoveryAction_t; NVML reference, "GPU Recovery Action"):
  Reset, Drain and Reset, Drain P2P, Bus Reset: FAIL reset_gpu; Reboot, System Reboot: FAIL reboot;
  Recover IMEX Domain: FAIL fix_config (restart the IMEX daemon of the domain). The older reset status
  (reset required, drain and reset recommended) where the driver has no recovery action: FAIL reset_gpu.
- power limit below the default limit by more than POWER_SLACK: WARN fix_config (nvidia-smi -pl; the GPU
  is capped below what it was designed to draw: the straggler).
- graphics applications clock below its default: WARN fix_config (nvidia-smi -rac). Applications clocks
  above the default, or the "deprecated" answer of Blackwell drivers: not judged.
- The compute-mode, power and clock WARNs are drift: they fire where the GPU differs from the strict
  majority of its model's GPUs in the run. A setting that majority shares, or the run's only GPU of its
  model holds, is the site's choice (a power policy, an exclusive-mode cluster, a workstation capped by
  its owner: ../shared/realworld telegraf_rtx-3090-v12 runs at 200 W of 350): said in the PASS message.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpu_state"

CHECK = Check(
    name=NAME,
    claim="No GPU is in a Prohibited/Exclusive compute mode, held by a leftover process, capped below its default "
    "power or applications clock, or waiting for a reset or reboot the driver asks for",
    why="A process left by a previous job holds GPU memory (the all-reduce runs out of memory or shares the GPU); "
    "a Prohibited or Exclusive compute mode makes ranks fail to create their context; a lowered power cap or "
    "application clock makes the GPU the straggler; the driver's recovery action says the GPU is unusable until "
    "reset or reboot. A site that caps every GPU alike is not failed.",
    fix="Leftover processes: end them (kill the pid named) or find the job that left them; compute mode: "
    "nvidia-smi -c DEFAULT; power cap: nvidia-smi -pl <default>; applications clocks: nvidia-smi -rac; recovery "
    "action Reset: drain and nvidia-smi -r; Reboot: reboot the node.",
    needs=("gpu",),
    action="fix_config",
    order=22,
    reads="the gpu probe's NVML session (compute mode, running processes, power limits, applications clocks, "
    "recovery action field) or its nvidia-smi -q -x",
    takes="< 0.1 s inside the gpu probe",
)

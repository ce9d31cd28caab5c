"""nvls: where NCCL would use NVLS (NVLink SHARP), its prerequisites are met, so NCCL's init does not fail on it.

Rule only: reads the gpu, fabric_manager, driver and nccl_env facts (nothing new runs on a node); the
node's state is derived once by preflight.derived.nvls.assess (its docstring cites the NCCL source, release notes
and issues the rule follows), the same reading the env file uses to write NCCL_NVLS_ENABLE=0.

NVLS is a performance feature, so nothing here drains a node: the worst verdict is a WARN with action
fix_config (the fabric itself, where it is broken, is the fabric_manager check's FAIL).

- NVLS-capable NVSwitch node (Hopper or later on 3rd-generation NVSwitches, GB200/GB300 trays) whose
  prerequisites are not met (a GPU's NVLink fabric not Completed, nvidia-fabricmanager not active, on a
  multi-node NVLink tray nvidia-imex not active or no IMEX channel): WARN fix_config. With NCCL 2.29 or
  later (or NCCL_NVLS_ENABLE=1) NCCL fails the communicator's init instead of falling back: set
  NCCL_NVLS_ENABLE=0 (the recommended env file does) or fix the fabric; older NCCL falls back without NVLS
  (slower collectives); NCCL's version unknown: said so.
- NCCL_NVLS_ENABLE=1 set on a node whose hardware has no NVLS (no NVSwitch fabric, a GPU before Hopper, a
  driver before R530): WARN fix_config, NCCL then fails at init whatever its version.
- not applicable (SKIP with the reason): PCIe / NVLink-bridge parts, a VM without NVLink, one GPU, MIG,
  A100's NVSwitch, a driver before R530, NCCL older than 2.17, NCCL_NVLS_ENABLE=0 set.
- facts that cannot tell (fabric manager state unreadable and no GPU fabric state, nvidia-imex state
  unreadable, driver version unknown): SKIP "not judged", never PASS. No gpu/fabric facts: ERROR (retest).
- prerequisites met: PASS naming the fabric, the NCCL version and that NCCL uses NVLS.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "nvls"

CHECK = Check(
    name=NAME,
    claim="Where NCCL would use NVLS (NVLink SHARP), its prerequisites are met: the NVSwitch fabric is programmed, "
    "and on multi-node NVLink trays IMEX is up",
    why="NCCL 2.29 and later no longer fall back when NVLS multicast memory cannot be bound: the job fails at init "
    "with 'Failed to bind NVLink SHARP (NVLS) Multicast memory' (older NCCL silently ran without NVLS, slower). "
    "NCCL_NVLS_ENABLE=1 makes it fail on any node without NVLS hardware.",
    fix="Fix the NVSwitch fabric (fabric_manager's findings: nvidia-fabricmanager, GPU fabric state, nvidia-imex and "
    "the IMEX channel on GB200/GB300), or run with NCCL_NVLS_ENABLE=0 (the recommended env file writes it while "
    "NVLS cannot work); remove NCCL_NVLS_ENABLE=1 from nodes without NVLS hardware.",
    needs=("gpu", "fabric_manager", "driver", "nccl_env"),
    action="fix_config",
    order=88,
    reads="nothing new: the gpu (model, MIG, NVLink fabric state), fabric_manager, driver (NCCL version) and "
    "nccl_env (NCCL_NVLS_ENABLE) facts",
    takes="no probe (rule only)",
)

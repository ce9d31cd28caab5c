"""nvls: where NCCL would use NVLS (NVLink SHARP), its prerequisites are met, so NCCL's init does not fail on it.

Rule only: reads the gpu, fabric_manager, driver and nccl_env facts (nothing new runs on a node); the
node's state is derived once by preflight.nvls.assess (its docstring cites the NCCL source, release notes
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

from typing import Any, List

from preflight.common import plural
from preflight.model import Check, ClusterView, Finding, Status

NAME = "nvls"
#: not-applicable reasons under which NCCL_NVLS_ENABLE=1 makes NCCL try multicast on hardware without it
NO_HARDWARE = ("no_fabric", "model", "driver")


def _nccl(state: Any) -> str:
    return "NCCL %s" % state.nccl if state.nccl else "NCCL (version unknown)"


def _setting(state: Any) -> str:
    return "NCCL_NVLS_ENABLE=%s (%s)" % state.setting if state.setting else "NCCL_NVLS_ENABLE unset (2: when CUDA reports multicast)"


def _unusable(node: str, state: Any) -> Finding:
    what = "; ".join(state.unmet)
    if state.forced:
        then = "%s forces NVLS: NCCL fails at init" % _setting(state)
    elif state.fatal:
        then = ("%s fails the communicator's init instead of falling back when its multicast setup fails "
                "(NCCL 2.29 and later)" % _nccl(state))
    elif state.fatal is None:
        then = "NCCL's version is unknown here: NCCL 2.29 and later fail at init on this, older ones fall back without NVLS"
    else:
        then = "%s falls back without NVLS (slower collectives); NCCL 2.29 and later fail at init on this" % _nccl(state)
    return Finding(NAME, node, Status.WARN,
                   "NVLS (NVLink SHARP) cannot work on this node (%s): %s; %s. Set NCCL_NVLS_ENABLE=0 (the recommended env "
                   "file does) or fix the fabric (see fabric_manager)" % (state.fabric, what, then),
                   expected="NVLS prerequisites met", actual=what, action="fix_config")


def _node(view: ClusterView, node: Any) -> List[Finding]:
    from preflight.nvls import assess  # controller side: not in the node bundle

    state = assess(view, node)
    name = node.name
    if state.kind == "cpu":
        return [Finding(NAME, name, Status.SKIP, state.reason)]
    if state.kind == "no_facts":
        return [Finding(NAME, name, Status.ERROR, "NVLS not judged: %s" % state.reason, expected="GPU and fabric facts",
                        actual="none", action="retest")]
    if state.kind == "not_applicable":
        if state.forced and state.code in NO_HARDWARE:
            return [Finding(NAME, name, Status.WARN, "%s forces NVLS where there is none (%s): NCCL fails at init; remove "
                            "it (NCCL's default 2 asks CUDA whether multicast exists)" % (_setting(state), state.reason),
                            expected="NCCL_NVLS_ENABLE unset, 2 or 0", actual=state.setting[0], action="fix_config")]
        return [Finding(NAME, name, Status.SKIP, "not applicable: %s" % state.reason)]
    if state.kind == "not_judged":
        return [Finding(NAME, name, Status.SKIP, "NVLS not judged (%s): %s" % (state.fabric, "; ".join(state.unknown)))]
    if state.kind == "unusable":
        return [_unusable(name, state)]
    uses = "uses it" if state.tried else "uses it from 2.17 on"
    return [Finding(NAME, name, Status.PASS, "NVLS prerequisites met on %s: %s, %s; %s %s (%s)" % (
        plural(state.gpus, "GPU"), state.fabric, "every GPU's NVLink fabric Completed" if state.fabric_seen
        else "nvidia-fabricmanager active", _nccl(state), uses, _setting(state)))]


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    for node in view.live:
        out.extend(_node(view, node))
    return out


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
    probe=None,
    rule=rule,
    needs=("gpu", "fabric_manager", "driver", "nccl_env"),
    action="fix_config",
    order=88,
    reads="nothing new: the gpu (model, MIG, NVLink fabric state), fabric_manager, driver (NCCL version) and "
    "nccl_env (NCCL_NVLS_ENABLE) facts",
    takes="no probe (rule only)",
)

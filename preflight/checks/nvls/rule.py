"""The nvls check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, List

from preflight.checks.nvls import NAME
from preflight.common import plural
from preflight.derived.nvls import assess
from preflight.model import ClusterView, Finding, Status

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

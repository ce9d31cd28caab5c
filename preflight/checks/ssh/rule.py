"""The ssh check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import List

from preflight.checks.ssh import NAME
from preflight.common import clock_offset
from preflight.model import FAILURE_KINDS, ClusterView, Finding, Status, probe_error

MIN_PYTHON = (3, 8)
MAX_SKEW_S = 1.0


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    kinds = view.cluster.get(FAILURE_KINDS) or {}
    for name, why in view.unreachable.items():
        if kinds.get(name) == "damaged":
            # the node ran the bundle and answered; frames of its answer were lost on the way: nothing is
            # known to be wrong with the node, so this is no verdict on it (never a drain)
            out.append(Finding(NAME, name, Status.ERROR, "%s; the node answered but its result was damaged in transit "
                               "(run again; if it repeats, check the transport's output handling)" % why,
                               data={"unreachable": True, "damaged": True}, action="retest"))
        elif kinds.get(name) == "scheduler":
            # Slurm could not run the step there (srun: "Unable to confirm allocation", the job ended under it, a
            # launch that timed out twice): nothing is known about the node (never a drain); the message says
            # where to look (preflight.slurm.fleet)
            out.append(Finding(NAME, name, Status.ERROR, why, data={"unreachable": True, "scheduler": True},
                               action="retest"))
        elif kinds.get(name) == "login_shell":
            # connected and authenticated; the shell's start-up files (a shared home's pyenv/conda init)
            # had not started the command: the login environment is slow, nothing is known of the node
            out.append(Finding(NAME, name, Status.ERROR, why, data={"unreachable": True, "login_shell": True},
                               action="retest"))
        else:
            out.append(Finding(NAME, name, Status.FAIL, why, data={"unreachable": True}, action="isolate"))
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts)
        if err:
            out.append(err)
            continue
        version = tuple(int(p) for p in facts["python"][:2])
        shown = ".".join(facts["python"])
        if version < MIN_PYTHON:
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL,
                    "python %s is too old for the probe" % shown,
                    expected=">= %d.%d" % MIN_PYTHON,
                    actual=shown,
                )
            )
            continue
        skew = clock_offset(facts)
        if skew is not None and abs(skew[0]) - skew[1] > MAX_SKEW_S:
            out.append(
                Finding(
                    NAME,
                    name,
                    Status.WARN,
                    "clock is %+.1f s off the controller's (±%.2f s); run chrony/ntpd" % skew,
                    expected="|skew| <= %.0f s" % MAX_SKEW_S,
                    actual="%+.1f s" % skew[0],
                )
            )
            continue
        out.append(Finding(NAME, name, Status.PASS, "reachable, python %s" % shown, actual=shown))
    return out

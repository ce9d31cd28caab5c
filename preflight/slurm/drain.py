"""Drain failing Slurm nodes and return to service the ones preflight drained that now pass.

Decisions:
- A node is drained when one of its findings is fail or error and a check decided a fault there: a node
  whose worst finding's action is *retest* (an ERROR: the check could not decide, e.g. a result damaged
  in transit) is not drained, and is named "not drained ... retest" (a false drain costs a healthy node
  as surely as a missed fault costs a job); it counts toward neither the blast radius nor --resume. The
  reason is
  `preflight: <check>: <finding>` cut to REASON_MAX characters (Slurm keeps the reason whole, but
  `sinfo -R` and admins' eyes do not), on one line. The reason names the root cause: a FAIL before an
  ERROR, and never a consequence ("mtu: not tested: no data interface" when nic FAILs on the node).
- A node drained by someone else (any reason not starting `preflight:`) or marked DOWN by Slurm is never
  touched, also when that happened during the run: each node is read again just before each `scontrol
  update` (drain, re-drain of a node resumed for its recheck, resume), and one that is someone else's now
  is named "left alone: n003 (drained by someone else during this run: ...)". A node Slurm had out of service when the run began is *unavailable* (set_aside): not
  checked, named with its state and reason, not counted in the exit code or the blast radius
  (--count-unavailable counts it as failing, as before).
- `--resume` returns to service only nodes whose drain reason starts `preflight:` and which passed this
  run (they were checked: findings exist for them and none is a problem).
- When more than `max_fraction` of the nodes this run checked fail, nothing is drained: a fabric-wide
  fault must not empty the cluster. The run says so, with its figures (failed / checked, unavailable
  nodes left out of both).
- scontrol is run with argv lists (no shell); `dry_run` only returns the commands.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from preflight.common import fold, plural, printable
from preflight.model import UNAVAILABLE, Finding, Status, is_consequence, unavailable
from preflight.slurm.scontrol import REASON_PREFIX, SlurmError, down as _down, drained as _drained, left_alone_why, node_info, ours

PREFIX = REASON_PREFIX
REASON_MAX = 120


def reason_for(finding: Finding) -> str:
    text = printable(" ".join(("%s %s: %s" % (PREFIX, finding.check, finding.message)).split()))  # scontrol show node
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def worst_findings(findings: Iterable[Finding]) -> Dict[str, Finding]:
    """{node: the finding its drain reason (and node-mode headline) names}: the root cause. The ssh
    finding first (the transport explains every 'not checked'), then a finding that is not a
    consequence (`model.is_consequence`: "not tested: no data interface" beside nic's FAIL), then a
    FAIL (a decided fault) before an ERROR (a check that could not decide)."""
    worst: Dict[str, Finding] = {}

    def key(f: Finding) -> Any:
        return (f.check == "ssh", not is_consequence(f), f.status is Status.FAIL)

    for f in findings:
        if f.node is not None and f.status.is_problem and (f.node not in worst or key(f) > key(worst[f.node])):
            worst[f.node] = f
    return worst


def set_aside(findings: Iterable[Finding], out_of_service: Dict[str, Dict[str, Any]], strict: bool = False) -> List[Finding]:
    """The run's findings with each node Slurm had out of service ({node: {"state", "reason"}}: the
    allocation's excluded nodes) reduced to one finding that names its state and reason: SKIP
    (unavailable: not checked, not this run's failure), or FAIL with strict (--count-unavailable).
    The node's "not checked" echoes go: nothing was run there."""
    out = [f for f in findings if f.node not in out_of_service]
    for node, info in sorted(out_of_service.items()):
        state = list(info.get("state") or [])
        reason = info.get("reason")
        said = "Slurm marked it %s" % "+".join(state) if _down(state) else "Slurm reports it %s" % "+".join(state)
        message = "%s%s; not checked" % (said, " (reason: %s)" % reason if reason else "")
        out.append(Finding("ssh", node, Status.FAIL if strict else Status.SKIP, message,
                           data={UNAVAILABLE: {"state": state, "reason": reason}}, action="isolate" if strict else None))
    return out


@dataclass
class Plan:
    drain: Dict[str, str] = field(default_factory=dict)  # node -> reason
    resume: List[str] = field(default_factory=list)
    left_alone: Dict[str, str] = field(default_factory=dict)  # node -> someone else's reason
    refused: Optional[str] = None
    undecided: List[str] = field(default_factory=list)  # problems only a check that could not decide: not drained
    resumed_already: List[str] = field(default_factory=list)  # in service since the recheck reservation

    def updates(self) -> List[Tuple[str, str, List[str]]]:
        """(node, "drain" | "resume", the scontrol argv) for each update the plan makes, drains first."""
        out = [(n, "drain", ["scontrol", "update", "nodename=%s" % n, "state=drain", "reason=%s" % r])
               for n, r in sorted(self.drain.items())]
        out += [(n, "resume", ["scontrol", "update", "nodename=%s" % n, "state=resume"]) for n in sorted(self.resume)
                if n not in self.resumed_already]
        return out

    def commands(self) -> List[List[str]]:
        return [argv for _, _, argv in self.updates()]

    def lines(self) -> List[str]:
        out = []
        if self.refused:
            out.append("drain: refused: %s" % self.refused)
        if self.drain:
            out.append("drain: %s" % fold(self.drain))
        if self.undecided:
            out.append("not drained: %s (no check decided a fault there: retest)" % fold(self.undecided))
        if self.resume:
            out.append("resume: %s" % fold(self.resume))
        for node, why in sorted(self.left_alone.items()):
            out.append("left alone: %s (%s)" % (node, why))
        return [printable(line) for line in out]  # another user's reason, as Slurm holds it


def plan(findings: Iterable[Finding], checked: Sequence[str], slurm_state: Dict[str, Dict[str, Any]],
         drain: bool, resume: bool, max_fraction: float = 0.2) -> Plan:
    """What to drain and resume, from this run's findings and Slurm's state of the nodes (before the run).

    checked: the nodes this run covered. slurm_state: {node: {"state": [...], "reason": str|None}}.
    """
    findings = list(findings)
    worst = worst_findings(findings)
    aside = {f.node for f in findings if unavailable(f)}
    seen = {f.node for f in findings if f.node is not None and not unavailable(f)}
    out = Plan()
    for node in checked:
        info = slurm_state.get(node) or {"state": [], "reason": None}
        reason = info.get("reason")
        why = left_alone_why("drain", info)
        if why is not None:
            out.left_alone[node] = why
            continue
        if node in aside:  # not checked in this run (e.g. drained by preflight, no --resume): as it is
            continue
        if node in worst:
            if worst[node].action == "retest":  # no check decided a fault: run it again, never drain for it
                out.undecided.append(node)
            elif drain and not _drained(info["state"]):
                out.drain[node] = reason_for(worst[node])
        elif resume and node in seen and _drained(info["state"]) and ours(reason):
            out.resume.append(node)
    judged = [n for n in checked if n not in out.left_alone and n not in aside]
    failing = [n for n in judged if n in worst and n not in out.undecided]
    if out.drain and judged and len(failing) > max_fraction * len(judged):
        left_out = len(checked) - len(judged)
        out.refused = ("%s of the %d checked in this run failed (%.0f%% > --max-drain-fraction %.0f%%%s): looks "
                       "cluster-wide (fabric, config), not per node; drained nothing (would have drained %s)" % (
                           plural(len(failing), "node"), len(judged), 100.0 * len(failing) / len(judged), 100 * max_fraction,
                           "; %d unavailable or left alone not counted" % left_out if left_out else "", fold(out.drain)))
        out.drain = {}
    return out


def apply(p: Plan, run: Any, read: Callable[[str], Dict[str, Any]]) -> List[str]:
    """Run the plan's scontrol updates with `run(argv) -> CompletedProcess`, each just after re-reading its
    node with `read(node) -> {"state", "reason"}`: a node someone drained (or Slurm set DOWN) since the run
    began is theirs, so it leaves the plan for p.left_alone ("during this run"); a node that cannot be
    re-read is not touched. Returns error lines."""
    errors = []
    for node, kind, argv in p.updates():
        try:
            why = left_alone_why(kind, read(node))
        except SlurmError as exc:
            errors.append("could not re-read %s before its %s (%s): left as it is" % (node, kind, exc.message))
            continue
        if why is not None:
            p.left_alone[node] = why.replace("someone else", "someone else during this run", 1)
            p.drain.pop(node, None)
            p.resume = [n for n in p.resume if n != node]
            continue
        done = run(argv)
        if done.returncode != 0:
            errors.append("%s failed: %s" % (" ".join(argv[:3]), (done.stderr or "").strip()[:200]))
    return errors


def _read_node(node: str) -> Dict[str, Any]:
    return node_info([node])[node]


def act(findings: Sequence[Finding], nodes: Sequence[str], alloc: Any, drain: bool, resume: bool, max_fraction: float,
        dry_run: bool, say: Callable[[str], None]) -> None:
    """--drain / --resume on the run's allocation (preflight.slurm.allocation.Allocation): plan from the
    findings and Slurm's state before the run, say the plan, then apply it (or, dry_run, print the
    scontrol commands). The nodes resumed for the recheck (alloc.held) are drained again, with this
    run's reason or their old one, unless they passed; then the allocation is settled."""
    from preflight.slurm import scontrol

    held = alloc.held
    p = plan(findings, nodes, alloc.state, drain=drain, resume=resume, max_fraction=max_fraction)
    worst = worst_findings(findings)
    for node, old in held.items():  # resumed only to be checked: back to drain unless it passed and --resume
        if node not in p.resume:  # a fault decided now names itself; an undecided recheck keeps the old reason
            p.drain[node] = reason_for(worst[node]) if node in worst and worst[node].action != "retest" else old
    # the ones that passed were resumed inside the recheck reservation already: a second resume is an
    # invalid transition (IDLE to RESUME) that scontrol rejects
    p.resumed_already = [n for n in p.resume if n in held]
    if dry_run:
        for line in p.lines():
            say(line)
        for argv in p.commands():
            say("would run: " + shlex.join(argv))
        return
    errors = apply(p, scontrol.run, _read_node)
    for line in p.lines() + ["drain: " + line for line in errors]:  # what was done, after the re-reads
        say(line)
    alloc.settle()  # the held nodes are drained again or returned, as the plan says: the reservation goes

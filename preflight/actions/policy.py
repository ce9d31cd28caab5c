"""The drain / cordon / resume policy, once for every scheduler: from a run's findings and each node's mark
(in service, out by preflight's hand, or someone else's), what to take out of service and what to return.

Decisions:
- A node is taken out (Slurm: drained; Kubernetes: cordoned) when one of its findings is fail or error and
  a check decided a fault there: a node whose worst finding's action is *retest* (an ERROR: the check
  could not decide, e.g. a result damaged in transit) is not, and is named "not drained ... retest" (a
  false drain costs a healthy node as surely as a missed fault costs a job); it counts toward neither the
  blast radius nor --resume. The reason is `preflight: <check>: <finding>` cut to REASON_MAX characters,
  on one line, and names the root cause: a FAIL before an ERROR, never a consequence ("mtu: not tested:
  no data interface" when nic FAILs on the node).
- A node someone else took out (a mark with `theirs`) is never touched, also when that happened during
  the run: `apply` reads each node again just before each update, and one that is someone else's now is
  named "left alone: n003 (drained by someone else during this run: ...)".
- `--resume` returns to service only nodes preflight took out and which passed this run (findings exist
  for them and none is a problem).
- When more than `max_fraction` of the nodes this run judged fail, nothing is taken out: a fabric-wide
  fault must not empty the cluster. The run says so, with its figures.

The history's part (N-in-W for retest-class and flapping faults, the circuit breaker across runs,
--shadow: preflight.history.escalation) runs before this one and hands it findings, so every applier
obeys it alike. An applier (Slurm: preflight.slurm.drain.SlurmApplier; Kubernetes:
preflight.k8s.nodes.KubeApplier) only reads marks and carries out the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

from preflight.common import fold, plural, printable
from preflight.errors import PreflightError
from preflight.model import Finding, Status, is_consequence, unavailable

#: every reason preflight writes starts with this: a reason that does not is someone else's
REASON_PREFIX = "preflight:"
REASON_MAX = 120


def ours(reason: Optional[str]) -> bool:
    """A reason preflight wrote (the node-mode wrapper's included)."""
    return bool(reason) and reason.startswith(REASON_PREFIX)


@dataclass(frozen=True)
class Mark:
    """A node as its scheduler holds it, in the policy's words (an applier translates its own states).

    out: out of service (Slurm DRAIN/DRAINING/DRAINED, a Kubernetes cordon); theirs: why preflight must not
    take it out (someone else took it out, Slurm set it DOWN), None when it may; back: why preflight must
    not return it to service (theirs, or it is not preflight's out-of-service any more), None when it may.
    """

    out: bool = False
    theirs: Optional[str] = None
    back: Optional[str] = None

    def refuses(self, kind: str) -> Optional[str]:
        """Why this node must not get preflight's `kind` ("drain" or "resume") update, None when it may."""
        return self.back if kind == "resume" else self.theirs


IN_SERVICE = Mark(back="not out of service any more")


def reason_for(finding: Finding) -> str:
    text = printable(" ".join(("%s %s: %s" % (REASON_PREFIX, finding.check, finding.message)).split()))
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


@dataclass
class Plan:
    drain: Dict[str, str] = field(default_factory=dict)  # node -> reason
    resume: List[str] = field(default_factory=list)
    left_alone: Dict[str, str] = field(default_factory=dict)  # node -> someone else's reason
    refused: Optional[str] = None
    undecided: List[str] = field(default_factory=list)  # problems only a check that could not decide: not drained
    resumed_already: List[str] = field(default_factory=list)  # in service since the recheck reservation
    done: List[Tuple[str, str]] = field(default_factory=list)  # (node, "drain" | "resume") carried out by apply

    def steps(self) -> List[Tuple[str, str]]:
        """(node, "drain" | "resume") for each update the plan makes, drains first."""
        out = [(n, "drain") for n in sorted(self.drain)]
        return out + [(n, "resume") for n in sorted(self.resume) if n not in self.resumed_already]

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
        return [printable(line) for line in out]  # another user's reason, as the scheduler holds it


def plan(findings: Iterable[Finding], checked: Sequence[str], marks: Dict[str, Mark], drain: bool, resume: bool,
         max_fraction: float = 0.2, into: Callable[[], Plan] = Plan) -> Plan:
    """What to take out and return, from this run's findings and the nodes' marks (before the run).

    checked: the nodes this run covered; a node without a mark is in service. into: the Plan class an
    applier extends (Slurm's knows its scontrol commands)."""
    findings = list(findings)
    worst = worst_findings(findings)
    aside = {f.node for f in findings if unavailable(f)}
    seen = {f.node for f in findings if f.node is not None and not unavailable(f)}
    out = into()
    for node in checked:
        mark = marks.get(node) or IN_SERVICE
        if mark.theirs is not None:
            out.left_alone[node] = mark.theirs
            continue
        if node in aside:  # not checked in this run (e.g. drained by preflight, no --resume): as it is
            continue
        if node in worst:
            if worst[node].action == "retest":  # no check decided a fault: run it again, never drain for it
                out.undecided.append(node)
            elif drain and not mark.out:
                out.drain[node] = reason_for(worst[node])
        elif resume and node in seen and mark.out and mark.back is None:
            out.resume.append(node)
    _blast_radius(out, checked, aside, worst, max_fraction)
    return out


def _blast_radius(out: Plan, checked: Sequence[str], aside: Any, worst: Dict[str, Finding], max_fraction: float) -> None:
    """Refuse every drain of the plan when more than max_fraction of the judged nodes fail."""
    judged = [n for n in checked if n not in out.left_alone and n not in aside]
    failing = [n for n in judged if n in worst and n not in out.undecided]
    if out.drain and judged and len(failing) > max_fraction * len(judged):
        left_out = len(checked) - len(judged)
        out.refused = ("%s of the %d checked in this run failed (%.0f%% > --max-drain-fraction %.0f%%%s): looks "
                       "cluster-wide (fabric, config), not per node; drained nothing (would have drained %s)" % (
                           plural(len(failing), "node"), len(judged), 100.0 * len(failing) / len(judged), 100 * max_fraction,
                           "; %d unavailable or left alone not counted" % left_out if left_out else "", fold(out.drain)))
        out.drain = {}


def apply(p: Plan, update: Callable[[str, str], Optional[str]], read: Callable[[str], Mark]) -> List[str]:
    """Carry out the plan's steps with `update(node, kind) -> error line or None`, each just after
    re-reading its node with `read(node) -> Mark`: a node someone took out since the run began is theirs,
    so it leaves the plan for p.left_alone ("during this run"); a node that cannot be re-read (read raises
    a PreflightError) is not touched. Steps carried out go to p.done. Returns error lines."""
    errors = []
    for node, kind in p.steps():
        try:
            why = read(node).refuses(kind)
        except PreflightError as exc:
            errors.append("could not re-read %s before its %s (%s): left as it is" % (node, kind, exc.message))
            continue
        if why is not None:
            p.left_alone[node] = why.replace("someone else", "someone else during this run", 1)
            p.drain.pop(node, None)
            p.resume = [n for n in p.resume if n != node]
            continue
        error = update(node, kind)
        if error is not None:
            errors.append(error)
        else:
            p.done.append((node, kind))
    return errors


@dataclass(frozen=True)
class Request:
    """What the command line asked of the nodes: --drain, --resume, --max-drain-fraction, --dry-run."""

    drain: bool = False
    resume: bool = False
    max_fraction: float = 0.2
    dry_run: bool = False


Say = Callable[[str], None]


class Applier(Protocol):
    """A scheduler that carries out the policy on its nodes (a backend's `applier(inv)`).

    kind        what its drain is called, and the history's action kind for it: "drain" or "cordon".
    marks()     {node: Mark} as the scheduler held them when the run began (the history's would-drain).
    wanted(r)   whether this run must act at all (a Slurm recheck reservation must be settled even
                without --drain/--resume).
    act(findings, nodes, request, say) -> the actions carried out other than drains, for the history
                ({"node", "kind": "resume", "reason"}); says what it did, one line each.
    """

    kind: str

    def marks(self) -> Dict[str, Mark]:
        ...

    def wanted(self, request: Request) -> bool:
        ...

    def act(self, findings: Sequence[Finding], nodes: Sequence[str], request: Request, say: Say) -> List[Dict[str, Any]]:
        ...


def would_drain(marks: Dict[str, Mark], nodes: Sequence[str], max_fraction: float) -> Callable[[List[Finding]], List[str]]:
    """For the history's drain policy: the nodes the drain step would take out from given findings."""
    return lambda findings: sorted(plan(findings, nodes, marks, drain=True, resume=False, max_fraction=max_fraction).drain)


def resumed(p: Plan, what: str) -> List[Dict[str, Any]]:
    """The history's rows for the nodes the plan returned to service."""
    return [{"node": n, "kind": "resume", "reason": "passed this run (%s)" % what, "shadow": False}
            for n, kind in p.done if kind == "resume"]

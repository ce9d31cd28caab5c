"""Slurm applies the drain policy (preflight.actions.policy): scontrol drain / resume, and nodes Slurm had
out of service set aside.

- A node's Slurm state ({"state", "reason"}) becomes the policy's Mark: drained or draining is out of
  service; drained by someone else (any reason not starting `preflight:`) or DOWN is theirs, never
  touched, also when that happened during the run (each node is read again just before each `scontrol
  update`: drain, re-drain of a node resumed for its recheck, resume).
- A node Slurm had out of service when the run began is *unavailable* (set_aside): not checked, named
  with its state and reason, not counted in the exit code or the blast radius (--count-unavailable
  counts it as failing, as before).
- scontrol is run with argv lists (no shell); `dry_run` only prints the commands.
"""

from __future__ import annotations

import shlex
from typing import Any, Callable, Dict, Iterable, List, Sequence

from preflight.actions import policy
from preflight.actions.policy import REASON_MAX, Mark, Request, reason_for, worst_findings  # noqa: F401  (the policy's
# words, where Slurm's callers have read them)
from preflight.model import UNAVAILABLE, Finding, Status
from preflight.slurm.scontrol import down as _down, drained as _drained, left_alone_why, node_info


def mark_of(info: Dict[str, Any]) -> Mark:
    """A Slurm node state ({"state": [...], "reason": str|None}) in the policy's words."""
    return Mark(out=_drained(list(info.get("state") or [])), theirs=left_alone_why("drain", info),
                back=left_alone_why("resume", info))


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


class Plan(policy.Plan):
    """The policy's plan, with the scontrol commands that carry it out."""

    def commands(self) -> List[List[str]]:
        return [argv_for(self, node, kind) for node, kind in self.steps()]


def plan(findings: Iterable[Finding], checked: Sequence[str], slurm_state: Dict[str, Dict[str, Any]],
         drain: bool, resume: bool, max_fraction: float = 0.2) -> Plan:
    """What to drain and resume, from this run's findings and Slurm's state of the nodes (before the run).

    checked: the nodes this run covered. slurm_state: {node: {"state": [...], "reason": str|None}}.
    """
    marks = {node: mark_of(info) for node, info in slurm_state.items()}
    return policy.plan(findings, checked, marks, drain=drain, resume=resume, max_fraction=max_fraction, into=Plan)


def argv_for(p: policy.Plan, node: str, kind: str) -> List[str]:
    """The scontrol update for one step of the plan."""
    if kind == "drain":
        return ["scontrol", "update", "nodename=%s" % node, "state=drain", "reason=%s" % p.drain[node]]
    return ["scontrol", "update", "nodename=%s" % node, "state=resume"]


def apply(p: policy.Plan, run: Callable[[List[str]], Any], read: Callable[[str], Dict[str, Any]]) -> List[str]:
    """Run the plan's scontrol updates with `run(argv) -> CompletedProcess`, each just after re-reading its
    node with `read(node) -> {"state", "reason"}` (policy.apply: a node someone drained, or Slurm set
    DOWN, since the run began is left alone; one that cannot be re-read is not touched). Returns error lines."""

    def update(node: str, kind: str) -> Any:
        argv = argv_for(p, node, kind)
        done = run(argv)
        if done.returncode != 0:
            return "%s failed: %s" % (" ".join(argv[:3]), (done.stderr or "").strip()[:200])
        return None

    return policy.apply(p, update, lambda node: mark_of(read(node)))


def _read_node(node: str) -> Dict[str, Any]:
    return node_info([node])[node]


def act(findings: Sequence[Finding], nodes: Sequence[str], alloc: Any, drain: bool, resume: bool, max_fraction: float,
        dry_run: bool, say: Callable[[str], None]) -> Plan:
    """--drain / --resume on the run's allocation (preflight.slurm.allocation.Allocation): plan from the
    findings and Slurm's state before the run, say the plan, then apply it (or, dry_run, print the
    scontrol commands). The nodes resumed for the recheck (alloc.held) are drained again, with this
    run's reason or their old one, unless they passed; then the allocation is settled. Returns the plan
    (p.done: the updates carried out)."""
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
        for node, kind in p.steps():
            say("would run: " + shlex.join(argv_for(p, node, kind)))
        return p
    errors = apply(p, scontrol.run, _read_node)
    for line in p.lines() + ["drain: " + line for line in errors]:  # what was done, after the re-reads
        say(line)
    alloc.settle()  # the held nodes are drained again or returned, as the plan says: the reservation goes
    p.done.extend((n, "resume") for n in p.resumed_already)
    return p


class SlurmApplier:
    """The policy carried out with scontrol on the run's allocation (preflight.actions.policy.Applier)."""

    kind = "drain"

    def __init__(self, alloc: Any) -> None:
        self.alloc = alloc

    def marks(self) -> Dict[str, Mark]:
        state = self.alloc.state if self.alloc is not None else {}
        return {node: mark_of(info) for node, info in state.items()}

    def wanted(self, request: Request) -> bool:
        return self.alloc is not None and (request.drain or request.resume or bool(self.alloc.held))

    def act(self, findings: Sequence[Finding], nodes: Sequence[str], request: Request,
            say: Callable[[str], None]) -> List[Dict[str, Any]]:
        p = act(findings, nodes, self.alloc, request.drain, request.resume, request.max_fraction, request.dry_run, say)
        return policy.resumed(p, "scontrol update state=resume")

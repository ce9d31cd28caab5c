"""Drain failing Slurm nodes and return to service the ones preflight drained that now pass.

Decisions:
- A node is drained when one of its findings is fail or error; the reason is
  `preflight: <check>: <finding>` cut to REASON_MAX characters (Slurm keeps the reason whole, but
  `sinfo -R` and admins' eyes do not), on one line.
- A node drained (or downed) by someone else — any reason not starting `preflight:` — is never touched.
- `--resume` returns to service only nodes whose drain reason starts `preflight:` and which passed this
  run (they were checked: findings exist for them and none is a problem).
- When more than `max_fraction` of the checked nodes fail, nothing is drained: a fabric-wide fault
  must not empty the cluster. The run says so.
- scontrol is run with argv lists (no shell); `dry_run` only returns the commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence

from preflight.common import fold, plural, printable
from preflight.model import Finding

PREFIX = "preflight:"
REASON_MAX = 120


def reason_for(finding: Finding) -> str:
    text = printable(" ".join(("%s %s: %s" % (PREFIX, finding.check, finding.message)).split()))  # scontrol show node
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def ours(reason: Optional[str]) -> bool:
    return bool(reason) and reason.startswith(PREFIX)


def _drained(state: Sequence[str]) -> bool:
    return any(s.rstrip("*") in ("DRAIN", "DRAINED", "DRAINING") for s in state)


def worst_findings(findings: Iterable[Finding]) -> Dict[str, Finding]:
    """{node: the finding its drain reason names}: the worst status; among equals the cause (ssh, the
    transport, explains every 'not checked'), then a finding that is not a 'not checked' echo."""
    worst: Dict[str, Finding] = {}

    def key(f: Finding) -> Any:
        return (f.check == "ssh", not f.message.startswith("not checked"), f.status.rank)

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
    resumed_already: List[str] = field(default_factory=list)  # in service since the recheck reservation

    def commands(self) -> List[List[str]]:
        cmds = [["scontrol", "update", "nodename=%s" % n, "state=drain", "reason=%s" % r] for n, r in sorted(self.drain.items())]
        cmds += [["scontrol", "update", "nodename=%s" % n, "state=resume"] for n in sorted(self.resume)
                 if n not in self.resumed_already]
        return cmds

    def lines(self) -> List[str]:
        out = []
        if self.refused:
            out.append("drain: refused: %s" % self.refused)
        if self.drain:
            out.append("drain: %s" % fold(self.drain))
        if self.resume:
            out.append("resume: %s" % fold(self.resume))
        for node, why in sorted(self.left_alone.items()):
            out.append("left alone: %s (drained by someone else: %s)" % (node, why))
        return [printable(line) for line in out]  # another user's reason, as Slurm holds it


def plan(findings: Iterable[Finding], checked: Sequence[str], slurm_state: Dict[str, Dict[str, Any]],
         drain: bool, resume: bool, max_fraction: float = 0.2) -> Plan:
    """What to drain and resume, from this run's findings and Slurm's state of the nodes (before the run).

    checked: the nodes this run covered. slurm_state: {node: {"state": [...], "reason": str|None}}.
    """
    findings = list(findings)
    worst = worst_findings(findings)
    seen = {f.node for f in findings if f.node is not None}
    out = Plan()
    for node in checked:
        info = slurm_state.get(node) or {"state": [], "reason": None}
        reason = info.get("reason")
        if (_drained(info["state"]) or "DOWN" in info["state"]) and not ours(reason):
            out.left_alone[node] = reason or "+".join(info["state"])
            continue
        if node in worst:
            if drain and not _drained(info["state"]):
                out.drain[node] = reason_for(worst[node])
        elif resume and node in seen and _drained(info["state"]) and ours(reason):
            out.resume.append(node)
    failing = [n for n in checked if n in worst and n not in out.left_alone]
    if out.drain and checked and len(failing) > max_fraction * len(checked):
        out.refused = ("%s of %d failed (%.0f%% > --max-drain-fraction %.0f%%): looks cluster-wide (fabric, "
                       "config), not per node; drained nothing" % (plural(len(failing), "node"), len(checked),
                                                                     100.0 * len(failing) / len(checked), 100 * max_fraction))
        out.drain = {}
    return out


def apply(p: Plan, run: Any) -> List[str]:
    """Run the plan's scontrol commands with `run(argv) -> CompletedProcess`; returns error lines."""
    errors = []
    for argv in p.commands():
        done = run(argv)
        if done.returncode != 0:
            errors.append("%s failed: %s" % (" ".join(argv[:3]), (done.stderr or "").strip()[:200]))
    return errors

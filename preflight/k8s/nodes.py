"""Kubernetes applies the drain policy (preflight.actions.policy): cordon+taint failing nodes, resume only
preflight's own.

The policy is the scheduler-neutral one (a failing node is taken out, a node someone else took out is left
alone, --resume returns only nodes preflight took out that pass now, nothing is taken out when more than
--max-drain-fraction fail; with --history, N-in-W, the circuit breaker and --shadow decided before it);
only the mechanism is Kubernetes':

    drain    spec.unschedulable=true, the taint preflight/unhealthy=<check>:NoSchedule and the annotation
             preflight/drained="preflight: <check>: <finding>" (who did it and why)
    resume   only a node still carrying preflight's cordon, annotation AND taint: unschedulable and the
             taint removed, annotation dropped
    labels   preflight/status=pass|fail and preflight/checked-at=<UTC stamp> on every checked node
    stale    a node no longer cordoned that still carries preflight's annotation or taint (an admin
             uncordoned it by hand) has both removed in the same patch, by any run that acts on nodes:
             otherwise an admin's later cordon of it would look like preflight's and --resume would undo it

A node is "someone else's" when it is cordoned without preflight's annotation, or with the annotation
but without preflight's taint (someone changed preflight's cordon): it is never touched, not even
labelled. Each node's change is ONE merge patch (RFC 7386) carrying metadata.resourceVersion as a
precondition: cordon, taint, annotation and labels land together or not at all (an interrupted run
leaves no node cordoned without its annotation, which would make it look like someone else's), and a
node changed since preflight read it (an admin cordoned it meanwhile) is re-read and planned again
instead of overwritten. Taints are a list without a merge key (core/v1 NodeSpec.taints has no
patchStrategy): the patch writes the whole list, kept from the node as read, hence the precondition.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import re
import shlex
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from preflight.common import fold
from preflight.k8s.kubectl import Kubectl, KubeError, NodeState, parse_nodes, said
from preflight.actions import policy
from preflight.actions.policy import Mark, Request
from preflight.model import Finding

ANNOTATION = "preflight/drained"
TAINT_KEY = "preflight/unhealthy"
STATUS_LABEL = "preflight/status"
CHECKED_LABEL = "preflight/checked-at"
#: a taint value is a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends
_LABEL_VALUE_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def taint_value(check: str) -> str:
    value = _LABEL_VALUE_RE.sub("_", check)[:63].strip("_.-")
    return value or "failed"


def has_taint(node: NodeState) -> bool:
    return any(t.get("key") == TAINT_KEY for t in node.taints)


def cordoned_by_us(node: NodeState) -> bool:
    """preflight's cordon, still whole: unschedulable, preflight's annotation and preflight's taint."""
    return node.unschedulable and policy.ours(node.annotations.get(ANNOTATION)) and has_taint(node)


def stale_marks(node: NodeState) -> bool:
    """In service, yet carrying preflight's annotation or taint (uncordoned by hand): marks to clear."""
    return not node.unschedulable and (ANNOTATION in node.annotations or has_taint(node))


def mark_of(node: NodeState) -> Mark:
    """A node in the policy's words: cordoned = out of service; preflight's whole cordon = ours; any other
    cordon (no annotation of preflight's, or its taint taken off by hand) = someone else's."""
    theirs = None
    if node.unschedulable and not cordoned_by_us(node):
        theirs = "cordoned by someone else: " + (
            "unschedulable without preflight's %s annotation" % ANNOTATION
            if not policy.ours(node.annotations.get(ANNOTATION)) else
            "unschedulable with preflight's annotation but without its %s taint (changed by hand)" % TAINT_KEY)
    back = theirs or (None if node.unschedulable else "not cordoned any more: schedulable")
    return Mark(out=node.unschedulable, theirs=theirs, back=back)


@dataclass
class Actions:
    plan: policy.Plan
    labels: Dict[str, str] = field(default_factory=dict)  # node -> pass|fail for nodes not left alone
    cleared: List[str] = field(default_factory=list)  # in service with preflight's stale marks: cleared
    errors: List[str] = field(default_factory=list)
    done: List[str] = field(default_factory=list)

    def lines(self) -> List[str]:
        out = self.plan.lines()
        if self.cleared:
            out.append("cleared preflight's annotation and taint from %s (uncordoned by hand since preflight "
                       "cordoned it)" % fold(self.cleared))
        return out + ["drain: %s" % e for e in self.errors]


def plan(findings: Iterable[Finding], nodes: Dict[str, NodeState], drain: bool, resume: bool,
         max_fraction: float = 0.2) -> Actions:
    """What to cordon, resume and label, from this run's findings and the nodes as read before acting."""
    findings = list(findings)
    marks = {name: mark_of(n) for name, n in nodes.items()}
    p = policy.plan(findings, list(nodes), marks, drain=drain, resume=resume, max_fraction=max_fraction)
    worst = policy.worst_findings(findings)
    labels = {n: ("fail" if n in worst else "pass") for n in nodes if n not in p.left_alone}
    cleared = [n for n in labels if stale_marks(nodes[n]) and n not in p.drain]
    return Actions(p, labels, cleared)


def patch_for(node: NodeState, reason: Optional[str], resume: bool, status: Optional[str], stamp: str,
              check: Optional[str] = None) -> Dict[str, Any]:
    """The one merge patch for a node (see the module docstring); reason: drain with it; resume: undo ours."""
    meta: Dict[str, Any] = {"resourceVersion": node.resource_version}
    spec: Dict[str, Any] = {}
    if status:
        meta["labels"] = {STATUS_LABEL: status, CHECKED_LABEL: stamp}
    others = [t for t in node.taints if t.get("key") != TAINT_KEY]
    if reason is not None:
        meta["annotations"] = {ANNOTATION: reason}
        spec["unschedulable"] = True
        spec["taints"] = others + [{"key": TAINT_KEY, "value": taint_value(check or "failed"), "effect": "NoSchedule"}]
    elif resume:
        meta["annotations"] = {ANNOTATION: None}
        spec["unschedulable"] = None
        spec["taints"] = others or None
    elif stale_marks(node):
        meta["annotations"] = {ANNOTATION: None}
        spec["taints"] = others or None
    out: Dict[str, Any] = {"metadata": meta}
    if spec:
        out["spec"] = spec
    return out


#: nodes patched at once (each patch is one kubectl process; a 1,000-node --drain labels every node)
PATCH_PARALLEL = 16


def apply(actions: Actions, kubectl: Kubectl, nodes: Dict[str, NodeState], findings: Sequence[Finding],
          dry_run: bool = False, retries: int = 3) -> List[str]:
    """Patch every node the plan touches (one merge patch each, PATCH_PARALLEL at once); with dry_run
    nothing runs and the kubectl command lines are returned (shell-quoted, in node order)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    worst = policy.worst_findings(findings)
    touched = sorted(set(actions.labels) | set(actions.plan.drain) | set(actions.plan.resume))
    lock = threading.Lock()

    def argv_for(name: str, node: NodeState) -> List[str]:
        with lock:
            reason, resume, status = actions.plan.drain.get(name), name in actions.plan.resume, actions.labels.get(name)
        patch = patch_for(node, reason, resume, status, stamp, worst[name].check if name in worst else None)
        return ["patch", "node", name, "--type=merge", "-p", json.dumps(patch, separators=(",", ":"))]

    def one(name: str) -> None:
        node = nodes[name]
        for attempt in range(retries):
            out = kubectl.run(*argv_for(name, node))
            if out.returncode == 0:
                with lock:
                    actions.done.append(name)
                return
            if "Conflict" not in out.stderr or attempt == retries - 1:
                with lock:
                    actions.errors.append("patch node %s failed: %s" % (name, said(out.stderr)))
                return
            fresh = _reread(kubectl, name)  # changed since read: plan this node again from its new state
            with lock:
                if fresh is None:
                    actions.errors.append("node %s is gone" % name)
                    return
                if fresh.unschedulable and not cordoned_by_us(fresh):
                    actions.plan.drain.pop(name, None)
                    actions.labels.pop(name, None)
                    actions.plan.left_alone[name] = mark_of(fresh).theirs or "cordoned by someone else"
                    return
            node = fresh

    if dry_run:
        return [shlex.join(kubectl.argv(*argv_for(name, nodes[name]))) for name in touched]
    if touched:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(PATCH_PARALLEL, len(touched))) as pool:
            list(pool.map(one, touched))
    actions.errors.sort()
    return []


def _reread(kubectl: Kubectl, name: str) -> Optional[NodeState]:
    try:
        return parse_nodes({"items": [kubectl.json("get", "node", name)]}).get(name)
    except (KubeError, ValueError):
        return None


def summary(actions: Actions) -> str:
    return "cordoned %s; resumed %s" % (fold(actions.plan.drain) or "none", fold(actions.plan.resume) or "none")


class KubeApplier:
    """The policy carried out on Kubernetes nodes with merge patches (preflight.actions.policy.Applier)."""

    kind = "cordon"

    def __init__(self, target: Any) -> None:
        self.target = target  # preflight.k8s.fleet.Target: the kubectl and the nodes as read before the run

    def marks(self) -> Dict[str, Mark]:
        return {name: mark_of(node) for name, node in self.target.nodes.items()}

    def wanted(self, request: Request) -> bool:
        return request.drain or request.resume

    def act(self, findings: Sequence[Finding], nodes: Sequence[str], request: Request,
            say: Callable[[str], None]) -> List[Dict[str, Any]]:
        target = self.target
        actions = plan(findings, target.nodes, drain=request.drain, resume=request.resume,
                       max_fraction=request.max_fraction)
        shown = apply(actions, target.kubectl, target.nodes, findings, dry_run=request.dry_run)
        for line in actions.lines() + ["would run: " + line for line in shown]:
            say(line)
        actions.plan.done = [(n, "resume") for n in actions.plan.resume if n in actions.done]
        return policy.resumed(actions.plan, "cordon, taint and annotation removed")

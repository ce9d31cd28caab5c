"""The shared vocabulary: statuses, findings, check declarations and the cluster view rules read.

Standard library only, Python 3.8 compatible. The controller's: the node side imports its share (ParseError,
CommandResult) from preflight.node_model, and the probe bundle ships the check declarations that import this
module as empty packages (preflight.transport.bundle), so no node pays for its dataclasses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.node_model import CommandResult, ParseError  # noqa: F401 - the node side's share, re-exported


class Status(str, enum.Enum):
    """The verdict of one finding. Ordered from best to worst by `rank`."""

    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def is_problem(self) -> bool:
        """True for the statuses that make the run exit 1."""
        return self in (Status.FAIL, Status.ERROR)


_RANK = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}

#: What an operator does about a failing finding (the vocabulary of NVIDIA's Xid catalogue's
#: "immediate action" column and of the fleet tools that act on it), most drastic first:
#:   isolate     drain the node / take it out of the scheduler (hardware to replace or repair)
#:   reboot      reboot the node (driver or kernel state only a reboot clears)
#:   reset_gpu   reset the GPU (nvidia-smi -r) with the node drained
#:   fix_config  change software or configuration (services, limits, files, versions, inventory)
#:   check_app   the application (or its launch) is at fault, not the node
#:   retest      nothing known to be broken: the test could not decide; run it again
ACTIONS = ("isolate", "reboot", "reset_gpu", "fix_config", "check_app", "retest")
#: What each action means, as `preflight checks` prints it.
ACTION_MEANINGS = {
    "isolate": "drain the node / take it out of the scheduler: hardware to replace or repair",
    "reboot": "reboot the node: driver or kernel state only a reboot clears",
    "reset_gpu": "drain the node and reset the GPU (nvidia-smi -r -i N)",
    "fix_config": "change software or configuration: services, limits, files, versions, inventory",
    "check_app": "the application or its launch is at fault, not the node",
    "retest": "nothing known to be broken: the check could not decide; run it again",
}


@dataclass(frozen=True)
class Finding:
    """One verdict: a check's claim judged on one node (or cluster-wide when node is None)."""

    check: str
    node: Optional[str]
    status: Status
    message: str
    expected: Optional[str] = None
    actual: Optional[str] = None
    data: Optional[Dict[str, Any]] = None
    action: Optional[str] = None  # one of ACTIONS; set on fail/error findings (engine fills the check's default)

    def __post_init__(self) -> None:
        if self.action is not None and self.action not in ACTIONS:
            raise ValueError("action %r: use one of %s" % (self.action, ", ".join(ACTIONS)))

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "check": self.check,
            "node": self.node,
            "status": self.status.value,
            "message": self.message,
        }
        if self.expected is not None:
            out["expected"] = self.expected
        if self.actual is not None:
            out["actual"] = self.actual
        if self.data:
            out["data"] = self.data
        if self.action is not None:
            out["action"] = self.action
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Finding":
        return cls(
            check=doc["check"],
            node=doc.get("node"),
            status=Status(doc["status"]),
            message=doc["message"],
            expected=doc.get("expected"),
            actual=doc.get("actual"),
            data=doc.get("data"),
            action=doc.get("action"),
        )


@dataclass(frozen=True)
class NodeInfo:
    """What the controller knows of a node from the inventory, as rules see it."""

    name: str
    host: str
    gpus_per_node: int
    is_head: bool = False
    settings: Dict[str, Any] = field(default_factory=dict)


#: view.cluster key: {node: the transport's NodeFailure.kind} for each node in view.unreachable
FAILURE_KINDS = "failure_kinds"


class ClusterView:
    """Everything a rule may read: the nodes, their gathered facts, and the inventory's expectations.

    Rules are pure: they get a ClusterView and return findings. Only nodes whose probe bundle ran are
    in `facts`; nodes that could not be reached are listed in `unreachable` and judged by the ssh check.
    """

    def __init__(
        self,
        nodes: Sequence[NodeInfo],
        facts: Mapping[str, Mapping[str, Any]],
        expect: Optional[Mapping[str, Any]] = None,
        cluster: Optional[Mapping[str, Any]] = None,
        unreachable: Optional[Mapping[str, str]] = None,
        derived: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.nodes = list(nodes)
        self.facts = {name: dict(f) for name, f in facts.items()}
        self.expect = dict(expect or {})
        self.cluster = dict(cluster or {})
        self.unreachable = dict(unreachable or {})
        self.derived: Dict[str, Any] = dict(derived or {})  # see derive()
        self._by_name = {n.name: n for n in self.nodes}

    @property
    def live(self) -> List[NodeInfo]:
        """Nodes whose facts were gathered, in inventory order."""
        return [n for n in self.nodes if n.name in self.facts]

    @property
    def head(self) -> NodeInfo:
        for n in self.nodes:
            if n.is_head:
                return n
        return self.nodes[0]

    def node(self, name: str) -> NodeInfo:
        return self._by_name[name]

    def previous(self, check: str, node: str, key: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
        """(the data of `check`'s finding on `node` in the previous run, when it holds `key` as a dict; that
        run's started_at), else (None, None): what a rule compares this run's counters with (--history)."""
        prev = self.cluster.get("previous") or {}
        for result in prev.get("results") or []:
            data = result.get("data") or {}
            if result.get("check") == check and result.get("node") == node and isinstance(data.get(key), dict):
                return data, prev.get("started_at")
        return None, None

    def of(self, check: str) -> Dict[str, Any]:
        """{node name: that check's raw facts} for every live node (a missing entry maps to None)."""
        return {n.name: self.facts[n.name].get(check) for n in self.live}

    def derive(self, name: str, compute: Callable[["ClusterView"], Any]) -> Any:
        """A fact derived from every node's facts, computed once and carried on the view: compute(view)
        on first use, the stored value after (`derived[name]`). What several rules, the env file and the
        bench read (the data-network choice: preflight.derived.datanet.of) is derived here, never recomputed.
        The engine computes them right after gathering and hands them to the later phases' views
        (ClusterView(..., derived=...)), so a value must only depend on facts later phases do not change.
        """
        if name not in self.derived:
            self.derived[name] = compute(self)
        return self.derived[name]


ProbeFn = Callable[[Any], Dict[str, Any]]
RuleFn = Callable[[ClusterView], List[Finding]]
PlanFn = Callable[[ClusterView], Dict[str, Dict[str, Any]]]


@dataclass(frozen=True)
class CrossNode:
    """A test that runs across nodes at once, after the node checks, on the nodes that passed them.

    Controller side only (the check module wraps a lazy import of the controller code that runs it):
    run(fleet, inventory, view, healthy node names, derived env, options) returns an object with
    `docs` ({node: facts}, stored as view.facts[node][check]) and `meta` (view.cluster[check]);
    summary(findings, meta, seconds), when given, is the report's section for it.
    warm(fleet, inventory), when given: {node: what its phase-1 run starts ahead of the test} (the config's
    "warm"; the all-reduce's ranks import torch while the node checks run), or {} where it cannot help.
    """

    run: Callable[..., Any]
    summary: Optional[Callable[..., Optional[Dict[str, Any]]]] = None
    warm: Optional[Callable[..., Dict[str, Dict[str, Any]]]] = None


#: the kinds of value a Setting holds; preflight.inventory validates each (SETTING_KINDS is its contract)
SETTING_KINDS = ("bool", "int", "number", "version", "paths")


@dataclass(frozen=True)
class Setting:
    """One inventory key a check reads, declared on its Check: the inventory accepts and validates it from here.

    key      its place under `cluster:`: "mtu_full_mesh", or "expect.mtu" for `cluster: expect: mtu:`
    kind     one of SETTING_KINDS: bool, int (low..high), number (low..high, in unit), version (a string),
             paths (absolute directory paths)
    doc      one line: what it asks of the check (the check settings table, docs/inventory.md)
    default  the value rules see when the inventory leaves it out (expect.* keys: absent, no expectation)
    """

    key: str
    kind: str
    doc: str
    default: Any = None
    low: float = 0
    high: float = 0
    unit: str = ""


@dataclass(frozen=True)
class Check:
    """A check's declaration: what every folder in preflight.checks exports as CHECK in its __init__.py.

    The declaration is data: probe, rule, plan, prepare and crossnode stay None there, and the catalogue
    (preflight.checks.get) binds them from the folder's probe.py, rule.py and stage.py on the controller.

    name    stable CLI name (ssh, gpu, driver, fabric_manager, nic, ib_hca, mtu, ports, allreduce)
    claim   one line: what is true when it passes
    why     why a failure matters to a multi-node job (printed in the report)
    fix     how to fix a failure (printed in the report)
    probe   node-side: probe(ctx) -> JSON-serialisable facts; standard library (+ pynvml) only
    rule    controller-side: rule(view) -> [Finding]; pure
    phase   1 = local facts; 2 = network facts that need a plan built from phase-1 facts
    plan    phase-2 only: plan(view) -> {node name: probe config}, built on the controller
    needs   other checks whose facts this rule reads (they are gathered even when not selected)
    prepare optional: prepare(cluster settings, node name, is head) -> that node's probe config in phase 1.
            A phase-1 check reads its run options there (dcgm: the diagnostic level); a phase-2 check
            gets a first run of its probe in phase 1 (storage: the head writes the token the others
            read in phase 2); the plan reads those phase-1 facts, the phase-2 facts replace them
    action  what to do about a FAIL finding that names no action of its own (one of ACTIONS); an
            ERROR finding without one gets "retest" (the check could not decide)
    order   where it runs and is reported among the checks (lower first); the catalogue is every
            folder in preflight.checks, sorted by order, so adding a check edits no list
    crossnode  a test run across the nodes that passed the node checks (CrossNode), e.g. the all-reduce;
            its rule is judged after it ran
    reads   what the probe reads or runs on a node (files, commands, libraries), for `preflight checks`
    takes   how long its probe takes on a node, typically ("< 0.1 s", "2 s window"), for `preflight checks`
    settings   the inventory keys its rules read (Setting); the inventory accepts no other check key, and
            two checks reading one key declare it alike
    """

    name: str
    claim: str
    why: str
    fix: str
    probe: Optional[ProbeFn] = None
    rule: Optional[RuleFn] = None
    phase: int = 1
    plan: Optional[PlanFn] = None
    needs: Sequence[str] = ()
    action: str = "fix_config"
    prepare: Optional[Callable[[Mapping[str, Any], str, bool], Dict[str, Any]]] = None
    order: int = 500
    crossnode: Optional[CrossNode] = None
    reads: str = ""
    takes: str = ""
    settings: Sequence[Setting] = ()


def with_action(finding: Finding, default: str) -> Finding:
    """The finding with its action filled in: its own, else `default` for FAIL and "retest" for ERROR."""
    if finding.action is not None or not finding.status.is_problem:
        return finding
    import dataclasses

    return dataclasses.replace(finding, action=default if finding.status is Status.FAIL else "retest")


def skip_all(check: str, nodes: Sequence[NodeInfo], reason: str) -> List[Finding]:
    """One SKIP finding per node, with the reason the check does not apply."""
    return [Finding(check, n.name, Status.SKIP, reason) for n in nodes]


def probe_error(check: str, node: str, facts: Any, listed: Optional[Tuple[str, str]] = None) -> Optional[Finding]:
    """The ERROR finding for a node whose facts cannot be judged, else None.

    The probe runner records a probe that raised as {"probe_error": "..."}; a network probe whose plan
    had nothing to test on the node answers {"skipped": why}; a check missing from a node's facts
    entirely means the probe never ran there. None of these may ever pass. listed=(key, what): the
    facts must also hold a list under key, else "probe returned no <what>".
    """
    if facts is None:
        return Finding(check, node, Status.ERROR, "no facts gathered for this check")
    if isinstance(facts, dict) and "probe_error" in facts:
        raw = {"raw": facts["raw"]} if facts.get("raw") else None  # the outputs it failed on (capped)
        return Finding(check, node, Status.ERROR, "probe failed: %s" % facts["probe_error"], data=raw)
    if isinstance(facts, dict) and facts.get("skipped"):
        return Finding(check, node, Status.ERROR, "not tested: %s" % facts["skipped"])
    if listed is not None and not (isinstance(facts, dict) and isinstance(facts.get(listed[0]), list)):
        return Finding(check, node, Status.ERROR, "probe returned no %s" % listed[1])
    return None


def per_gpu_node(
    check: str, view: "ClusterView", judge: Callable[[NodeInfo, Dict[str, Any]], List[Finding]]
) -> List[Finding]:
    """judge(node, facts) for every live GPU node; CPU-only nodes SKIP, nodes without facts ERROR."""
    out: List[Finding] = []
    for node in view.live:
        if node.gpus_per_node == 0:
            out.append(Finding(check, node.name, Status.SKIP, "CPU-only node (gpus_per_node: 0)"))
            continue
        facts = view.facts[node.name].get(check)
        err = probe_error(check, node.name, facts)
        if err:
            out.append(err)
            continue
        out.extend(judge(node, facts))
    return out


# ------------------------------------------------------------- findings that repeat another's cause

#: data key of a finding that only says its check could not run on an unreachable node: it stays in
#: the JSON (per check, as data) but the terminal folds it into the node's ssh line ("7 checks not run")
NOT_RUN = "not_run"
NOT_RUN_MESSAGE = "not checked: node unreachable (see ssh)"


def not_run(finding: Finding) -> bool:
    """A finding that says only that its check could not run on an unreachable node."""
    return bool(finding.data) and NOT_RUN in finding.data


UNAVAILABLE = "unavailable"


def unavailable(finding: Finding) -> bool:
    """The finding that marks its node unavailable (not checked: Slurm had it out of service)."""
    return bool(finding.data) and isinstance(finding.data.get(UNAVAILABLE), dict)


def is_consequence(finding: Finding) -> bool:
    """A finding that only repeats another's cause: a check that could not run ("not checked: node
    unreachable") or had nothing to test because of another check's fault ("not tested: no data
    interface (see the nic check)"). It never becomes a headline or a drain reason when a root cause
    stands beside it on the node."""
    return not_run(finding) or (finding.status is Status.ERROR and finding.message.startswith(("not tested:", "not checked")))

"""One preflight run: gather facts in phases, then judge them with every selected rule.

    phase 1   local facts on every node (ssh basics, gpu, driver, fabric manager, nic, ib)
    phase 2   network facts planned from phase 1 (jumbo pings to ring neighbours, rendezvous port)
    crossnode the checks declaring Check.crossnode (the timed all-reduce, preflight.checks.allreduce.stage) on the nodes
              that passed
    rules     pure functions over the gathered facts → findings

Rules never reach back into a node: every verdict is computed here, from data.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from preflight import checks as catalogue
from preflight.errors import UsageError
from preflight.transport.contract import Outcome, Progress
from preflight.transport import backends
from preflight.inventory import Inventory, NodeSpec
from preflight.model import FAILURE_KINDS, NOT_RUN, NOT_RUN_MESSAGE, ClusterView, Finding, NodeInfo, Status, with_action


@dataclass
class Options:
    only: Optional[Sequence[str]] = None
    skip: Sequence[str] = ()
    parallel: int = 64
    timeout: Optional[float] = None  # overrides every node's command_timeout
    accept_new_host_keys: bool = False
    progress: Optional[Progress] = None
    gather_also: Sequence[str] = ()  # checks whose facts are gathered but not judged (e.g. for the env file)
    capture: bool = False  # nodes send back every command output and file read (preflight.output.capture)
    previous: Optional[Dict[str, Any]] = None  # the last run's report (--history): rules compare against it
    tier: str = "quick"  # --tier: standard / burn-in add the compute phase to the all-reduce (preflight/checks/allreduce/tiers.py)


@dataclass
class RunReport:
    """Everything one run produced; report.py renders it; the env it recommends is derived once (preflight.derived.ncclenv)."""

    inventory: Inventory
    selected: List[str]
    findings: List[Finding]
    view: ClusterView
    started_at: str
    duration_s: float
    allreduce: Optional[Dict[str, Any]] = None  # the allreduce check's report section (summaries["allreduce"])
    summaries: Dict[str, Any] = field(default_factory=dict)  # {cross-node check: its report section}
    phase_times: Dict[str, float] = field(default_factory=dict)
    captures: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # {node: {check: recording}} with capture
    env: Any = None  # preflight.derived.envvars.Derived, when it was derived for the all-reduce or the env file
    transport: Dict[str, Any] = field(default_factory=dict)  # what carried the run (fleet.describe())

    @property
    def exit_code(self) -> int:
        return 1 if any(f.status.is_problem for f in self.findings) else 0


def select_checks(only: Optional[Sequence[str]], skip: Sequence[str]) -> List[str]:
    """The checks to report, in catalogue order. ssh always runs: nothing is known of a node without it."""
    names = list(catalogue.CHECK_NAMES)
    for given in list(only or []) + list(skip):
        if given not in names:
            raise UsageError("unknown check %r" % given, "choose from: %s (see `preflight checks`)" % ", ".join(names))
    if "ssh" in skip:
        raise UsageError("the ssh check cannot be skipped", "every other check runs over it")
    chosen = [n for n in names if (not only or n in only or n == "ssh") and n not in skip]
    return chosen


def dcgm_budget_s(level: int) -> float:
    """The per-node deadline `dcgmi diag -r LEVEL` needs: its budget, the probe's slack, the bundle's start and answer."""
    from preflight.checks.dcgm import probe as dcgm_probe

    return dcgm_probe.LEVEL_BUDGET_S[level] + 2 * dcgm_probe.DEADLINE_SLACK_S + 10.0


def dcgm_timeout(level: int, timeout: Optional[float]) -> Optional[float]:
    """The per-node deadline a `--dcgm-level` run needs. Level 1 fits any deadline (the probe kills dcgmi
    before it); level 2 raises an unset deadline to fit DCGM's medium run; level 3 (DCGM's long stress run,
    about 30 minutes) runs only with an explicit --timeout that fits it, never by accident (--tier burn-in
    asks for it: the CLI sets that deadline)."""
    from preflight.checks.dcgm import probe as dcgm_probe

    if level <= 1:
        return timeout
    need = dcgm_budget_s(level)
    if timeout is None and level == 2:
        return need
    if timeout is None or timeout < need:
        raise UsageError("--dcgm-level %d runs `dcgmi diag -r %d` for up to %.0f s; %s" % (
            level, level, dcgm_probe.LEVEL_BUDGET_S[level], "no --timeout given" if timeout is None else "--timeout %g is shorter" % timeout),
            "give --timeout %.0f or more" % need)
    return timeout


def node_infos(inv: Inventory) -> List[NodeInfo]:
    head = inv.head_name
    return [
        NodeInfo(
            name=s.name,
            host=s.host,
            gpus_per_node=s.gpus_per_node,
            is_head=s.name == head,
            settings={"data_interface": s.data_interface, "local": s.local},
        )
        for s in inv.nodes
    ]


def _deadline(timeout: Optional[float]):
    return lambda spec: timeout if timeout is not None else spec.command_timeout


def _probe_config(names: Sequence[str], spec: NodeSpec, deadline: float, per_check: Optional[Dict[str, Any]] = None,
                  capture: bool = False) -> Dict[str, Any]:
    node = {"gpus_per_node": spec.gpus_per_node, "data_interface": spec.data_interface}
    checks = {name: dict((per_check or {}).get(name) or {}, node=node) for name in names}
    config = {"mode": "probe", "checks": checks, "probe_timeout_s": max(1.0, deadline - 2.0)}
    if capture:
        config["capture"] = True
    return config


def _absorb(view_facts: Dict[str, Dict[str, Any]], outcomes: Dict[str, Outcome], names: Sequence[str],
            captures: Optional[Dict[str, Dict[str, Any]]] = None, kinds: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Merge phase results into the facts; {node: failure message} for nodes that gave none (and, into
    `kinds`, each one's NodeFailure.kind: the ssh rule tells a damaged result from a dead node by it)."""
    failed: Dict[str, str] = {}
    for name, outcome in outcomes.items():
        if outcome.failure is not None or outcome.result is None:
            failed[name] = str(outcome.failure)
            if kinds is not None and outcome.failure is not None:
                kinds[name] = outcome.failure.kind
            continue
        if captures is not None and isinstance(outcome.result.get("capture"), dict):
            captures.setdefault(name, {}).update(outcome.result["capture"])
        facts = outcome.result.get("facts", {})
        view_facts.setdefault(name, {}).update(facts)
        ssh = view_facts[name].get("ssh")
        run = outcome.run
        if isinstance(ssh, dict) and run is not None and run.clock is not None and run.clock_received_at:
            ssh["time"] = run.clock
            ssh["window"] = [run.sent_at, run.clock_received_at]
    return failed


def _derive(view: ClusterView) -> Dict[str, Any]:
    """The facts derived from every node's phase-1 facts, once (ClusterView.derive): the data-network
    choice that phase 2's plans, the nic/mtu/ports/nccl_env rules, the env file and the bench read.
    Later phases add facts of other checks only, so the later views carry these values unchanged."""
    from preflight.derived import datanet

    datanet.of(view)
    return view.derived


def open_fleet(inv: Inventory, opts: Options) -> Any:
    """The transport for this inventory (a contract.Fleet), from its registered backend
    (preflight.transport.backends): SSH/local sessions, srun steps or kubectl exec into agent pods."""
    return backends.get(inv.transport).module().open_fleet(inv, opts)


@dataclass
class _Selection:
    """Which checks run in which phase: phase 1, phase 2 (planned from phase 1), the cross-node tests, and
    the checks judged after those tests."""

    selected: List[str]
    checks: Dict[str, Any]
    prepared: List[str]  # checks whose phase-1 probe config is prepared on the controller
    phase1: List[str]
    phase2: List[str]
    crossnode: List[str]
    late: List[str]


def _select(opts: Options) -> _Selection:
    selected = select_checks(opts.only, opts.skip)
    gathered = catalogue.closure(list(selected) + list(opts.gather_also))
    checks = {name: catalogue.get(name) for name in gathered}
    prepared = [n for n in gathered if checks[n].prepare is not None]
    phase1 = [n for n in gathered if (checks[n].phase == 1 and checks[n].probe is not None) or n in prepared]
    phase2 = [n for n in gathered if checks[n].phase == 2]
    # a cross-node test runs when selected, or (--tier standard, burn-in) when a selected check reads it
    wanted = set(selected) if opts.tier == "quick" else set(selected) | {d for n in selected for d in checks[n].needs}
    crossnode = [n for n in gathered if checks[n].crossnode is not None and n in wanted]
    # judged after the cross-node tests: those tests and the checks that read their results (gpu_compute)
    late = [n for n in selected if n in crossnode or any(d in crossnode for d in checks[n].needs)]
    return _Selection(selected, checks, prepared, phase1, phase2, crossnode, late)


@dataclass
class _Gathered:
    """What one run has gathered so far (filled phase by phase)."""

    facts: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    unreachable: Dict[str, str] = field(default_factory=dict)
    captures: Optional[Dict[str, Dict[str, Any]]] = None
    times: Dict[str, float] = field(default_factory=dict)


def _warm(fleet: Any, inv: Inventory, crossnode: Sequence[Any]) -> Dict[str, Dict[str, Any]]:
    """{node: the phase-1 config's "warm"}: what the cross-node test starts ahead of itself (one test may)."""
    for check in crossnode:
        if check.crossnode.warm is not None:
            return check.crossnode.warm(fleet, inv)
    return {}


def _phase1(fleet: Any, inv: Inventory, opts: Options, sel: _Selection, cluster: Dict[str, Any], got: _Gathered) -> bool:
    """The node checks on every node; the cross-node test's processes start beside them (CrossNode.warm), so
    the node keeps its process for them after this phase. Returns whether any were started."""
    deadline = _deadline(opts.timeout)
    t0 = time.monotonic()
    warm = _warm(fleet, inv, [sel.checks[n] for n in sel.crossnode])
    configs = {
        s.name: _probe_config(
            sel.phase1, s, deadline(s),
            {n: sel.checks[n].prepare(cluster, s.name, s.name == inv.head_name) for n in sel.prepared},
            capture=opts.capture,
        )
        for s in inv.nodes
    }
    for name, spec in warm.items():
        configs[name]["warm"] = spec
    outcomes = fleet.run(configs, deadline, then=bool(sel.phase2 or warm))
    got.unreachable.update(_absorb(got.facts, outcomes, sel.phase1, got.captures, cluster[FAILURE_KINDS]))
    got.times["phase1_s"] = time.monotonic() - t0
    return bool(warm)


def _phase2(fleet: Any, inv: Inventory, opts: Options, sel: _Selection, view: ClusterView, got: _Gathered,
            warm: bool = False) -> None:
    """The network probes each node's phase-2 checks plan from phase 1 (on the nodes that answered); with warm
    cross-node processes started in phase 1, each node keeps its process for them after this phase too."""
    deadline = _deadline(opts.timeout)
    specs = {s.name: s for s in inv.nodes}
    t0 = time.monotonic()
    plans = {name: sel.checks[name].plan(view) if sel.checks[name].plan else {} for name in sel.phase2}
    configs = {}
    for node in view.live:
        per_check = {name: plans[name][node.name] for name in sel.phase2 if node.name in plans[name]}
        if per_check:
            configs[node.name] = _probe_config(list(per_check), specs[node.name], deadline(specs[node.name]),
                                               per_check, capture=opts.capture)
    failed = _absorb(got.facts, fleet.run(configs, deadline, then=warm), sel.phase2, got.captures)
    for name, why in failed.items():
        for check in configs[name]["checks"]:
            got.facts[name][check] = {"probe_error": "network probe run failed: %s" % why}
    got.times["phase2_s"] = time.monotonic() - t0


def _crossnode(fleet: Any, inv: Inventory, opts: Options, sel: _Selection, view: ClusterView, findings: List[Finding],
               cluster: Dict[str, Any], got: _Gathered) -> Any:
    """The cross-node tests on the nodes the node checks left healthy; returns the derived env (or None)."""
    if not (sel.crossnode or opts.gather_also):
        return None
    from preflight.derived import ncclenv

    sick = {f.node for f in findings if f.status.is_problem}
    env = ncclenv.derive(view, [n.name for n in view.live if n.name not in sick])
    healthy = list(env.nodes)  # a node whose facts the env file cannot carry is left out of the bench too
    for check in sel.crossnode:
        if not view.live:
            break
        t0 = time.monotonic()
        ran = sel.checks[check].crossnode.run(fleet, inv, view, healthy, env, opts)
        for name, doc in ran.docs.items():
            got.facts[name][check] = doc
        cluster[check] = ran.meta
        got.times[check + "_s"] = time.monotonic() - t0
    return env


def run(inv: Inventory, opts: Options) -> RunReport:
    """One run: phase 1 on every node, phase 2 planned from it, the node checks judged, the cross-node
    tests on the healthy nodes, then the checks that read their results."""
    sel = _select(opts)
    infos = node_infos(inv)
    started = time.time()
    got = _Gathered(captures={} if opts.capture else None)
    summaries: Dict[str, Any] = {}
    cluster = dict(inv.cluster)
    cluster[FAILURE_KINDS] = {}  # {node: NodeFailure.kind} of the nodes that gave no phase-1 result
    if opts.previous:
        cluster["previous"] = opts.previous

    with open_fleet(inv, opts) as fleet:
        warm = _phase1(fleet, inv, opts, sel, cluster, got)
        view = ClusterView(infos, got.facts, inv.expect, cluster, got.unreachable)
        derived = _derive(view)
        if sel.phase2 and view.live:
            _phase2(fleet, inv, opts, sel, view, got, warm)
        view = ClusterView(infos, got.facts, inv.expect, cluster, got.unreachable, derived)
        # The node checks' verdicts are final here (a cross-node test only adds its own facts): judge them once.
        findings = judge(view, [n for n in sel.selected if n not in sel.late])
        env = _crossnode(fleet, inv, opts, sel, view, findings, cluster, got)
        transport = fleet.describe()

    view = ClusterView(infos, got.facts, inv.expect, cluster, got.unreachable, derived)
    if env is not None:
        findings.extend(with_action(f, "fix_config") for f in env.refused)
    for check in sel.late:
        findings.extend(judge(view, [check]))
        summarise = sel.checks[check].crossnode.summary if check in sel.crossnode else None
        if summarise is not None:
            summaries[check] = summarise(findings, cluster.get(check) or {}, got.times.get(check + "_s"))
    return RunReport(
        inventory=inv,
        selected=sel.selected,
        findings=findings,
        view=view,
        started_at=datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        duration_s=time.time() - started,
        allreduce=summaries.get("allreduce"),
        summaries=summaries,
        phase_times=got.times,
        env=env,
        transport=transport,
        captures=got.captures or {},
    )


def judge(view: ClusterView, selected: Sequence[str]) -> List[Finding]:
    """Every selected rule over the view. A node without facts is reported per check, never passed."""
    findings: List[Finding] = []
    for name in selected:
        check = catalogue.get(name)
        try:
            findings.extend(with_action(f, check.action) for f in check.rule(view))
        except Exception as exc:  # a rule bug must not hide the other checks' verdicts
            findings.append(Finding(name, None, Status.ERROR, "rule failed: %s: %s" % (type(exc).__name__, exc), action="check_app"))
        if name != "ssh":
            for node in view.unreachable:
                findings.append(Finding(name, node, Status.ERROR, NOT_RUN_MESSAGE, action="retest", data={NOT_RUN: "unreachable"}))
    return findings



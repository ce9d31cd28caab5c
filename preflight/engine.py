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
from preflight.transport.fleet import Fleet
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
    tier: str = "quick"  # --tier: standard / burn-in add the compute phase to the all-reduce (allreduce/tiers.py)


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


def dcgm_timeout(level: int, timeout: Optional[float]) -> Optional[float]:
    """The per-node deadline a `--dcgm-level` run needs. Level 1 fits any deadline (the probe kills dcgmi
    before it); level 2 raises an unset deadline to fit DCGM's medium run; level 3 (DCGM's long stress run,
    about 30 minutes) runs only with an explicit --timeout that fits it, never by accident."""
    from preflight.checks.dcgm import probe as dcgm_probe
    if level <= 1:
        return timeout
    need = dcgm_probe.LEVEL_BUDGET_S[level] + 2 * dcgm_probe.DEADLINE_SLACK_S + 10.0  # + the bundle's start and answer
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


def _warm(fleet: Any, inv: Inventory, crossnode: Sequence[Any]) -> Dict[str, Dict[str, Any]]:
    """{node: the phase-1 config's "warm"}: what the cross-node test starts ahead of itself (one test may)."""
    for check in crossnode:
        if check.crossnode.warm is not None:
            return check.crossnode.warm(fleet, inv)
    return {}


def open_fleet(inv: Inventory, opts: Options) -> Any:
    """The transport for this inventory (a contract.Fleet): SSH/local fan-out (transport.fleet.Fleet), srun
    steps (slurm.fleet.SlurmFleet) or kubectl exec into agent pods (k8s.fleet.KubeFleet)."""
    if inv.transport == "slurm":
        from preflight.slurm import fleet as slurm

        return slurm.fleet_for(inv, opts.progress)
    if inv.transport == "k8s":
        from preflight.k8s import fleet as k8s

        return k8s.fleet_for(inv, opts.progress, opts.parallel)
    return Fleet(inv.nodes, opts.parallel, opts.accept_new_host_keys, opts.progress)


def run(inv: Inventory, opts: Options) -> RunReport:
    selected = select_checks(opts.only, opts.skip)
    gathered = catalogue.closure(list(selected) + list(opts.gather_also))
    checks = {name: catalogue.get(name) for name in gathered}
    prepared = [n for n in gathered if checks[n].prepare is not None]  # their phase-1 probe config
    phase1 = [n for n in gathered if (checks[n].phase == 1 and checks[n].probe is not None) or n in prepared]
    phase2 = [n for n in gathered if checks[n].phase == 2]
    # a cross-node test runs when selected, or (--tier standard, burn-in) when a selected check reads it
    wanted = set(selected) if opts.tier == "quick" else set(selected) | {d for n in selected for d in checks[n].needs}
    crossnode = [n for n in gathered if checks[n].crossnode is not None and n in wanted]
    # judged after the cross-node tests: those tests and the checks that read their results (gpu_compute)
    late = [n for n in selected if n in crossnode or any(d in crossnode for d in checks[n].needs)]
    infos = node_infos(inv)
    specs = {s.name: s for s in inv.nodes}
    deadline = _deadline(opts.timeout)
    started = time.time()
    times: Dict[str, float] = {}
    facts: Dict[str, Dict[str, Any]] = {}
    unreachable: Dict[str, str] = {}
    summaries: Dict[str, Any] = {}
    captures: Optional[Dict[str, Dict[str, Any]]] = {} if opts.capture else None
    env: Any = None
    cluster = dict(inv.cluster)
    cluster[FAILURE_KINDS] = {}  # {node: NodeFailure.kind} of the nodes that gave no phase-1 result
    if opts.previous:
        cluster["previous"] = opts.previous

    with open_fleet(inv, opts) as fleet:
        t0 = time.monotonic()
        # the cross-node tests' processes start now, while the node checks run (CrossNode.warm)
        warm = _warm(fleet, inv, [checks[n] for n in crossnode])
        configs = {
            s.name: _probe_config(
                phase1, s, deadline(s), {n: checks[n].prepare(cluster, s.name, s.name == inv.head_name) for n in prepared},
                capture=opts.capture,
            )
            for s in inv.nodes
        }
        for name, spec in warm.items():
            configs[name]["warm"] = spec
        unreachable.update(_absorb(facts, fleet.run(configs, deadline, then=bool(phase2 or warm)), phase1, captures,
                                   cluster[FAILURE_KINDS]))
        times["phase1_s"] = time.monotonic() - t0

        view = ClusterView(infos, facts, inv.expect, cluster, unreachable)
        derived = _derive(view)
        if phase2 and view.live:
            t0 = time.monotonic()
            plans = {name: checks[name].plan(view) if checks[name].plan else {} for name in phase2}
            configs = {}
            for node in view.live:
                per_check = {name: plans[name][node.name] for name in phase2 if node.name in plans[name]}
                if per_check:
                    configs[node.name] = _probe_config(list(per_check), specs[node.name], deadline(specs[node.name]),
                                                       per_check, capture=opts.capture)
            failed = _absorb(facts, fleet.run(configs, deadline, then=bool(warm)), phase2, captures)
            for name, why in failed.items():
                for check in configs[name]["checks"]:
                    facts[name][check] = {"probe_error": "network probe run failed: %s" % why}
            times["phase2_s"] = time.monotonic() - t0

        view = ClusterView(infos, facts, inv.expect, cluster, unreachable, derived)
        # The node checks' verdicts are final here (a cross-node test only adds its own facts): judge them once.
        findings = judge(view, [n for n in selected if n not in late])
        if crossnode or opts.gather_also:
            from preflight.derived import ncclenv

            sick = {f.node for f in findings if f.status.is_problem}
            healthy = [n.name for n in view.live if n.name not in sick]
            env = ncclenv.derive(view, healthy)
            healthy = list(env.nodes)  # a node whose facts the env file cannot carry is left out of the bench too
        for check in crossnode:
            if not view.live:
                break
            t0 = time.monotonic()
            ran = checks[check].crossnode.run(fleet, inv, view, healthy, env, opts)
            for name, doc in ran.docs.items():
                facts[name][check] = doc
            cluster[check] = ran.meta
            times[check + "_s"] = time.monotonic() - t0
        transport = fleet.describe()

    view = ClusterView(infos, facts, inv.expect, cluster, unreachable, derived)
    if env is not None:
        findings.extend(with_action(f, "fix_config") for f in env.refused)
    for check in late:
        findings.extend(judge(view, [check]))
        summarise = checks[check].crossnode.summary if check in crossnode else None
        if summarise is not None:
            summaries[check] = summarise(findings, cluster.get(check) or {}, times.get(check + "_s"))
    return RunReport(
        inventory=inv,
        selected=selected,
        findings=findings,
        view=view,
        started_at=datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        duration_s=time.time() - started,
        allreduce=summaries.get("allreduce"),
        summaries=summaries,
        phase_times=times,
        env=env,
        transport=transport,
        captures=captures or {},
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



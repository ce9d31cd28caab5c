"""Launch the timed all-reduce on the nodes that passed, over the same SSH sessions, and localize failures.

Ranks are plain processes started by preflight.probe.bench_agent on each node (one per GPU with nccl,
one per node with gloo on CPU nodes), rendezvousing at the head's data-plane address on the port the
`ports` check verified, with exactly the env the env file will hold (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...).
Deadlines are layered: the agents enforce init / per-operation / total deadlines and always answer;
the controller's outer deadline kills the remote process group of an agent that does not.

On CPU nodes (gloo) the whole-cluster run also times rotations of disjoint node pairs once its sweep is done,
in the same rank processes (plan.pair_rotations, bench_worker._pair_phase): the fleet judgement of a
healthy cluster costs no second launch and no second torch import; rounds run only for what they leave
undecided. When the whole-cluster run hangs, fails or is slow and no node stands out, the nodes are tested in disjoint
pairs, then suspects beside known-good nodes (preflight.checks.allreduce.localize), so the report names the node to
exclude. The rounds re-run only the size the first run stopped at (or its verdict size), under deadlines
derived from what the first run measured (localize.localization_plan, plan.round_deadlines): a hang is
already known, so each round costs one torch import and one short op deadline, not a whole sweep; where the
transport keeps each node's process from one bench to the next, not even that: every run starts the next
round's ranks while it runs, and the round adopts them (preflight.checks.allreduce.spares).
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Dict, List, Optional, Sequence

from preflight.checks.allreduce import judge, localize, plan, spares, tiers, timeplan
from preflight.checks.allreduce.busbw import threshold_for
from preflight.derived import datanet, rails
from preflight.derived.gpus import node_gpus
from preflight.inventory import Inventory
from preflight.model import ClusterView, NodeInfo
from preflight.probe import portclaim
from preflight.transport.contract import Fleet

#: Groups run side by side start timing together, at least this long after their launch (bench_worker).
ROUND_START_MIN_S = 3.0
ROUND_START_FACTOR = 1.25
#: Timed iterations per size in the gloo rounds and in-process pairs (at least): plan.ROUND_MIN_ITERS.
ROUND_MIN_ITERS = plan.ROUND_MIN_ITERS

#: Variables the agent sets itself for each rank; the env file's values are identical.
_AGENT_SET = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


class BenchResult:
    """What the bench adds to the run: per-node agent documents and the cluster-level metadata."""
    def __init__(self) -> None:
        self.docs: Dict[str, Dict[str, Any]] = {}
        self.meta: Dict[str, Any] = {}


def _participants(view: ClusterView, healthy: Sequence[str], inv: Inventory) -> List[NodeInfo]:
    python = {s.name: s.python for s in inv.nodes}
    out = []
    for name in healthy:
        info = view.node(name)
        settings = dict(info.settings, python=python[name])
        out.append(NodeInfo(info.name, info.host, info.gpus_per_node, info.is_head, settings))
    head = [n for n in out if n.is_head]
    return head + [n for n in out if not n.is_head]  # the head hosts rank 0 (and the TCPStore)


def warm(fleet: Fleet, inv: Inventory) -> Dict[str, Dict[str, Any]]:
    """{node: the ranks its phase-1 run starts ahead of the all-reduce} (preflight.probe.bench_warm): each
    imports torch and makes its CUDA context while the node checks run, and the bench later adopts it;
    "reserves": one more set per launch certain to follow (spares.reserves: nccl's NIC round, screening).
    Only where the fleet runs the bench in the process that ran phase 1 (fleet.keeps_ranks(ranks a node));
    none when the test is off (cluster.allreduce.enabled or .warm false) or would be a single rank. A
    node that fails the node checks gets no bench: its warm ranks end with its process, never joining."""
    raw = inv.cluster.get("allreduce") or {}
    keeps = getattr(fleet, "keeps_ranks", None)
    if raw.get("enabled") is False or raw.get("warm") is False or keeps is None:
        return {}
    backend = "nccl" if all(s.gpus_per_node > 0 for s in inv.nodes) else "gloo"
    ranks = {s.name: s.gpus_per_node if backend == "nccl" else 1 for s in inv.nodes}
    if sum(ranks.values()) < 2:
        return {}
    later = spares.reserves(backend, inv.nodes, raw)  # the launches that certainly follow: their ranks too
    return {s.name: dict({"backend": backend, "local_world_size": ranks[s.name], "python": s.python},
                         **({"reserves": later} if later else {}))
            for s in inv.nodes if keeps(ranks[s.name])}


def _settings(inv: Inventory) -> Dict[str, Any]:
    return timeplan.settings(dict(inv.cluster.get("allreduce") or {}))


def _hardware(view: ClusterView, nodes: Sequence[str], choice: Any) -> Dict[str, Any]:
    """gpu_model and nic_gbps for the built-in bandwidth profile, from the gpu/ib_hca facts and the
    nic choice the view carries (datanet.of); rails, the HCA ports NCCL should use per node (the check
    judges NCCL's choice against them without reading another check's facts)."""

    out: Dict[str, Any] = {}
    models = set()
    for name in nodes:
        record = node_gpus(view, name)
        models.update(record.models() if record is not None else ())
    if len(models) == 1:
        out["gpu_model"] = models.pop()
    usable = rails.of(view)
    out["rails"] = {name: list(usable["nodes"][name]) for name in nodes if name in usable["nodes"]}
    layer_rate = (usable.get("rate_gbps") or {}).get(usable.get("link_layer"))
    rates = []
    for name in nodes:
        ports = usable["nodes"].get(name) or []
        if ports and layer_rate:
            rates.append(len(ports) * float(layer_rate))
        else:
            entry = choice.get(name)
            if entry and entry.get("speed_mbps"):
                rates.append(entry["speed_mbps"] / 1000.0)
    if rates and len(rates) == len(nodes):
        out["nic_gbps"] = min(rates)
    return out


def _run_groups(
    fleet: Fleet,
    groups: List[List[NodeInfo]],
    addr_of: Dict[str, str],
    port: int,
    env: Dict[str, str],
    settings: Dict[str, Any],
    pairs: Optional[Sequence[Sequence[Sequence[str]]]] = None,
    node_phase: bool = False,
    compute: Optional[Dict[str, Any]] = None,
    warm_next: Optional[str] = None,
) -> Dict[str, Any]:
    """Run one all-reduce per group, all groups at once. {"configs", "docs", "unanswered", "kept"}.

    pairs: node-pair rotations the (single) group's ranks time after their sweep (plan.pair_rotations);
    node_phase: the partner-free tests they time first (plan.node_spec); warm_next ("sweep" or "round"): the
    nodes start the next round's ranks during this one (spares.mark), kept: the nodes holding them now."""
    configs: Dict[str, Dict[str, Any]] = {}
    metas = []
    for group in groups:
        cfgs = plan.make_configs(
            group,
            addr_of[group[0].name],
            port,
            env=env,
            sizes=settings["sizes"],
            warmup=settings["warmup"],
            iters=settings["iters"],
            deadlines=settings["deadlines"],
            local_ranks=settings.get("local_ranks"),
            run_id=secrets.token_hex(8),
            iters_min=settings.get("iters_min"),
        )
        if settings.get("start_at"):
            for cfg in cfgs.values():
                cfg["start_at"] = settings["start_at"]
        if pairs:
            spec = plan.pair_spec(cfgs, pairs, settings.get("pair_iters") or settings["iters"])
            if settings.get("recheck"):  # the screening re-measures its low nodes in-process (bench_worker._recheck)
                spec.update(recheck=True, warn=judge.warn_fraction(settings["slow_fraction"]))
            for cfg in cfgs.values():
                cfg["pairs"] = spec
        # the node tests at the sweep's iterations, not the pairs' (the gloo loopback is judged on completion)
        node = plan.node_spec(cfgs, settings["iters"], settings["slow_fraction"]) if node_phase else None
        if node:
            for cfg in cfgs.values():
                cfg["node"] = node
        tiers.with_compute(cfgs, compute)  # --tier standard / burn-in: the compute phase in the same ranks
        metas.append(plan.cluster_meta(cfgs))
        configs.update(cfgs)
    # "tasks": a transport that launches one task per rank (srun) splits the node's ranks across them
    bundles = {name: {"mode": "bench", "bench": cfg, "tasks": cfg["local_world_size"],
                      "gpus_per_task": 1 if cfg["backend"] == "nccl" else 0} for name, cfg in configs.items()}
    deadline = lambda spec: plan.outer_deadline(configs[spec.name])  # noqa: E731
    keep = bool(warm_next) and spares.mark(fleet, configs, warm_next)
    outcomes = fleet.run(bundles, deadline, then=True) if keep else fleet.run(bundles, deadline)
    docs: Dict[str, Dict[str, Any]] = {}
    unanswered: Dict[str, str] = {}
    for name, outcome in outcomes.items():
        bench = (outcome.result or {}).get("bench")
        if outcome.failure is not None or not isinstance(bench, dict):
            unanswered[name] = "no all-reduce result: %s" % (outcome.failure or "the agent returned nothing")
        else:
            docs[name] = bench
    kept = {name for name in docs if configs[name].get("next_warm")}
    return {"configs": configs, "metas": metas, "docs": docs, "unanswered": unanswered, "kept": kept}


def run(fleet: Fleet, inv: Inventory, view: ClusterView, healthy: Sequence[str], env: Any, opts: Any) -> BenchResult:
    """The whole-cluster all-reduce, then localization rounds if it failed or was slow and no node stands out."""
    result = BenchResult()
    settings = dict(_settings(inv), tier=getattr(opts, "tier", "quick"),
                    warm_next=spares.enabled(inv.cluster.get("allreduce") or {}, fleet))
    if inv.cluster.get("allreduce", {}).get("enabled") is False:
        result.meta = {"skip": "disabled in the inventory (cluster.allreduce.enabled: false)"}
        return result
    nodes = _participants(view, healthy, inv)
    if not nodes:
        result.meta = {"skip": "not run: no node passed the node checks"}
        return result
    if len(nodes) == 1 and nodes[0].gpus_per_node <= 1:
        result.meta = {"skip": "a single rank (%s, %d GPU): no all-reduce traffic to measure" % (nodes[0].name, nodes[0].gpus_per_node)}
        return result
    choice = datanet.of(view)
    addr_of = {n.name: (choice.get(n.name) or {}).get("ip") for n in nodes}
    no_addr = [n.name for n in nodes if not addr_of[n.name]]
    if no_addr:
        result.meta = {"unanswered": {}, "nodes": [n.name for n in nodes]}
        for name in no_addr:
            result.meta["unanswered"][name] = "no data interface to run the all-reduce on (see the nic check)"
        return result
    port = int(view.cluster.get("master_port", 29500))
    env_vars = {k: v for k, v in (env.as_dict() if env is not None else {}).items() if k not in _AGENT_SET}
    claims, held = portclaim.claim_nodes([n.host for n in nodes])
    if held:  # another preflight run on this machine is testing some of these nodes right now
        by_host = {n.host: n.name for n in nodes}
        result.meta = {"nodes": [n.name for n in nodes],
                       "held": {by_host[h]: holder for h, holder in held.items()}}
        return result
    try:
        _measure(result, fleet, view, nodes, addr_of, port, env_vars, settings, choice)
        if settings["warm_next"]:  # (on Ctrl-C the fleet's cancel and close end them)
            spares.end(fleet)  # the processes kept for a round that did not come, and their spares
    finally:
        for claim in claims:
            claim.close()
    return result


def _measure(result: BenchResult, fleet: Fleet, view: ClusterView, nodes: List[NodeInfo], addr_of: Dict[str, str],
             port: int, env_vars: Dict[str, str], settings: Dict[str, Any], choice: Any) -> None:
    """The whole-cluster run and the rounds after it, into result: the documents and the metadata."""
    t0, t0_wall = time.monotonic(), time.time()
    # gloo: the pair tests ride on the whole-cluster run (one launch, one torch import); see
    # plan.PAIR_ROTATIONS. nccl keeps them as separate rounds, beside its node rounds.
    gloo = not all(n.gpus_per_node > 0 for n in nodes)
    rotations = plan.pair_rotations([n.name for n in nodes]) if gloo and len(nodes) >= 3 else None
    # the partner-free tests ride on the sweep too (gloo loopback; nccl NVLink): cluster.allreduce.node_round
    # false turns them off with the separate NIC round
    node_phase = settings["node_round"] is not False
    compute = tiers.compute_spec(settings["tier"], "gloo" if gloo else "nccl")
    first = _run_groups(fleet, [nodes], addr_of, port, env_vars,
                        dict(settings, pair_iters=ROUND_MIN_ITERS if gloo else settings["iters"], recheck=True),
                        pairs=rotations, node_phase=node_phase, compute=compute,
                        warm_next="sweep" if settings["warm_next"] else None)
    timings: Dict[str, Any] = {"run_s": round(time.monotonic() - t0, 3)}
    timings.update(_slowest_start(first["docs"]))
    timings["timeline"] = _timeline(first["docs"], t0_wall)
    result.docs = first["docs"]
    meta = first["metas"][0]
    meta.update(unanswered=first["unanswered"], env=env_vars, timings_s=timings)
    if compute:
        meta["compute"] = compute  # the gpu_compute check reads the ranks' figures against it
    meta.update(_hardware(view, [n.name for n in nodes], choice))
    alone = localize.node_results(first["docs"], first["configs"]) if node_phase else None
    if alone:
        kind = next(iter(first["configs"].values())).get("node", {}).get("kind", "loopback")
        meta["node_rounds"] = [{"name": "loopback" if kind == "loopback" else "nvlink", "what": plan.NODE_TESTS[kind],
                                "results": alone, "by_bandwidth": True, "in_process": True,
                                "sizes": [alone[0]["bytes"]] if alone[0].get("bytes") else []}]

    threshold = threshold_for(view, meta, [n.name for n in nodes], meta["backend"])
    limit = threshold[0] if threshold else None
    meta["slow_fraction"] = settings["slow_fraction"]
    wanted = localize.localization_plan(first["docs"], meta, limit) if len(nodes) >= 2 else None
    if wanted is not None:
        rounds = _Rounds(fleet, nodes, addr_of, port, env_vars, settings, meta, first["docs"], wanted)
        rounds.kept = first["kept"]
        rounds.warm_launch_s = spares.first_round_launch_s(first["docs"], timings["run_s"], meta["backend"])
        if node_phase:
            rounds.node_rounds()
        if len(nodes) >= 3:  # pairs: the path between nodes, which only a partner can test
            rounds.pairs(first, rotations, limit)
    timings["total_s"] = round(time.monotonic() - t0, 3)
    result.meta = meta


class _Rounds:
    """The localization rounds after a whole-cluster run that failed or was slow: groups launched side by
    side at the one size that decides, under deadlines taken from what the whole-cluster run measured."""

    def __init__(self, fleet: Fleet, nodes: List[NodeInfo], addr_of: Dict[str, str], port: int,
                 env_vars: Dict[str, str], settings: Dict[str, Any], meta: Dict[str, Any],
                 docs: Dict[str, Dict[str, Any]], wanted: Dict[str, Any]) -> None:
        self.fleet, self.nodes, self.addr_of, self.port, self.env_vars = fleet, nodes, addr_of, port, env_vars
        self.settings, self.meta, self.wanted = settings, meta, wanted
        self.by_name = {n.name: n for n in nodes}
        self.by_bandwidth = wanted["mode"] in ("slow", "check")
        self.timings = meta["timings_s"]
        self.timings["rounds_s"] = []
        self.timings["rounds_warm_ranks"] = []  # per round: the ranks adopted from the last run's spares
        self.kept = set()  # type: set  # nodes whose process holds spares for the next round (spares.mark)
        self.warm_launch_s = None  # type: Optional[float]  # the last round's launch, every rank warm
        # gloo rounds time more iterations: groups side by side share CPUs, and their best iteration is
        # what they are compared on (one size of a few ms: 20 iterations cost well under a second)
        iters = max(settings["iters"], ROUND_MIN_ITERS) if meta["backend"] == "gloo" else settings["iters"]
        # the rounds time a fixed count (no stop rule): groups are compared at the same iterations
        self.short = dict(settings, sizes=wanted["sizes"], iters=iters, iters_min=None, deadlines=plan.round_deadlines(
            meta["deadlines"], docs, settings["warmup"], iters, len(wanted["sizes"]),
            at_init=bool(wanted.get("at_init"))))
        # no more iterations than fit half the rounds' op deadline at the pace the sweep measured there
        # (a slow link's pair must end as a slow measurement, not as a hang), as the in-process pairs do
        self.short["iters"] = plan.round_iters(docs, wanted["sizes"], settings["warmup"], iters,
                                               settings["iters"], self.short["deadlines"]["op_s"])

    def run_groups(self, groups: List[List[str]], extra_env=None, local_ranks=None, sync=True) -> List[Dict[str, Any]]:
        """One round: every group at once; each group's result (localize.group_result)."""
        started = time.monotonic()
        infos = [[self.by_name[n] for n in g] for g in groups]  # each group's first node hosts its store
        # every group starts timing at once, once the slowest of them should have started: the slowest
        # start of the whole-cluster run, scaled by how many more ranks each node starts now
        ratio = float(local_ranks or 1) if self.meta["backend"] == "gloo" else 1.0
        names = {n for g in groups for n in g}
        launch = self.timings.get("slowest_launch_s")
        if names <= self.kept and self.warm_launch_s is not None:  # every rank adopts a spare, as last round
            launch = self.warm_launch_s
        elif self.kept and not names <= self.kept:
            # a node the last round left out has no process to warm it: every kept one ends first (under
            # Slurm a kept step cannot take back a node whose task left it), and this round starts cold
            spares.end(self.fleet)
            self.kept = set()
        delay = ROUND_START_FACTOR * ratio * float(launch or 0) + 1.0
        # never so late that the agents' init deadline fires first
        start_at = time.time() + min(max(ROUND_START_MIN_S, delay), 0.5 * self.short["deadlines"]["init_s"])
        if not sync:  # judged on completion: no need to wait for the others
            start_at = None
        settings = dict(self.short, local_ranks=local_ranks, start_at=start_at)
        turns = localize.interleaved(groups)
        if turns:  # groups that share a node (a suspect and its control on 3 nodes): one launch, alternating
            infos = [[self.by_name[n] for n in dict.fromkeys(n for g in groups for n in g)]]
            settings.update(deadlines=self._turn_deadlines(len(turns)), iters=self._turn_iters())
        done = _run_groups(self.fleet, infos, self.addr_of, self.port, dict(self.env_vars, **(extra_env or {})),
                           settings, pairs=turns or None, warm_next="round" if self.settings["warm_next"] else None)
        docs = dict(done["docs"])
        took = time.monotonic() - started
        self.kept = done["kept"]
        self.warm_launch_s = spares.warm_launch_s(docs, took, spares.AFTER["round"][self.meta["backend"]])
        self.timings["rounds_s"].append(round(took, 3))
        self.timings["rounds_warm_ranks"].append(sum(1 for d in docs.values() for e in d.get("ranks") or []
                                                     if e.get("warm")))
        if turns:
            measured = localize.pair_results(docs, done["configs"], turns)
            if measured is None:  # the launch failed before its turns: every group carries why
                whole = localize.group_result(list(done["configs"]), docs, self.meta["backend"])
                return [dict(whole, nodes=list(g), failure=whole["failure"] or "the turns did not run")
                        for g in groups]
            return localize.merge_turns(groups, measured)
        return [localize.group_result(g, {n: docs.get(n) for n in g}, self.meta["backend"]) for g in groups]

    def round_deadline(self, groups: List[List[str]]) -> float:
        """The longest the controller waits for a round of these groups: an interleaved one (groups sharing a
        node) has its total stretched per turn (_turn_deadlines), so the time budget counts it as such."""
        turns = localize.interleaved(groups)
        deadlines = self._turn_deadlines(len(turns)) if turns else self.short["deadlines"]
        return plan.outer_deadline({"deadlines": deadlines})

    def _turn_iters(self) -> int:
        """An interleaved round's iterations per turn: the round's split over its ALTERNATIONS turns (at least
        3), so a group is timed about as often as in a plain round and no turn of a slow link runs past the
        op deadline without an event (a rank outside a turn waits at its barrier; seen once: a throttled
        3-node run's suspect turn of 22 iterations at 256 KiB hung at the 10 s op deadline)."""
        return max(3, -(-int(self.short["iters"]) // localize.ALTERNATIONS))

    def _turn_deadlines(self, turns: int) -> Dict[str, float]:
        """An interleaved round's deadlines: the round's, with its total stretched by half an op deadline per
        turn (each turn stops within half the op deadline, bench_worker's size budget)."""
        dl = dict(self.short["deadlines"])
        dl["total_s"] = round(dl["total_s"] + 0.5 * dl["op_s"] * turns, 1)
        return dl

    def node_rounds(self) -> None:
        """Partner-free rounds that need their own launch (nccl: the NIC loopback): every node alone, all
        at once, then the suspects again, each beside a known-good node timed at the same moment."""
        for spec in plan.node_rounds(self.nodes, self.meta["backend"]):
            results = [dict(g, **{"pass": 0}) for g in self.run_groups([[n.name] for n in self.nodes], spec["env"],
                                                                        spec["local_ranks"], sync=self.by_bandwidth)]
            suspects, good = (judge.node_suspects(results, self.settings["slow_fraction"]) if self.by_bandwidth
                              else ([], []))
            pairs = list(zip(suspects, good))
            if pairs:
                again = self.run_groups([[s] for s, _g in pairs] + [[g] for _s, g in pairs], spec["env"],
                                        spec["local_ranks"])
                results += [dict(r, beside=pairs[i][1], **{"pass": 1}) for i, r in enumerate(again[:len(pairs)])]
                results += [dict(r, control_for=pairs[i][0], **{"pass": 1}) for i, r in enumerate(again[len(pairs):])]
            self.meta.setdefault("node_rounds", []).append(dict(spec, results=results, sizes=self.wanted["sizes"],
                                                                by_bandwidth=self.by_bandwidth))

    def pairs(self, first: Dict[str, Any], rotations: Optional[List[Any]], limit: Optional[float]) -> None:
        """The pair rounds. The in-process rotations stand for the first rounds when the sweep completed
        (they judge bandwidth); a hang or an error is localized by separate rounds at the size it stopped at."""
        done = localize.pair_results(first["docs"], first["configs"], rotations) if (
            rotations and self.by_bandwidth) else None
        begun = time.monotonic()
        verdict = localize.localize([n.name for n in self.nodes], self.run_groups,
                                    threshold=limit if self.by_bandwidth else None, by_bandwidth=self.by_bandwidth,
                                    slow_fraction=self.settings["slow_fraction"], results=done,
                                    may_start=lambda groups: time.monotonic() - begun + self.round_deadline(groups)
                                    <= plan.LOCALIZE_BUDGET_S)
        self.meta["localization"] = {
            "results": verdict["results"], "rounds": verdict["rounds"],
            "in_process_rotations": len(rotations) if done is not None else 0,
            "out_of_time": verdict["out_of_time"],
            "threshold_gbps": limit if self.by_bandwidth else None, "by_bandwidth": self.by_bandwidth,
            "mode": self.wanted["mode"], "why": self.wanted["why"], "sizes": self.wanted["sizes"],
            "deadlines": self.short["deadlines"],
        }


def _slowest_start(docs: Dict[str, Dict[str, Any]]) -> Dict[str, Optional[float]]:
    """The slowest rank's torch import and whole init (seconds from its start, or a warm rank's from its go),
    where every rank got there; how many ranks were warm; the slowest sweep and phases after it."""
    out: Dict[str, Optional[float]] = {}
    entries = [e for doc in docs.values() for e in doc.get("ranks") or []]
    for key in ("import_s", "init_s"):
        values = [e.get(key) for e in entries]
        out["slowest_" + key] = max(values) if values and None not in values else None
    out["warm_ranks"] = sum(1 for e in entries if e.get("warm"))  # started in phase 1 (bench_warm), adopted
    # what starting these ranks anew costs (the rounds do): a warm rank's init counts from its go, so its
    # own import is added (an upper bound where the go found it still importing)
    launch = [None if e.get("init_s") is None else e["init_s"] + float((e.get("warm") and e.get("import_s")) or 0)
              for e in entries]
    out["slowest_launch_s"] = max(launch) if launch and None not in launch else None
    for key in ("sweep_s", "node_s", "pairs_s"):  # the sweep, the node tests, node tests + pairs (in run_s)
        values = [e[key] for e in entries if e.get(key) is not None]
        if values:
            out["slowest_" + key] = max(values)
    return out


def _timeline(docs: Dict[str, Dict[str, Any]], t0_wall: float) -> Dict[str, List[float]]:
    """Where the first launch's time went: for each step (the agents' start, each rank's import, store,
    init, sweep end, partner-free tests' end, pair tests' end, done and exit, the agents' return),
    [earliest, latest] over the ranks, in seconds from the controller's bench call (time.time(): the nodes' clocks, so their offsets from the
    controller's are in it; a warm rank's import is negative: it ended during the node checks)."""
    steps: Dict[str, List[float]] = {}

    def add(step: str, when: Any) -> None:
        if isinstance(when, (int, float)):
            steps.setdefault(step, []).append(float(when) - t0_wall)

    for doc in docs.values():
        at = doc.get("at") or {}
        add("agent_start", at.get("start"))
        for entry in doc.get("ranks") or []:
            for step, when in (entry.get("at") or {}).items():
                add(step, when)
        add("agent_end", at.get("end"))
    order = ("agent_start", "imported", "store", "init_done", "pairs_start", "node_done", "pairs_done", "done",
             "exit", "agent_end")
    return {step: [round(min(steps[step]), 3), round(max(steps[step]), 3)] for step in order if step in steps}


def summary(findings: Sequence[Any], meta: Dict[str, Any], elapsed_s: Optional[float]) -> Optional[Dict[str, Any]]:
    """The report's "allreduce" section: verdict, headline busbw, threshold, the whole curve."""
    main = next((f for f in findings if f.check == "allreduce" and f.node is None and f.data and "curve" in f.data), None)
    if not meta or meta.get("skip"):
        return {"verdict": "skip", "reason": meta.get("skip")} if meta else None
    worst = max((f.status for f in findings if f.check == "allreduce"), key=lambda s: s.rank, default=None)
    data = main.data if main else {}
    point = None
    if data.get("verdict_bytes"):
        point = next((p for p in data["curve"] if p["bytes"] == data["verdict_bytes"]), None)
    loc = meta.get("localization")
    loc_finding = next((f for f in findings if f.check == "allreduce" and f.node is None and f.data
                        and "localization" in f.data), None)
    if loc:
        loc = dict(loc, exclude=sorted((loc_finding.data["localization"].get("bad") or {}) if loc_finding else []))
    return {
        "backend": meta.get("backend"),
        "world_size": meta.get("world_size"),
        "nodes": meta.get("nodes"),
        "master": meta.get("master"),
        "verdict": worst.value if worst else None,
        "summary": main.message if main else None,
        "busbw_gbps": point["busbw_gbps"] if point else None,
        "threshold_gbps": data.get("threshold_gbps"),
        "curve": data.get("curve") or [],
        "elapsed_s": round(elapsed_s, 3) if elapsed_s is not None else None,
        "env": meta.get("env"),
        "deadlines": meta.get("deadlines"),
        "timings_s": meta.get("timings_s"),
        "localization": _localization_summary(loc),
        "node_rounds": [{"name": r.get("name"), "what": r.get("what"), "median_gbps": r.get("median_gbps"),
                         "named": sorted(r.get("named") or {}),
                         "nodes": {g["nodes"][0]: g.get("best_gbps", g.get("busbw_gbps")) for g in r.get("results") or []},
                         # what ran, against the time plan's counts: timed iterations and passes
                         "iters": sorted({g["iters"] for g in r.get("results") or [] if g.get("iters") is not None}),
                         "passes": len({int(g.get("pass", 0)) for g in r.get("results") or []})}
                        for r in data.get("node_rounds") or []] or None,
        "nccl": {f.node: f.data["nccl"] for f in findings
                 if f.check == "allreduce" and f.node and f.data and "nccl" in f.data} or None,
    }


def _localization_summary(loc: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if not loc:
        return None
    out = {k: loc.get(k) for k in ("rounds", "in_process_rotations", "why", "sizes", "deadlines", "by_bandwidth", "exclude")}
    out["groups"] = loc.get("results")
    return out

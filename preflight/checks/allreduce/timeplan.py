"""How long the all-reduce bench will take on a fleet, phase by phase, before any node is touched.

Controller only, pure: `preflight check --plan` and the JSON report's "allreduce_plan" show it, and
benchmarks/allreduce_plan_model.py runs it for 128 nodes / 1,024 GPUs. It follows what
preflight.checks.allreduce.stage does (one whole-cluster sweep, with the partner-free node tests and, on gloo, the
screening pairs in its own processes; for nccl the NIC loopback round; pair rounds up to
localize.max_rounds(n)) with the sizes, iterations and deadlines
plan.py gives, and states two figures per phase:

  expected_s  a healthy run, from the model below
  budget_s    the worst case the deadlines allow (every phase hangs until its deadline fires)

The model (each figure an assumption, printed with the plan):
  launch      LAUNCH_S + LAUNCH_PER_DOUBLING_S * log2(ranks): agents start in parallel, each rank imports
              torch and creates its CUDA context (the fixed part), NCCL's bootstrap and topology exchange
              grow with the log of the world (ring/tree setup; NCCL 2.2x init at 1k GPUs: tens of seconds)
  one size    latency + bytes * 2(n-1)/n / busbw (nccl-tests' busbw definition, inverted), with
              latency = HOP_LATENCY_S * 2 * log2(ranks) (a tree's depth, up and down: NCCL picks trees
              for small messages at scale)
  a sweep     (warmup + iters_min) runs of every size (each stops once stable, or latency-bound below the
              last size: plan.LATENCY_GROWTH), at most (warmup + iters):
              the cap, its figure expected_cap_s; the last timed run is the size's check (no extra run),
              and with the stop rule each size's decisions are one tiny all-reduce each (latency only),
              which also carry the budget agreement between sizes (bench_worker._sweep)
  node tests  in the sweep's processes: gloo's loopback at warmup + iters, one pass (judged on completion
              only); nccl's NVLink test at warmup + iters, a second pass for suspects in the worst case
  pairs       gloo: the in-process rotations at plan.ROUND_MIN_ITERS timed runs (and the rounds after them);
              nccl: warmup + iters
  busbw       between nodes: expect.busbw_gbps, else expect.ib_hcas * ib_rate_gbps / 8 * LINE_RATE_FRACTION;
              inside a node: the NVLink profile of the GPU (busbw.NVLINK_PROFILES); gloo: CPU_GBPS
  rounds      the pair rounds run every group at once: one launch and one size each, whatever the node
              count; at most localize.max_rounds(n) = ceil(log2 n) + 2 of them after the screening (group
              halving, then two confirmations); a healthy fleet runs none on gloo, the screening on nccl
  overlap     (warm, the default) IMPORT_S of a launch is the ranks' torch import and CUDA context, which a
              warm rank has done before its go: the first launch's is hidden up to first_hidden_s (the node
              checks it overlaps: the caller's figure, 0 for `--plan`), each later launch's up to the previous
              run's time after its store connection (its bootstrap and traffic: preflight.checks.allreduce.
              spares starts the next round's ranks then); only where the transport keeps a node's process
              (SSH; Slurm with one rank a node), which a plan made before the run cannot know
  reserves    (nccl, warm) the launches certain to follow the sweep (the NIC round, the pair screening:
              each phase's first launch) have their ranks started in phase 1 too (spares.reserves): each
              hides its import like the first, up to the node checks plus the phases before it
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from preflight.checks.allreduce import localize, plan
from preflight.checks.allreduce.busbw import LINE_RATE_FRACTION, NVLINK_PROFILES, busbw_factor
from preflight.common import GiB, human_bytes

#: Seconds to start the agents, import torch and create the CUDA context, per launch (fixed part).
LAUNCH_S = 20.0
#: NCCL bootstrap and topology exchange, per doubling of the world.
LAUNCH_PER_DOUBLING_S = 1.0
#: One hop's latency in a collective (NVLink/IB: a few microseconds).
HOP_LATENCY_S = 5e-6
#: gloo over TCP on a CPU node's data NIC, GB/s (a 10 GbE link); assumed when no figure is known.
CPU_GBPS = 1.0
#: The sweep's timed iterations a size runs at least (cluster.allreduce.iters_min): it stops there when
#: its busbw is stable (bench_worker._stop_rule); `iters` is the cap.
ITERS_MIN = 3
#: NVLink busbw assumed for a GPU model no profile knows (NVLink4, H100 SXM).
DEFAULT_NVLINK_GBPS = 450.0
#: Of LAUNCH_S, the ranks' torch import and CUDA context: what a rank started warm has done before its go
#: (the rest: the agents' start, the go, the round's common start).
IMPORT_S = 15.0


def settings(raw: Mapping[str, Any]) -> Dict[str, Any]:
    """The bench's settings from the inventory's cluster.allreduce mapping (run.py launches with these)."""
    deadlines = {}
    for key, name in (("init_timeout", "init_s"), ("op_timeout", "op_s"), ("total_timeout", "total_s")):
        if key in raw:
            deadlines[name] = float(raw[key])
    iters = raw.get("iters", 5)
    return {"sizes": raw.get("sizes"), "warmup": raw.get("warmup", 2), "iters": iters,
            "iters_min": min(iters, raw.get("iters_min", ITERS_MIN)),
            "deadlines": deadlines, "slow_fraction": float(raw.get("slow_fraction", localize.SLOW_FRACTION)),
            "node_round": raw.get("node_round")}


def launch_s(ranks: int, launch: float = LAUNCH_S, per_doubling: float = LAUNCH_PER_DOUBLING_S) -> float:
    return launch + per_doubling * math.log2(max(ranks, 1))


def op_s(nbytes: int, ranks: int, gbps: float, hop: float = HOP_LATENCY_S) -> float:
    """One all-reduce of nbytes over ranks at busbw gbps (GB/s): latency + bytes * 2(n-1)/n / busbw."""
    if ranks < 2:
        return 0.0
    return hop * 2 * math.ceil(math.log2(ranks)) + nbytes * busbw_factor(ranks) / (gbps * 1e9)


def rates(expect: Mapping[str, Any], gpu_model: Optional[str] = None) -> Dict[str, Any]:
    """{"net_gbps", "nvlink_gbps", "net_from", "nvlink_from"}: the busbw figures the plan assumes."""
    if expect.get("busbw_gbps"):
        net, net_from = float(expect["busbw_gbps"]), "expect.busbw_gbps"
    elif expect.get("ib_rate_gbps"):
        hcas = int(expect.get("ib_hcas") or 1)
        net = hcas * float(expect["ib_rate_gbps"]) / 8 * LINE_RATE_FRACTION
        net_from = "expect.ib_hcas x ib_rate_gbps / 8 x %g" % LINE_RATE_FRACTION
    else:
        net, net_from = CPU_GBPS, "assumed (no expect.busbw_gbps or ib_rate_gbps)"
    nvlink, nvlink_from = DEFAULT_NVLINK_GBPS, "assumed NVLink4 (no GPU model known before the run)"
    for pattern, label, figure in NVLINK_PROFILES:
        if gpu_model and pattern.search(gpu_model):
            nvlink, nvlink_from = figure, label
    return {"net_gbps": net, "nvlink_gbps": nvlink, "net_from": net_from, "nvlink_from": nvlink_from}


def time_plan(gpus_per_node: Sequence[int], raw_settings: Mapping[str, Any], expect: Mapping[str, Any],
              gpu_model: Optional[str] = None, launch: float = LAUNCH_S, per_doubling: float = LAUNCH_PER_DOUBLING_S,
              hop: float = HOP_LATENCY_S, first_hidden_s: float = 0.0, import_s: float = IMPORT_S,
              reserves: Optional[bool] = None) -> Dict[str, Any]:
    """The phases of the all-reduce bench on nodes with these GPU counts, their expected and budget seconds.
    reserves: whether phase 1 starts the later launches' ranks (default: warm nccl, as stage.warm does).

    Returns {"nodes", "ranks", "backend", "sizes", "warmup", "iters", "rates", "assumptions",
    "phases": [{"phase", "what", "runs", "expected_s", "budget_s"}], "expected_s", "budget_s",
    "localization_expected_s", "rounds": {"planned_max", "log2_bound"}}.
    """
    n = len(gpus_per_node)
    cfg = settings(raw_settings)
    backend = "nccl" if n and all(g > 0 for g in gpus_per_node) else "gloo"
    ranks = sum(gpus_per_node) if backend == "nccl" else n
    sizes = sorted(int(s) for s in (cfg["sizes"] or (plan.GPU_SIZES if backend == "nccl" else plan.CPU_SIZES)))
    warmup, iters, least = int(cfg["warmup"]), int(cfg["iters"]), int(cfg["iters_min"])
    dl = plan.default_deadlines(backend)
    dl.update(cfg["deadlines"])
    rate = rates(expect, gpu_model)
    net = rate["net_gbps"] if backend == "nccl" else min(rate["net_gbps"], CPU_GBPS)
    per_node = max(gpus_per_node) if backend == "nccl" and n else 1
    verdict = max([s for s in sizes if s >= GiB] or sizes) if backend == "nccl" else sizes[-1]
    ph = _Phases(warmup + iters, launch, per_doubling, hop, warmup)

    # 1. the whole-cluster sweep: one launch, every size; the controller waits plan.outer_deadline()
    gbps_world = net if n > 1 else rate["nvlink_gbps"]
    # expected: every size stable at iters_min; expected_cap_s: none stable before the cap (iters)
    sweep_step = _sweep_phase(ph, sizes, warmup, least, iters, ranks, gbps_world, dl)
    # the rounds' deadlines, as plan.round_deadlines derives them from the sweep's slowest size
    slowest = max(ph.runs * op_s(s, ranks, gbps_world, hop) for s in sizes) if sizes else 0.0
    rdl = plan.round_budget(dl, None, slowest, 1)
    round_budget = plan.outer_deadline({"deadlines": rdl})
    if cfg["node_round"] is not False and n >= 2:
        _node_phases(ph, gpus_per_node, backend, per_node, verdict, net, rate["nvlink_gbps"], round_budget)
    most = localize.max_rounds(n) if n >= 3 else 0
    if n >= 3:
        _pair_phase(ph, n, backend, per_node, verdict, net, round_budget, most, warmup)
    phases = ph.phases
    warm = raw_settings.get("warm") is not False
    reserves = warm and backend == "nccl" and reserves is not False
    if warm:
        _hide_imports(phases, min(import_s, launch), first_hidden_s, reserves)
    expected = round(sum(p["expected_s"] for p in phases), 1)
    return {
        "nodes": n, "ranks": ranks, "backend": backend, "sizes": sizes, "warmup": warmup, "iters": iters,
        "iters_min": least,
        "verdict_bytes": verdict, "rates": rate,
        "assumptions": {"launch_s": launch, "launch_per_doubling_s": per_doubling, "hop_latency_s": hop,
                        "warm": warm, "reserves": reserves, "import_s": min(import_s, launch) if warm else 0.0,
                        "first_hidden_s": first_hidden_s if warm else 0.0,
                        "op": "latency (hop x 2 log2 ranks) + bytes x 2(n-1)/n / busbw",
                        "deadlines": dl, "round_deadlines": rdl},
        "phases": phases, "expected_s": expected, "budget_s": round(sum(p["budget_s"] for p in phases), 1),
        "localization_expected_s": round(expected - phases[0]["expected_s"], 1),
        # every pair round the code may run (a suspect in each): the full run with localization
        "expected_with_localization_s": round(sum(p.get("expected_worst_s", p["expected_s"]) for p in phases), 1),
        "sweep_op_s": round(sweep_step, 3),
        "rounds": {"planned_max": most, "log2_bound": math.ceil(math.log2(n)) if n >= 2 else 0},
    }


class _Phases:
    """The plan's phase list, and the model every phase is costed by (runs a size, launch, hop latency)."""

    def __init__(self, runs: int, launch: float, per_doubling: float, hop: float, warmup: int = 0) -> None:
        self.runs, self.launch, self.per_doubling, self.hop, self.warmup = runs, launch, per_doubling, hop, warmup
        self.phases: List[Dict[str, Any]] = []

    def op(self, nbytes: int, world: int, gbps: float) -> float:
        return op_s(nbytes, world, gbps, self.hop)

    def launch_s(self, world: int) -> float:
        return launch_s(world, self.launch, self.per_doubling)

    def add(self, name: str, what: str, count: int, world: int, gbps: float, sizes: Sequence[int],
            budget: float, runs: Optional[int] = None) -> float:
        """A phase of `count` launches of `world` ranks, each running every size `runs` times (default
        warm-up + iters); its op time per launch."""
        step = sum((runs or self.runs) * self.op(s, world, gbps) for s in sizes)
        expected = count * (self.launch_s(world) + step)
        self.phases.append({"phase": name, "what": what, "runs": count, "ranks": world,
                            "expected_s": round(expected, 1), "budget_s": round(count * budget, 1),
                            "tail_s": self.per_doubling * math.log2(max(world, 1)) + step})
        return step


#: What a stop decision (and the budget agreement riding on it) all-reduces: 3 float64 (bench_worker._agree_stop).
DECISION_BYTES = 24
#: After iters_min, the ranks decide every this many iterations (bench_worker.DECIDE_EVERY: that module is the
#: rank's program, not imported here; tests/checks/test_allreduce_timeplan.py holds the two equal).
DECIDE_EVERY = 2


def _sweep_phase(ph: _Phases, sizes: Sequence[int], warmup: int, least: int, iters: int, ranks: int, gbps: float,
                 dl: Mapping[str, float]) -> float:
    """The whole-cluster sweep: every size's warm-up and timed runs, its last timed run the check, and with the
    stop rule (least < iters) its decisions, one tiny all-reduce each (bench_worker._one_size): one when the size
    is stable at `least`, every DECIDE_EVERY after it up to the cap. They carry the budget agreement (none runs
    apart on a healthy sweep). expected_s counts every size stable at `least`, expected_cap_s every size at its
    cap; "collectives" and "collectives_cap": the all-reduces each rank runs. Its op time per launch."""
    rule = least < iters
    decisions = -(-(iters - least) // DECIDE_EVERY) if rule else 0
    decide = ph.op(DECISION_BYTES, ranks, gbps)
    # without the stop rule the budget agreement runs between sizes, on its own (bench_worker._slowest)
    apart = 0 if rule else max(0, len(sizes) - 1)
    step = ph.add("sweep", "whole cluster, %d sizes %s-%s, %d warm-up + %s timed runs each, the last the check" % (
        len(sizes), human_bytes(sizes[0]), human_bytes(sizes[-1]), warmup,
        "%d" % iters if not rule else "%d-%d (stops once stable or latency-bound)" % (least, iters)),
        1, ranks, gbps, sizes, plan.outer_deadline({"deadlines": dl}), runs=warmup + least)
    p = ph.phases[-1]
    extra = (len(sizes) * (1 if rule else 0) + apart) * decide
    p["expected_s"] = round(p["expected_s"] + extra, 1)
    p["tail_s"] += extra
    p["expected_cap_s"] = round(ph.launch_s(ranks) + sum((warmup + iters) * ph.op(s, ranks, gbps) for s in sizes)
                                + (len(sizes) * decisions + apart) * decide, 1)
    p["iters"] = [least, iters]
    p["collectives"] = len(sizes) * (warmup + least + (1 if rule else 0)) + apart
    p["collectives_cap"] = len(sizes) * (warmup + iters + decisions) + apart
    return step + extra


def _hide_imports(phases: List[Dict[str, Any]], import_s: float, first_hidden_s: float, reserves: bool) -> None:
    """Take off each launch's import what overlaps something before it (the module docstring's `overlap`):
    the first launch's under the node checks; with reserves each later phase's first launch's under the
    node checks and the phases before it, else under the previous run after its store connection (its
    bootstrap and traffic). A phase gets "hidden_s"; budgets stay (a deadline still may fire)."""
    tail = None
    before = 0.0  # expected seconds from the node checks' end to this phase
    for p in phases:
        tail_s = p.pop("tail_s")
        if not p["runs"]:
            before += p["expected_s"]
            continue
        if tail is None:
            hidden = min(import_s, first_hidden_s)
        else:
            hidden = min(import_s, first_hidden_s + before if reserves else tail)
        p["hidden_s"] = round(hidden, 1)
        p["expected_s"] = round(max(0.0, p["expected_s"] - hidden), 1)
        if "expected_worst_s" in p:  # a second launch of the same round (suspects again): a spare's
            p["expected_worst_s"] = round(max(0.0, p["expected_worst_s"] - hidden - min(import_s, tail_s)), 1)
        if "expected_cap_s" in p:
            p["expected_cap_s"] = round(max(0.0, p["expected_cap_s"] - hidden), 1)
        before += p["expected_s"]
        tail = tail_s


def _node_phases(ph: _Phases, gpus_per_node: Sequence[int], backend: str, per_node: int, verdict: int, net: float,
                 nvlink: float, round_budget: float) -> None:
    """The partner-free node tests: in the sweep's processes (gloo loopback, nccl NVLink) and the rounds
    that need a launch of their own (nccl: the NIC loopback)."""
    if backend == "gloo" or per_node >= 2:
        # in the sweep's own processes, no launch: every node alone at once at warmup + iters runs (the
        # last the check); nccl then the suspects beside known-good nodes (the worst case: one more pass),
        # gloo's loopback none (judged on completion only: plan.node_spec)
        world = 2 if backend == "gloo" else per_node
        gbps = CPU_GBPS if backend == "gloo" else nvlink
        again = "" if backend == "gloo" else "; suspects again beside a known-good node"
        ph.add("node tests", "every node alone, in the sweep's processes: %s%s" % (
            plan.NODE_TESTS["loopback" if backend == "gloo" else "local"], again), 0, world, gbps, [verdict], 0.0)
        one = ph.runs * ph.op(verdict, world, gbps)
        p = ph.phases[-1]
        p["expected_s"], p["iters"], p["passes"] = round(one, 1), ph.runs - ph.warmup, 1
        if backend != "gloo":
            p["expected_worst_s"] = round(2 * one, 1)
    for spec in plan.node_rounds([_Node(g) for g in gpus_per_node], backend):
        ph.add("node round: " + spec["name"], "every node alone, at once: %s; suspects again beside a "
               "known-good node (a second launch)" % spec["what"], 1, per_node, net, [verdict], 2 * round_budget)
        ph.phases[-1]["worst_runs"] = 2
        ph.phases[-1]["expected_worst_s"] = round(2 * ph.phases[-1]["expected_s"], 1)


def _pair_phase(ph: _Phases, n: int, backend: str, per_node: int, verdict: int, net: float, round_budget: float,
                most: int, warmup: int) -> None:
    """The pair rounds: the screening (gloo: rotations in the sweep's processes; nccl: one launch), then at
    most `most` rounds while a node is undecided, none started past plan.LOCALIZE_BUDGET_S. gloo's pairs
    run plan.ROUND_MIN_ITERS timed iterations (stage), nccl's the sweep's cap."""
    pair_world = 2 * per_node
    in_process = backend == "gloo"
    runs = warmup + plan.ROUND_MIN_ITERS if in_process else ph.runs
    one = ph.launch_s(pair_world) + runs * ph.op(verdict, pair_world, net)
    ph.add("pair rounds", "screening: every node beside %s (%s); then at most %d rounds (ceil(log2 %d) + 2: "
           "group halving and two confirmations) while a node is undecided" % (
               "up to %d partners" % plan.PAIR_ROTATIONS if in_process else "one partner",
               "in the sweep's own processes" if in_process else "one launch", most, n),
           0 if in_process else 1, pair_world, net, [verdict], round_budget)
    last = ph.phases[-1]
    worst = most + (0 if in_process else 1)
    # the rounds start none that could end past plan.LOCALIZE_BUDGET_S (the screening launch aside)
    last["budget_s"] = round(min(worst * round_budget, (0 if in_process else round_budget) +
                                 max(plan.LOCALIZE_BUDGET_S, round_budget)), 1)
    last["worst_runs"] = worst
    last["expected_worst_s"] = round(worst * one, 1)
    last["iters"] = runs - warmup
    if in_process:
        last["rotations"] = len(plan.pair_rotations(["n%d" % i for i in range(n)]))
        last["expected_s"] = round(last["rotations"] * runs * ph.op(verdict, pair_world, net), 1)


def for_inventory(inv: Any) -> Dict[str, Any]:
    """time_plan() for an inventory's nodes, cluster.allreduce settings and expect values."""
    return time_plan([int(spec.gpus_per_node) for spec in inv.nodes], dict(inv.cluster.get("allreduce") or {}),
                     dict(inv.expect or {}))


def write(tp: Mapping[str, Any], json_path: Optional[str], echo: Any) -> None:
    """`preflight check --plan`: the lines through echo, and the plan as JSON to json_path ('-': stdout)."""
    import json
    import sys

    if json_path:
        text = json.dumps({"allreduce_plan": tp}, indent=1, sort_keys=True) + "\n"
        if json_path == "-":
            sys.stdout.write(text)
        else:
            with open(json_path, "w") as fh:
                fh.write(text)
    if json_path != "-":
        for line in render(tp):
            echo(line)


def print_plan(inv: Any, json_path: Optional[str], echo: Any, tier: str = "quick") -> int:
    """`preflight check --plan [--tier T]`: write(for_inventory(inv)) with the tier's plan; exit status 0."""
    from preflight.checks.allreduce import tiers

    tp = for_inventory(inv)
    write(dict(tp, tier=tiers.plan(tier, tp["backend"], tp["expected_s"])), json_path, echo)
    return 0


class _Node:
    """What plan.node_rounds reads of a node."""

    def __init__(self, gpus: int) -> None:
        self.gpus_per_node = gpus


def render(tp: Mapping[str, Any]) -> List[str]:
    """The plan as text lines (the CLI prints them; no rich markup)."""
    lines = ["all-reduce time plan: %d node%s, %d %s rank%s, verdict at %s (nothing was run)" % (
        tp["nodes"], "" if tp["nodes"] == 1 else "s", tp["ranks"], tp["backend"], "" if tp["ranks"] == 1 else "s",
        human_bytes(tp["verdict_bytes"]))]
    lines.append("  %-20s %10s %10s  %s" % ("phase", "expected", "budget", "what"))
    for p in tp["phases"]:
        lines.append("  %-20s %9.1fs %9.1fs  %s" % (p["phase"], p["expected_s"], p["budget_s"], p["what"]))
        if p.get("expected_cap_s", p["expected_s"]) != p["expected_s"]:
            lines.append("  %-20s %9.1fs %10s  (every size run to its cap of %d iterations)" % (
                "", p["expected_cap_s"], "", tp["iters"]))
    lines.append("  %-20s %9.1fs %9.1fs  (localization %.1fs; with every pair round: %.1fs)" % (
        "total", tp["expected_s"], tp["budget_s"], tp["localization_expected_s"], tp["expected_with_localization_s"]))
    r = tp["rates"]
    nvlink = "; NVLink %.0f GB/s (%s)" % (r["nvlink_gbps"], r["nvlink_from"]) if tp["backend"] == "nccl" else ""
    lines.append("  busbw assumed: between nodes %.0f GB/s (%s)%s" % (
        r["net_gbps"] if tp["backend"] == "nccl" else min(r["net_gbps"], CPU_GBPS), r["net_from"], nvlink))
    a = tp["assumptions"]
    lines.append("  model: launch %gs + %gs x log2(ranks); one all-reduce = %s (hop %g us); pair rounds after "
                 "the screening: at most %d (ceil(log2 n) = %d halvings + 2 confirmations)" % (
                     a["launch_s"], a["launch_per_doubling_s"], a["op"], a["hop_latency_s"] * 1e6,
                     tp["rounds"]["planned_max"], tp["rounds"]["log2_bound"]))
    if a.get("warm"):
        hidden = ["%s %.1fs" % (p["phase"], p["hidden_s"]) for p in tp["phases"] if p.get("hidden_s") is not None]
        lines.append("  overlap: a warm rank has done its torch import and CUDA context (%gs of a launch) before its go: "
                     "hidden %s (the first launch's under the node checks: %gs given; %s; where the transport keeps "
                     "each node's process: SSH, Slurm with one rank a node)" % (
                         a["import_s"], ", ".join(hidden) or "nothing", a["first_hidden_s"],
                         "the NIC round's and the screening's too, their ranks started in phase 1 (reserves), a later "
                         "round's under the run before it" if a.get("reserves") else "a round's under the run before it"))
    if tp.get("tier"):
        from preflight.checks.allreduce import tiers

        lines += tiers.render(tp["tier"])
    return lines

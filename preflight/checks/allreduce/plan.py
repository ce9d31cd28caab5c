"""How the all-reduce bench is launched: every node's agent config, the size sweeps, the deadlines.

Controller only (never shipped to the nodes): preflight.checks.allreduce.stage runs what this module plans, and
preflight.checks.allreduce.localize plans the rounds after it; the allreduce check (preflight/checks/allreduce/)
judges what came back.

make_configs() gives every node its preflight.probe.bench_agent config (backend, ranks, the size sweep,
deadlines); cluster_meta() the skeleton of view.cluster["allreduce"] the rule reads; outer_deadline()
how long the controller waits for one agent; pair_rotations() and pair_spec() the node pairs the
whole-cluster run's ranks time in-process after their sweep (gloo); node_spec() the partner-free tests
in the same processes, node_rounds() those that need a launch of their own; round_deadlines() keeps the rounds' deadlines to what the whole-cluster run measured.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from preflight.checks.allreduce.busbw import rank_table
from preflight.checks.allreduce.judge import warn_fraction
from preflight.common import KiB, MiB
from preflight.model import NodeInfo


#: GPU sweep: 1 MiB to 4 GiB, doubling (nccl-tests' usual range; bandwidth plateaus above 1 GiB).
GPU_SIZES = [MiB << i for i in range(13)]


#: CPU sweep: 1 KiB to 4 MiB, doubling. A ring all-reduce moves about bytes/world_size per message, so
#: the sweep starts below one 1500-byte Ethernet frame and ends far above a 9000-byte jumbo frame even
#: split over many ranks: a path that drops jumbo frames (an MTU black hole) passes the small sizes
#: and hangs at the first size whose segments exceed the real path MTU.
CPU_SIZES = [KiB << i for i in range(13)]


DEFAULT_DEADLINES = {"init_s": 60.0, "op_s": 30.0, "total_s": 300.0, "kill_grace_s": 3.0, "fail_grace_s": 5.0}
#: gloo on CPU: the whole 1 KiB - 4 MiB sweep takes about a second even on two loaded cores, one size's
#: 8 all-reduces well under one; 10 s without progress is a hang, and it is what a hang costs.
CPU_DEFAULT_DEADLINES = dict(DEFAULT_DEADLINES, op_s=10.0, total_s=180.0)


#: Localization rounds re-run only the size the whole-cluster run stopped at (or its verdict size), and
#: a pair that hangs costs the rounds' op deadline: LOCALIZE_OP_FACTOR times the slowest size the first
#: run completed (warm-up and verification included), at least LOCALIZE_OP_MIN_S, at most the op deadline.
LOCALIZE_OP_MIN_S = 5.0
LOCALIZE_OP_FACTOR = 10.0


#: Their init deadline stays the configured one, unless the first run hung at init (the pairs will hang
#: there too): then LOCALIZE_INIT_FACTOR times the slowest init (torch import included) the first run
#: saw, at least LOCALIZE_INIT_MIN_S, at most the init deadline. Import time varies a lot with load.
LOCALIZE_INIT_MIN_S = 30.0
LOCALIZE_INIT_FACTOR = 4.0

#: The pair rounds start no round that could end after this many seconds from their start (each round
#: counted at its outer deadline): a fleet with many undecided nodes ends with "could not localize" for
#: them rather than with a run longer than the time plan says (localize.localize's may_start).
LOCALIZE_BUDGET_S = 300.0

#: Timed iterations per group in the gloo pair tests (the screening's in-process rotations and the rounds),
#: at least: a pair timed 5 times on a shared CPU is measured low by one busy moment.
ROUND_MIN_ITERS = 20


#: The whole-cluster sweep stops a size below its last at iters_min when the slowest rank's best iteration
#: took at most this many times the size before it (bench_worker._agree_stop, "latency"): twice the bytes,
#: the same time, so the size measures latency and more iterations would not change its figure. A
#: bandwidth-bound size takes twice as long as the one before it; 1.5 lies between the two. The verdict
#: size (the last; any size >= 1 GiB) always runs to stable or the cap.
LATENCY_GROWTH = 1.5


# ------------------------------------------------------------------------------------------------ launch

def make_configs(
    nodes: Sequence[NodeInfo],
    master_addr: str,
    master_port: int = 29500,
    backend: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    sizes: Optional[Sequence[int]] = None,
    warmup: int = 2,
    iters: int = 5,
    deadlines: Optional[Mapping[str, float]] = None,
    local_ranks: Optional[int] = None,
    run_id: Optional[str] = None,
    iters_min: Optional[int] = None,
) -> Dict[str, Dict[str, Any]]:
    """{node name: bench_agent config} for the nodes, in order (node_rank = position). Pure.

    nccl with one rank per GPU when every node has GPUs, else gloo with one rank per node (local_ranks
    per node when given: the node round's two local gloo ranks).
    A node's `python` setting, when the inventory has one, names the ranks' interpreter. run_id (the
    launch's id, unique per group) lets a rank tell its own store from another preflight run's. iters_min
    (the whole-cluster sweep only): each size stops once stable (or latency-bound below the last size:
    LATENCY_GROWTH) after that many iterations, iters the cap.
    """
    if not nodes:
        return {}
    if backend is None:
        backend = "nccl" if all(n.gpus_per_node > 0 for n in nodes) else "gloo"
    per_node = [n.gpus_per_node if backend == "nccl" else (local_ranks or 1) for n in nodes]
    if min(per_node) < 1:
        raise ValueError("backend nccl needs GPUs on every node")
    sizes = list(sizes or (GPU_SIZES if backend == "nccl" else CPU_SIZES))
    dl = default_deadlines(backend)
    dl.update(deadlines or {})
    world = sum(per_node)
    out: Dict[str, Dict[str, Any]] = {}
    offset = 0
    for rank, (node, local) in enumerate(zip(nodes, per_node)):
        cfg: Dict[str, Any] = {
            "backend": backend, "master_addr": master_addr, "master_port": int(master_port),
            "world_size": world, "node_rank": rank, "nnodes": len(nodes), "local_world_size": local,
            "rank_offset": offset, "env": dict(env or {}), "sizes": sizes, "warmup": warmup, "iters": iters,
            "deadlines": dl,
        }
        if node.settings.get("python"):
            cfg["python"] = node.settings["python"]
        if run_id:
            cfg["run_id"] = run_id
        if iters_min:
            cfg["iters_min"] = int(iters_min)
            cfg["latency_growth"] = LATENCY_GROWTH
        out[node.name] = cfg
        offset += local
    return out


def default_deadlines(backend: str) -> Dict[str, float]:
    """The agents' deadlines when the inventory sets none: CPU_DEFAULT_DEADLINES for gloo."""
    return dict(DEFAULT_DEADLINES if backend == "nccl" else CPU_DEFAULT_DEADLINES)


def cluster_meta(configs: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The skeleton of view.cluster["allreduce"] for the configs sent; the controller adds unanswered,
    gpu_model and nic_gbps."""
    ordered = sorted(configs.items(), key=lambda kv: kv[1]["node_rank"])
    if not ordered:
        return {}
    first = ordered[0][1]
    return {
        "backend": first["backend"],
        "world_size": first["world_size"],
        "nodes": [name for name, _c in ordered],
        "ranks": {name: [c["rank_offset"], c["rank_offset"] + c["local_world_size"] - 1] for name, c in ordered},
        "master": "%s:%s" % (first["master_addr"], first["master_port"]),
        "deadlines": dict(first.get("deadlines") or {}),
        "unanswered": {},
    }


def outer_deadline(config: Mapping[str, Any]) -> float:
    """Seconds the controller should give one agent: its total deadline, two kill graces and slack."""
    dl = dict(DEFAULT_DEADLINES)
    dl.update(config.get("deadlines") or {})
    return dl["total_s"] + 2 * dl["kill_grace_s"] + dl["fail_grace_s"] + 15.0


#: In-process pair rotations: the whole-cluster run's ranks, once their sweep is done, time disjoint pairs of
#: nodes as sub-groups of the world they already formed (bench_worker._pair_phase): no second launch, no
#: second torch import. Each rotation pairs every node with a different partner, so a node is measured
#: beside PAIR_ROTATIONS partners (fewer when the cluster has fewer): one slow measurement (a busy
#: neighbour on a shared machine) is outvoted by the others, because a node that passes beside anyone is
#: good; a slow link is slow beside every partner.
PAIR_ROTATIONS = 3


def pair_rotations(nodes: Sequence[str], count: int = PAIR_ROTATIONS) -> List[List[List[str]]]:
    """Rotations of disjoint cross-half pairs: rotation r pairs node i of the first half with node
    (i + r) mod m of the second half (m nodes; the second half has the odd one out, who sits out one
    rotation in m). Rotation 0 is plan_pairs(); at most m rotations (then partners would repeat). Three
    nodes get every pair (three rotations), so each is measured twice."""
    nodes = list(nodes)
    half = len(nodes) // 2
    first, second = nodes[:half], nodes[half:]
    if not first:
        return []
    out = [[[first[i], second[(i + r) % len(second)]] for i in range(half)]
           for r in range(min(count, len(second)))]
    if len(nodes) == 3 and count >= 3:  # else the second half's nodes are measured once each: no confirmation
        out.append([[second[0], second[1]]])
    return out


def pair_spec(configs: Mapping[str, Mapping[str, Any]], rotations: Sequence[Sequence[Sequence[str]]],
              iters: int) -> Dict[str, Any]:
    """The whole-cluster run's "pairs" config (bench_worker._pair_phase): each node pair as its global ranks."""
    def ranks(name):
        c = configs[name]
        first = int(c.get("rank_offset", 0))
        return list(range(first, first + int(c.get("local_world_size", 1))))

    ordered = [name for name, _c in sorted(configs.items(), key=lambda kv: kv[1].get("node_rank", 0))]
    return {"rotations": [[ranks(a) + ranks(b) for a, b in rotation] for rotation in rotations], "iters": int(iters),
            "nodes": [ranks(name) for name in ordered]}


def node_spec(configs: Mapping[str, Mapping[str, Any]], iters: int, slow_fraction: float) -> Optional[Dict[str, Any]]:
    """The whole-cluster run's "node" config (bench_worker._node_phase): the partner-free tests in the
    sweep's own processes, or None where there are none. gloo (one rank a node): "loopback", two gloo
    ranks in the rank's process through the node's data-NIC address; nccl with 2+ GPUs on every node:
    "local", the node's GPUs alone (NVLink/NVSwitch or PCIe P2P). warn: the share below the median that
    sends a node to the confirmation pass (judge.warn_fraction). The loopback has no confirmation pass
    ("confirm": false): the rule judges it on completion only (its traffic stays in the node's kernel, so its
    figure is the node's CPU), so a second pass would be timed for nothing."""
    ordered = sorted(configs.items(), key=lambda kv: kv[1]["node_rank"])
    if len(ordered) < 2:
        return None
    backend = ordered[0][1]["backend"]
    local = [int(c.get("local_world_size", 1)) for _n, c in ordered]
    if backend == "nccl" and min(local) < 2:
        return None
    nodes = [list(range(int(c.get("rank_offset", 0)), int(c.get("rank_offset", 0)) + n))
             for (_n, c), n in zip(ordered, local)]
    spec = {"kind": "local" if backend == "nccl" else "loopback", "nodes": nodes,
            "warn": warn_fraction(slow_fraction), "iters": int(iters)}
    if backend != "nccl":
        spec["confirm"] = False
    return spec


#: What each partner-free test measures (the report's words).
NODE_TESTS = {
    "loopback": "two local gloo ranks through its own data-NIC address (CPU, memory, TCP stack)",
    "local": "its GPUs alone (NVLink/P2P)",
    "nic": "its GPUs through its own NICs (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)",
}


def node_rounds(nodes: Sequence[NodeInfo], backend: str) -> List[Dict[str, Any]]:
    """The partner-free rounds that need a launch of their own: every node alone, all nodes at once,
    judged against each other (then suspects again beside known-good nodes: run.py).

    nccl, nodes with 2+ GPUs: "nic" (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the node's GPUs exchange
    through its own NICs and back; NCCL reads these variables once, at its first communicator, so this
    cannot ride on the sweep's processes as the NVLink test does). gloo: none (the loopback rides on
    the sweep, node_spec()). Each is {"name", "what", "env": {...}, "local_ranks": None}.
    """
    if backend == "nccl" and min((n.gpus_per_node for n in nodes), default=0) >= 2:
        return [{"name": "nic", "what": NODE_TESTS["nic"], "env": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
                 "local_ranks": None}]
    return []


def round_deadlines(deadlines: Mapping[str, float], docs: Mapping[str, Any], warmup: int, iters: int,
                    nsizes: int = 1, at_init: bool = False) -> Dict[str, float]:
    """The localization rounds' deadlines, from what the whole-cluster run measured (see LOCALIZE_*).

    at_init: the first run hung at init, so the init deadline is what a failing pair costs: shorten it.
    """
    dl = dict(DEFAULT_DEADLINES)
    dl.update(deadlines or {})
    entries = [e for _n, e in rank_table(docs).values()]
    # init_s, or import_s for a rank that imported torch but hung at the rendezvous
    inits = [float(e.get("init_s") or e["import_s"]) for e in entries if (e.get("init_s") or e.get("import_s"))]
    slowest_init = max(inits) if at_init and entries and len(inits) == len(entries) else None
    # a size runs warmup + iters all-reduces, its last timed one the check (bench_worker._one_size)
    steps = [float(s.get("max_s", s.get("time_s", 0.0))) * (warmup + iters) for e in entries
             for s in e.get("sizes") or []]
    return round_budget(dl, slowest_init, max(steps, default=0.0), nsizes)


def round_iters(docs: Mapping[str, Any], sizes: Sequence[int], warmup: int, wanted: int, least: int,
                op_s: float) -> int:
    """Timed iterations for the rounds: `wanted`, fewer when warm-up and iterations (the last one is the
    check) at the slowest per-iteration time the sweep saw at these sizes would pass half of op_s; never
    below `least`."""
    per_op = [float(s.get("time_s", 0.0)) for _n, e in rank_table(docs).values() for s in e.get("sizes") or []
              if int(s.get("bytes", -1)) in set(int(b) for b in sizes)]
    if not per_op or max(per_op) <= 0:
        return wanted
    fit = int(0.5 * op_s / max(per_op)) - warmup
    return max(least, min(wanted, fit))


def round_budget(deadlines: Mapping[str, float], slowest_init_s: Optional[float], slowest_step_s: float,
                 nsizes: int = 1) -> Dict[str, float]:
    """The rounds' deadlines from the sweep's slowest init (None: keep init_s) and slowest size's
    warm-up + iterations (see LOCALIZE_*); preflight.checks.allreduce.timeplan plans with it before any run."""
    dl = dict(DEFAULT_DEADLINES)
    dl.update(deadlines or {})
    init = dl["init_s"]
    if slowest_init_s is not None:
        init = max(LOCALIZE_INIT_MIN_S, LOCALIZE_INIT_FACTOR * slowest_init_s)
    op = max(LOCALIZE_OP_MIN_S, LOCALIZE_OP_FACTOR * slowest_step_s)
    out = dict(dl, init_s=round(min(dl["init_s"], init), 1), op_s=round(min(dl["op_s"], op), 1))
    out["total_s"] = round(min(dl["total_s"], out["init_s"] + out["op_s"] * (nsizes + 2)), 1)
    return out

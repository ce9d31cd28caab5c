"""The controller's side of warm rounds (preflight.checks.allreduce.spares, stage._Rounds): which nodes are
asked to start the next round's ranks, on which transports, when kept processes are ended, and how the
rounds' common start uses what an all-warm round measured. A recording fleet stands in for the transport
(the node side, with real processes, is tests/probe/test_bench_spares.py)."""

from __future__ import annotations

from preflight.checks.allreduce import localize, plan, spares, stage
from preflight.model import NodeInfo
from preflight.transport.contract import Outcome

SIZE = plan.CPU_SIZES[-1]


def rank_doc(node_rank, warm=False, store_s=0.4):
    entry = {"rank": node_rank, "local_rank": 0, "status": "ok", "stage": None, "step": None, "bytes": None,
             "error": None, "import_s": 2.0, "init_s": 3.0, "store_s": store_s, "warm": warm,
             "sizes": [{"bytes": SIZE, "time_s": 1e-3, "min_s": 1e-3, "max_s": 2e-3, "ok": True}]}
    return {"node_rank": node_rank, "backend": "gloo", "world_size": 2, "sizes": [SIZE], "deadline": None,
            "error": None, "ranks": [entry]}


class Fleet:
    """Records every run: (the nodes named, then, each config's next_warm); answers every bench as warm."""

    def __init__(self, keeps=lambda ranks: True, warm=True):
        self.calls, self.warm = [], warm
        if keeps is not None:
            self.keeps_ranks = keeps

    def run(self, configs, deadline_of, then=False):
        self.calls.append((sorted(configs), then, {n: c["bench"].get("next_warm") for n, c in configs.items()}))
        return {n: Outcome(n, result={"bench": rank_doc(c["bench"]["node_rank"], self.warm)})
                for n, c in configs.items()}


def cfgs(backend="gloo", ranks=1):
    return {"n%d" % i: {"backend": backend, "local_world_size": ranks, "python": "/opt/py"} for i in (1, 2)}


def test_mark_asks_for_spares_only_where_the_fleet_keeps_the_process():
    slurm = Fleet(keeps=lambda ranks: ranks == 1)  # one rank a node: the kept step
    one, eight = cfgs("gloo", 1), cfgs("nccl", 8)
    assert spares.mark(slurm, one, "round") is True
    # gloo's rounds: once the ranks are done, so that no import competes with the round's CPU traffic
    assert one["n1"]["next_warm"] == {"backend": "gloo", "local_world_size": 1, "after": "done", "python": "/opt/py"}
    nccl_round = cfgs("nccl", 1)
    assert spares.mark(slurm, nccl_round, "round") and nccl_round["n1"]["next_warm"]["after"] == "store"
    assert spares.mark(slurm, eight) is False and "next_warm" not in eight["n1"]  # eight tasks a node: a new step
    k8s = Fleet(keeps=lambda ranks: False)  # each bench an Indexed Job
    assert spares.mark(k8s, cfgs()) is False
    sweep = cfgs("gloo", 1)
    # gloo's sweep: only where it failed on the node (its in-process screening settles a healthy cluster)
    assert spares.mark(Fleet(), sweep, "sweep") is True and sweep["n1"]["next_warm"]["after"] == "failed"
    nccl_sweep = cfgs("nccl", 8)
    assert spares.mark(Fleet(), nccl_sweep, "sweep") is True  # nccl's: its NIC round and screening follow
    assert nccl_sweep["n1"]["next_warm"]["after"] == "store"


def test_warming_is_off_by_inventory_or_without_keeps_ranks():
    assert spares.enabled({}, Fleet()) is True
    assert spares.enabled({"warm": False}, Fleet()) is False
    assert spares.enabled({}, Fleet(keeps=None)) is False


def test_the_warm_launch_is_read_only_from_a_round_where_every_rank_was_warm():
    both = {"a": rank_doc(0, True, 0.5), "b": rank_doc(1, True, 1.5)}  # import_s 2.0 each
    assert spares.warm_launch_s(both, 10.0) == 0.5  # the spares had 8.5 s after the slowest store: imported
    assert spares.warm_launch_s(both, 2.5) == 1.5  # only 1 s: 1 s of the import is left, plus the connection
    assert spares.warm_launch_s(both, 10.0, "done") == 2.5  # started as the round ended: the whole import left
    assert spares.warm_launch_s({"a": rank_doc(0, True, 0.5), "b": rank_doc(1, False, 9.0)}, 10.0) is None
    assert spares.warm_launch_s({"a": None}, 10.0) is None


def rounds(fleet, names=("n1", "n2", "n3", "n4")):
    nodes = [NodeInfo(n, n, 0, i == 0) for i, n in enumerate(names)]
    docs = {n: rank_doc(i) for i, n in enumerate(names)}
    settings = {"iters": 5, "warmup": 1, "slow_fraction": 0.2, "deadlines": {}, "warm_next": True}
    meta = {"backend": "gloo", "deadlines": plan.default_deadlines("gloo"), "timings_s": {"slowest_launch_s": 20.0}}
    r = stage._Rounds(fleet, nodes, {n: "10.0.0.%d" % i for i, n in enumerate(names)}, 29500, {}, settings, meta,
                      docs, {"mode": "slow", "sizes": [SIZE]})
    r.kept = set(names)  # the sweep asked every node for spares
    return r


def test_a_round_asks_for_the_next_rounds_spares_and_the_one_after_starts_at_the_warm_launch():
    fleet = Fleet()
    r = rounds(fleet)
    r.run_groups([["n1", "n2"], ["n3", "n4"]])
    (names, then, nxt), = fleet.calls
    assert then is True and all(v["after"] == "done" for v in nxt.values())  # gloo: after the round's traffic
    assert r.kept == {"n1", "n2", "n3", "n4"} and r.warm_launch_s is not None
    assert r.timings["rounds_warm_ranks"] == [4]


def test_a_round_that_names_a_node_left_out_before_ends_the_kept_processes_first():
    """The last round left n4 out (its process ended, its spares with it); this round names it again: every
    kept process ends first (a kept Slurm step cannot take n4 back) and the round starts cold."""
    fleet = Fleet()
    r = rounds(fleet)
    r.run_groups([["n1", "n2"], ["n3", "n1"]])
    assert r.kept == {"n1", "n2", "n3"}
    r.run_groups([["n4", "n1"]])
    assert [c[0] for c in fleet.calls] == [["n1", "n2", "n3"], [], ["n1", "n4"]]  # [] : spares.end


def test_no_spares_are_asked_for_when_warming_is_off():
    """Twin: cluster.allreduce.warm false (or a transport without keeps_ranks): then=False, no next_warm."""
    fleet = Fleet()
    r = rounds(fleet)
    r.settings["warm_next"] = False
    r.run_groups([["n1", "n2"], ["n3", "n4"]])
    (names, then, nxt), = fleet.calls
    assert then is False and set(nxt.values()) == {None} and r.kept == set()


def inventory(gpus, count, **allreduce):
    from preflight.inventory import Inventory, NodeSpec

    nodes = [NodeSpec("n%d" % i, "n%d" % i, i + 1, python="/opt/py", gpus_per_node=gpus) for i in range(count)]
    return Inventory("hosts.yaml", nodes, cluster={"allreduce": allreduce} if allreduce else {})


def test_phase_1_asks_for_reserves_only_for_the_nccl_launches_certain_to_follow():
    """nccl, 2+ GPUs a node, 3+ nodes: the NIC round and the pair screening (2 reserve sets); 2 nodes: the NIC
    round only; 1 GPU a node: the screening only; node_round false: the screening only."""
    ssh = Fleet()
    specs = stage.warm(ssh, inventory(8, 3))
    assert specs["n0"] == {"backend": "nccl", "local_world_size": 8, "python": "/opt/py", "reserves": 2}
    assert {s["reserves"] for s in specs.values()} == {2} and len(specs) == 3
    assert {s["reserves"] for s in stage.warm(ssh, inventory(8, 2)).values()} == {1}
    assert {s["reserves"] for s in stage.warm(ssh, inventory(1, 3)).values()} == {1}
    assert {s["reserves"] for s in stage.warm(ssh, inventory(8, 4, node_round=False)).values()} == {1}
    # two nodes of one GPU: no NIC round, no screening: the sweep is the only certain launch
    assert [s.get("reserves") for s in stage.warm(ssh, inventory(1, 2)).values()] == [None, None]


def test_no_reserves_for_gloo_when_warming_is_off_or_where_the_fleet_keeps_no_process():
    """Twins: gloo's healthy run is one launch (its pairs ride in the sweep's processes): its warm ranks, no
    reserve; cluster.allreduce.warm false: nothing; Slurm GPU nodes (one task a rank: a new step) and
    Kubernetes: nothing."""
    gloo = stage.warm(Fleet(), inventory(0, 4))
    assert gloo["n0"] == {"backend": "gloo", "local_world_size": 1, "python": "/opt/py"}
    assert stage.warm(Fleet(), inventory(8, 3, warm=False)) == {}
    assert stage.warm(Fleet(keeps=lambda ranks: ranks == 1), inventory(8, 3)) == {}
    assert stage.warm(Fleet(keeps=None), inventory(8, 3)) == {}


def test_the_first_round_starts_at_the_warm_launch_after_an_all_warm_nccl_sweep():
    """nccl: the next launch's ranks were importing by the sweep's store connection (spares) or since phase 1
    (reserves), so the first round's common start is set from the sweep as after an all-warm round; gloo's
    sweep starts spares only after a fault: its first round keeps the cold figure."""
    docs = {"a": rank_doc(0, True, 0.5), "b": rank_doc(1, True, 1.5)}
    assert spares.first_round_launch_s(docs, 10.0, "nccl") == spares.warm_launch_s(docs, 10.0) == 0.5
    assert spares.first_round_launch_s(docs, 10.0, "gloo") is None
    assert spares.first_round_launch_s({"a": rank_doc(0, False), "b": rank_doc(1, True)}, 10.0, "nccl") is None


def test_the_time_budget_counts_an_interleaved_round_at_its_stretched_deadline():
    """A round whose groups share a node (a suspect and its control on 3 nodes) runs as alternating turns of one
    launch, its total deadline stretched per turn: the localization's budget check (may_start) must count that,
    not a plain round's. Its twin: disjoint groups run side by side and keep the plain deadline."""
    r = rounds(Fleet(), names=("n1", "n2", "n3"))
    plain = plan.outer_deadline({"deadlines": r.short["deadlines"]})
    assert r.round_deadline([["n1", "n2"], ["n3", "n4"]]) == plain
    shared = [["n1", "n2"], ["n3", "n2"]]
    turns = len(localize.interleaved(shared))
    assert turns == 2 * localize.ALTERNATIONS
    assert r.round_deadline(shared) == plain + 0.5 * r.short["deadlines"]["op_s"] * turns > plain


"""The ranks of the next launch start warm: each bench run asks its nodes to start the next round's ranks
while it runs (preflight.probe.bench_spares), so a localization round adopts processes that have imported
torch (and made their CUDA contexts) instead of paying that again.

Controller side, pure apart from the fleet calls. It holds only where the transport sends the next bench to
the node process that ran this one (fleet.keeps_ranks: SSH yes, whatever the ranks a node; Slurm
with one rank a node, the kept step; Kubernetes no: each bench is an Indexed Job). A node the next round
leaves out is not named in its fleet.run, so the transport ends its kept process and the spares in it; after
the last round, end() ends every kept process (the contract's fleet.run({})): nothing waits past the stage.
A spare that does not fit the next round (another rank count, an import-time variable) is stopped and a cold
rank started on the node (bench_warm.fits): the verdict never depends on warming.

Reserves: where the healthy run certainly launches again (nccl: the NIC loopback round on nodes of 2+ GPUs,
the pair screening from 3 nodes), phase 1 starts those launches' ranks too (reserves(), in the phase-1
warm config: stage.warm), so each imports under the node checks instead of under the run before it; a node
holding a reserve set for the next launch starts no spares for it (preflight.probe.bench_spares).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

from preflight.checks.allreduce import plan

Fleet = Any  # preflight.transport.contract.Fleet (a layer below the stage, above this module's)

#: When a node's spares start (preflight.probe.bench_spares), by run and backend: once every local rank has
#: connected to the store ("store"), so the import (and CUDA context) overlaps the communicator's bootstrap,
#: a round's wait for its common start (stage.ROUND_START_*) and the traffic; nccl's traffic is the GPUs',
#: and an idle second context does not slow it; a gloo round's ranks mostly wait for the common start.
#: gloo's sweep asks for them only where it failed on the node ("failed": at its end, when a local rank did
#: not finish ok): its in-process screening (plan.pair_rotations) settles a healthy cluster with no round at
#: all, so spares after every sweep would be a torch import per node thrown away on every healthy run (on
#: the CPUs the run's own judging and the next job use); a slow but complete sweep's first round starts cold
#: (it waits for its common start anyway: round 1 measured 0.98x with spares, docs/speed.md).
#: gloo's rounds start them once every local rank is done ("done"): a gloo round's figures are CPU work on the
#: cores the import takes. Started at the store connection, the next round's imports can outlast the wait for
#: the common start under load and slow an interleaved round's first turns (3 nodes) but not its last: a
#: healed node was named 64% below its control in the suite (2 cores, three test workers), every turn of its
#: pair slow and its control's best turn not (docs/allreduce.md, "The rounds start warm too").
AFTER = {"sweep": {"nccl": "store", "gloo": "failed"}, "round": {"nccl": "store", "gloo": "done"}}


def enabled(raw: Mapping[str, Any], fleet: Fleet) -> bool:
    """Warm rounds unless the inventory turns warming off (cluster.allreduce.warm: false) or the fleet
    cannot keep a node's process from one bench to the next."""
    return raw.get("warm") is not False and getattr(fleet, "keeps_ranks", None) is not None


def mark(fleet: Fleet, configs: Dict[str, Dict[str, Any]], run: str = "sweep") -> bool:
    """Ask every node whose process the fleet keeps for a next bench of the same ranks a node to start that
    bench's ranks during this one (config "next_warm"). True when any was asked: run with then=True."""
    keeps = getattr(fleet, "keeps_ranks", None)
    asked = False
    for cfg in configs.values():
        ranks = int(cfg.get("local_world_size") or 1)
        if keeps is None or not keeps(ranks):
            continue
        cfg["next_warm"] = {"backend": cfg["backend"], "local_world_size": ranks, "after": AFTER[run][cfg["backend"]]}
        if cfg.get("python"):
            cfg["next_warm"]["python"] = cfg["python"]
        asked = True
    return asked


def reserves(backend: str, nodes: Sequence[Any], raw: Mapping[str, Any]) -> int:
    """How many launches certainly follow the sweep on these nodes (each node's gpus_per_node) when it is
    healthy, each a set of ranks phase 1 may start ahead: nccl's NIC round (plan.node_rounds, unless
    cluster.allreduce.node_round is false) and pair screening (3+ nodes: localize's first round). gloo: none
    (its node and pair tests ride in the sweep's processes; a healthy CPU cluster launches once)."""
    if backend != "nccl":
        return 0
    rounds = len(plan.node_rounds(nodes, backend)) if raw.get("node_round") is not False else 0
    return rounds + (1 if len(nodes) >= 3 else 0)


def first_round_launch_s(docs: Mapping[str, Optional[Dict[str, Any]]], sweep_s: float, backend: str) -> Optional[float]:
    """The first round's launch when every rank of the sweep was warm: warm_launch_s of the sweep, where
    the next launch's ranks were importing by the sweep's store connection at the latest (nccl: spares
    after "store", or reserves since phase 1, earlier still). None for gloo (its sweep starts spares only
    after a fault, at its end): the round's start is then set from the sweep's slowest cold launch."""
    if AFTER["sweep"][backend] != "store":
        return None
    return warm_launch_s(docs, sweep_s)


def end(fleet: Fleet) -> None:
    """End every node process kept for a next bench, and the spares it holds (no round follows)."""
    fleet.run({}, lambda spec: 1.0)


def warm_launch_s(docs: Mapping[str, Optional[Dict[str, Any]]], round_s: float, after: str = "store") -> Optional[float]:
    """What the next round's launch costs when it adopts the spares this round (round_s long, every rank
    warm) started: the quickest way to the store from a go (a rank whose import was done: the connection
    alone) plus what is left of the slowest import (the rank's own import_s). Spares started at the store
    connection (after="store") have had this round after its slowest store connection; spares started when
    the ranks were done ("done", gloo) are counted as not imported at all. None unless every rank was warm
    (a rank's init_s would count the wait for the common start, so store_s is read)."""
    entries = [e for doc in docs.values() if doc for e in doc.get("ranks") or []]
    if not entries or not all(e.get("warm") and e.get("store_s") is not None for e in entries):
        return None
    stores = [float(e["store_s"]) for e in entries]
    imports = [float(e.get("import_s") or 0) for e in entries]
    had = round_s - max(stores) if after == "store" else 0.0
    return round(min(stores) + max(0.0, max(imports) - had), 3)

"""Agent result documents and views that the all-reduce tests build (preflight.probe.bench_agent's layout).

One place for the test modules that mirror preflight/checks/allreduce/ and the check, so they never import
from each other.
"""

from __future__ import annotations

from preflight import common
from preflight.model import NodeInfo
from tests.builders import view

GiB, MiB, KiB = common.GiB, common.MiB, common.KiB


def doc(node_rank, ranks, sizes, time_s=0.01, slow=None, status=None, world=None, backend="nccl", **extra):
    """One node's agent document: `ranks` global ranks, each done with every size in `sizes`.

    slow: {rank: factor} multiplies that rank's times; status: {rank: rank-entry overrides}.
    """
    entries = []
    for local, rank in enumerate(ranks):
        factor = (slow or {}).get(rank, 1.0)
        entry = {"rank": rank, "local_rank": local, "pid": 100 + rank, "status": "ok", "stage": None, "step": None,
                 "bytes": None, "error": None, "exit": 0, "stderr_tail": "",
                 "sizes": [{"bytes": b, "time_s": time_s * factor * b / sizes[-1], "ok": True} for b in sizes]}
        entry.update((status or {}).get(rank, {}))
        entries.append(entry)
    out = {"node_rank": node_rank, "hostname": "n%03d" % (node_rank + 1), "backend": backend,
           "world_size": world, "deadline": None, "error": None, "ranks": entries, "elapsed_s": 1.0}
    out.update(extra)
    return out


def cluster(docs, gpus=8, expect=None, **meta):
    """A view of len(docs) nodes n001.. with those documents and the cluster metadata."""
    names = ["n%03d" % (i + 1) for i in range(len(docs))]
    infos = [NodeInfo(n, n, gpus) for n in names]
    facts = {n: {"allreduce": d} for n, d in zip(names, docs) if d is not None}
    world = sum(len(d["ranks"]) for d in docs if d is not None)
    base = {"backend": docs[0]["backend"] if docs[0] else "nccl", "world_size": world, "nodes": names,
            "deadlines": {"init_s": 30, "op_s": 20, "total_s": 120}}
    base.update(meta)
    return view(facts, nodes=infos, expect=expect or {}, cluster={"allreduce": base})


def eight_ranks_on(n_nodes, per_node, sizes, **kw):
    world = n_nodes * per_node
    return [doc(i, list(range(i * per_node, (i + 1) * per_node)), sizes, world=world, **kw) for i in range(n_nodes)]


def the(findings, node=None):
    (f,) = [f for f in findings if f.node == node]
    return f


def hung_entry(stage="size", nbytes=2 * KiB, step=None):
    """A rank entry stopped by its deadline at `stage` (the op deadline's message)."""
    return {"status": "timeout", "stage": stage, "bytes": nbytes, "step": step,
            "error": "no progress within the op deadline (20 s)"}


def fake_round(bad, slow=(), slow_gbps=10.0, healthy_gbps=40.0, scale=1.0):
    """run_round for localize(): a group fails when it holds a bad node, is slow with a slow one.
    scale: every figure of the round times this (a loaded machine slows the whole round)."""
    calls = []

    def run_round(groups):
        calls.append(groups)
        out = []
        for g in groups:
            if any(n in bad for n in g):
                out.append({"nodes": g, "busbw_gbps": None, "failure": "hung at init"})
            else:
                bw = slow_gbps if any(n in slow for n in g) else healthy_gbps
                out.append({"nodes": g, "busbw_gbps": bw * scale, "failure": None})
        return out

    return run_round, calls

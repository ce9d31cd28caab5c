"""The ranks of the next all-reduce launch start while this one runs: they import torch (and make their CUDA
contexts) during this bench, and the next bench on this node process adopts them (bench_warm.take/go).

Node side, standard library only, Python 3.8 compatible. The controller asks for them in the bench config,
{"next_warm": {"backend", "local_world_size", "python", "after": "store" | "init" | "done" | "end" | "failed"}}
(preflight.checks.allreduce.stage: only where its transport sends the next bench to this same process,
fleet.keeps_ranks). They start, in this (the main) thread, once every local rank of this bench has reached
`after`: "store" (connected to the rendezvous store: the import overlaps the group's creation and the
wait for the round's common start), "init" (its process group is made: the import overlaps the traffic) or
"done" (its results are in), or when the bench ends ("end", and at the latest: a bench that fails short of
its trigger is followed by rounds), or when it ends with a local rank that did not finish ok ("failed": a
sweep whose own screening settles a healthy cluster, so a healthy node pays no import for nothing). The
controller picks it (preflight.checks.allreduce.spares.AFTER).

The same rules as phase 1's warm ranks (bench_warm's docstring): a spare only imports until its go (it
never connects anywhere before), it dies with this process (PR_SET_PDEATHSIG, the process group, EOF on its
go pipe), a misfit is stopped and a cold rank started (the verdict never depends on warming), and a spare
still importing at the next bench's init deadline is a timeout at step "import". A node the next round
leaves out gets no config: the transport ends its kept process (contract: a node not named), and its spares
with it. This bench's own unadopted warm ranks are stopped when the spares start (bench_warm.start).

Where phase 1 started reserves (bench_warm.RESERVES: the next launch's ranks, importing since the node
checks), a bench starts no spares (no second import of the same launch): when it ends, the next reserve set
becomes the warm ranks the next bench adopts (bench_warm.next_set). Once the reserves are used up, spares
start as above.
"""

from __future__ import annotations


from preflight.probe import bench_warm

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional


class Spares:
    """This bench's spares for the next one: when to start them, and whether they were."""

    def __init__(self, cfg: Dict[str, Any], python: str, nccl_env: Dict[str, str]) -> None:
        spec = cfg.get("next_warm")
        self.spec = dict(spec) if isinstance(spec, dict) else None
        self.after = str((self.spec or {}).get("after") or "done")
        self.source = cfg.get("worker_source") or ""
        self.python, self.nccl_env = python, nccl_env
        self.result = None  # type: Optional[Dict[str, Any]]

    def poll(self, ranks: Any) -> None:
        """Start the spares once every local rank has reached `after` (its store connection, init_done or
        done); "end" and "failed" wait for at_end."""
        if self.spec is None or self.result is not None or not ranks or self.after in ("end", "failed"):
            return
        if self.after == "store":  # connected to the store: the rendezvous and the wait to start are idle
            reached = all(r.init_done or r.step == "group" for r in ranks)
        elif self.after == "init":
            reached = all(r.init_done for r in ranks)
        else:
            reached = all(r.done for r in ranks)
        if reached:
            self.start()

    def start(self) -> None:
        """Start them now (at the latest when the bench ends: a failed bench is followed by rounds), unless
        a reserve set for the next launch is held already (it started in phase 1)."""
        if self.spec is not None and self.result is None:
            if bench_warm.RESERVES:
                self.result = {"reserved": len(bench_warm.RESERVES)}
            else:
                self.result = bench_warm.start(self.spec, self.source, self.python, self.nccl_env)

    def at_end(self, ranks: Any) -> None:
        """The bench is over: start the spares if they have not started, unless they were asked for only
        after a fault ("failed") and every local rank finished ok."""
        if self.after == "failed" and ranks and all(r.status == "ok" for r in ranks):
            return
        self.start()

    def settle(self) -> None:
        """The bench is over: the spares started for the next bench stay; any other warm rank is stopped,
        and the next reserve set, if one is held, is what the next bench adopts."""
        if self.result is None or "started" not in self.result:
            bench_warm.next_set()


def adopt(cfg: Dict[str, Any], rank: Any, worker_cfg: Dict[str, Any], env: Dict[str, str]) -> bool:
    """Run this rank in the process warmed for its local rank (in phase 1, or during the last bench), when
    there is one that fits: its init deadline counts from this go, its torch import is done or under way."""
    warm = bench_warm.take(cfg, rank.local_rank)
    if warm is None:
        return False
    if not bench_warm.go(warm, worker_cfg, env):
        bench_warm.stop(warm)
        return False
    rank.proc, rank.go_fd, rank.warm = warm.proc, warm.go_fd, True
    return True

"""Modelled wall time of the all-reduce bench with localization at 128 nodes / 1,024 GPUs (issue 23 item 5).

    python3 benchmarks/allreduce_plan_model.py                      # 128 x 8 H100, 8x NDR 400G, NVLink4
    python3 benchmarks/allreduce_plan_model.py --nodes 16 --launch 30 --json -

No node is touched: preflight.checks.allreduce.timeplan plans the phases run.py would run (whole-cluster sweep,
NVLink and NIC node rounds, pair rounds up to localize.MAX_ROUNDS) with plan.py's default sizes,
iterations and deadlines. Assumptions (each a flag):
  line rates  NDR InfiniBand 400 Gb/s per HCA, --hcas 8 per node, LINE_RATE_FRACTION of it as busbw
              between nodes (no SHARP); NVLink4 450 GB/s per GPU one way inside a node
  launch      --launch seconds per launch (agents start, torch import, CUDA context) + --per-doubling
              seconds per doubling of the ranks (NCCL bootstrap/topology)
  one size    latency (--hop-us x 2 log2 ranks) + bytes x 2(n-1)/n / busbw
  rounds      every pair at once, one launch a round; the worst case runs every pair round
Goal: a full run with localization in at most 10 minutes at this scale. The script prints the
expected figure (healthy, and with every pair round), the deadline budget, and whether the goal holds.

Then the healthy go/no-go (issue 38: goal <= 60 s at 128 x 8 H100), the node checks included, in three
scenarios, each assumption printed beside it:
  today        node checks (--node-checks s), then the all-reduce above (every launch pays --launch)
  overlap      the first launch's rank processes import torch and create their CUDA context while the node
               checks run (issue 38 item 1, built): the first launch's import (--import-s of --launch) is
               hidden up to the node checks' length; the later launches pay it in full
  warm rounds  also each later launch's ranks start during the run before it (built: preflight.checks.allreduce.
               spares, docs/allreduce.md): the NIC round's import is hidden up to the sweep's time after
               its store connection (NCCL bootstrap + traffic), the pair screening's up to the NIC round's. One
               CUDA context more per GPU while they wait (a few hundred MB of HBM, no kernels); the spares' import
               overlaps the sweep's traffic on real nodes because that traffic is the GPUs' and NICs' while the
               import is one CPU core of dozens (on the 2-core simulator it is not: gloo's sweep starts them last).
  reserves     also the launches certain to follow a healthy nccl sweep (the NIC round, the pair screening) have
               their ranks started in phase 1 beside the first launch's (built: preflight.checks.allreduce.spares.
               reserves, docs/allreduce.md): each hides its import like the first, up to the node checks
               plus the phases before it. Costs: k+1 = 3 CUDA contexts per GPU while the node checks run (two idle
               ones more: --context-gb each of HBM), k+1 = 3 imports per GPU at once on the node's CPUs (24 on an
               8-GPU node; --node-cores). On the 2-core simulator nothing of this can be shown (gloo starts none).
The rendezvous (TCPStore connect + a store barrier, all ranks at once) is measured, not modelled:
--rendezvous-s (default: benchmarks/rendezvous_scale.py at 1,024 ranks, see RENDEZVOUS_1024_S); it is printed
against the per-doubling NCCL bootstrap term it must fit in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from preflight.checks.allreduce import timeplan  # noqa: E402

GOAL_S = 600.0
GO_GOAL_S = 60.0
#: TCPStore rendezvous of 1,024 ranks at once, connect + barrier, measured by
#: `sudo python3 benchmarks/rendezvous_scale.py --ranks 64,256,1024 --repeat 3` (variant libuv: 1,023 client threads
#: on one 2-core host at load 30, loopback; 1.3 s in a quieter run): the slower figure
RENDEZVOUS_1024_S = 2.4
#: node checks (phase 1 and 2) at 128 nodes: an assumption (the controller's CPU at ~30 ms a node is 4 s; nodes
#: probe in parallel, nvidia-smi -q -x and dcgmi diag -r 1 take seconds on a real H100 node); not measured there
NODE_CHECKS_S = 12.0
#: HBM one idle CUDA context holds with torch loaded (no kernels run): an assumption, not measured here (no
#: GPU). Public figures with lazy module loading (torch's default since 1.13): 287 MB (pytorch/pytorch PR 86509,
#: 667 MB eager), ~400 MB (pytorch/pytorch issue 109888), 426 MiB on an RTX 6000 Ada (unslothai/unsloth-zoo PR 1053)
CONTEXT_GB = 0.5
#: CPU cores of an 8-GPU node (DGX H100: 2 x 56): an assumption, the reserves' imports must fit in them
NODE_CORES = 112


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    ap.add_argument("--hcas", type=int, default=8, help="NDR HCAs per node")
    ap.add_argument("--rate-gbps", type=float, default=400.0, help="line rate of one HCA, Gb/s")
    ap.add_argument("--launch", type=float, default=timeplan.LAUNCH_S)
    ap.add_argument("--per-doubling", type=float, default=timeplan.LAUNCH_PER_DOUBLING_S)
    ap.add_argument("--import-s", type=float, default=timeplan.IMPORT_S,
                    help="of --launch, the ranks' torch import + CUDA context (what a warm rank has done)")
    ap.add_argument("--hop-us", type=float, default=timeplan.HOP_LATENCY_S * 1e6)
    ap.add_argument("--json", metavar="PATH", help="also write the plan as JSON ('-': stdout only)")
    ap.add_argument("--node-checks", type=float, default=NODE_CHECKS_S, help="seconds of the node checks (phases 1+2)")
    ap.add_argument("--rendezvous-s", type=float, default=RENDEZVOUS_1024_S,
                    help="measured TCPStore connect + barrier of all the ranks, seconds")
    ap.add_argument("--context-gb", type=float, default=CONTEXT_GB, help="HBM of one idle CUDA context, GB")
    ap.add_argument("--node-cores", type=int, default=NODE_CORES, help="CPU cores of a node")
    args = ap.parse_args(argv)
    tp = plan_for(args, {"warm": False})  # every launch cold: the figures issue 23 set its goal on
    timeplan.write(tp, args.json, print)
    if args.json != "-":
        worst = tp["expected_with_localization_s"]
        print("modelled full run with localization, %d nodes / %d GPUs: %.1f s expected (%.1f s healthy, "
              "deadline budget %.1f s); goal <= %.0f s: %s" % (
                  tp["nodes"], tp["ranks"], worst, tp["expected_s"], tp["budget_s"], GOAL_S,
                  "met" if worst <= GOAL_S else "NOT met"))
        for line in go_no_go(tp, args):
            print(line)
    return 0


def plan_for(args, raw, first_hidden_s=0.0, reserves=False):
    return timeplan.time_plan([args.gpus] * args.nodes, raw, {"ib_hcas": args.hcas, "ib_rate_gbps": args.rate_gbps},
                              gpu_model="NVIDIA H100 80GB HBM3", launch=args.launch, per_doubling=args.per_doubling,
                              hop=args.hop_us * 1e-6, first_hidden_s=first_hidden_s, import_s=args.import_s,
                              reserves=reserves)


def hidden_later(tp):
    return ", ".join("%s %.1f s" % (p["phase"], p["hidden_s"]) for p in tp["phases"][1:] if p.get("hidden_s") is not None)


def go_no_go(tp, args):
    """The healthy go/no-go in four scenarios (today, overlapped import, warm rounds, reserves), assumptions
    stated."""
    first = timeplan.launch_s(tp["ranks"], args.launch, args.per_doubling)
    hidden = min(args.import_s, args.launch, args.node_checks)  # the first import, up to the node checks' length
    today = args.node_checks + tp["expected_s"]
    overlap = today - hidden
    warm_tp = plan_for(args, {}, first_hidden_s=args.node_checks)  # what --plan models, the node checks given
    warm = args.node_checks + warm_tp["expected_s"]
    reserve_tp = plan_for(args, {}, first_hidden_s=args.node_checks, reserves=True)
    reserved = args.node_checks + reserve_tp["expected_s"]
    sets = 1 + sum(1 for p in reserve_tp["phases"][1:] if p["runs"])  # the sweep's set and one per later launch
    bootstrap = args.per_doubling * math.log2(max(tp["ranks"], 1))
    yield ""
    yield "healthy go/no-go, %d nodes / %d GPUs (goal <= %.0f s):" % (tp["nodes"], tp["ranks"], GO_GOAL_S)
    yield "  assumed  node checks (phases 1+2) %.1f s (--node-checks); a launch's fixed part (agents, torch import," \
          " CUDA context) %.1f s (--launch), of it the import + CUDA context %.1f s (--import-s); NCCL bootstrap" \
          " %.1f s x log2(ranks) (--per-doubling)" % (args.node_checks, args.launch, args.import_s, args.per_doubling)
    yield "  assumed  a warm rank holds one CUDA context per GPU while it waits (no kernels); its import overlaps the" \
          " run before it on a real node (GPU/NIC traffic; one CPU core of dozens), from that run's store connection:" \
          " its bootstrap (%.1f s x log2 ranks) and traffic, not the round's wait for its common start" % args.per_doubling
    yield "  measured TCPStore connect + barrier of %d ranks: %.2f s (--rendezvous-s; rendezvous_scale.py, loopback), " \
          "%s the %.1f s bootstrap term of the first launch (%.1f s)" % (
              tp["ranks"], args.rendezvous_s, "inside" if args.rendezvous_s <= bootstrap else "OVER", bootstrap, first)
    yield "  assumed  reserves: %d sets of ranks a node start in phase 1, so %d CUDA contexts per GPU during the node" \
          " checks (%d idle, %.1f GB of HBM each: %.1f GB of 80 GB per GPU, --context-gb) and %d imports at once on" \
          " %d cores a node (--node-cores; %s); nothing of it measured on a GPU" % (
              sets, sets, sets - 1, args.context_gb, (sets - 1) * args.context_gb, sets * args.gpus,
              args.node_cores, "fits" if sets * args.gpus <= args.node_cores else "OVER: they would queue")
    for label, value, what in (
            ("today", today, "node checks + all-reduce %.1f s, every launch pays its fixed part" % tp["expected_s"]),
            ("overlap", overlap, "the first launch's import overlaps the node checks: -%.1f s (issue 38 item 1)" % hidden),
            ("warm rounds", warm, "and each later launch's import under the run before it: %s (built)"
             % hidden_later(warm_tp)),
            ("reserves", reserved, "the NIC round's and the screening's ranks start in phase 1 too: %s (built)"
             % hidden_later(reserve_tp))):
        yield "  %-12s %6.1f s  %s  goal: %s" % (label, value, what, "met" if value <= GO_GOAL_S else "NOT met")


if __name__ == "__main__":
    sys.exit(main())

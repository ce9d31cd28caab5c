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
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from preflight.checks.allreduce import timeplan  # noqa: E402

GOAL_S = 600.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    ap.add_argument("--hcas", type=int, default=8, help="NDR HCAs per node")
    ap.add_argument("--rate-gbps", type=float, default=400.0, help="line rate of one HCA, Gb/s")
    ap.add_argument("--launch", type=float, default=timeplan.LAUNCH_S)
    ap.add_argument("--per-doubling", type=float, default=timeplan.LAUNCH_PER_DOUBLING_S)
    ap.add_argument("--hop-us", type=float, default=timeplan.HOP_LATENCY_S * 1e6)
    ap.add_argument("--json", metavar="PATH", help="also write the plan as JSON ('-': stdout only)")
    args = ap.parse_args(argv)
    tp = timeplan.time_plan([args.gpus] * args.nodes, {}, {"ib_hcas": args.hcas, "ib_rate_gbps": args.rate_gbps},
                            gpu_model="NVIDIA H100 80GB HBM3", launch=args.launch, per_doubling=args.per_doubling,
                            hop=args.hop_us * 1e-6)
    timeplan.write(tp, args.json, print)
    if args.json != "-":
        worst = tp["expected_with_localization_s"]
        print("modelled full run with localization, %d nodes / %d GPUs: %.1f s expected (%.1f s healthy, "
              "deadline budget %.1f s); goal <= %.0f s: %s" % (
                  tp["nodes"], tp["ranks"], worst, tp["expected_s"], tp["budget_s"], GOAL_S,
                  "met" if worst <= GOAL_S else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

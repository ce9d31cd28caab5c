"""A simulated month of nightly audits with repeat faults injected, and what the history made of it:
what it escalated, what it kept from draining and why, then `preflight history` itself.

    python3 benchmarks/history_month.py [--nodes 16] [--keep DIR]

Each night goes through the same steps as `preflight check --history PATH --drain`: the escalation
ladder and the drain policy decided from the nights before (preflight.history.recorder.decide, with
Slurm's drain plan, preflight.slurm.drain.plan, as the drain step), then the run recorded. The reports
come from tests/history_fleet.py (the --json document's shape, faults worded as the checks word them).

The month:
    gpu-0003 GPU 5   Xid 79 on nights 3, 5, 7, 9        the ladder: reset -> reboot -> reboot -> inspect/RMA
    gpu-0007         one IB link flap, night 5           held: never drained (clean since)
    gpu-0009         IB link flaps, nights 10 and 13     held the first time, drained the second
    gpu-0011         an undecided (retest) result, 15-16 held, then confirmed and drained
    board of gpu-0002/0  ECC failure night 4; moved to gpu-0014 night 8, fails there night 20: a lemon
    nights 26-28     two IB ports down a night            the circuit breaker (25% of the fleet drained within
                                                          7 days): night 26 drains, night 27 would make 5 of 16
                                                          and drains nothing, night 28 makes 4 of 16 and drains
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from preflight import cli  # noqa: E402
from preflight.history import recorder  # noqa: E402
from preflight.model import Finding, Status  # noqa: E402
from preflight.slurm import drain  # noqa: E402
from tests import history_fleet as fleet  # noqa: E402

CLUSTER = {"history": {"breaker_fraction": 0.25, "breaker_window_s": 7 * 86400}}


def faults_of(day: int, nodes: list) -> tuple:
    n = {i: nodes[i - 1] for i in range(1, len(nodes) + 1)}
    faults, failed, moved = [], {}, {}
    if day in (3, 5, 7, 9):
        faults.append(fleet.xid(n[3], 5))
    if day == 5:
        faults.append(fleet.flaky(n[7]))
    if day in (10, 13):
        faults.append(fleet.flaky(n[9]))
    if day in (15, 16):
        faults.append(fleet.undecided(n[11]))
    board = fleet.serial(n[2], 0)
    if day >= 8:
        moved[board] = n[14]
    if day == 4:
        failed[n[2]] = 0
    if day == 20:
        failed[n[14]] = 0
    for night, pair in ((26, (4, 5)), (27, (6, 8)), (28, (10, 12))):
        if day == night:
            faults += [fleet.ib_port(n[pair[0]]), fleet.ib_port(n[pair[1]])]
    return faults, failed, moved


def finding(r: dict) -> Finding:
    return Finding(r["check"], r["node"], Status(r["status"]), r["message"], action=r.get("action"), data=r.get("data"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--keep", metavar="DIR", help="keep the database in DIR (default: a temporary directory)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="history-month-")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "month.sqlite")
    nodes = fleet.node_names(args.nodes)
    try:
        h, _ = recorder.open_history(path, print)
        with h:
            for day in range(30):
                doc = fleet.report(day, nodes, *faults_of(day, nodes))
                findings = [finding(r) for r in doc["results"]]
                lines = []
                would = lambda fs: sorted(drain.plan(fs, nodes, {}, drain=True, resume=False).drain)  # noqa: E731
                out, actions = recorder.decide(h, doc, findings, CLUSTER, would, False, lines.append)
                drained = [a["node"] for a in actions if a["kind"] == "drain"]
                if lines or drained:
                    print("night %2d (%s):" % (day, doc["started_at"][:10]))
                    for line in lines:
                        print("    " + line)
                    if drained:
                        print("    drained: %s" % ", ".join(drained))
                recorder.record(h, None, doc, None, actions, CLUSTER, print)
        print()
        print("$ preflight history month.sqlite")
        sys.stdout.flush()
        cli.main(["history", path, "--show", "flapping,lemons,repeats,rates,incidents,actions", "--limit", "20"])
        print("$ preflight history month.sqlite --node gpu-0003 --show timeline --limit 30")
        sys.stdout.flush()
        cli.main(["history", path, "--node", nodes[2], "--show", "timeline", "--limit", "30"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

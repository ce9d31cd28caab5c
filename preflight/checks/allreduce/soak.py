"""The burn-in's all-reduce soak judged: the same all-reduce repeated for rounds of a few seconds each
(preflight.probe.bench_compute.allreduce_soak, in the ranks after the compute phase), by the spread of
its rounds.

Pure, controller side. Every rank reports the same rounds (each round's time is the slowest rank's, a MAX
all-reduce), so the fleet's figure is read from the first rank that has it. On a healthy fabric a
collective of one size takes the same time round after round; a link that flaps, retrains or drops
packets under sustained load shows as rounds far from the median:

- wrong sums after the soak: FAIL (the data went wrong on the way: check the fabric, rerun to localize);
- slowest round more than FAIL_SLOW x the median: FAIL retest (a round at under 2/3 of the pace: a link
  that retrained or flapped; the pair rounds of a quick run localize it);
- spread (slowest - fastest) / median over WARN_SPREAD: WARN retest;
- CPU nodes (gloo): completion and right sums only (the shared cores of a CPU box make round times noise).

Every verdict is cluster-wide (node None): the collective cannot say which link varied.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from preflight.model import ClusterView, Finding, Status

NAME = "allreduce"
WARN_SPREAD = 0.15
FAIL_SLOW = 1.5


def soak_record(view: ClusterView, nodes: List[str]) -> Optional[Dict[str, Any]]:
    """The soak's figures from the first rank that reports them (all ranks hold the same), or None."""
    for node in nodes:
        doc = (view.facts.get(node) or {}).get(NAME)
        if not isinstance(doc, dict):
            continue
        for rank in doc.get("ranks") or []:
            soak = (rank.get("compute") or {}).get("soak")
            if isinstance(soak, dict) and soak.get("rounds"):
                return dict(soak, backend=doc.get("backend"))
    return None


def soak_findings(view: ClusterView) -> List[Finding]:
    """The soak's verdict (one cluster-wide finding), or none when this run had no soak (not burn-in)."""
    meta = view.cluster.get(NAME) or {}
    if not (meta.get("compute") or {}).get("soak_rounds"):
        return []
    rec = soak_record(view, list(meta.get("nodes") or []))
    if rec is None:
        return [Finding(NAME, None, Status.ERROR, "all-reduce soak: no rank reported it (the compute phase "
                        "stopped first: see gpu_compute)", action="retest")]
    rounds = [float(t) for t in rec["rounds"]]
    med = statistics.median(rounds)
    busbw = 2.0 * (rec["world"] - 1) / rec["world"] * rec["bytes"] / med / 1e9 if med > 0 and rec.get("world") else 0.0
    iters = rec.get("iters") or []
    said = "all-reduce soak: %d rounds, %d x %s MiB all-reduces, %.4g-%.4g ms each (median %.4g ms, %.3g GB/s bus)" % (
        len(rounds), sum(iters) if isinstance(iters, list) else iters * len(rounds), rec["bytes"] >> 20,
        1e3 * min(rounds), 1e3 * max(rounds), 1e3 * med, busbw)
    data = {"soak": {k: rec.get(k) for k in ("bytes", "iters", "rounds", "world", "backend")}}
    if not rec.get("ok", True):
        return [Finding(NAME, None, Status.FAIL, "%s; the sums after it were wrong" % said, expected="exact sums",
                        actual="wrong sums", data=data, action="retest")]
    if rec.get("backend") == "gloo":
        return [Finding(NAME, None, Status.PASS, "%s (CPU: judged on completion)" % said, data=data)]
    spread = (max(rounds) - min(rounds)) / med if med > 0 else 0.0
    if max(rounds) > FAIL_SLOW * med:
        return [Finding(NAME, None, Status.FAIL, "%s: a round took %.1fx the median (a link that retrained or flapped "
                        "under sustained load; run the quick tier's pair rounds to localize it)" % (said, max(rounds) / med),
                        expected="every round within %.1fx the median" % FAIL_SLOW, actual="%.1fx" % (max(rounds) / med),
                        data=data, action="retest")]
    if spread > WARN_SPREAD:
        return [Finding(NAME, None, Status.WARN, "%s: rounds spread %.0f%% of the median" % (said, 100 * spread),
                        expected="spread <= %.0f%%" % (100 * WARN_SPREAD), actual="%.0f%%" % (100 * spread), data=data,
                        action="retest")]
    return [Finding(NAME, None, Status.PASS, "%s: steady (spread %.0f%%)" % (said, 100 * spread), data=data)]

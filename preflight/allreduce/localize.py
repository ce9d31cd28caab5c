"""Which node to exclude when the whole-cluster all-reduce failed or was slow: pair rounds and their verdict.

Pure planning and judging; the controller (preflight.allreduce.run) runs the rounds. localization_plan()
says whether rounds can add anything after the whole-cluster run and which single size they run;
plan_pairs() puts every node in one disjoint pair for round 1; plan_suspects() pairs each node of a
failing group with a node that passed; verdict_localization() names the nodes to exclude; localize()
drives it, at most MAX_ROUNDS rounds, starting from the in-process pair rotations when the
whole-cluster run timed them (pair_results(): gloo). judge_nodes() judges the partner-free node rounds.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.allreduce.busbw import best_busbw, busbw_factor, curve, gbps, rank_table, verdict_point, wrong_values
from preflight.allreduce.plan import pair_spec
from preflight.allreduce.wording import contention, doc_problem, peer_error, position, stage_name
from preflight.common import fold, human_bytes


#: Localization: at most this many rounds of concurrent pair tests.
MAX_ROUNDS = 3

#: The gloo loopback round (two local ranks) is CPU-bound: its figure moves with whatever else the node's
#: CPUs do. On the simulated cluster, where every "node" shares two cores, identical nodes spread 2-3x
#: even on their best of 20 iterations, so this round names a node only when it cannot complete (its
#: figures are reported); the NCCL node rounds, and every pair round, are judged by bandwidth.
#: A group (node, pair) whose busbw is more than this share below the fleet median is slow, whatever the
#: absolute figure (cluster.allreduce.slow_fraction). SuperBench's and NCCL's own diagnostics judge a node
#: against its peers the same way; 20% is well outside the run-to-run spread of a healthy fabric.
SLOW_FRACTION = 0.2

#
# When the whole-cluster run hangs or is slow and no node stands out, the controller localizes:
#   round 1: every node in one disjoint pair, all pairs at once (plan_pairs; an odd node makes a triple);
#   round 2: each node of a failing group with a node that passed (plan_suspects), one pair per good node;
#   round 3: the suspects round 2 had no partner for (more suspects than good nodes).
# A node that fails beside a known-good partner is bad; a node that passes anywhere is good; the rest
# are undecided. If no group passes, the fault is shared (a switch, the fabric, the configuration) and
# no node is named. Pairs cross the inventory's halves (i with i + n/2) so that, with rack-ordered
# inventories, each pair goes through the spine as the real job does.
#
# A group result is {"nodes": [...], "busbw_gbps": float | None, "failure": str | None};
# group_result() builds one from the group's agent documents.

GroupResult = Dict[str, Any]


def plan_pairs(nodes: Sequence[str]) -> List[List[str]]:
    """Round 1: nodes in disjoint pairs (node i with node i + n/2). An odd one out waits for round 2 and
    a known-good partner: in a triple it could not be told apart from its partners (3 nodes would re-run
    the whole cluster as their only group)."""
    nodes = list(nodes)
    half = len(nodes) // 2
    return [[nodes[i], nodes[i + half]] for i in range(half)]


def pair_results(docs: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]],
                 rotations: Sequence[Sequence[Sequence[str]]]) -> Optional[List[GroupResult]]:
    """Group results of the in-process pair rotations from the whole-cluster run's documents, or None when
    no rank ran them (the sweep did not complete, or an agent without the pair phase answered)."""
    table = rank_table({n: d for n, d in docs.items() if isinstance(d, dict) and not doc_problem(d)})
    if not any((e.get("pairs") is not None) for _n, e in table.values()):
        return None
    out: List[GroupResult] = []
    for r, rotation in enumerate(rotations):
        for group in rotation:
            spec = pair_spec(configs, [[group]], 0)["rotations"][0][0]
            found, failure = [], None
            for rank in spec:
                node, entry = table.get(rank, (None, {}))
                hit = [p for p in entry.get("pairs") or [] if int(p.get("rotation", -1)) == r
                       and sorted(int(x) for x in p.get("ranks") or []) == spec]
                if not hit:
                    why = entry.get("pairs_error") or "no result"
                    failure = failure or "%s rank %d: pair test did not complete (%s)" % (node or "?", rank, why)
                elif not hit[0].get("ok", False):
                    failure = failure or "wrong sums at %s" % human_bytes(int(hit[0]["bytes"]))
                else:
                    found.append(hit[0])
            result: GroupResult = {"nodes": list(group), "busbw_gbps": None, "failure": failure, "rotation": r}
            if failure is None and found:
                nbytes, world = int(found[0]["bytes"]), len(spec)
                slowest = max(float(p["time_s"]) for p in found)
                result["bytes"] = nbytes
                result["busbw_gbps"] = round(nbytes / max(slowest, 1e-12) / 1e9 * busbw_factor(world), 4)
                if all(p.get("min_s") is not None for p in found):
                    best = max(float(p["min_s"]) for p in found)
                    result["best_gbps"] = round(nbytes / max(best, 1e-12) / 1e9 * busbw_factor(world), 4)
            out.append(result)
    return out


def group_result(nodes: Sequence[str], docs: Mapping[str, Any], backend: str = "nccl") -> GroupResult:
    """One group's outcome from its agent documents: busbw at the verdict size, or why it failed."""
    failure = None
    good_docs: Dict[str, Dict[str, Any]] = {}
    for name in nodes:
        doc = docs.get(name)
        problem = doc_problem(doc) if doc is not None else "no result"
        if problem:
            failure = failure or "%s: %s" % (name, problem)
        else:
            good_docs[name] = doc
    table = rank_table(good_docs)
    world = next((int(d["world_size"]) for d in good_docs.values() if d.get("world_size")), len(table))
    if failure is None:
        bad = sorted((r, e) for r, (_n, e) in table.items() if e.get("status") != "ok")
        if bad:
            r, e = bad[0]
            what = "hung" if e.get("status") == "timeout" else "failed"
            failure = "%s at %s (rank %d: %s)" % (what, stage_name(e), r, e.get("error") or e.get("status"))
        elif wrong_values(table):
            failure = "wrong sums at %s" % human_bytes(wrong_values(table)[0][0])
    point = verdict_point(curve(good_docs, world), backend) if failure is None else None
    if point is None and failure is None:
        points = curve(good_docs, world)
        point = points[-1] if points else None
    out = {"nodes": list(nodes), "busbw_gbps": point["busbw_gbps"] if point else None, "failure": failure}
    if point is not None:
        out["bytes"] = point["bytes"]
        best = best_busbw(table, point["bytes"], world)
        if best is not None:
            out["best_gbps"] = best
    return out


def judged_gbps(g: Mapping[str, Any]) -> Optional[float]:
    """The figure a group is compared on: its best iteration's busbw, else its median busbw."""
    return g.get("best_gbps") if g.get("best_gbps") is not None else g.get("busbw_gbps")


def judge(
    results: Sequence[GroupResult], threshold: Optional[float] = None, by_bandwidth: bool = True,
    slow_fraction: float = SLOW_FRACTION,
) -> List[Tuple[GroupResult, bool, str]]:
    """(group, passed, reason): failed outright, below the threshold, or more than slow_fraction below the
    fleet median (fleet_median(): groups of the same kind, pairs with pairs, nodes with nodes).

    by_bandwidth=False (localizing a hang or an error): a group passes when it completed; its busbw,
    measured at one small size, says nothing and is not compared.
    """
    median = fleet_median(results) if by_bandwidth else None
    if not by_bandwidth:
        threshold = None
    out = []
    for g in results:
        bw = judged_gbps(g)
        if g.get("failure"):
            out.append((g, False, str(g["failure"])))
        elif threshold is not None and bw is not None and bw < threshold:
            out.append((g, False, "busbw %s below %g GB/s" % (gbps(bw), threshold)))
        elif median and bw is not None and bw < (1.0 - slow_fraction) * median:
            out.append((g, False, "slow: busbw %s, %d%% below the fleet median %s (limit %d%%)" % (
                gbps(bw), round(100 * (1 - bw / median)), gbps(median), round(100 * slow_fraction))))
        else:
            out.append((g, True, "busbw %s" % gbps(bw) if bw is not None else "ok"))
    return out


def fleet_median(results: Sequence[GroupResult]) -> Optional[float]:
    """The fleet's figure groups are judged against: the median over nodes of each node's median group
    figure (None with fewer than two groups measured). A node round (one node a group) gives the median
    of the groups; with pairs a slow node cannot drag it down however many of the pairs it sits in (three
    nodes: two of the three pairs hold it, and the median of the pairs would be its slow figure)."""
    by_node: Dict[str, List[float]] = {}
    measured = 0
    for g in results:
        bw = judged_gbps(g)
        if g.get("failure") is None and bw is not None:
            measured += 1
            for n in g["nodes"]:
                by_node.setdefault(n, []).append(bw)
    if measured < 2:
        return None
    return statistics.median(statistics.median(v) for v in by_node.values())


def _good_and_suspects(results, threshold, by_bandwidth=True, slow_fraction=SLOW_FRACTION):
    judged = judge(results, threshold, by_bandwidth, slow_fraction)
    good = []
    for g, ok, _why in judged:
        if ok:
            good.extend(n for n in g["nodes"] if n not in good)
    suspects = []
    for g, ok, _why in judged:
        if not ok:
            suspects.extend(n for n in g["nodes"] if n not in good and n not in suspects)
    return judged, good, suspects


def plan_suspects(
    results: Sequence[GroupResult],
    suspects: Optional[Sequence[str]] = None,
    good: Optional[Sequence[str]] = None,
    threshold: Optional[float] = None,
    by_bandwidth: bool = True,
    nodes: Optional[Sequence[str]] = None,
    slow_fraction: float = SLOW_FRACTION,
) -> List[List[str]]:
    """The next round: each undecided suspect, and each node not yet tested (the odd one out), paired with
    a distinct known-good node ([] when done).

    suspects and good default to what results say. A suspect already tested beside a known-good node is
    decided and not tested again. With more suspects than good nodes, the rest wait for the next round.
    With no known-good node at all, an untested node is paired with a suspect, and in a cluster of three
    the suspects are paired in a way not tried yet: whichever pair passes clears both its nodes.
    """
    judged, found_good, found_suspects = _good_and_suspects(results, threshold, by_bandwidth, slow_fraction)
    good = list(good if good is not None else found_good)
    suspects = [s for s in (suspects if suspects is not None else found_suspects) if s not in good]
    tested = {n for g in results for n in g["nodes"]}
    untested = [n for n in nodes or [] if n not in tested]
    decided = set(_verdicts(judged, set(good))[0])
    waiting = [s for s in suspects if s not in decided] + untested
    pairs = []
    if good:
        partners = iter(good)
        for s in waiting:
            partner = next(partners, None)
            if partner is None:
                break
            pairs.append([s, partner])
        return pairs
    tried = {frozenset(g["nodes"]) for g in results}
    free = list(suspects)
    for n in untested:
        partner = next((s for s in free if frozenset((n, s)) not in tried), None)
        if partner is not None:
            free.remove(partner)
            pairs.append([n, partner])
    if not untested and len(set(nodes or tested)) <= 3:
        for i, a in enumerate(free):
            b = next((x for x in free[i + 1:] if frozenset((a, x)) not in tried), None)
            if b is not None:
                pairs.append([a, b])
                break
    return pairs


def _verdicts(judged, good) -> Tuple[Dict[str, str], Dict[str, str]]:
    """({bad node: why}, {undecided node: why}) from judged groups and the known-good set."""
    bad: Dict[str, str] = {}
    undecided: Dict[str, str] = {}
    for g, ok, why in judged:
        if ok:
            continue
        others_good = [n for n in g["nodes"] if n in good]
        for n in g["nodes"]:
            if n in good:
                continue
            partners = [m for m in g["nodes"] if m != n]
            if partners and all(m in good for m in partners):
                bad.setdefault(n, "failed beside known-good %s: %s" % (fold(others_good), why))
            else:
                undecided.setdefault(n, "failed with %s: %s" % (fold(partners), why))
    for n in bad:
        undecided.pop(n, None)
    return bad, undecided


def verdict_localization(
    results: Sequence[GroupResult], threshold: Optional[float] = None, by_bandwidth: bool = True,
    nodes: Optional[Sequence[str]] = None, slow_fraction: float = SLOW_FRACTION,
) -> Dict[str, Any]:
    """{"bad": {node: why}, "good": [...], "undecided": {node: why}, "shared_fault": bool, "message": str}.

    nodes: every node the rounds were for; one that no group held is undecided (no partner)."""
    judged, good, _suspects = _good_and_suspects(results, threshold, by_bandwidth, slow_fraction)
    bad, undecided = _verdicts(judged, set(good))
    tested = {n for g in results for n in g["nodes"]}
    for n in nodes or []:
        if n not in tested:
            undecided.setdefault(n, "not tested: no partner was free")
    all_nodes = [n for g in results for n in g["nodes"]]
    shared = bool(results) and not good
    if shared:
        message = "every group failed (%s): the fault is shared (switch, fabric or configuration), not one node" % (
            fold(all_nodes))
    elif bad:
        message = "exclude %s: %s" % (fold(list(bad)), "; ".join("%s %s" % (n, w) for n, w in bad.items()))
    elif undecided:
        message = "could not localize %s: undecided after %d groups (not enough known-good partners)" % (
            fold(list(undecided)), len(results))
    else:
        message = "every group passed: no node stands out"
    return {"bad": bad, "good": sorted(good), "undecided": undecided, "shared_fault": shared, "message": message}


def localize(
    nodes: Sequence[str],
    run_round: Callable[[List[List[str]]], List[GroupResult]],
    threshold: Optional[float] = None,
    max_rounds: int = MAX_ROUNDS,
    by_bandwidth: bool = True,
    slow_fraction: float = SLOW_FRACTION,
    results: Optional[Sequence[GroupResult]] = None,
) -> Dict[str, Any]:
    """Drive the rounds: run_round(groups) runs those groups concurrently and returns their results.

    results: groups already measured (the in-process pair rotations): the rounds start from them, with
    suspects beside known-good nodes, and run only when something is left to decide.
    Returns verdict_localization() plus "results" (every group result) and "rounds" (how many ran).
    """
    rounds = 0
    if results is not None:
        results = list(results)
        groups = plan_suspects(results, threshold=threshold, by_bandwidth=by_bandwidth, nodes=nodes,
                               slow_fraction=slow_fraction)
    else:
        results = []
        groups = plan_pairs(nodes)
    while groups and rounds < max_rounds:
        results.extend(run_round(groups))
        rounds += 1
        groups = plan_suspects(results, threshold=threshold, by_bandwidth=by_bandwidth, nodes=nodes,
                               slow_fraction=slow_fraction)
    verdict = verdict_localization(results, threshold, by_bandwidth, nodes, slow_fraction)
    verdict.update(results=results, rounds=rounds)
    return verdict


def localization_plan(
    docs: Mapping[str, Any], meta: Mapping[str, Any], threshold: Optional[float] = None
) -> Optional[Dict[str, Any]]:
    """What the rounds after the whole-cluster run must test (node round, pairs), or None when they cannot
    add anything.

    {"mode": "fail" | "slow" | "check", "sizes": [bytes], "why": str, "at_init": bool (fail only)}:
      None   another run held the rendezvous (wording.contention), or it failed in a way that already
             names the nodes: an agent that returned an error or nothing, ranks that could not start or
             died on some of the nodes (not all); or ranks were still importing torch at the init
             deadline (pairs would be as slow)
      fail   every rank hung or failed together at one point (no node stands out), or sums were wrong:
             the rounds run only the size where it stopped (the smallest size for init) and a group
             passes when it completes it
      slow   it completed below the threshold: the rounds run only the verdict size and compare busbw
      check  it completed (above the threshold, or with none): every node is still judged against the
             fleet at the verdict size, so a slow node is named whatever the absolute figure
    """
    nodes = set(meta.get("nodes") or docs)
    if meta.get("unanswered") or any(doc_problem(d) for d in docs.values()) or contention(docs, meta):
        return None
    table = rank_table(docs)
    sizes = sorted({int(b) for d in docs.values() for b in (d or {}).get("sizes") or []})
    if not sizes:
        return None
    bad = {r: (n, e) for r, (n, e) in table.items() if e.get("status") != "ok"}
    # a rank that failed on its own: at init (no torch, no device, cannot start) or whose process died
    own = {n for n, e in bad.values() if e.get("status") == "error" and (
        e.get("stage") == "init" or str(e.get("error") or "").startswith("rank process"))}
    if own and own != nodes:
        return None
    if any(e.get("stage") == "init" and e.get("step") == "import" for _n, e in bad.values()):
        return None  # still importing torch at the deadline: slow nodes or a slow filesystem, not a path
    if bad:
        stopped = min(position(e, sizes) for _n, e in bad.values())
        size = sizes[min(max(stopped, 0), len(sizes) - 1)]
        where = "init" if stopped < 0 else ("teardown" if stopped >= len(sizes) else human_bytes(size))
        errors = [e for _n, e in bad.values() if e.get("status") == "error"]
        if stopped >= 0 and errors and len(errors) < len(bad) and all(peer_error(e) for e in errors):
            # a stall (a rank stopped at its deadline, the others lost it): slowness until shown otherwise,
            # so the rounds compare bandwidth as well as completion
            return {"mode": "slow", "sizes": [size], "at_init": False,
                    "why": "the whole-cluster run stalled at %s" % where}
        return {"mode": "fail", "sizes": [size], "at_init": stopped < 0,
                "why": "the whole-cluster run stopped at %s" % where}
    wrong = wrong_values(table)
    if wrong:
        return {"mode": "fail", "sizes": [wrong[0][0]], "why": "wrong sums at %s" % human_bytes(wrong[0][0])}
    world = int(meta.get("world_size") or len(table))
    point = verdict_point(curve(docs, world), meta.get("backend") or "gloo")
    if point is not None and threshold is not None and point["busbw_gbps"] < threshold:
        return {"mode": "slow", "sizes": [point["bytes"]],
                "why": "busbw %.2f GB/s below %g GB/s" % (point["busbw_gbps"], threshold)}
    points = curve(docs, world)
    if points:
        at = point or points[-1]
        return {"mode": "check", "sizes": [at["bytes"]], "why": "every node judged against the fleet at %s"
                % human_bytes(at["bytes"])}
    return None


def judge_nodes(results: Sequence[GroupResult], threshold: Optional[float] = None,
                slow_fraction: float = SLOW_FRACTION, by_bandwidth: bool = True) -> Dict[str, str]:
    """{node: why} for the nodes a node round names: failed, or slow against the fleet (one node a group).
    by_bandwidth=False (the round re-ran a small size a hang stopped at): completion only."""
    return {g["nodes"][0]: why for g, ok, why in judge(results, threshold, by_bandwidth, slow_fraction) if not ok}

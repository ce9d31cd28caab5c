"""Which node to exclude when the whole-cluster all-reduce failed or was slow: pair rounds and their verdict.

Pure planning; the controller (preflight.checks.allreduce.stage) runs the rounds and preflight.checks.allreduce.judge
grades each group. localization_plan() says whether rounds can add anything after the whole-cluster run
and which single size they run; plan_pairs() the screening pairs when the run did not time its own
(pair_results(): the gloo in-process rotations); plan_round() the next round; verdict_localization() names
the nodes; localize() drives it in at most max_rounds(n) = ceil(log2 n) + 2 rounds after the screening.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.checks.allreduce.busbw import best_busbw, busbw_factor, curve, gbps, rank_table, verdict_point, wrong_values
from preflight.checks.allreduce.judge import (
    FAIL, OK, SLOW_FRACTION, control_reference, grade, judged_gbps, reference, severity,
)
from preflight.checks.allreduce.plan import pair_spec
from preflight.checks.allreduce.wording import contention, doc_problem, peer_error, position, stage_name
from preflight.common import fold, human_bytes

#
# When the whole-cluster run hangs or is slow, or to judge every node against the fleet, the controller
# localizes:
#   screening (round 0): every node beside up to plan.PAIR_ROTATIONS partners, timed in the sweep's own
#     processes (gloo), or one round of disjoint pairs (plan_pairs);
#   rounds 1..max_rounds(n) (plan_round): every node still to decide beside a distinct known-good node,
#     k to a group when there are more of them than known-good nodes, k halving every round; bandwidth
#     rounds add a control pair of known-good nodes measured at the same moment (the round's reference).
# A node that passes anywhere is good. A node that fails (hangs, errors) beside known-good partners is
# bad; a node slow beside known-good partners is named only once confirmed (two partners, and
# CONFIRM_ROUNDS later rounds each against its own control). If no group passes, the fault is shared (a switch, the fabric, the configuration)
# and no node is named; what is left is "could not localize", never a guess. Pairs cross the
# inventory's halves (i with i + n/2) so that, with rack-ordered inventories, each pair goes through
# the spine as the real job does.
#
# A group result is {"nodes": [...], "busbw_gbps": float | None, "best_gbps": float | None,
# "failure": str | None, "round": int, "control": bool}; group_result() builds one from agent documents.

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
    no rank ran them (the sweep did not complete, or an agent without the pair phase answered); then one
    result per group of the ranks' own recheck (bench_worker._recheck), with "recheck": true (and
    "control": true), its turns merged (merge_turns)."""
    table = rank_table({n: d for n, d in docs.items() if isinstance(d, dict) and not doc_problem(d)})
    if not any((e.get("pairs") is not None) for _n, e in table.values()):
        return None
    out: List[GroupResult] = []
    for r, rotation in enumerate(rotations):
        for group in rotation:
            out.append(dict(_pair_figure(table, configs, group, r, False), rotation=r))
    node_of = {rank: node for rank, (node, _e) in table.items()}
    turns: Dict[Tuple[int, Tuple[int, ...]], bool] = {}
    for _n, entry in table.values():
        for p in entry.get("pairs") or []:
            if p.get("recheck"):
                turns[(int(p["rotation"]), tuple(sorted(int(x) for x in p["ranks"])))] = bool(p.get("control"))
    groups: Dict[Tuple[str, ...], bool] = {}
    measured = []
    for (r, ranks), control in sorted(turns.items()):
        nodes = list(dict.fromkeys(node_of.get(x, "?") for x in ranks))
        groups.setdefault(tuple(nodes), control)
        measured.append(_pair_figure(table, configs, nodes, r, True))
    for g, turn in zip(groups, merge_turns([list(g) for g in groups], measured)):
        out.append(dict(turn, recheck=True, **({"control": True} if groups[g] else {})))
    return out


def _pair_figure(table: Mapping[int, Any], configs: Mapping[str, Mapping[str, Any]], group: Sequence[str],
                 r: int, recheck: bool) -> GroupResult:
    """One group's figure in rotation (or recheck turn) r: the slowest rank's median and best iteration."""
    spec = sorted(pair_spec(configs, [[group]], 0)["rotations"][0][0])
    found, failure = [], None
    for rank in spec:
        node, entry = table.get(rank, (None, {}))
        hit = [p for p in entry.get("pairs") or [] if int(p.get("rotation", -1)) == r
               and bool(p.get("recheck")) == recheck and sorted(int(x) for x in p.get("ranks") or []) == spec]
        if not hit:
            why = entry.get("pairs_error") or "no result"
            failure = failure or "%s rank %d: pair test did not complete (%s)" % (node or "?", rank, why)
        elif not hit[0].get("ok", False):
            failure = failure or "wrong sums at %s" % human_bytes(int(hit[0]["bytes"]))
        else:
            found.append(hit[0])
    result: GroupResult = {"nodes": list(group), "busbw_gbps": None, "failure": failure}
    if failure is None and found:
        nbytes, world = int(found[0]["bytes"]), len(spec)
        slowest = max(float(p["time_s"]) for p in found)
        result["bytes"] = nbytes
        result["busbw_gbps"] = round(nbytes / max(slowest, 1e-12) / 1e9 * busbw_factor(world), 4)
        if all(p.get("min_s") is not None for p in found):
            best = max(float(p["min_s"]) for p in found)
            result["best_gbps"] = round(nbytes / max(best, 1e-12) / 1e9 * busbw_factor(world), 4)
        if found[0].get("iters") is not None:
            result["iters"] = int(found[0]["iters"])  # timed iterations (the time plan counts them)
    return result


def node_results(docs: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> Optional[List[GroupResult]]:
    """The partner-free tests the whole-cluster run's ranks timed in-process (bench_worker._node_phase) as
    node-round results (judge.judge_nodes): one per node and pass, a node's figure its slowest rank's;
    pass 1 with "beside" (the suspect) or "control_for" (the known-good node timed with it). None when no
    rank ran them (the sweep did not complete, or an agent without the phase answered)."""
    table = rank_table({n: d for n, d in docs.items() if isinstance(d, dict) and not doc_problem(d)})
    if not any(e.get("nodes") is not None for _n, e in table.values()):
        return None
    names = [name for name, _c in sorted(configs.items(), key=lambda kv: kv[1]["node_rank"])]
    found: Dict[Tuple[int, int, Any, Any], List[Dict[str, Any]]] = {}
    errors: Dict[str, str] = {}
    for node, e in table.values():
        if e.get("node_error"):
            errors.setdefault(node, e["node_error"])
        for m in e.get("nodes") or []:
            key = (int(m.get("pass", 0)), int(m["node"]), m.get("beside"), m.get("control_for"))
            found.setdefault(key, []).append(m)
    out: List[GroupResult] = []
    keys = set(found) | {(0, i, None, None) for i in range(len(names))}
    for key in sorted(keys, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2], -1 if k[3] is None else k[3])):
        pas, i = key[0], key[1]
        name = names[i]
        entries = found.get(key) or []
        result: GroupResult = {"nodes": [name], "busbw_gbps": None, "failure": None, "pass": pas}
        if not entries:
            result["failure"] = "the test alone did not complete (%s)" % errors.get(name, "no result")
        elif not all(m.get("ok", False) for m in entries):
            result["failure"] = "wrong sums at %s" % human_bytes(int(entries[0]["bytes"]))
        else:
            nbytes, factor = int(entries[0]["bytes"]), busbw_factor(int(entries[0].get("ranks") or 2))
            result["bytes"] = nbytes
            result["busbw_gbps"] = round(nbytes / max(max(float(m["time_s"]) for m in entries), 1e-12) / 1e9 * factor, 4)
            result["best_gbps"] = round(nbytes / max(max(float(m["min_s"]) for m in entries), 1e-12) / 1e9 * factor, 4)
        for key in ("beside", "control_for"):
            if entries and entries[0].get(key) is not None:
                result[key] = names[int(entries[0][key])]
        if entries and entries[0].get("iters") is not None:
            result["iters"] = int(entries[0]["iters"])  # timed iterations (the time plan counts them)
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


#: Later measurements (each in its own round, against that round's control) a bandwidth verdict needs
#: beyond the screening: on a machine shared by hundreds of threads one round can spoil a healthy pair
#: against its control (seen once: 8 nodes, load 374); two rounds apart cannot both by chance.
CONFIRM_ROUNDS = 2


def max_rounds(n: int) -> int:
    """The most rounds the localization runs after its screening for n nodes: ceil(log2 n) group halvings
    and CONFIRM_ROUNDS confirmations (at least 3). See plan_round()."""
    return max(3, math.ceil(math.log2(max(2, n))) + CONFIRM_ROUNDS)


def _judged(results, threshold, by_bandwidth, slow_fraction):
    """[(group, level, why, controlled, decisive, doubt)]: round 0 (the screening) against its own fleet median;
    a later round against its control groups measured at the same moment (controlled) when one completed, else
    the screening's median (not controlled: that figure is from another moment, so it can clear a node but
    never confirm one, see _decide). doubt: why a low group beside a completed control is not controlled after
    all (overlap()), else None. decisive: a failure (hang, error) that may name a node at once; not one
    of the screening's recheck (it only clears) nor one whose moment's controls all failed with it (on 3
    nodes the control alternates with the group in one launch, so a stall of any of its ranks ends every
    group of it: the failure is the moment's, not the group's)."""
    by_round: Dict[int, List[GroupResult]] = {}
    for g in results:
        by_round.setdefault(int(g.get("round", 0)), []).append(g)
    screen = reference([g for g in by_round.get(0, []) if not g.get("recheck")])
    out = []
    for r in sorted(by_round):
        # the screening's own recheck (bench_worker._recheck) is a moment of its own, with its own control
        for moment in ([g for g in by_round[r] if not g.get("recheck")], [g for g in by_round[r] if g.get("recheck")]):
            controls = [g for g in moment if g.get("control")]
            ref, name, beside_control = screen, "the fleet median", False
            if (r > 0 or moment and moment[0].get("recheck")) and control_reference(controls):
                ref, beside_control = control_reference(controls), True
                name = "the control %s measured beside it" % " & ".join("+".join(c["nodes"]) for c in controls)
            controlled = beside_control and r > 0
            shared = bool(controls) and not beside_control  # every control of the moment failed too
            for g in moment:
                decisive = not (g.get("failure") and (g.get("recheck") or shared))
                level, why = grade(g, ref, threshold, slow_fraction, by_bandwidth, ref_name=name)
                if r == 0 and level != OK and beside_control:
                    # the recheck only clears (never confirms): fine against the fleet median is enough. Two
                    # pairs on a shared machine split its CPUs unevenly; a control that got them alone
                    # measured 3.6x the screening's figures (4 nodes, load 39) and spoiled the recheck
                    level, why = min((level, why), grade(g, screen, threshold, slow_fraction, by_bandwidth),
                                     key=lambda lw: lw[0] != OK)
                doubt = overlap(g, controls) if controlled and level != OK else None
                out.append((g, level, why, controlled and doubt is None, decisive, doubt))
    return out


def overlap(group: GroupResult, controls: Sequence[GroupResult]) -> Optional[str]:
    """Why a group graded low beside its control in an interleaved round is still no confirmation, or None:
    some turn of the group measured at least as fast as some turn of the control (turn_gbps, merge_turns).

    On a shared machine the median of three short turns moves with load that lasts a few of them; only
    turns apart (every one of the suspect's below every one of the control's) say the node was slower,
    whatever the load did. Seen twice in the suite (2 cores, three test workers): a healed node named after
    rounds 23% and 25% below its control, and 13% and 64%. By chance, with the turns exchangeable, all three of
    one side fall below all three of the other 1 time in 20 a round; a throttled link's turns sit far apart.
    Groups without turn figures (rounds side by side) are not judged here."""
    mine = group.get("turn_gbps") or []
    theirs = [x for c in controls if c.get("failure") is None for x in c.get("turn_gbps") or []]
    if group.get("failure") or len(mine) < 2 or len(theirs) < 2 or max(mine) < min(theirs):
        return None
    return "its turns overlapped its control's (busbw %s to %s beside %s to %s)" % (
        gbps(min(mine)), gbps(max(mine)), gbps(min(theirs)), gbps(max(theirs)))


def _assess(results, threshold, by_bandwidth=True, slow_fraction=SLOW_FRACTION):
    """(judged, good nodes, {node: [(group, level, why, partners, controlled, decisive, doubt)]} evidence
    beside known-good partners)."""
    judged = _judged(results, threshold, by_bandwidth, slow_fraction)
    good: List[str] = []
    for g, level, _why, _c, _d, _o in judged:
        if level == OK:
            good.extend(n for n in g["nodes"] if n not in good)
    evidence: Dict[str, List[Tuple[GroupResult, str, str, List[str], bool, bool, Optional[str]]]] = {}
    for g, level, why, controlled, decisive, doubt in judged:
        if level == OK:
            continue
        for n in g["nodes"]:
            partners = [m for m in g["nodes"] if m != n]
            if n not in good and partners and all(m in good for m in partners):
                evidence.setdefault(n, []).append((g, level, why, partners, controlled, decisive, doubt))
    return judged, good, evidence


def _decide(evidence, by_bandwidth) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    """({FAIL node: why}, {WARN node: why}, {unconfirmed node: why}) from the evidence beside known-good
    partners. A failure (hang, error, wrong sums) beside a known-good partner decides at once. A bandwidth
    verdict needs measurements beside two different known-good partners and CONFIRM_ROUNDS of them from
    confirmation rounds, each judged against a control pair timed at the same moment in its round: one
    disturbed moment on a shared machine can spoil every group measured together, not several moments
    apart, and a round judged against the screening's median (measured earlier, under other load) says
    nothing about the node when the machine's load came and went in between."""
    bad: Dict[str, str] = {}
    warn: Dict[str, str] = {}
    waiting: Dict[str, str] = {}
    for n, ev in evidence.items():
        first = "failed beside known-good %s: %s" % (fold(ev[0][3]), ev[0][2])
        hard = [e for e in ev if (e[0].get("failure") or not by_bandwidth) and e[5]]
        if hard:
            bad[n] = "failed beside known-good %s: %s" % (fold(hard[0][3]), hard[0][2])
            continue
        partners = {frozenset(e[3]) for e in ev}
        later = [e for e in ev if int(e[0].get("round", 0)) > 0 and e[4]]
        if len(partners) >= 2 and len({int(e[0]["round"]) for e in later}) >= CONFIRM_ROUNDS:
            why = first + "; confirmed beside %s: %s" % (fold(later[-1][3]), later[-1][2])
            (bad if severity([e[1] for e in ev]) == FAIL else warn)[n] = why
        elif any(int(e[0].get("round", 0)) > 0 and not e[4] for e in ev):
            spoiled = any(e[0].get("failure") and not e[5] for e in ev)
            doubt = next((e[6] for e in ev if e[6]), None)
            waiting[n] = first + "; not confirmed: %s (retest)" % (
                "its control failed in the same round" if spoiled else doubt or "no control pair was timed beside it")
        else:
            waiting[n] = first + "; not yet confirmed beside another known-good partner"
    return bad, warn, waiting


def plan_round(
    results: Sequence[GroupResult], nodes: Optional[Sequence[str]] = None, threshold: Optional[float] = None,
    by_bandwidth: bool = True, slow_fraction: float = SLOW_FRACTION, last_chunk: int = 0,
) -> Dict[str, Any]:
    """The next round: {"groups": [[node, ...], ...], "controls": [[good, good]], "chunk": k}.

    Every node still to decide (a suspect not confirmed, a node not yet tested, a node whose partners were
    suspects too) goes beside a distinct known-good node, a partner it has not had when one is free.
    With more of them than known-good nodes they share partners, k to a group (group halving): a group
    that passes clears all its k nodes, one that fails is split in halves next round (k halves every
    round), so n nodes are decided in at most ceil(log2 n) rounds plus the confirmations (max_rounds()).
    Bandwidth rounds add a control pair of two spare known-good nodes, measured at the same moment: the
    round's own expected rate; with fewer than two spare, a control that shares a node with a group,
    which the round alternates with the groups (interleaved()). With no known-good node at all, an
    untested node goes beside a suspect, and in a cluster of three the suspects are paired in a way not
    tried yet.
    """
    judged, good, evidence = _assess(results, threshold, by_bandwidth, slow_fraction)
    bad, warn, _waiting = _decide(evidence, by_bandwidth)
    tested = {n for g in results for n in g["nodes"]}
    everyone = list(nodes) if nodes else sorted(tested)
    todo = [n for n in everyone if n in tested and n not in good and n not in bad and n not in warn]
    todo += [n for n in everyone if n not in tested]
    out: Dict[str, Any] = {"groups": [], "controls": [], "chunk": 0}
    if not todo:
        return out
    if good:
        had: Dict[str, Dict[str, int]] = {n: {} for n in todo}  # how often each node sat beside each other
        for g in results:
            for n in g["nodes"]:
                if n in had:
                    for m in g["nodes"]:
                        had[n][m] = had[n].get(m, 0) + 1
        k = -(-len(todo) // len(good))
        if last_chunk:
            k = min(k, max(1, last_chunk // 2))
        free = list(good)
        for start in range(0, min(len(todo), k * len(good)), k):
            chunk = todo[start:start + k]
            partner = min(free, key=lambda p: sum(had[c].get(p, 0) for c in chunk))  # the least met
            free.remove(partner)
            out["groups"].append(chunk + [partner])
        out["chunk"] = k
        if by_bandwidth and len(free) >= 2:
            out["controls"].append(free[:2])
        elif by_bandwidth and len(good) >= 2:
            # too few spare known-good nodes for a control beside the groups (3 nodes): a control of the
            # spare one and a partner (or two partners), which shares a node with a group, so the round
            # alternates the two sides in one launch (interleaved(); stage._Rounds) instead of running
            # them side by side
            out["controls"].append((free + [g[-1] for g in out["groups"]])[:2])
        return out
    tried = {frozenset(g["nodes"]) for g in results}
    suspects = [n for n in todo if n in tested]
    for n in [n for n in todo if n not in tested]:
        partner = next((s for s in suspects if frozenset((n, s)) not in tried), None)
        if partner is not None:
            suspects.remove(partner)
            out["groups"].append([n, partner])
    if len(out["groups"]) == 0 and len(set(everyone)) <= 3:
        for i, a in enumerate(suspects):
            b = next((x for x in suspects[i + 1:] if frozenset((a, x)) not in tried), None)
            if b is not None:
                out["groups"].append([a, b])
                break
    return out


#: An interleaved round (interleaved()) times each side this many times: load that comes and goes over a
#: second lands on the suspect's turns and on the control's alike.
ALTERNATIONS = 3


def interleaved(groups: Sequence[Sequence[str]]) -> List[List[List[str]]]:
    """The rotations that time groups sharing a node (a suspect pair and its control on 3 nodes) in one
    launch: the groups split into sides of disjoint groups (first fit), the sides alternated ALTERNATIONS
    times, every other alternation in reverse (A B, B A, A B); [] when the groups are disjoint (they run side
    by side).

    The reversal: load that ends during the round (a process starting up beside it, such as an import: see
    spares.AFTER) lies on the first turns; in A B A B A B a burst over the first three turns held two of the
    suspect's three and one of the control's, enough to move the suspect's median and not the control's. In
    A B B A A B no burst from the round's start does that. A burst over five turns still spares the control's
    last: overlap() keeps that from confirming anything."""
    sides: List[List[List[str]]] = []
    for g in groups:
        side = next((s for s in sides if not any(set(g) & set(h) for h in s)), None)
        if side is None:
            sides.append([list(g)])
        else:
            side.append(list(g))
    if len(sides) < 2:
        return []
    return [side for i in range(ALTERNATIONS) for side in (sides if i % 2 == 0 else sides[::-1])]


def merge_turns(groups: Sequence[Sequence[str]], turns: Sequence[GroupResult]) -> List[GroupResult]:
    """One result per group from its turns in an interleaved launch (pair_results of interleaved()'s
    rotations): the first failure, else the median of the turns' median figures and the best of their
    best (the benefit of the doubt, as every group gets)."""
    out: List[GroupResult] = []
    for g in groups:
        mine = [t for t in turns if sorted(t["nodes"]) == sorted(g)]
        failure = next((t["failure"] for t in mine if t.get("failure")), None if mine else "no result")
        figures = [float(t["busbw_gbps"]) for t in mine if t.get("busbw_gbps") is not None]
        if failure is None and not figures:
            failure = "no figure"
        result: GroupResult = {"nodes": list(g), "busbw_gbps": None, "failure": failure, "turns": len(mine)}
        if failure is None:
            result["busbw_gbps"] = round(statistics.median(figures), 4)
            best = [float(t["best_gbps"]) for t in mine if t.get("best_gbps") is not None]
            if best:
                result["best_gbps"] = max(best)
            result["bytes"] = mine[0].get("bytes")
            # each turn's own figure, in launch order: a confirmation needs the suspect's turns apart from
            # its control's (overlap())
            result["turn_gbps"] = [round(float(judged_gbps(t)), 4) for t in mine]
        out.append(result)
    return out


def plan_suspects(results: Sequence[GroupResult], nodes: Optional[Sequence[str]] = None,
                  threshold: Optional[float] = None, by_bandwidth: bool = True,
                  slow_fraction: float = SLOW_FRACTION) -> List[List[str]]:
    """The next round's groups to decide (plan_round() without its control pair)."""
    return plan_round(results, nodes, threshold, by_bandwidth, slow_fraction)["groups"]


def verdict_localization(
    results: Sequence[GroupResult], threshold: Optional[float] = None, by_bandwidth: bool = True,
    nodes: Optional[Sequence[str]] = None, slow_fraction: float = SLOW_FRACTION,
) -> Dict[str, Any]:
    """{"bad": {node: why} (FAIL), "warn": {node: why} (WARN), "good": [...], "undecided": {node: why},
    "not_confirmed": {node: why}, "shared_fault": bool, "message": str}.

    nodes: every node the rounds were for; one that no group held is undecided (no partner).
    not_confirmed: nodes measured low beside a known-good partner once that measured fine elsewhere:
    not named (their evidence says so)."""
    judged, good, evidence = _assess(results, threshold, by_bandwidth, slow_fraction)
    bad, warn, undecided = _decide(evidence, by_bandwidth)
    for g, level, why, _c, _d, _o in judged:
        if level == OK:
            continue
        for n in g["nodes"]:
            if n not in good and n not in bad and n not in warn:
                undecided.setdefault(n, "failed with %s: %s" % (fold([m for m in g["nodes"] if m != n]), why))
    tested = {n for g in results for n in g["nodes"]}
    for n in nodes or []:
        if n not in tested:
            undecided.setdefault(n, "not tested: no partner was free")
    # suspects after the screening that a later round cleared: not named, and the evidence says so
    not_confirmed: Dict[str, str] = {}
    screened = [g for g in results if int(g.get("round", 0)) == 0 and not g.get("recheck")]
    _j, screen_good, _e = _assess(screened, threshold, by_bandwidth, slow_fraction)
    for n in [n for n in good if n not in screen_good] if by_bandwidth else []:
        low = next(((g, why) for g, level, why, _c, _d, _o in judged if level != OK and n in g["nodes"]), None)
        fine = next((g for g, level, _w, _c, _d, _o in judged if level == OK and n in g["nodes"]), None)
        if low and fine:
            not_confirmed[n] = "not confirmed: %s beside %s, then busbw %s beside %s" % (
                low[1], fold([m for m in low[0]["nodes"] if m != n]), gbps(judged_gbps(fine)),
                fold([m for m in fine["nodes"] if m != n]))
    all_nodes = [n for g in results for n in g["nodes"]]
    shared = bool(results) and not good
    parts = []
    if shared:
        parts.append("every group failed (%s): the fault is shared (switch, fabric or configuration), not one node"
                     % fold(all_nodes))
    if bad:
        parts.append("exclude %s: %s" % (fold(list(bad)), "; ".join("%s %s" % (n, w) for n, w in bad.items())))
    if warn:
        parts.append("%s below the fleet: %s" % (fold(list(warn)), "; ".join("%s %s" % (n, w) for n, w in warn.items())))
    if undecided and not shared:
        parts.append("could not localize %s: undecided after %d groups (%s)" % (
            fold(list(undecided)), len(results), "; ".join("%s %s" % (n, w) for n, w in undecided.items())))
    if not parts:
        parts.append("every group passed: no node stands out" if not not_confirmed else "no node stands out")
    if not_confirmed and not shared:
        parts.append("; ".join("%s %s" % (n, w) for n, w in not_confirmed.items()))
    return {"bad": bad, "warn": warn, "good": sorted(good), "undecided": undecided, "not_confirmed": not_confirmed,
            "shared_fault": shared, "message": "; ".join(parts)}


def localize(
    nodes: Sequence[str],
    run_round: Callable[[List[List[str]]], List[GroupResult]],
    threshold: Optional[float] = None,
    max_rounds_: Optional[int] = None,
    by_bandwidth: bool = True,
    slow_fraction: float = SLOW_FRACTION,
    results: Optional[Sequence[GroupResult]] = None,
    may_start: Optional[Callable[[List[List[str]]], bool]] = None,
) -> Dict[str, Any]:
    """Drive the rounds: run_round(groups) runs those groups concurrently and returns their results.

    may_start(groups): asked before each round after the screening, with the groups it would run (an
    interleaved round lasts longer than a plain one); False (the localization's time budget would be
    overrun) stops there, and what is left undecided is said so.

    results: groups already measured (the in-process pair rotations): they are the screening (round 0);
    otherwise the screening is one round of disjoint pairs (plan_pairs). Then at most max_rounds(n)
    rounds of plan_round(), each only while something is left to decide.
    Returns verdict_localization() plus "results" (every group result, each with its "round", control
    groups with "control": true) and "rounds" (how many rounds were launched).
    """
    limit = max_rounds(len(nodes)) if max_rounds_ is None else max_rounds_
    rounds = 0
    if results is not None:
        results = [dict(g, round=int(g.get("round", 0))) for g in results]
    else:
        results = [dict(g, round=0) for g in run_round(plan_pairs(nodes))] if len(nodes) >= 2 else []
        rounds = 1
    chunk = 0
    stopped = False
    for r in range(1, limit + 1):
        planned = plan_round(results, nodes, threshold, by_bandwidth, slow_fraction, chunk)
        if not planned["groups"]:
            break
        groups = planned["groups"] + planned["controls"]
        if may_start is not None and not may_start(groups):
            stopped = True
            break
        chunk = planned["chunk"]
        done = run_round(groups)
        ngroups = len(planned["groups"])
        results.extend(dict(g, round=r, **({"control": True} if i >= ngroups else {})) for i, g in enumerate(done))
        rounds += 1
    verdict = verdict_localization(results, threshold, by_bandwidth, nodes, slow_fraction)
    verdict.update(results=results, rounds=rounds, out_of_time=stopped)
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

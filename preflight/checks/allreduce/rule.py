"""The allreduce check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.checks.allreduce import NAME, nccllog, soak
from preflight.checks.allreduce.busbw import (
    GPU_VERDICT_MIN,
    curve,
    gbps,
    rank_table,
    sku_warn_level,
    stragglers,
    sweep_cut,
    threshold_for,
    verdict_point,
    wrong_values,
)
from preflight.checks.allreduce.judge import SLOW_FRACTION, judge_nodes, reference, warn_fraction
from preflight.checks.allreduce.localize import verdict_localization
from preflight.checks.allreduce.nccllog import hca_mismatch, ifname_allows, nccl_summary
from preflight.checks.allreduce.wording import contention, cut_phrase, doc_problem, explain_failure, ranks_phrase
from preflight.common import fold, human_bytes, plural
from preflight.model import ClusterView, Finding, ParseError, Status

#: What the cluster finding says when no absolute figure applies (the fleet rounds may then judge).
NO_THRESHOLD = "no threshold applies (set expect.busbw_gbps)"
#: A sweep cut before a size more than this many times the last one completed was projected from too far
#: below it (the built-in sweeps double): its bandwidth is not proven (a sparse size list skips the sizes between).
SPARSE_STEP = 2


def parse_nccl_log(text: str) -> Dict[str, Any]:
    """preflight.checks.allreduce.nccllog.parse_nccl_log, where the fixture cases under tests/fixtures/allreduce
    find this check's parser."""

    return nccllog.parse_nccl_log(text)


@dataclasses.dataclass
class _Run:
    """The whole-cluster run as the rule reads it: its nodes, their results, the per-rank table and the curve.
    `data` is the cluster finding's data, filled in as the judgement goes."""

    meta: Dict[str, Any]
    nodes: List[str]
    docs: Dict[str, Dict[str, Any]]
    missing: Dict[str, str]
    backend: str
    table: Dict[int, Tuple[str, Dict[str, Any]]]
    world: int
    node_of: Dict[int, str]
    points: List[Dict[str, Any]]
    data: Dict[str, Any]
    where: str


def rank_findings(view: ClusterView) -> List[Finding]:
    """The whole-cluster run judged from each rank's figures: a node without a result or a failed rank FAILs
    (explain_failure), wrong sums FAIL, a sweep that proves no bandwidth is an ERROR, and the busbw at the
    verdict size is judged against the threshold (threshold_for) and the GPU's warn level."""

    meta = dict(view.cluster.get(NAME) or {})
    if meta.get("skip"):
        return [Finding(NAME, None, Status.SKIP, str(meta["skip"]))]
    nodes, unanswered = _run_nodes(view, meta)
    if not nodes:
        return [Finding(NAME, None, Status.ERROR, "no all-reduce results gathered (the bench did not run)")]
    taken = contention({n: (view.facts.get(n) or {}).get(NAME) for n in nodes}, meta)
    if taken:  # another run (or program) held the rendezvous: no node is judged
        return [Finding(NAME, None, Status.ERROR, taken, action="retest")]
    run = _read_run(view, meta, nodes, unanswered)
    out = [Finding(NAME, name, Status.FAIL, why) for name, why in run.missing.items()]
    broken = _broken(run)
    if broken is not None:
        return out + broken
    if run.world < 2:
        return [Finding(NAME, None, Status.WARN, "a single rank: no all-reduce traffic to measure", data=run.data)]
    point = verdict_point(run.points, run.backend)
    cut = sweep_cut(run.table)
    if cut:
        run.data["cut"] = cut
    unproven = _unproven(run, point, cut)
    if unproven is not None:
        return [unproven]
    return [_busbw_verdict(view, run, point, _figures(run, point, cut))]


def _run_nodes(view: ClusterView, meta: Mapping[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    """(the run's nodes, {node: why it did not answer}): the bench's list, else every live node with a result,
    and the nodes that did not answer after them."""
    nodes = list(meta.get("nodes") or [n.name for n in view.live if view.facts[n.name].get(NAME) is not None])
    unanswered = dict(meta.get("unanswered") or {})
    for name in unanswered:
        if name not in nodes:
            nodes.append(name)
    return nodes, unanswered


def _read_run(view: ClusterView, meta: Dict[str, Any], nodes: List[str], unanswered: Mapping[str, Any]) -> _Run:
    """The run's results sorted into usable documents and missing nodes, with its per-rank table and curve."""
    docs: Dict[str, Dict[str, Any]] = {}
    missing: Dict[str, str] = {}
    for name in nodes:
        doc = (view.facts.get(name) or {}).get(NAME)
        problem = doc_problem(doc)
        if name in unanswered:
            missing[name] = str(unanswered[name])
        elif doc is None:
            missing[name] = "no all-reduce result from this node"
        elif problem:
            missing[name] = problem
        else:
            docs[name] = doc
    backend = meta.get("backend") or next((d.get("backend") for d in docs.values() if d.get("backend")), "gloo")
    table = rank_table(docs)
    world = int(meta.get("world_size") or next((d.get("world_size") for d in docs.values() if d.get("world_size")),
                                               0) or len(table))
    node_of = {r: node for r, (node, _e) in table.items()}
    for node, span in (meta.get("ranks") or {}).items():
        for r in range(int(span[0]), int(span[1]) + 1):
            node_of.setdefault(r, node)
    points = curve(docs, world)
    data: Dict[str, Any] = {"curve": points, "backend": backend, "world_size": world, "nodes": len(nodes)}
    where = "%d ranks on %s" % (world, plural(len(nodes), "node"))
    return _Run(meta, nodes, docs, missing, backend, table, world, node_of, points, data, where)


def _broken(run: _Run) -> Optional[List[Finding]]:
    """The cluster FAIL (and the nodes it implicates) when a rank failed or a node has no result, or the
    FAIL for wrong sums; None when every rank completed with the right sums."""
    bad = {r: (n, e) for r, (n, e) in run.table.items() if e.get("status") != "ok"}
    if bad or run.missing:
        message, implicated = explain_failure(run.meta, run.docs, run.missing, run.table, bad, run.node_of,
                                              run.points, run.data, run.world)
        out = [Finding(NAME, None, Status.FAIL, message, data=run.data)]
        return out + [Finding(NAME, name, Status.FAIL, why) for name, why in implicated.items()]
    wrong = wrong_values(run.table)
    if not wrong:
        return None
    world = run.world
    nbytes, ranks, sample = wrong[0]
    msg = "all-reduce returned wrong sums at %s on %s: expected %g, got %g (%d elements)" % (
        human_bytes(nbytes), ranks_phrase(ranks, run.node_of), sample.get("expected", float("nan")),
        sample.get("got", float("nan")), sample.get("mismatches", 0))
    run.data["wrong"] = [{"bytes": b, "ranks": rs} for b, rs, _s in wrong]
    return [Finding(NAME, None, Status.FAIL, msg, expected="every element = %g" % sample.get(
        "expected", world * (world + 1) / 2.0), actual="%g" % sample.get("got", float("nan")), data=run.data)]


def _unproven(run: _Run, point: Optional[Dict[str, Any]], cut: Optional[Dict[str, Any]]) -> Optional[Finding]:
    """The finding for a sweep that proves no bandwidth (too sparse, too slow, or too small to judge), or None
    when `point` (the verdict size) can be judged."""
    points, where, data = run.points, run.where, run.data
    if cut and points and int(cut["bytes"]) > SPARSE_STEP * points[-1]["bytes"]:
        # a sparse size list: the time of a small, latency-bound size says little about one many times
        # larger, so the cut is no measurement of bandwidth, and the run proves none (never an exit 0)
        return Finding(NAME, None, Status.ERROR, "all-reduce bandwidth not proven across %s: %s, a %dx step "
                       "from a size too small to project from; list cluster.allreduce.sizes in doubling steps"
                       % (where, cut_phrase(cut, points), int(cut["bytes"]) // points[-1]["bytes"]),
                       action="fix_config", data=data)
    if point is None and cut and points:
        return Finding(NAME, None, Status.FAIL, "all-reduce too slow to reach %s across %s: %s" % (
            human_bytes(GPU_VERDICT_MIN), where, cut_phrase(cut, points)), data=data)
    if point is None:
        # the sweep ended below the size that proves bandwidth: not a pass (exit 1), and the fix is the list
        largest = human_bytes(points[-1]["bytes"]) if points else "none"
        return Finding(NAME, None, Status.ERROR, "all-reduce completed across %s, but the largest size (%s) is "
                       "below %s: bus bandwidth not judged; add a size of at least %s to cluster.allreduce.sizes"
                       % (where, largest, human_bytes(GPU_VERDICT_MIN), human_bytes(GPU_VERDICT_MIN)),
                       action="fix_config", data=data)
    return None


def _figures(run: _Run, point: Dict[str, Any], cut: Optional[Dict[str, Any]]) -> str:
    """'busbw 180 GB/s (algbw 95 GB/s) at 1 GiB across 16 ranks on 2 nodes; straggler: ...; ...': the
    verdict size's figures, the straggler and the sweep cut (each also put in the run's data)."""
    points, node_of, data = run.points, run.node_of, run.data
    figures = "busbw %s (algbw %s) at %s across %s" % (
        gbps(point["busbw_gbps"]), gbps(point["algbw_gbps"]), human_bytes(point["bytes"]), run.where)
    straggler = stragglers(points, node_of, float(run.meta.get("slow_fraction") or 0.2))
    data["slowest_per_size"] = [{"bytes": p["bytes"], "rank": p["slowest_rank"], "node": node_of.get(p["slowest_rank"])}
                                for p in points]
    if straggler:
        data["straggler"] = straggler
        figures += "; straggler: %s slowest at %d of %d sizes, %.1fx the median rank" % (
            ranks_phrase([straggler["rank"]], node_of), straggler["sizes"], len(points), straggler["ratio"])
    if cut:
        figures += "; " + cut_phrase(cut, points)
    data["verdict_bytes"] = point["bytes"]
    return figures


def _busbw_verdict(view: ClusterView, run: _Run, point: Dict[str, Any], figures: str) -> Finding:
    """The verdict size's busbw against the threshold (WARN without one), and below the GPU's warn level."""
    meta, nodes, backend, data = run.meta, run.nodes, run.backend, run.data
    threshold = threshold_for(view, meta, nodes, backend)
    if threshold is None:
        return Finding(NAME, None, Status.WARN, "all-reduce %s; %s" % (figures, NO_THRESHOLD),
                       actual="%.2f GB/s" % point["busbw_gbps"], data=data)
    limit, source = threshold
    data.update(threshold_gbps=limit, threshold_source=source)
    expected = "busbw >= %g GB/s (%s)" % (limit, source)
    actual = "%.2f GB/s" % point["busbw_gbps"]
    warn = None
    if source != "expect.busbw_gbps":
        known = {n.name: n for n in view.nodes}
        gpus = [known[n].gpus_per_node for n in nodes if n in known]
        warn = sku_warn_level(backend, len(nodes), min(gpus) if gpus else 0, meta.get("gpu_model"),
                              meta.get("nic_gbps") or view.expect.get("nic_gbps"))
    if point["busbw_gbps"] >= limit and warn and warn[0] > limit and point["busbw_gbps"] < warn[0]:
        data.update(warn_gbps=warn[0], warn_source=warn[1])
        return Finding(NAME, None, Status.WARN, "all-reduce %s, below %g GB/s (%s)" % (figures, warn[0], warn[1]),
                       expected="busbw >= %g GB/s" % warn[0], actual=actual, data=data)
    if point["busbw_gbps"] >= limit:
        return Finding(NAME, None, Status.PASS, "all-reduce " + figures, expected=expected, actual=actual, data=data)
    msg = "all-reduce %s, below %g GB/s (%s)" % (figures, limit, source)
    slow = point["slowest_rank"]
    if point["median_time_s"] > 0 and point["time_s"] > 1.5 * point["median_time_s"]:
        msg += "; slowest %s at %.1fx the median rank" % (ranks_phrase([slow], run.node_of),
                                                          point["time_s"] / point["median_time_s"])
    else:
        msg += "; slowest %s" % ranks_phrase([slow], run.node_of)
    return Finding(NAME, None, Status.FAIL, msg, expected=expected, actual=actual, data=data)


def _fleet_findings(view: ClusterView, meta: Mapping[str, Any]) -> Tuple[List[Finding], List[str], Status, Dict[str, Any]]:
    """What the rounds after the whole-cluster run found: (node findings, notes for the cluster finding,
    the status they imply, data). Node rounds name a node on its own; pair rounds beside a known-good node
    (preflight.checks.allreduce.localize); both judge against the fleet median (meta["slow_fraction"])."""

    frac = float(meta.get("slow_fraction") or SLOW_FRACTION)
    named: Dict[str, List[str]] = {}
    warned: Dict[str, List[str]] = {}
    notes: List[str] = []
    status = Status.PASS
    data: Dict[str, Any] = {"slow_fraction": frac, "warn_fraction": warn_fraction(frac)}
    for rnd in meta.get("node_rounds") or []:
        results = rnd.get("results") or []
        if not results:
            continue
        # The gloo loopback (CPU nodes) is judged on completion only: its traffic stays in the node's kernel
        # (the data address is local), so its figure measures the node's CPU, not its NIC, and a healthy node
        # was confirmed "slow" there when other work took the CPU (CI with two test workers; 2 of 12 throttled
        # 8-node simulator runs). The pair test, beside known-good partners with a control pair, judges
        # a CPU node's bandwidth. GPU node rounds (NVLink, the NIC loopback) keep their bandwidth verdicts.
        by_bandwidth = bool(rnd.get("by_bandwidth", True)) and rnd.get("name") != "loopback"
        verdict = judge_nodes(results, None, frac, by_bandwidth)
        median = reference([g for g in results if int(g.get("pass", 0)) == 0])
        median = median.get("best_gbps", median.get("busbw_gbps"))
        what = "alone (%s): " % (rnd.get("what") or rnd.get("name"))
        for n, why in verdict["fail"].items():
            named.setdefault(n, []).append(what + why)
        for n, why in verdict["warn"].items():
            warned.setdefault(n, []).append(what + why)
        where = " at %s" % human_bytes(int(rnd["sizes"][0])) if rnd.get("sizes") else ""
        bad = dict(verdict["fail"], **verdict["warn"])
        if bad:
            notes.append("node round %s%s: %s" % (rnd.get("name"), where, fold(list(bad))))
        elif not by_bandwidth:
            notes.append("node round %s%s: every node completed alone" % (rnd.get("name"), where))
        else:
            notes.append("node round %s%s: every node within %d%% of the fleet median %s" % (
                rnd.get("name"), where, round(100 * warn_fraction(frac)),
                gbps(median) if median is not None else "(none measured)"))
        if verdict["not_confirmed"]:
            notes.append("node round %s: %s" % (rnd.get("name"), "; ".join(
                "%s %s" % kv for kv in verdict["not_confirmed"].items())))
        data.setdefault("node_rounds", []).append({"name": rnd.get("name"), "what": rnd.get("what"),
                                                   "median_gbps": median, "named": bad,
                                                   "not_confirmed": verdict["not_confirmed"], "results": results})
    loc = meta.get("localization") or {}
    if loc.get("results"):
        results = loc["results"]
        verdict = verdict_localization(results, loc.get("threshold_gbps"), bool(loc.get("by_bandwidth", True)),
                                       meta.get("nodes"), frac)
        for n, why in verdict["bad"].items():
            named.setdefault(n, []).append("pair test: %s" % why)
        for n, why in verdict["warn"].items():
            warned.setdefault(n, []).append("pair test: %s" % why)
        notes.append("pair test: " + verdict["message"])
        if verdict["shared_fault"]:
            status = Status.FAIL
        elif verdict["undecided"] or verdict["warn"]:
            status = Status.WARN
        data["localization"] = {k: verdict[k] for k in ("bad", "warn", "good", "undecided", "not_confirmed")}
        data["groups"] = list(results)
    findings = [Finding(NAME, n, Status.FAIL, "; ".join(whys), data={"fleet": whys}) for n, whys in named.items()]
    # a node 10-20% below the fleet, confirmed: a WARN (retest it; it stays in the hostfile)
    findings += [Finding(NAME, n, Status.WARN, "; ".join(whys), action="retest", data={"fleet": whys})
                 for n, whys in warned.items() if n not in named]
    if warned and status is Status.PASS:
        status = Status.WARN
    if named:
        status = Status.FAIL
    return findings, notes, status, data


def _with_fleet(out: List[Finding], view: ClusterView, meta: Mapping[str, Any]) -> List[Finding]:
    """The rule's findings with the rounds' verdict folded into the one cluster finding: one check, one
    cluster verdict (a failed run is never followed by a cluster-wide PASS of its localization)."""
    extra, notes, status, data = _fleet_findings(view, meta)
    if not notes:
        return out
    idx = next((i for i, f in enumerate(out) if f.node is None), None)
    if idx is None:
        return out + extra
    main = out[idx]
    message = main.message
    new_status = max((main.status, status), key=lambda s: s.rank)
    judged = bool(data.get("node_rounds")) or (meta.get("localization") or {}).get("by_bandwidth")
    if main.status is Status.WARN and NO_THRESHOLD in message and judged:
        message = message.replace(NO_THRESHOLD, "no absolute threshold set: judged against the fleet")
        new_status = status
    merged = dict(main.data or {})
    merged.update(data)
    out = list(out)
    # a WARN the rounds left (a node undecided or not confirmed) is retested: its documented action
    action = "retest" if main.action is None and new_status is Status.WARN and status is Status.WARN else main.action
    out[idx] = dataclasses.replace(main, status=new_status, message=message + "; " + "; ".join(notes), data=merged,
                                   action=action)
    by_node = {f.node: i for i, f in enumerate(out) if f.node is not None}
    for f in extra:
        if f.node in by_node:
            old = out[by_node[f.node]]
            worse = f if f.status.rank > old.status.rank else old
            out[by_node[f.node]] = dataclasses.replace(old, message=old.message + "; " + f.message,
                                                       status=worse.status, action=worse.action)
        else:
            out.append(f)
    return out


def _gdr_expected(facts: Any) -> Tuple[Optional[bool], str]:
    """(should GPUDirect RDMA work on this node, why) from the gpudirect check's facts; None when unknown."""
    if not isinstance(facts, dict) or "probe_error" in facts:
        return None, "no gpudirect facts (run the gpudirect check with the bench)"
    if not facts.get("hcas"):
        return False, "no RDMA HCA"
    if not (facts.get("peermem") or facts.get("dmabuf_possible")):
        return False, "no peer-memory module and no DMA-BUF"
    if not facts.get("virtual"):
        on_paths = {b for p in facts.get("paths") or [] for b in p.get("bridges") or []}
        for bdf, port in (facts.get("acs") or {}).items():
            ctl = (port or {}).get("acs_ctl") or {}
            if bdf in on_paths and (ctl.get("ReqRedir") or ctl.get("CmpltRedir")):
                return False, "ACS redirects peer traffic at %s" % bdf
    return True, "gpudirect: %s loaded" % (facts.get("peermem") or "DMA-BUF")


def _evidence(facts: Mapping[str, Any], key: str) -> str:
    line = (facts.get("lines") or {}).get(key)
    return " [NCCL: \"%s\"]" % line if line else ""


def _socket_reason(facts: Mapping[str, Any]) -> str:
    """Why NCCL took sockets, from its own lines (NCCL src/transport/net_ib.cc, misc/param.cc)."""
    env = facts.get("env") or {}
    if env.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
        return "NCCL_IB_DISABLE=%s is set: unset it" % env["NCCL_IB_DISABLE"]
    if env.get("NCCL_NET", "").lower() == "socket":
        return "NCCL_NET=Socket is set: unset it"
    if facts.get("ib_no_device"):
        return ("NCCL's IB transport found no device: libibverbs/rdma-core missing where NCCL runs (a "
                "container without /dev/infiniband?) or NCCL_IB_HCA names none of them" + _evidence(facts, "ib_no_device"))
    return "NCCL did not say why: run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"


def _gdr_reason(facts: Mapping[str, Any]) -> str:
    env = facts.get("env") or {}
    for var in ("NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_GDR_DISABLE"):  # NCCL src/graph/paths.cc
        if var in env:
            return "%s=%s is set" % (var, env[var])
    return "NCCL found no peer-memory path from the GPU to the HCA"


def nccl_findings(view: ClusterView, meta: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> List[Finding]:
    """Per node: what NCCL chose (version, transport, devices, GDR, intra-node transports), and a FAIL when
    it fell back to sockets although ACTIVE HCAs were found (with NCCL's reason), sent traffic over a
    container veth or an IPv6 link-local address (whatever the env file says), bound an interface the env
    file does not name, ran without GPUDirect RDMA where the gpudirect facts say it should work, or
    returned errors of its own (bootstrap, connect, proxy) on a node whose ranks failed; a WARN when it
    only listed such an interface or reported faults it survived. Across nodes, a WARN when NCCL_IB_HCA
    names HCAs and the nodes' NCCL listed different ones. Action fix_config."""

    env = dict(meta.get("env") or {})
    out: List[Finding] = []
    hcas_used: Dict[str, List[str]] = {}  # {node: the HCAs its NCCL listed} where NCCL ran over IB
    ib_hca_set: List[str] = []  # NCCL_IB_HCA as the logs say it was set, where the env file does not set it
    for node, doc in docs.items():
        if (doc or {}).get("backend") != "nccl":
            continue
        logs, problems = _node_logs(doc)
        if not logs:
            if problems:
                out.append(Finding(NAME, node, Status.ERROR, "NCCL's choices unknown: %s" % "; ".join(problems[:2])))
            continue
        facts = nccl_summary(logs)
        if any(t.startswith("NET/IB") for t in facts["transport"]):
            hcas_used[node] = facts["devices"]
        if facts["env"].get("NCCL_IB_HCA") and facts["env"]["NCCL_IB_HCA"] not in ib_hca_set:
            ib_hca_set.append(facts["env"]["NCCL_IB_HCA"])
        out.append(_node_nccl_finding(view, node, doc, facts, env, list((meta.get("rails") or {}).get(node) or [])))
    return out + _hca_findings(hcas_used, env.get("NCCL_IB_HCA") or (ib_hca_set[0] if ib_hca_set else None))


def _node_logs(doc: Mapping[str, Any]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(the parsed NCCL log of each rank that has one, why the others have none)."""
    logs, problems = [], []
    for entry in doc.get("ranks") or []:
        text = entry.get("nccl_log")
        if not text:
            if entry.get("init_s") is not None:
                problems.append("rank %s: no NCCL_DEBUG=INFO lines" % entry.get("rank"))
            continue
        try:
            logs.append(parse_nccl_log(text))
        except ParseError as exc:
            problems.append("rank %s: %s" % (entry.get("rank"), exc))
    return logs, problems


def _node_nccl_finding(view: ClusterView, node: str, doc: Mapping[str, Any], facts: Dict[str, Any],
                       env: Mapping[str, Any], active: List[str]) -> Finding:
    """One node's NCCL finding (see nccl_findings); `active`: the node's ACTIVE rails (ib_hca facts)."""
    ifspec = env.get("NCCL_SOCKET_IFNAME")
    what = "NCCL %s, %s on %s" % ("/".join(facts["version"]) or "?", "/".join(facts["transport"]) or
                                  "no network (single node)", ",".join(facts["devices"]) or "no device")
    gdr_on = sorted(h for h, ok in facts["gdr"].items() if ok)
    if facts["gdr"] and "NET/Socket" not in facts["transport"]:
        what += ", GPUDirect RDMA %s" % ("enabled" if gdr_on else "disabled")
    what += ", intra-node %s" % (",".join(facts["intra"]) or "none")
    bad: List[str] = []  # FAIL: NCCL ran on a path worse than the node offers, or one that cannot work
    warn: List[str] = []  # WARN: a path that may not carry traffic, or faults NCCL survived
    if "NET/Socket" in facts["transport"] and active and facts["net_used"]:
        bad.append("fell back to sockets although %s %s ACTIVE (%s)" % (
            ",".join(active), "is" if len(active) == 1 else "are", _socket_reason(facts)))
    for iface in facts["suspect_ifaces"]:
        text = "NCCL %s %s: %s, its traffic does not route between nodes (set NCCL_SOCKET_IFNAME to the " \
               "data interface)" % ("sent traffic over" if iface["used"] else "listed for its " + (
                   "bootstrap" if iface["role"] == "bootstrap" else "sockets"), iface["name"], iface["reason"])
        (bad if iface["used"] else warn).append(text + _evidence(facts, "NET/Socket"))
    if ifspec:
        wrong = [i for i in facts["socket_ifaces"] + facts["oob"] if i and not ifname_allows(ifspec, i)]
        if wrong:
            bad.append("bound %s, not the interface the env file names (NCCL_SOCKET_IFNAME=%s)" % (
                ",".join(sorted(set(wrong))), ifspec))
    failed = any((e or {}).get("status") not in (None, "ok") for e in doc.get("ranks") or [])
    said = _failure_words(facts["failures"])
    if said:  # NCCL's own errors: the cause of a rank that failed, or errors the node's ranks survived
        (bad if failed and said[0] else warn).append(said[1])
    elif facts["net_faults"]:
        warn.append("NCCL reported network faults between nodes: \"%s\"" % facts["net_faults"][0])
    gdr_note = None
    if facts["net_used"] and "NET/Socket" not in facts["transport"]:
        should, why = _gdr_expected((view.facts.get(node) or {}).get("gpudirect"))
        used = True in facts["gdr_used"] or bool(gdr_on)
        if should is None:
            gdr_note = "GPUDirect RDMA not judged: %s" % why
        elif should and not used:
            bad.append("GPUDirect RDMA disabled (%s) although %s: NCCL staged every transfer through host "
                       "memory (%s)%s" % (",".join(sorted(facts["gdr"])) or "every connection", why,
                                          _gdr_reason(facts), _evidence(facts, "gdr_disabled")))
    data: Dict[str, Any] = {"nccl": facts}
    if gdr_note:
        data["gdr_note"] = gdr_note
    if bad or warn:
        return Finding(NAME, node, Status.FAIL if bad else Status.WARN, "%s: %s" % (what, "; ".join(bad + warn)),
                       expected="NCCL on the data path preflight chose", actual=what, data=data, action="fix_config")
    return Finding(NAME, node, Status.PASS, what + ("" if not gdr_note else " (%s)" % gdr_note), data=data)


#: How each stage of NCCL's that failed is said: (the lead, quoting NCCL's line; what it means)
_STAGE_WORDS = {
    "bootstrap": ("NCCL's bootstrap failed: \"%s\"", "its TCP rendezvous between ranks: NCCL_SOCKET_IFNAME "
                  "must name an interface every node can reach, and no firewall may block it"),
    "connect": ("NCCL reported network faults between nodes: \"%s\"", "the address NCCL dialled does not answer: "
                "routes, firewalls, the interface NCCL chose"),
    "network": ("NCCL reported network faults between nodes: \"%s\"", "a connection between the nodes failed: "
                "links, switch, the interface NCCL chose"),
    "proxy": ("NCCL's proxy failed: \"%s\"", "it sets up and progresses the connections between nodes: "
              "look at the network path"),
}


def _failure_words(failures: Sequence[Mapping[str, Any]]) -> Optional[Tuple[bool, str]]:
    """(any NCCL error at WARN level, the words for NCCL's own failures, the cause's stage first), or None.

    A failure at INFO level is a retry ("Call to connect returned Connection timed out, retrying") the
    run may have survived; a WARN one is an error NCCL returned."""
    if not failures:
        return None
    first = failures[0]
    lead, meaning = _STAGE_WORDS[first["stage"]]
    later = []
    for f in failures[1:]:
        if f["stage"] != first["stage"] and f["stage"] not in later:
            later.append(f["stage"])
    text = "%s%s (%s%s)" % (lead % first["line"][:200], " on " + first["host"] if first.get("host") else "",
                            meaning, "; then its %s failed" % " and ".join(later) if later else "")
    return any(f.get("level") == "WARN" for f in failures), text


def _hca_findings(hcas_used: Mapping[str, Sequence[str]], spec: Optional[str]) -> List[Finding]:
    """A WARN (fix_config) naming the nodes whose NCCL listed other HCAs than the rest when the env file's
    NCCL_IB_HCA names them (nccllog.hca_mismatch); different names without it are only reported."""

    found = hca_mismatch(hcas_used, spec)
    if not found:
        return []
    parts = ["%s %s" % (fold(hosts), ",".join(names)) for hosts, names in found["groups"]]
    return [Finding(NAME, None, Status.WARN, "NCCL_IB_HCA=%s names HCAs, but NCCL listed different ones by host: %s; "
                    "NCCL pairs HCAs across nodes by their place in that list, so the nodes that name a rail "
                    "differently use another rail or none: set NCCL_IB_HCA per node, or by a prefix every node "
                    "shares (or '^' the ports to skip)" % (found["spec"], "; ".join(parts)),
                    expected="the same HCA names on every node", actual="; ".join(parts),
                    data={"hca_mismatch": found}, action="fix_config")]


def rule(view: ClusterView) -> List[Finding]:
    """The all-reduce judged: each rank's figures (rank_findings), the fleet rounds that localize a slow or
    broken node, and what NCCL's own log says of the path it took (nccl_findings)."""

    meta = dict(view.cluster.get(NAME) or {})
    docs = {n: (view.facts.get(n) or {}).get(NAME) for n in meta.get("nodes") or []}
    if contention(docs, meta):
        return rank_findings(view)
    docs = {n: d for n, d in docs.items() if isinstance(d, dict) and not doc_problem(d)}
    return _with_fleet(rank_findings(view), view, meta) + nccl_findings(view, meta, docs) + soak.soak_findings(view)

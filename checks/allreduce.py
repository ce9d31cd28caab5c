"""allreduce: a timed all-reduce across every node completes, returns the right sums, and reaches its bus bandwidth.

This check has no probe half in the bundle sense: the controller runs preflight.probe.bench_agent on
every participating node at once (see that module for the config and result documents). The rule reads

    view.facts[node]["allreduce"]   that node's agent result document (or {"probe_error": "..."})
    view.cluster["allreduce"]       cluster-level metadata, filled by the controller
                                    (preflight.benchplan.cluster_meta() builds the skeleton from the
                                    configs it sent):
        backend      "nccl" | "gloo"
        world_size   total ranks
        nodes        participating node names, index = node_rank
        ranks        {node: [first_rank, last_rank]}: names the ranks of nodes that sent no document
        master       "198.19.0.2:29500", for messages
        deadlines    the deadlines sent to the agents ({"init_s", "op_s", "total_s"})
        unanswered   {node: why}: nodes whose agent returned nothing (outer deadline, SSH failure)
        gpu_model    NVML name, e.g. "NVIDIA H100 80GB HBM3" (for the built-in profile)
        nic_gbps     per-node aggregate line rate of the NICs the collective uses, Gb/s (multi-node profile)
        localization {"results": [group result, ...], "by_bandwidth": bool, "threshold_gbps": ...} from the
                     pair rounds (see preflight.benchplan.localize(); by_bandwidth false when localizing a
                     hang or an error)
        skip         a reason: the test deliberately did not run (the rule then SKIPs)

and `view.expect["busbw_gbps"]` (also `expect["nic_gbps"]` as a fallback for the NIC rate).

Verdict: per size the slowest rank's median time is the collective's time; algbw = bytes / time and
busbw = algbw * 2(n-1)/n (nccl-tests). The verdict is taken at the largest size >= 1 GiB on GPU (nccl),
or the largest size run on CPU (gloo), against expect.busbw_gbps, else the built-in profile below, else
the figures are reported as WARN "no threshold applies". A hang, a rank error or a wrong sum is a FAIL
naming the stage, the ranks and the nodes.

The launch (configs, size sweeps, deadlines) and the pair-test localization are planned on the controller
by preflight.benchplan; the rule reports the localization's verdict (benchplan.verdict_localization).
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.common import GiB, MiB, fold, fold_ints, human_bytes, plural
from preflight.model import Check, ClusterView, CrossNode, Finding, Status

NAME = "allreduce"

#: Smallest size a GPU verdict may be taken at: below it latency, not bandwidth, dominates.
GPU_VERDICT_MIN = GiB

#: Fraction of the hardware line rate a healthy system must reach. nccl-tests' busbw is directly
#: comparable to the link's unidirectional peak (NVIDIA nccl-tests doc/PERFORMANCE.md); published
#: single-node runs reach 75-105% of it (8x A100 SXM4 ~230-240 GB/s of 300; 8x H100 SXM 450-480 GB/s of
#: 450 with NVLink SHARP). 70% keeps a healthy node from failing while catching a lost link or a fallback
#: to PCIe/host memory (typically a 2-10x drop).
LINE_RATE_FRACTION = 0.7

#: Built-in single-node profiles: 8-GPU HGX/DGX baseboards with NVSwitch. Value: NVLink bandwidth per
#: GPU, one direction, GB/s, from NVIDIA's datasheets (A100: NVLink3 600 GB/s bidirectional; H100/H200
#: SXM: NVLink4 900 GB/s; B200: NVLink5 1.8 TB/s).
NVLINK_PROFILES = (
    (re.compile(r"A100[- ]SXM", re.I), "A100 SXM4 8-GPU NVLink3", 300.0),
    (re.compile(r"H100(?!.*(PCIe|NVL\b)).*(HBM3|SXM)", re.I), "H100 SXM 8-GPU NVLink4", 450.0),
    (re.compile(r"H200(?!.*NVL)", re.I), "H200 SXM 8-GPU NVLink4", 450.0),
    (re.compile(r"\bB200\b", re.I), "B200 8-GPU NVLink5", 900.0),
)


# ----------------------------------------------------------------------------------------------- formatting


def _ranks_phrase(ranks: Sequence[int], node_of: Mapping[int, str]) -> str:
    """'rank 3 (n004)' / 'ranks 0-7 (n[001-002])'."""
    nodes = [node_of[r] for r in ranks if r in node_of]
    word = "rank" if len(set(ranks)) == 1 else "ranks"
    where = " (%s)" % fold(nodes) if nodes else ""
    return "%s %s%s" % (word, fold_ints(ranks), where)


# ------------------------------------------------------------------------------------------------ the maths


def busbw_factor(n: int) -> float:
    """All-reduce bus bandwidth factor 2(n-1)/n.

    From nccl-tests doc/PERFORMANCE.md: for all-reduce, busbw = algbw * 2(n-1)/n, because each rank
    sends and receives 2(n-1)/n of the buffer in a ring (a reduce-scatter then an all-gather); the
    result is comparable to the peak bandwidth of the slowest link, whatever the rank count.
    """
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def rank_table(docs: Mapping[str, Mapping[str, Any]]) -> Dict[int, Tuple[str, Dict[str, Any]]]:
    """{global rank: (node, the rank's entry)} from every node's agent document."""
    out: Dict[int, Tuple[str, Dict[str, Any]]] = {}
    for node, doc in docs.items():
        for entry in (doc or {}).get("ranks") or []:
            out[int(entry["rank"])] = (node, entry)
    return out


def curve(docs: Mapping[str, Mapping[str, Any]], world_size: int) -> List[Dict[str, Any]]:
    """The bandwidth curve over the sizes every one of world_size ranks completed.

    Per size the slowest rank's median time is the collective's time (every rank waits for the last
    one to contribute): [{bytes, time_s, algbw_gbps, busbw_gbps, slowest_rank, fastest_rank}], plus
    cpu_s (the ranks' mean CPU seconds per all-reduce) where every rank measured it (gloo).
    """
    by_size: Dict[int, Dict[int, float]] = {}
    cpu: Dict[int, List[float]] = {}
    for rank, (_node, entry) in rank_table(docs).items():
        for s in entry.get("sizes") or []:
            by_size.setdefault(int(s["bytes"]), {})[rank] = float(s["time_s"])
            if s.get("cpu_s") is not None:
                cpu.setdefault(int(s["bytes"]), []).append(float(s["cpu_s"]))
    points = []
    for nbytes in sorted(by_size):
        times = by_size[nbytes]
        if len(times) < world_size:
            continue
        slowest = max(sorted(times), key=lambda r: times[r])
        fastest = min(sorted(times), key=lambda r: times[r])
        t = max(times[slowest], 1e-12)
        algbw = nbytes / t / 1e9
        points.append(
            {
                "bytes": nbytes,
                "time_s": times[slowest],
                "algbw_gbps": round(algbw, 4),
                "busbw_gbps": round(algbw * busbw_factor(world_size), 4),
                "slowest_rank": slowest,
                "fastest_rank": fastest,
                "median_time_s": statistics.median(times.values()),
            }
        )
        if len(cpu.get(nbytes) or []) == len(times):
            points[-1]["cpu_s"] = statistics.mean(cpu[nbytes])
    return points


def verdict_point(points: List[Dict[str, Any]], backend: str) -> Optional[Dict[str, Any]]:
    """The curve point the verdict is taken at: largest size >= 1 GiB on GPU, largest size on CPU."""
    if not points:
        return None
    last = points[-1]
    if backend == "nccl" and last["bytes"] < GPU_VERDICT_MIN:
        return None
    return last


# ------------------------------------------------------------------------------------------------ thresholds


def profile_threshold(
    backend: str, nnodes: int, gpus_per_node: int, gpu_model: Optional[str], nic_gbps: Optional[float]
) -> Optional[Tuple[float, str]]:
    """(busbw GB/s a healthy system reaches at >= 1 GiB, where the figure comes from), or None.

    Single node: the NVLink profile of an 8-GPU NVSwitch baseboard, LINE_RATE_FRACTION of the per-GPU
    unidirectional NVLink bandwidth.
    Several nodes: LINE_RATE_FRACTION of the node's aggregate NIC line rate in GB/s. A ring all-reduce
    with one NCCL channel per NIC crosses each node boundary once per channel, so its busbw is bounded by
    the per-node network injection bandwidth; NCCL's tree/NVLS algorithms beat that at small node counts
    (2x H100 nodes with 8x 200 Gb/s, i.e. 200 GB/s, publish ~330 GB/s busbw at 4 GiB), so the bound is a
    conservative floor. Capped by the NVLink profile when both apply.
    gloo (CPU, TCP through the kernel): no profile; it is bounded by memory copies and a single stream,
    not the NIC, and a line-rate floor would fail healthy nodes.
    """
    if backend != "nccl":
        return None
    nvlink = None
    if gpus_per_node == 8 and gpu_model:
        for pattern, label, gbps in NVLINK_PROFILES:
            if pattern.search(gpu_model):
                nvlink = (round(LINE_RATE_FRACTION * gbps, 1), "%s profile: %d%% of %g GB/s per GPU" % (
                    label, LINE_RATE_FRACTION * 100, gbps))
                break
    if nnodes <= 1:
        return nvlink
    if not nic_gbps:
        return None
    net = LINE_RATE_FRACTION * float(nic_gbps) / 8.0
    found = (round(net, 1), "network profile: %d%% of %g Gb/s NIC line rate per node" % (
        LINE_RATE_FRACTION * 100, float(nic_gbps)))
    if nvlink is not None and nvlink[0] < found[0]:
        return nvlink
    return found


def threshold_for(view: ClusterView, meta: Mapping[str, Any], nodes: Sequence[str], backend: str):
    """expect.busbw_gbps, else the built-in profile, else None: (GB/s, source)."""
    if view.expect.get("busbw_gbps") is not None:
        return float(view.expect["busbw_gbps"]), "expect.busbw_gbps"
    known = {n.name: n for n in view.nodes}
    gpus = [known[n].gpus_per_node for n in nodes if n in known]
    gpus_per_node = min(gpus) if gpus else 0
    nic = meta.get("nic_gbps") or view.expect.get("nic_gbps")
    return profile_threshold(backend, len(nodes), gpus_per_node, meta.get("gpu_model"), nic)


# ------------------------------------------------------------------------------------------------ the rule


def _doc_problem(doc: Any) -> Optional[str]:
    if doc is None:
        return None
    if isinstance(doc, dict) and "probe_error" in doc:
        return "bench agent failed: %s" % doc["probe_error"]
    if isinstance(doc, dict) and doc.get("error"):
        return "bench agent: %s" % doc["error"]
    return None


def _position(entry: Mapping[str, Any], sizes: Sequence[int]) -> int:
    """How far a rank got: -1 at init, i at sizes[i], len(sizes) at teardown."""
    stage = entry.get("stage")
    if stage == "init":
        return -1
    if stage == "size" and entry.get("bytes") in sizes:
        return list(sizes).index(entry["bytes"])
    return len(sizes)


def _stage_name(entry: Mapping[str, Any]) -> str:
    if entry.get("stage") == "size" and entry.get("bytes") is not None:
        return human_bytes(int(entry["bytes"]))
    if entry.get("stage") == "finish":
        return "teardown"
    return "init"


def _deadline_of(entry: Mapping[str, Any], doc: Mapping[str, Any], meta: Mapping[str, Any]) -> Optional[float]:
    fired = doc.get("deadline") or {}
    if fired.get("limit_s") is not None:
        return float(fired["limit_s"])
    deadlines = meta.get("deadlines") or {}
    key = "init_s" if entry.get("stage") == "init" else "op_s"
    return deadlines.get(key)


def rule(view: ClusterView) -> List[Finding]:
    meta = dict(view.cluster.get(NAME) or {})
    if meta.get("skip"):
        return [Finding(NAME, None, Status.SKIP, str(meta["skip"]))]
    nodes = list(meta.get("nodes") or [n.name for n in view.live if view.facts[n.name].get(NAME) is not None])
    unanswered = dict(meta.get("unanswered") or {})
    for name in unanswered:
        if name not in nodes:
            nodes.append(name)
    if not nodes:
        return [Finding(NAME, None, Status.ERROR, "no all-reduce results gathered (the bench did not run)")]

    out: List[Finding] = []
    docs: Dict[str, Dict[str, Any]] = {}
    missing: Dict[str, str] = {}
    for name in nodes:
        doc = (view.facts.get(name) or {}).get(NAME)
        problem = _doc_problem(doc)
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

    for name, why in missing.items():
        out.append(Finding(NAME, name, Status.FAIL, why))

    bad = {r: (n, e) for r, (n, e) in table.items() if e.get("status") != "ok"}
    if bad or missing:
        out.extend(_failure(view, meta, docs, missing, table, bad, node_of, points, data, world))
        return out

    wrong = _wrong_values(table)
    if wrong:
        nbytes, ranks, sample = wrong[0]
        msg = "all-reduce returned wrong sums at %s on %s: expected %g, got %g (%d elements)" % (
            human_bytes(nbytes), _ranks_phrase(ranks, node_of), sample.get("expected", float("nan")),
            sample.get("got", float("nan")), sample.get("mismatches", 0))
        data["wrong"] = [{"bytes": b, "ranks": rs} for b, rs, _s in wrong]
        out.append(Finding(NAME, None, Status.FAIL, msg, expected="every element = %g" % sample.get(
            "expected", world * (world + 1) / 2.0), actual="%g" % sample.get("got", float("nan")), data=data))
        return out

    if world < 2:
        out.append(Finding(NAME, None, Status.WARN, "a single rank: no all-reduce traffic to measure", data=data))
        return out
    point = verdict_point(points, backend)
    if point is None:
        largest = human_bytes(points[-1]["bytes"]) if points else "none"
        out.append(Finding(NAME, None, Status.WARN, "all-reduce completed across %s, but the largest size (%s) is "
                           "below %s: bus bandwidth not judged" % (where, largest, human_bytes(GPU_VERDICT_MIN)),
                           data=data))
        return out
    figures = "busbw %.2f GB/s (algbw %.2f GB/s) at %s across %s" % (
        point["busbw_gbps"], point["algbw_gbps"], human_bytes(point["bytes"]), where)
    data["verdict_bytes"] = point["bytes"]
    threshold = threshold_for(view, meta, nodes, backend)
    if threshold is None:
        out.append(Finding(NAME, None, Status.WARN, "all-reduce %s; no threshold applies (set expect.busbw_gbps)"
                           % figures, actual="%.2f GB/s" % point["busbw_gbps"], data=data))
        return out
    limit, source = threshold
    data.update(threshold_gbps=limit, threshold_source=source)
    expected = "busbw >= %g GB/s (%s)" % (limit, source)
    actual = "%.2f GB/s" % point["busbw_gbps"]
    if point["busbw_gbps"] >= limit:
        out.append(Finding(NAME, None, Status.PASS, "all-reduce " + figures, expected=expected, actual=actual,
                           data=data))
        return out
    msg = "all-reduce %s, below %g GB/s (%s)" % (figures, limit, source)
    slow = point["slowest_rank"]
    if point["median_time_s"] > 0 and point["time_s"] > 1.5 * point["median_time_s"]:
        msg += "; slowest %s at %.1fx the median rank" % (_ranks_phrase([slow], node_of),
                                                          point["time_s"] / point["median_time_s"])
    else:
        msg += "; slowest %s" % _ranks_phrase([slow], node_of)
    out.append(Finding(NAME, None, Status.FAIL, msg, expected=expected, actual=actual, data=data))
    return out


def _wrong_values(table) -> List[Tuple[int, List[int], Dict[str, Any]]]:
    """[(bytes, ranks that saw wrong sums, one sample entry)] in size order."""
    found: Dict[int, Tuple[List[int], Dict[str, Any]]] = {}
    for rank, (_node, entry) in sorted(table.items()):
        for s in entry.get("sizes") or []:
            if not s.get("ok", False):
                ranks, _sample = found.setdefault(int(s["bytes"]), ([], s))
                ranks.append(rank)
    return [(b, found[b][0], found[b][1]) for b in sorted(found)]


def _failure(view, meta, docs, missing, table, bad, node_of, points, data, world) -> List[Finding]:
    """FAIL findings for a run that hung or failed: the stage, the ranks and nodes that did not finish."""
    sizes = sorted({int(b) for d in docs.values() for b in d.get("sizes") or []} |
                   {int(s["bytes"]) for _n, e in table.values() for s in e.get("sizes") or []} |
                   {int(e["bytes"]) for _n, e in bad.values() if e.get("bytes") is not None})
    master = meta.get("master") or _master(docs)
    parts: List[str] = []
    implicated: Dict[str, str] = {}

    if bad:
        # Where the collective stopped: the least advanced rank that did not finish.
        stopped = min(_position(e, sizes) for _n, e in bad.values())
        head = sorted(r for r, (_n, e) in bad.items() if _position(e, sizes) == stopped)
        first_node, first = bad[head[0]]
        stage = _stage_name(first)
        data["stopped_at"] = {"stage": first.get("stage"), "bytes": first.get("bytes")}
        errors = {r: ne for r, ne in bad.items() if ne[1].get("status") == "error"}
        if errors:
            parts.append(_error_message(errors, bad, sizes, node_of, implicated))
        elif stopped == -1:
            limit = _deadline_of(first, docs.get(first_node) or {}, meta)
            within = " within %g s" % limit if limit else ""
            parts.append(_init_message(head, bad, _arrived(docs), world, node_of, master, within, implicated))
        else:
            limit = _deadline_of(first, docs.get(first_node) or {}, meta)
            within = " within %g s" % limit if limit else ""
            text = "all-reduce hung at %s: %s did not finish%s" % (stage, _ranks_phrase(head, node_of), within)
            ahead = sorted(r for r in table if r not in head)
            if ahead:
                text += " (%s got past it)" % _ranks_phrase(ahead, node_of)
                for r in head:
                    implicated.setdefault(node_of[r], "rank %d did not finish the %s all-reduce%s" % (r, stage, within))
            elif not missing:
                done = [p["bytes"] for p in points if p["bytes"] < (first.get("bytes") or 0)]
                if done and (first.get("bytes") or 0) <= MiB:
                    text += ("; sizes up to %s completed: small messages pass and larger ones hang, the "
                             "signature of an MTU mismatch on the path (jumbo frames dropped)" % human_bytes(max(done)))
                text += "; every rank was stuck, so no node stands out: the pair localization below names the node"
            parts.append(text)

    if missing:
        missing_ranks = sorted(r for r, n in node_of.items() if n in missing and r not in table)
        text = "no result from %s" % fold(missing)
        if missing_ranks:
            text += " (%s %s)" % ("rank" if len(missing_ranks) == 1 else "ranks", fold_ints(missing_ranks))
        if not parts:
            text = "all-reduce incomplete: " + text
        parts.append(text)

    out = [Finding(NAME, name, Status.FAIL, why) for name, why in implicated.items() if name not in missing]
    data["failed_ranks"] = sorted(bad)
    data["implicated"] = sorted(set(implicated) | set(missing))
    out.insert(0, Finding(NAME, None, Status.FAIL, "; ".join(parts), data=data))
    return out


def _error_message(errors, bad, sizes, node_of, implicated) -> str:
    """The failure at the earliest point, led by ranks whose process died (peers report its death)."""
    died = {r: ne for r, ne in errors.items() if str(ne[1].get("error", "")).startswith("rank process")}
    first = died or errors
    at = min(_position(e, sizes) for _n, e in first.values())
    lead = sorted(r for r, (_n, e) in first.items() if _position(e, sizes) == at)
    sample = first[lead[0]][1]
    error = sample.get("error") or "error"
    text = "all-reduce failed at %s: %s: %s" % (_stage_name(sample), _ranks_phrase(lead, node_of), error)
    others = sorted(set(bad) - set(lead))
    if others:
        text += "; %s stopped too" % _ranks_phrase(others, node_of)
    if "No module named 'torch'" in error:
        text += " (install torch in the interpreter named by python: on those nodes)"
    for r in lead:
        implicated.setdefault(node_of[r], "rank %d failed at %s: %s" % (r, _stage_name(sample), error))
    return text


def _init_message(head, bad, arrived, world, node_of, master, within, implicated) -> str:
    at = " at %s" % master if master else ""
    if arrived is not None:
        absent = sorted(r for r in range(world) if r not in set(arrived))
        if absent:
            for r in absent:
                implicated.setdefault(node_of.get(r, "?"), "rank %d never reached the rendezvous%s" % (r, at))
            implicated.pop("?", None)
            return "all-reduce hung at init: %s never reached the rendezvous%s%s" % (
                _ranks_phrase(absent, node_of), at, within)
    steps = {bad[r][1].get("step") for r in head}
    ranks = sorted(r for r, (_n, e) in bad.items() if e.get("stage") == "init")
    if steps == {"import"}:
        return "all-reduce hung at init: %s still importing torch%s (slow shared filesystem?)" % (
            _ranks_phrase(ranks, node_of), within)
    if "store" in steps:
        store_ranks = sorted(r for r, (_n, e) in bad.items() if e.get("step") == "store")
        return "all-reduce hung at init: %s could not connect to the rendezvous store%s%s" % (
            _ranks_phrase(store_ranks, node_of), at, within)
    return ("all-reduce hung at init: %s reached the rendezvous but the process group did not form%s "
            "(ranks cannot connect to each other: check GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME and firewalls)"
            % (_ranks_phrase(ranks, node_of), within))


def _arrived(docs) -> Optional[List[int]]:
    for doc in docs.values():
        rv = doc.get("rendezvous") or {}
        if rv.get("arrived") is not None:
            return [int(r) for r in rv["arrived"]]
    return None


def _master(docs) -> Optional[str]:
    for doc in docs.values():
        rv = doc.get("rendezvous") or {}
        if rv.get("addr"):
            return "%s:%s" % (rv["addr"], rv.get("port"))
    return None


def _localization_findings(view: ClusterView, meta: Mapping[str, Any]) -> List[Finding]:
    loc = meta.get("localization") or {}
    results = loc.get("results") or []
    if not results:
        return []
    from preflight.benchplan import verdict_localization  # controller only

    threshold = loc.get("threshold_gbps")
    verdict = verdict_localization(results, threshold, bool(loc.get("by_bandwidth", True)))
    out = [Finding(NAME, n, Status.FAIL, "pair test: %s" % why) for n, why in verdict["bad"].items()]
    status = Status.FAIL if (verdict["bad"] or verdict["shared_fault"]) else (
        Status.WARN if verdict["undecided"] else Status.PASS)
    out.insert(0, Finding(NAME, None, status, "localization: " + verdict["message"],
                          data={"localization": {k: verdict[k] for k in ("bad", "good", "undecided")},
                                "groups": list(results)}))
    return out


def _run_bench(fleet: Any, inv: Any, view: ClusterView, healthy: Sequence[str], env: Any, opts: Any) -> Any:
    """The cross-node stage: preflight.bench launches the agents and localizes (controller only)."""
    from preflight import bench

    return bench.run(fleet, inv, view, healthy, env, opts)


def _summary(findings: Sequence[Finding], meta: Dict[str, Any], elapsed_s: Optional[float]) -> Optional[Dict[str, Any]]:
    from preflight import bench

    return bench.summary(findings, meta, elapsed_s)


def _rule_with_localization(view: ClusterView) -> List[Finding]:
    return rule(view) + _localization_findings(view, dict(view.cluster.get(NAME) or {}))


CHECK = Check(
    name=NAME,
    claim="A timed all-reduce across every node completes, returns correct sums and reaches the expected "
    "bus bandwidth",
    why="The all-reduce is what a data-parallel job does every step: a rank that cannot join it hangs the "
    "job at start, one that stalls hangs it mid-run, and one slow link sets the pace for every GPU.",
    fix="For a hang at init check the rendezvous address/port and firewalls, and GLOO_SOCKET_IFNAME/"
    "NCCL_SOCKET_IFNAME; for a hang above small sizes compare MTUs along the path; for low bandwidth check "
    "NVLink (nvidia-smi nvlink -s), NIC link rates and NCCL_IB_HCA; exclude nodes named by the pair test.",
    probe=None,
    rule=_rule_with_localization,
    # the launcher runs on the data interface the nic check chose, at the port the ports check verified,
    # with the env derived from the ib_hca and driver facts
    needs=("nic", "ib_hca", "ports", "driver"),
    action="isolate",
    order=90,
    crossnode=CrossNode(run=_run_bench, summary=_summary),
)

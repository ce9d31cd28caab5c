"""Bus bandwidth from the agents' timings (nccl-tests' definitions) and the figures a healthy system reaches.

Pure. The rank table and the curve are read from the preflight.probe.bench_agent result documents;
the profiles below say what busbw a healthy system of a known kind reaches, each figure with its source.
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.common import GiB
from preflight.model import ClusterView


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


#: Published all-reduce busbw (GB/s, nccl-tests all_reduce_perf at >= 1 GiB) of healthy systems: a run below
#: SKU_WARN_FRACTION of the figure is a WARN (the FAIL floor stays the line-rate profile above). Each entry:
#: (GPU name pattern, nodes it was measured on, per-node NIC aggregate it needs in Gb/s or None, label,
#: busbw, source). "2" means two or more nodes: a ring's busbw is bounded by per-node injection, whatever
#: the node count.
SKU_WARN_FRACTION = 0.8
SKU_PROFILES = (
    (re.compile(r"H100(?!.*(PCIe|NVL\b)).*(HBM3|SXM)", re.I), 1, None, "8x H100 SXM, one node", 460.0,
     "docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests: 460-480 GB/s, 'more than 20% below "
     "this, something is off'"),
    (re.compile(r"A100[- ]SXM", re.I), 1, None, "8x A100 SXM4, one node", 230.0,
     "docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests: 230-250 GB/s"),
    (re.compile(r"H200(?!.*NVL)", re.I), 1, None, "8x H200 SXM, one node", 460.0,
     "same NVLink4/NVSwitch baseboard as H100 SXM (NVIDIA H200 datasheet: 900 GB/s NVLink); H100 figure"),
    (re.compile(r"H100(?!.*(PCIe|NVL\b)).*(HBM3|SXM)", re.I), 2, 3200.0, "H100 SXM, 8x 400G per node", 400.0,
     "saturncloud.io/blog/crusoe-nccl-cluster-validation: H100 SXM NVLink + IB NDR 400-450 GB/s"),
    (re.compile(r"H200(?!.*NVL)", re.I), 2, 3200.0, "H200 SXM, 8x 400G per node", 400.0,
     "saturncloud.io/blog/crusoe-nccl-cluster-validation: H200 SXM NVLink + IB NDR 400-450 GB/s"),
    (re.compile(r"\bB200\b", re.I), 2, 3200.0, "B200, 8x 400G per node", 400.0,
     "no published multi-node run found: DGX B200 has the same 8x 400 Gb/s ConnectX-7 as DGX H100, so the "
     "H100 NDR figure (saturncloud.io, above) is the network-bound floor"),
    (re.compile(r"A100[- ]SXM", re.I), 2, 1600.0, "A100 SXM4, 8x 200G HDR per node", 192.0,
     "NVIDIA/nccl#778 (NVIDIA, AddyLaddy): 'DGX-A100 systems with 8x IB HDR NICs ... peak NCCL AllReduce "
     "BusBW of ~192GB/s'"),
)


# ------------------------------------------------------------------------------------------------ the maths

def gbps(value: float) -> str:
    """'1.23 GB/s', '0.0042 GB/s' (CPU figures are small: keep 2 significant digits)."""
    return ("%.2f GB/s" % value) if value >= 0.1 else ("%.2g GB/s" % value)


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
    cpu_s (the ranks' mean CPU seconds per all-reduce) where every rank measured it (gloo), and iters and
    stop (the timed iterations run and why they stopped: "stable", "latency", "cap", "budget"; every rank ran the
    same) where the ranks report them.
    """
    by_size: Dict[int, Dict[int, float]] = {}
    cpu: Dict[int, List[float]] = {}
    runs: Dict[int, Dict[str, Any]] = {}
    for rank, (_node, entry) in rank_table(docs).items():
        for s in entry.get("sizes") or []:
            by_size.setdefault(int(s["bytes"]), {})[rank] = float(s["time_s"])
            if s.get("iters") is not None:
                runs[int(s["bytes"])] = {"iters": int(s["iters"]), "stop": s.get("stop")}
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
        points[-1].update(runs.get(nbytes) or {})
    return points


def verdict_point(points: List[Dict[str, Any]], backend: str) -> Optional[Dict[str, Any]]:
    """The curve point the verdict is taken at: largest size >= 1 GiB on GPU, largest size on CPU."""
    if not points:
        return None
    last = points[-1]
    if backend == "nccl" and last["bytes"] < GPU_VERDICT_MIN:
        return None
    return last


def best_busbw(table: Mapping[int, Tuple[str, Mapping[str, Any]]], nbytes: int, world: int) -> Optional[float]:
    """busbw of the best iteration at nbytes (the slowest rank's fastest time): what the path can do,
    least disturbed by a busy neighbour. Groups are compared on it; None without per-iteration minima."""
    times = []
    for _n, entry in table.values():
        found = [s for s in entry.get("sizes") or [] if int(s["bytes"]) == nbytes and s.get("min_s") is not None]
        if not found:
            return None
        times.append(float(found[0]["min_s"]))
    if not times or len(times) < world:
        return None
    return round(nbytes / max(max(times), 1e-12) / 1e9 * busbw_factor(world), 4)


def stragglers(points: Sequence[Mapping[str, Any]], node_of: Mapping[int, str], fraction: float) -> Optional[Dict[str, Any]]:
    """The rank that was slowest at most sizes, when that is more than half of them and its time there
    was more than `fraction` above the median rank's (in a ring every rank waits for the slowest, so
    only a clear, repeated lead means something), else None."""
    if len(points) < 2:
        return None
    counts: Dict[int, List[Mapping[str, Any]]] = {}
    for p in points:
        counts.setdefault(int(p["slowest_rank"]), []).append(p)
    rank, where = max(counts.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    if len(where) * 2 <= len(points):
        return None
    ratios = [p["time_s"] / p["median_time_s"] for p in where if p.get("median_time_s")]
    ratio = statistics.median(ratios) if ratios else 1.0
    if ratio <= 1.0 + fraction:
        return None
    return {"rank": rank, "node": node_of.get(rank), "sizes": len(where), "ratio": round(ratio, 2)}


def sweep_cut(table: Mapping[int, Tuple[str, Mapping[str, Any]]]) -> Optional[Dict[str, Any]]:
    """The "cut" the ranks agreed on (the sweep ended before a size projected over its budget), or None."""
    cuts = [e["cut"] for _n, e in table.values() if e.get("cut")]
    return min(cuts, key=lambda c: c.get("bytes") or 0) if cuts else None


def wrong_values(table) -> List[Tuple[int, List[int], Dict[str, Any]]]:
    """[(bytes, ranks that saw wrong sums, one sample entry)] in size order."""
    found: Dict[int, Tuple[List[int], Dict[str, Any]]] = {}
    for rank, (_node, entry) in sorted(table.items()):
        for s in entry.get("sizes") or []:
            if not s.get("ok", False):
                ranks, _sample = found.setdefault(int(s["bytes"]), ([], s))
                ranks.append(rank)
    return [(b, found[b][0], found[b][1]) for b in sorted(found)]


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


def sku_warn_level(
    backend: str, nnodes: int, gpus_per_node: int, gpu_model: Optional[str], nic_gbps: Optional[float]
) -> Optional[Tuple[float, str]]:
    """(WARN level in GB/s, source) from SKU_PROFILES for 8-GPU nodes of a known model, or None. Multi-node
    figures apply only where each node has at least the NIC aggregate they were measured with."""
    if backend != "nccl" or gpus_per_node != 8 or not gpu_model:
        return None
    scope = 1 if nnodes <= 1 else 2
    for pattern, nodes, nic_needed, label, gbps, source in SKU_PROFILES:
        if nodes != scope or not pattern.search(gpu_model):
            continue
        if nic_needed and (not nic_gbps or float(nic_gbps) < nic_needed):
            return None
        return (round(SKU_WARN_FRACTION * gbps, 1), "%s: %d%% of the published %g GB/s (%s)" % (
            label, SKU_WARN_FRACTION * 100, gbps, source))
    return None


def threshold_for(view: ClusterView, meta: Mapping[str, Any], nodes: Sequence[str], backend: str):
    """expect.busbw_gbps, else the built-in profile, else None: (GB/s, source)."""
    if view.expect.get("busbw_gbps") is not None:
        return float(view.expect["busbw_gbps"]), "expect.busbw_gbps"
    known = {n.name: n for n in view.nodes}
    gpus = [known[n].gpus_per_node for n in nodes if n in known]
    gpus_per_node = min(gpus) if gpus else 0
    nic = meta.get("nic_gbps") or view.expect.get("nic_gbps")
    return profile_threshold(backend, len(nodes), gpus_per_node, meta.get("gpu_model"), nic)

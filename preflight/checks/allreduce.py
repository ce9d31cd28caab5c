"""allreduce: a timed all-reduce across every node completes, returns the right sums, and reaches its bus bandwidth.

This check has no probe half in the bundle sense: the controller runs preflight.probe.bench_agent on
every participating node at once (see that module for the config and result documents). The rule reads

    view.facts[node]["allreduce"]   that node's agent result document (or {"probe_error": "..."})
    view.cluster["allreduce"]       cluster-level metadata, filled by the controller
                                    (preflight.allreduce.plan.cluster_meta() builds the skeleton from the
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
                     pair rounds (see preflight.allreduce.plan.localize(); by_bandwidth false when localizing a
                     hang or an error)
        skip         a reason: the test deliberately did not run (the rule then SKIPs)

and `view.expect["busbw_gbps"]` (also `expect["nic_gbps"]` as a fallback for the NIC rate).

Verdict: per size the slowest rank's median time is the collective's time; algbw = bytes / time and
busbw = algbw * 2(n-1)/n (nccl-tests). The verdict is taken at the largest size >= 1 GiB on GPU (nccl),
or the largest size run on CPU (gloo), against expect.busbw_gbps, else the built-in profile below, else
the figures are reported as WARN "no threshold applies". A hang, a rank error or a wrong sum is a FAIL
naming the stage, the ranks and the nodes.

The launch (configs, size sweeps, deadlines) and the pair-test localization are planned on the controller
by preflight.allreduce.plan; the rule reports the localization's verdict (benchplan.verdict_localization).
"""

from __future__ import annotations

import re
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.common import GiB, MiB, fold, fold_ints, human_bytes, nccl_selects, plural
from preflight.model import Check, ClusterView, CrossNode, Finding, Setting, Status

NAME = "allreduce"

#: What the cluster finding says when no absolute figure applies (the fleet rounds may then judge).
NO_THRESHOLD = "no threshold applies (set expect.busbw_gbps)"
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


# ----------------------------------------------------------------------------------------------- formatting


def _ranks_phrase(ranks: Sequence[int], node_of: Mapping[int, str]) -> str:
    """'rank 3 (n004)' / 'ranks 0-7 (n[001-002])'."""
    nodes = [node_of[r] for r in ranks if r in node_of]
    word = "rank" if len(set(ranks)) == 1 else "ranks"
    where = " (%s)" % fold(nodes) if nodes else ""
    return "%s %s%s" % (word, fold_ints(ranks), where)


# ---------------------------------------------------------------------------------------------- NCCL log
#
# NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET makes every rank say what it chose at init. The lines this
# parser reads, with the NCCL source that prints them (format strings as of NCCL 2.18-2.27; older ones
# differ only where noted):
#   NCCL version 2.27.6+cuda13.0                                  init.cc (rank 0 only before 2.19,
#                                                                 without the "host:pid:tid [dev] NCCL INFO" prefix)
#   NET/Plugin : No plugin found ... / Plugin Path : <lib>         net.cc (which network plugin was loaded)
#   NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>   transport/net_ib.cc
#   NET/IB : No device found.                                     transport/net_ib.cc
#   NET/Socket : Using [0]eth1:198.19.0.3<0>                      transport/net_socket.cc
#   Using network IB                                              init.cc (2.7+: the network actually used)
#   NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'           graph/topo.cc ("NET/%s : GPU Direct RDMA %s
#                                                                 for HCA %d '%s'": the HCA can do GDR)
#   Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA        transport/net.cc ("/GDRDMA" only when
#                                                                 this connection really uses GDR)
#   Channel 00/0 : 0[0] -> 1[1] via P2P/IPC | P2P/CUMEM/read | SHM/direct/direct   transport/p2p.cc, shm.cc
#   Ring 00 : 155[3d000] -> 157[b2000] via P2P/IPC                the same before NCCL 2.6
#   Connected all rings, use ring PXN 0 GDR 1                     init.cc
#   NVLS multicast support is available on dev 0                  transport/nvls.cc
#   NCCL_SOCKET_IFNAME set by environment to eth1                 misc/param.cc
# Real logs in these formats are quoted in the NVIDIA/nccl issue tracker; tests/fixtures/allreduce/ holds
# fixtures modelled on them, each naming its source.

_NCCL_LINE = re.compile(r"(?P<host>\S*?):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE) ?(?P<msg>.*)$")
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\w.]+))?")
_NET_USING = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devs>.*?)(?:\s*; OOB (?P<oob>\S*))?\s*$")
_NET_DEV = re.compile(r"\[(?P<index>\d+)\](?P<dev>\S+)")
_IB_DEV = re.compile(r"^(?P<name>[^:\s]+):(?P<port>\d+)/(?P<link>[A-Za-z]+)")
_SOCK_DEV = re.compile(r"^(?P<name>[^:\s]+):(?P<addr>.*)<\d+>$")
_GDR_HCA = re.compile(r"^NET/(?P<net>\w+) ?: GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<index>\d+) '(?P<name>[^']*)'")
_GDR_OLD = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU \S+ / HCA (?P<index>\d+)")
_CONNECT = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[\w+\])? -> \d+(?:\[\w+\])?(?: \[(?:send|receive)\])? via (?P<via>.+?)\s*$")
_RING_GDR = re.compile(r"Connected all rings.*\bGDR (?P<gdr>\d)")
_ENV_SET = re.compile(r"^(?P<var>NCCL_\w+) set by environment to (?P<value>.*)$")


def _nccl_iface(text: str) -> Dict[str, Any]:
    m = _SOCK_DEV.match(text)
    return {"name": m.group("name"), "addr": m.group("addr") or None} if m else {"name": text, "addr": None}


def _intra_transport(via: str) -> Optional[str]:
    """'P2P/CUMEM/read' -> 'P2P/CUMEM', 'SHM/direct/direct' -> 'SHM', 'direct shared memory' -> 'SHM'."""
    if via.startswith("P2P/"):
        kind = via.split("/")[1]
        return "P2P/" + ("direct" if kind.startswith("direct") else kind)
    if via.startswith("SHM") or "shared memory" in via:
        return "SHM"
    if via.startswith("NVLS") or via.startswith("CollNet"):
        return via.split("/")[0]
    return None


def parse_nccl_log(text: str) -> Dict[str, Any]:
    """What NCCL chose, from one rank's NCCL_DEBUG=INFO output (lines of other programs are ignored).

    Returns {"version", "cuda", "plugin", "network", "transport", "devices", "oob", "ib_no_device",
    "gdr", "gdr_used", "net_paths", "intra", "bootstrap", "env", "warnings", "hosts"}:
      network     "IB" | "Socket" | a plugin's name ("IBext_v8", "AWS Libfabric"): "Using network X", else
                  the network that listed devices (IB before Socket, as NCCL tries them)
      transport   "NET/" + network
      devices     the network's devices: IB "mlx5_0:1/IB" strings, Socket {"name", "addr"} dicts
      gdr         {HCA name: True/False} from "GPU Direct RDMA Enabled/Disabled for HCA"
      gdr_used    True when a NET connection ran with /GDRDMA (or "GDR 1"), False when NET connections
                  were made without it, None when the log shows no NET connection (one node)
      intra       sorted intra-node transports seen: "P2P/IPC", "P2P/CUMEM", "SHM", "NVLS", ...
    Raises ParseError when the text holds no NCCL INFO line (NCCL_DEBUG=INFO not set, or not NCCL's
    output), or a "NET/... : Using" line names no device.
    """
    from preflight.model import ParseError

    out: Dict[str, Any] = {
        "version": None, "cuda": None, "plugin": None, "network": None, "transport": None, "devices": [],
        "oob": None, "ib_no_device": False, "gdr": {}, "gdr_used": None, "net_paths": [], "intra": [],
        "bootstrap": [], "env": {}, "warnings": [], "hosts": [],
    }
    listed: Dict[str, List[Any]] = {}
    chosen = None
    infos = 0
    net_gdr: List[bool] = []
    hosts: List[str] = []
    for number, raw in enumerate(str(text).splitlines(), 1):
        line = raw.rstrip()
        version = _NCCL_VERSION.search(line)
        if version and out["version"] is None:
            out["version"], out["cuda"] = version.group("version"), version.group("cuda")
        m = _NCCL_LINE.search(line)
        if not m:
            continue
        host = m.group("host").rsplit(">:", 1)[-1].rsplit("]", 1)[-1]
        if host and host not in hosts:
            hosts.append(host)
        msg = m.group("msg").strip()
        if m.group("level") == "WARN":
            if len(out["warnings"]) < 10:
                out["warnings"].append(msg[:300])
            continue
        infos += 1
        using = _NET_USING.match(msg)
        if using:
            net = using.group("net")
            devs = [d.group("dev") for d in _NET_DEV.finditer(using.group("devs"))]
            if not devs:
                raise ParseError("NCCL log line %d: NET/%s 'Using' line names no device: %r" % (number, net, msg[:200]))
            if net == "Socket":
                listed[net] = [_nccl_iface(d) for d in devs]
            else:
                listed[net] = devs
            if using.group("oob"):
                out["oob"] = _nccl_iface(using.group("oob"))
            continue
        if msg.startswith("Bootstrap") and ": Using" in msg:
            devs = [d.group("dev") for d in _NET_DEV.finditer(msg)] or [msg.split("Using", 1)[1].strip()]
            out["bootstrap"] = [_nccl_iface(d) for d in devs]
            continue
        if msg.startswith("Using network "):
            chosen = msg[len("Using network "):].strip()
            continue
        if re.match(r"^NET/IB ?: No device found", msg):
            out["ib_no_device"] = True
            continue
        if msg.startswith("Plugin Path :"):
            out["plugin"] = msg.split(":", 1)[1].strip()
            continue
        if msg.startswith("NET/Plugin") and "Loaded net plugin" in msg:  # 2.18: "Loaded net plugin NCCL RDMA Plugin (v5)"
            if out["plugin"] in (None, "internal"):  # a "Plugin Path :" already read says more
                out["plugin"] = msg.split("Loaded net plugin", 1)[1].strip() or out["plugin"]
            continue
        if msg.startswith("NET/Plugin") and out["plugin"] is None and (
                "No plugin found" in msg or "Could not find" in msg or "internal" in msg):
            out["plugin"] = "internal"
            continue
        gdr = _GDR_HCA.match(msg)
        if gdr:
            out["gdr"][gdr.group("name")] = gdr.group("state") == "Enabled"
            continue
        old = _GDR_OLD.search(msg)
        if old:
            out["gdr"]["HCA %s" % old.group("index")] = old.group("state") == "Enabled"
            continue
        connect = _CONNECT.match(msg)
        if connect:
            via = connect.group("via")
            if via.startswith("NET/"):
                if via not in out["net_paths"]:
                    out["net_paths"].append(via)
                net_gdr.append("/GDRDMA" in via)
            else:
                kind = _intra_transport(via)
                if kind and kind not in out["intra"]:
                    out["intra"].append(kind)
            continue
        ring = _RING_GDR.search(msg)
        if ring:
            net_gdr.append(ring.group("gdr") == "1")
            continue
        if "NVLS multicast support is available" in msg or msg.startswith("Connected NVLS"):
            if "NVLS" not in out["intra"]:
                out["intra"].append("NVLS")
            continue
        env = _ENV_SET.match(msg)
        if env:
            value = env.group("value").strip()
            out["env"][env.group("var")] = value[:-1] if value.endswith(".") else value  # "... to 1."
    if not infos:
        raise ParseError("NCCL log: no 'NCCL INFO' line (run with NCCL_DEBUG=INFO; NCCL prints to stdout "
                         "unless NCCL_DEBUG_FILE is set)")
    if chosen is None:  # before NCCL 2.7: the first network that found devices (IB before Socket)
        chosen = next((n for n in listed if n != "Socket"), "Socket" if "Socket" in listed else None)
    out["network"] = chosen
    out["transport"] = "NET/%s" % chosen if chosen else None
    if chosen is not None:
        out["devices"] = listed.get(chosen) or next((v for k, v in listed.items() if k.startswith(chosen[:2])), [])
    out["gdr_used"] = any(net_gdr) if net_gdr else None
    out["intra"] = sorted(out["intra"])
    out["net_paths"] = sorted(out["net_paths"])
    out["hosts"] = hosts
    return out


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
    cut = sweep_cut(table)
    if cut:
        data["cut"] = cut
    if point is None and cut and points:
        out.append(Finding(NAME, None, Status.FAIL, "all-reduce too slow to reach %s across %s: %s" % (
            human_bytes(GPU_VERDICT_MIN), where, _cut_phrase(cut, points)), data=data))
        return out
    if point is None:
        largest = human_bytes(points[-1]["bytes"]) if points else "none"
        out.append(Finding(NAME, None, Status.WARN, "all-reduce completed across %s, but the largest size (%s) is "
                           "below %s: bus bandwidth not judged" % (where, largest, human_bytes(GPU_VERDICT_MIN)),
                           data=data))
        return out
    figures = "busbw %s (algbw %s) at %s across %s" % (
        gbps(point["busbw_gbps"]), gbps(point["algbw_gbps"]), human_bytes(point["bytes"]), where)
    straggler = stragglers(points, node_of, float(meta.get("slow_fraction") or 0.2))
    data["slowest_per_size"] = [{"bytes": p["bytes"], "rank": p["slowest_rank"], "node": node_of.get(p["slowest_rank"])}
                                for p in points]
    if straggler:
        data["straggler"] = straggler
        figures += "; straggler: %s slowest at %d of %d sizes, %.1fx the median rank" % (
            _ranks_phrase([straggler["rank"]], node_of), straggler["sizes"], len(points), straggler["ratio"])
    if cut:
        figures += "; " + _cut_phrase(cut, points)
    data["verdict_bytes"] = point["bytes"]
    threshold = threshold_for(view, meta, nodes, backend)
    if threshold is None:
        out.append(Finding(NAME, None, Status.WARN, "all-reduce %s; %s" % (figures, NO_THRESHOLD),
                           actual="%.2f GB/s" % point["busbw_gbps"], data=data))
        return out
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
        out.append(Finding(NAME, None, Status.WARN, "all-reduce %s, below %g GB/s (%s)" % (figures, warn[0], warn[1]),
                           expected="busbw >= %g GB/s" % warn[0], actual=actual, data=data))
        return out
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


def _cut_phrase(cut: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> str:
    last = human_bytes(points[-1]["bytes"]) if points else "the first size"
    return "sweep stopped before %s: %s took %.2f s on the slowest rank, so %s would take about %.1f s " \
        "(over its %g s budget)" % (human_bytes(int(cut["bytes"])), last, float(cut.get("took_s") or 0),
                                   human_bytes(int(cut["bytes"])), float(cut.get("projected_s") or 0),
                                   float(cut.get("budget_s") or 0))


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
        stopped_ranks = {r: ne for r, ne in bad.items() if ne[1].get("status") == "timeout"}
        if errors and stopped_ranks and all(_peer_error(e) for _n, e in errors.values()):
            # a rank stopped at its deadline and its peers lost their connection to it: a stall, which the
            # ranks that report the reset did not cause
            parts.append(_stall_message(stopped_ranks, errors, sizes, node_of, docs, meta))
        elif errors:
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


_PEER_ERROR = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|Connection refused|"
                         r"Socket Timeout|recv.*timed out|NCCL communicator was aborted", re.I)


def _peer_error(entry: Mapping[str, Any]) -> bool:
    """True when a rank's error says only that a peer went away (the cause is elsewhere)."""
    return bool(_PEER_ERROR.search(str(entry.get("error") or "")))


def _stall_message(stopped, errors, sizes, node_of, docs, meta) -> str:
    at = min(_position(e, sizes) for _n, e in stopped.values())
    lead = sorted(r for r, (_n, e) in stopped.items() if _position(e, sizes) == at)
    node, first = stopped[lead[0]]
    limit = _deadline_of(first, docs.get(node) or {}, meta)
    sample = errors[sorted(errors)[0]][1].get("error") or ""
    return ("all-reduce stalled at %s: %s made no progress within the %s deadline and %s stopped; %s then lost "
            "the connection (%s). Every rank was still in the collective, so no node stands out: a slow or "
            "lossy link stalls the whole ring; the rounds below name it" % (
                _stage_name(first), _ranks_phrase(lead, node_of), "%g s op" % limit if limit else "op",
                "was" if len(lead) == 1 else "were", _ranks_phrase(sorted(errors), node_of), sample[:160]))


#: init's steps in order: a rank that failed importing torch failed before peers that then lost it at
#: the store or while forming the group
_INIT_STEPS = {"import": 0, "store": 1, "group": 2}


def _error_message(errors, bad, sizes, node_of, implicated) -> str:
    """The failure at the earliest point (init: the earliest step), led by ranks whose process died and
    by errors that are not a peer's disappearance (peers report the cause's death, not the cause)."""
    died = {r: ne for r, ne in errors.items() if str(ne[1].get("error", "")).startswith("rank process")}
    first = died or errors
    first = {r: ne for r, ne in first.items() if not _peer_error(ne[1])} or first

    def depth(entry: Mapping[str, Any]) -> Tuple[int, int]:
        at = _position(entry, sizes)
        return at, _INIT_STEPS.get(entry.get("step"), len(_INIT_STEPS)) if at == -1 else 0

    at = min(depth(e) for _n, e in first.values())
    lead = sorted(r for r, (_n, e) in first.items() if depth(e) == at)
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


def _fleet_findings(view: ClusterView, meta: Mapping[str, Any]) -> Tuple[List[Finding], List[str], Status, Dict[str, Any]]:
    """What the rounds after the whole-cluster run found: (node findings, notes for the cluster finding,
    the status they imply, data). Node rounds name a node on its own; pair rounds beside a known-good node
    (preflight.allreduce.plan); both judge against the fleet median (meta["slow_fraction"])."""
    from preflight.allreduce.plan import SLOW_FRACTION, judge_nodes, judged_gbps, verdict_localization

    frac = float(meta.get("slow_fraction") or SLOW_FRACTION)
    named: Dict[str, List[str]] = {}
    notes: List[str] = []
    status = Status.PASS
    data: Dict[str, Any] = {"slow_fraction": frac}
    for rnd in meta.get("node_rounds") or []:
        results = rnd.get("results") or []
        if not results:
            continue
        rfrac = frac
        bad = judge_nodes(results, None, rfrac, bool(rnd.get("by_bandwidth", True)))
        measured = [judged_gbps(g) for g in results if not g.get("failure") and judged_gbps(g) is not None]
        median = statistics.median(measured) if measured else None
        for n, why in bad.items():
            named.setdefault(n, []).append("alone (%s): %s" % (rnd.get("what") or rnd.get("name"), why))
        where = " at %s" % human_bytes(int(rnd["sizes"][0])) if rnd.get("sizes") else ""
        if bad:
            notes.append("node round %s%s: %s" % (rnd.get("name"), where, fold(list(bad))))
        elif not rnd.get("by_bandwidth", True):
            notes.append("node round %s%s: every node completed alone" % (rnd.get("name"), where))
        else:
            notes.append("node round %s%s: every node within %d%% of the fleet median %s" % (
                rnd.get("name"), where, round(100 * rfrac), gbps(median) if median is not None else "(none measured)"))
        data.setdefault("node_rounds", []).append({"name": rnd.get("name"), "what": rnd.get("what"),
                                                   "median_gbps": median, "named": bad, "results": results})
    loc = meta.get("localization") or {}
    if loc.get("results"):
        results = loc["results"]
        verdict = verdict_localization(results, loc.get("threshold_gbps"), bool(loc.get("by_bandwidth", True)),
                                       meta.get("nodes"), frac)
        for n, why in verdict["bad"].items():
            named.setdefault(n, []).append("pair test: %s" % why)
        notes.append("pair test: " + verdict["message"])
        if verdict["shared_fault"]:
            status = Status.FAIL
        elif verdict["undecided"]:
            status = Status.WARN
        data["localization"] = {k: verdict[k] for k in ("bad", "good", "undecided")}
        data["groups"] = list(results)
    findings = [Finding(NAME, n, Status.FAIL, "; ".join(whys), data={"fleet": whys}) for n, whys in named.items()]
    if named:
        status = Status.FAIL
    return findings, notes, status, data


def _with_fleet(out: List[Finding], view: ClusterView, meta: Mapping[str, Any]) -> List[Finding]:
    """The rule's findings with the rounds' verdict folded into the one cluster finding: one check, one
    cluster verdict (a failed run is never followed by a cluster-wide PASS of its localization)."""
    import dataclasses

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
    out[idx] = dataclasses.replace(main, status=new_status, message=message + "; " + "; ".join(notes), data=merged)
    by_node = {f.node: i for i, f in enumerate(out) if f.node is not None}
    for f in extra:
        if f.node in by_node:
            old = out[by_node[f.node]]
            out[by_node[f.node]] = dataclasses.replace(old, message=old.message + "; " + f.message)
        else:
            out.append(f)
    return out


def ifname_allows(spec: Optional[str], name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME `spec` admits interface `name` (NCCL's syntax: comma list, "^" excludes,
    "=" exact match, else prefix match). No spec admits everything but lo and docker*, as NCCL does."""
    if not spec:
        return not (name == "lo" or name.startswith("docker"))
    return nccl_selects(spec.strip(), name)


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


def _devices_text(nccl: Mapping[str, Any]) -> str:
    devs = []
    for d in nccl.get("devices") or []:
        devs.append(d["name"] if isinstance(d, dict) else str(d))
    return ",".join(devs) or "no device"


def nccl_summary(logs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One node's NCCL facts from its ranks' parsed logs: every value seen, in order."""
    def seen(key):
        out = []
        for log in logs:
            value = log.get(key)
            if value is not None and value not in out:
                out.append(value)
        return out

    devices: List[str] = []
    for log in logs:
        for d in log.get("devices") or []:
            text = d["name"] if isinstance(d, dict) else str(d)
            if text not in devices:
                devices.append(text)
    gdr: Dict[str, bool] = {}
    for log in logs:
        gdr.update(log.get("gdr") or {})
    return {
        "version": seen("version"), "transport": seen("transport"), "plugin": seen("plugin"), "devices": devices,
        "socket_ifaces": sorted({d["name"] for log in logs if log.get("network") == "Socket"
                                 for d in log.get("devices") or [] if isinstance(d, dict)}),
        "oob": sorted({(log.get("oob") or {}).get("name") for log in logs if log.get("oob")}),
        "gdr": gdr, "gdr_used": seen("gdr_used"),
        "intra": sorted({t for log in logs for t in log.get("intra") or []}),
        "net_used": any(log.get("net_paths") for log in logs),
        "ranks": len(logs),
    }


def nccl_findings(view: ClusterView, meta: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> List[Finding]:
    """Per node: what NCCL chose (version, transport, devices, GDR, intra-node transports), and a FAIL when
    it fell back to sockets although ACTIVE HCAs were found, bound an interface the env file does not
    name, or ran without GPUDirect RDMA where the gpudirect facts say it should work."""
    from preflight.model import ParseError

    env = dict(meta.get("env") or {})
    ifspec = env.get("NCCL_SOCKET_IFNAME")
    from preflight.checks import ib_hca

    hcas: Dict[str, List[str]] = ib_hca.usable_hcas(view)["nodes"]  # nodes without ib_hca facts: absent
    out: List[Finding] = []
    for node, doc in docs.items():
        if (doc or {}).get("backend") != "nccl":
            continue
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
        if not logs:
            if problems:
                out.append(Finding(NAME, node, Status.ERROR, "NCCL's choices unknown: %s" % "; ".join(problems[:2])))
            continue
        facts = nccl_summary(logs)
        what = "NCCL %s, %s on %s" % ("/".join(facts["version"]) or "?", "/".join(facts["transport"]) or
                                      "no network (single node)", ",".join(facts["devices"]) or "no device")
        gdr_on = sorted(h for h, ok in facts["gdr"].items() if ok)
        if facts["gdr"] and "NET/Socket" not in facts["transport"]:
            what += ", GPUDirect RDMA %s" % ("enabled" if gdr_on else "disabled")
        what += ", intra-node %s" % (",".join(facts["intra"]) or "none")
        bad: List[str] = []
        active = hcas.get(node) or []
        if "NET/Socket" in facts["transport"] and active and facts["net_used"]:
            bad.append("fell back to sockets although %s %s ACTIVE" % (
                ",".join(active), "is" if len(active) == 1 else "are"))
        if ifspec:
            wrong = [i for i in facts["socket_ifaces"] + facts["oob"] if i and not ifname_allows(ifspec, i)]
            if wrong:
                bad.append("bound %s, not the interface the env file names (NCCL_SOCKET_IFNAME=%s)" % (
                    ",".join(sorted(set(wrong))), ifspec))
        gdr_note = None
        if facts["net_used"] and "NET/Socket" not in facts["transport"]:
            should, why = _gdr_expected((view.facts.get(node) or {}).get("gpudirect"))
            used = True in facts["gdr_used"] or bool(gdr_on)
            if should is None:
                gdr_note = "GPUDirect RDMA not judged: %s" % why
            elif should and not used:
                bad.append("GPUDirect RDMA disabled (%s) although %s" % (
                    ",".join(sorted(facts["gdr"])) or "every connection", why))
        data = {"nccl": facts}
        if gdr_note:
            data["gdr_note"] = gdr_note
        if bad:
            out.append(Finding(NAME, node, Status.FAIL, "%s: %s" % (what, "; ".join(bad)),
                               expected="NCCL on the data path preflight chose", actual=what, data=data))
        else:
            out.append(Finding(NAME, node, Status.PASS, what + ("" if not gdr_note else " (%s)" % gdr_note),
                               data=data))
    return out


def _run_bench(fleet: Any, inv: Any, view: ClusterView, healthy: Sequence[str], env: Any, opts: Any) -> Any:
    """The cross-node stage: preflight.allreduce.run launches the agents and localizes (controller only)."""
    from preflight.allreduce import run as bench

    return bench.run(fleet, inv, view, healthy, env, opts)


def _summary(findings: Sequence[Finding], meta: Dict[str, Any], elapsed_s: Optional[float]) -> Optional[Dict[str, Any]]:
    from preflight.allreduce import run as bench

    return bench.summary(findings, meta, elapsed_s)


def _rule_with_localization(view: ClusterView) -> List[Finding]:
    meta = dict(view.cluster.get(NAME) or {})
    docs = {n: (view.facts.get(n) or {}).get(NAME) for n in meta.get("nodes") or []}
    docs = {n: d for n, d in docs.items() if isinstance(d, dict) and not _doc_problem(d)}
    return _with_fleet(rule(view), view, meta) + nccl_findings(view, meta, docs)


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
    reads="torch.distributed: a timed all-reduce across the nodes (NCCL on GPUs, gloo on CPUs)",
    takes="10-60 s (the sweep)",
    order=90,
    crossnode=CrossNode(run=_run_bench, summary=_summary),
    settings=(Setting("expect.busbw_gbps", "number", "the bus bandwidth the largest size must reach", low=0.001,
                      high=100000, unit="GB/s"),
              Setting("expect.nic_gbps", "number", "each node's NIC line rate, for the built-in bandwidth floor when "
                      "the HCA facts give none", low=0.001, high=100000, unit="Gb/s")),
)

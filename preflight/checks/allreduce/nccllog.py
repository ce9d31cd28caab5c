"""What NCCL chose, read from its NCCL_DEBUG=INFO output: network, devices, GPUDirect RDMA, intra-node paths.

Pure parsing, controller side: preflight.probe.bench_agent runs every nccl rank with NCCL_DEBUG_ENV and
sends each rank's log back; the allreduce check (preflight/checks/allreduce/) turns what this module
reads into per-node findings.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Match, Optional, Pattern, Sequence, Tuple

from preflight.common import nccl_selects
from preflight.model import ParseError

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
#   NCCL_SOCKET_IFNAME set by environment to eth1                 misc/param.cc ("set to eth1" in 2.2x+)
#   comm 0x55.. rank 0 nranks 16 cudaDev 0 ... - Init START        init.cc (2.19+; the communicator's size)
#   NET/OFI Selected Provider is efa                              aws-ofi-nccl (the libfabric provider; 1.14+:
#                                                                 "Selected provider is efa, fabric is efa-direct")
#   NET/OFI Initializing aws-ofi-nccl 1.14.0 | NET/FasTrak <time>: Initializing network FasTrak, version: 1.0.17
#   | NET/gIB : Initializing gIB v1.0.6 | NET/GPUDirectTCPX ver. 3.1.8.   the net plugin's banner (its version)
#   Call to connect returned Connection timed out, retrying       misc/socket.cc (INFO, yet a network fault:
#                                                                 the peer's address does not answer)
# When the log has no "Using" line (an excerpt, or a failure before init ended), the network is read from
# the channel lines ("via NET/Socket/0") and then from the error chain: "transport/net_socket.cc:368 -> 6"
# is the socket plugin, "transport/net_ib.cc" / ib_plugin.c / "NET/IB :" WARN the IB one (NCCL prints the
# source file of every frame an error passes: misc/debug.cc NCCLCHECK). Checked against 15 real logs
# (../shared/realworld/nccl_info, tests/realworld/test_nccl.py) and fixtures modelled on them.
# Real logs in these formats are quoted in the NVIDIA/nccl issue tracker; tests/fixtures/allreduce/ holds
# fixtures modelled on them, each naming its source.
# A launcher's combined log holds every host's lines (mpirun's "[1,N]<stdout>:" prefix, NVIDIA/nccl#224;
# nodea/nodeb in NVIDIA/nccl-tests#133): what each host listed and used is kept per host ("per_host"), since
# hosts may name the same rail apart (mlx5_2/mlx5_3 on one, mlx5_0/mlx5_1 on the other: NVIDIA/nccl#981,
# #1277) and a channel's "NET/Socket/1" is an index into its own host's list.

# A line's "host:pid:tid " prefix may be missing where a log was cut down to "[dev] NCCL INFO ..." (the TCPX capture
# in tests/fixtures/allreduce/tcpx_lab18_a3high_real_excerpt.log): such lines count for a host named "".
_NCCL_LINE = re.compile(r"(?:(?P<host>\S*?):(?P<pid>\d+):(?P<tid>\d+) )?\[(?P<dev>\d+)\] (?:(?P<src>\S+):\d+ )?NCCL (?P<level>INFO|WARN|TRACE) ?(?P<msg>.*)$")
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\w.]+))?")
_NET_USING = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devs>.*?)(?:\s*; OOB (?P<oob>\S*))?\s*$")
_NET_DEV = re.compile(r"\[(?P<index>\d+)\](?P<dev>\S+)")
_SOCK_DEV = re.compile(r"^(?P<name>[^:\s]+):(?P<addr>.*)<\d+>$")
_NRANKS = re.compile(r"\bnranks (?P<n>\d+)\b", re.I)
_TESTS_RANK = re.compile(r"^#\s+Rank\s+(?P<rank>\d+) Group")
# Lines that show the network failing between nodes (NCCL misc/socket.cc, transport/net_ib.cc, ibvwrap.cc).
NET_FAULTS = ("Connection timed out", "Connection refused", "Connection closed by remote peer", "Broken pipe",
              "Network is unreachable", "No route to host", "Connection reset by peer", "Got completion from peer")
# NCCL's own failures, by the stage that failed, first match wins (NCCL 2.18-2.27 wording: bootstrap.cc's
# "Bootstrap : no socket interface found", misc/socket.cc's "ncclSocketInit: connecting to address with
# family 0 is neither AF_INET(2) nor AF_INET6(10)" (NVIDIA/nccl#1267, #1837: no bootstrap address),
# proxy.cc's "[Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6" (#795, #952),
# misc/socket.cc's "Call to connect returned Connection timed out, retrying" (INFO, Oneflow-Inc/oneflow#3586)
# and "socketStartConnect: Connect to 10.0.0.2<43567> failed : Software caused connection abort").
# `src` is the source file NCCL prints before "NCCL WARN"; a WARN line that matches none of these (e.g.
# "Failed to open libibverbs.so[.1]" on a socket-only host, NVIDIA/nccl#857) is not a failure.
_FAILURES = (
    ("bootstrap", re.compile(r"^Bootstrap\b|\bbootstrap\w*\b|ncclSocketInit: connecting to address", re.I), "bootstrap"),
    ("proxy", re.compile(r"\[Proxy Service(?: \d+)?\] Failed|Proxy Call to rank|Error encountered progressing"), "proxy"),
    ("connect", re.compile(r"Call to connect returned|socketStartConnect|Connect to \S+ failed|ibv_modify_qp failed"), None),
)
# Interfaces NCCL should never carry traffic over between nodes: a container's end of a veth pair, a bridge of
# a container runtime or an overlay (flannel.1 in NVIDIA/nccl#224), loopback (their addresses do not route
# between hosts).
_CONTAINER_IFACE = re.compile(r"^(?:veth|docker|br-|cni|flannel|cali|virbr|lo$)")


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


def suspect_iface(iface: Mapping[str, Any]) -> Optional[str]:
    """Why socket traffic over this {"name", "addr"} will not reach other nodes, or None: a container or
    bridge interface, or an IPv6 link-local address (fe80::/10 routes only on its own link)."""
    name, addr = str(iface.get("name") or ""), str(iface.get("addr") or "")
    why = []
    if _CONTAINER_IFACE.match(name):
        why.append("is a container/bridge interface")
    if addr.lower().startswith(("fe8", "fe9", "fea", "feb")):
        why.append("has only an IPv6 link-local address (%s)" % addr.split("%")[0])
    return "%s %s" % (name, " and ".join(why)) if why else None


class _Reader:
    """What one pass over a log has read so far: the result, and per host what its ranks listed."""

    def __init__(self) -> None:
        self.out: Dict[str, Any] = {
            "version": None, "cuda": None, "plugin": None, "network": None, "transport": None, "devices": [],
            "oob": None, "ib_no_device": False, "gdr": {}, "gdr_used": None, "net_paths": [], "intra": [],
            "bootstrap": [], "env": {}, "warnings": [], "hosts": [], "provider": None, "network_from": None,
            "net_faults": [], "failures": [], "nranks": None, "lines": {}, "per_host": {}, "plugin_version": None,
        }
        self.tests_ranks: List[int] = []
        self.raised: List[str] = []  # the net plugins an error chain passed through
        self.chosen: Optional[str] = None  # the last "Using network X"
        self.infos = 0
        self.net_gdr: List[bool] = []
        self.by_host: Dict[str, Dict[str, Any]] = {}

    def host(self, name: str) -> Dict[str, Any]:
        """The entry of `name` ("" when the line names no host): what that host's ranks listed and used."""
        if name and name not in self.out["hosts"]:
            self.out["hosts"].append(name)
        return self.by_host.setdefault(name, {"chosen": None, "listed": {}, "net_paths": [], "oob": None,
                                              "bootstrap": []})


def _on_error_frame(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.raised.append("Socket" if m.group("file") == "net_socket" else "IB")


def _on_provider(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.out["provider"] = m.group("provider")


def _on_plugin_version(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    """The net plugin's own banner: '<name> <version>' ("aws-ofi-nccl 1.14.0", "FasTrak 1.0.17", "gIB 1.0.6")."""
    if r.out["plugin_version"] is None:
        r.out["plugin_version"] = "%s %s" % (m.group("name"), m.group("version").rstrip("."))


def _on_net_using(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    """'NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE; OOB ib0:10.0.0.1<0>': the host's devices of that net."""
    net = m.group("net")
    devs = [d.group("dev") for d in _NET_DEV.finditer(m.group("devs"))]
    r.out["lines"].setdefault("NET/" + net, msg[:300])
    if not devs:
        raise ParseError("NCCL log line %d: NET/%s 'Using' line names no device: %r" % (number, net, msg[:200]))
    h["listed"][net] = [_nccl_iface(d) for d in devs] if net == "Socket" else devs
    if m.group("oob"):
        h["oob"] = _nccl_iface(m.group("oob"))


def _on_bootstrap(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    devs = [d.group("dev") for d in _NET_DEV.finditer(msg)] or [m.group("rest").strip()]
    h["bootstrap"] = [_nccl_iface(d) for d in devs]


def _on_using_network(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.chosen = h["chosen"] = m.group("net")


def _on_ib_no_device(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.out["ib_no_device"] = True
    r.out["lines"].setdefault("ib_no_device", msg[:300])


def _on_plugin_path(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.out["plugin"] = m.group("path").strip()


def _on_plugin_loaded(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    """2.18: 'Loaded net plugin NCCL RDMA Plugin (v5)'; a "Plugin Path :" already read says more."""
    if r.out["plugin"] in (None, "internal"):
        r.out["plugin"] = m.group("name").strip() or r.out["plugin"]


def _on_plugin_internal(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    if r.out["plugin"] is None:
        r.out["plugin"] = "internal"


def _on_gdr_hca(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.out["gdr"][m.group("name")] = m.group("state") == "Enabled"
    if m.group("state") == "Disabled":
        r.out["lines"].setdefault("gdr_disabled", msg[:300])


def _on_gdr_old(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.out["gdr"]["HCA %s" % m.group("index")] = m.group("state") == "Enabled"


def _on_channel(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    """'Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA' (between hosts) or 'via P2P/IPC' (inside)."""
    via = m.group("via")
    if via.startswith("NET/"):
        for paths in (r.out["net_paths"], h["net_paths"]):
            if via not in paths:
                paths.append(via)
        r.net_gdr.append("/GDRDMA" in via)
        return
    kind = _intra_transport(via)
    if kind and kind not in r.out["intra"]:
        r.out["intra"].append(kind)


def _on_ring_gdr(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    r.net_gdr.append(m.group("gdr") == "1")


def _on_nvls(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    if "NVLS" not in r.out["intra"]:
        r.out["intra"].append("NVLS")


def _on_env(r: _Reader, m: Match, msg: str, h: Dict[str, Any], number: int) -> None:
    value = m.group("value").strip()
    r.out["env"][m.group("var")] = value[:-1] if value.endswith(".") else value  # "... to 1."


Handler = Callable[[_Reader, Match, str, Dict[str, Any], int], None]
#: What an INFO line says, tried in order, the first match handles it (each pattern is matched at the start
#: of the message, after "host:pid:tid [dev] NCCL INFO "). The lines and the NCCL source that prints them
#: are listed at the top of this module.
_INFO_LINES: Tuple[Tuple[Pattern, Handler], ...] = (
    (re.compile(r"(?:transport/)?(?P<file>net_socket|net_ib|ib_plugin|p2p_plugin)\.cc?:\d+ -> \d+"), _on_error_frame),
    (re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w.-]+)"), _on_provider),
    (re.compile(r"NET/OFI Initializing (?P<name>aws-ofi-nccl) (?P<version>\S+)"), _on_plugin_version),
    (re.compile(r"NET/FasTrak .*?Initializing network (?P<name>FasTrak), version: (?P<version>[\w.]+)"), _on_plugin_version),
    (re.compile(r"NET/gIB ?: Initializing (?P<name>gIB) v(?P<version>[\w.]+)"), _on_plugin_version),
    (re.compile(r"NET/(?P<name>GPUDirectTCPX) ver\. (?P<version>[\w.]+)"), _on_plugin_version),
    (_NET_USING, _on_net_using),
    (re.compile(r"Bootstrap\S* ?: Using(?P<rest>.*)$"), _on_bootstrap),
    (re.compile(r"Using network (?P<net>.+?)\s*$"), _on_using_network),
    (re.compile(r"NET/IB ?: No device found"), _on_ib_no_device),
    (re.compile(r"Plugin Path ?:(?P<path>.*)$"), _on_plugin_path),
    (re.compile(r"NET/Plugin.*Loaded net plugin(?P<name>.*)$"), _on_plugin_loaded),
    (re.compile(r"NET/Plugin.*(?:No plugin found|Could not find|internal)"), _on_plugin_internal),
    (re.compile(r"NET/(?P<net>\w+) ?: GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<index>\d+) "
                r"'(?P<name>[^']*)'"), _on_gdr_hca),
    (re.compile(r".*GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU \S+ / HCA (?P<index>\d+)"), _on_gdr_old),
    (re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[\w+\])? -> \d+(?:\[\w+\])?(?: \[(?:send|receive)\])? "
                r"via (?P<via>.+?)(?:\s+\[[^\]]*\])*\s*$"), _on_channel),
    (re.compile(r".*Connected all rings.*\bGDR (?P<gdr>\d)"), _on_ring_gdr),
    (re.compile(r".*NVLS multicast support is available|Connected NVLS"), _on_nvls),
    (re.compile(r"(?P<var>NCCL_\w+) set (?:by environment )?to (?P<value>.*)$"), _on_env),
)


def _failure(msg: str, src: str, level: str) -> Optional[str]:
    """The stage of NCCL's that failed on this line ("bootstrap", "proxy", "connect", "network"), else None."""
    for kind, pattern, file in _FAILURES:
        if pattern.search(msg) or (level == "WARN" and file and src.endswith(file + ".cc")):
            return kind
    return "network" if any(f in msg for f in NET_FAULTS) else None


def _on_warn(r: _Reader, msg: str, src: str) -> None:
    """A WARN line: its evidence, and the net plugin whose source file raised it."""
    where = src.rsplit("/", 1)[-1].split(".")[0]
    if where in ("ib_plugin", "p2p_plugin", "net_ib", "ibvwrap") or msg.startswith("NET/IB"):
        r.raised.append("IB")
    elif where == "net_socket":
        r.raised.append("Socket")
    if len(r.out["warnings"]) < 10:
        r.out["warnings"].append(msg[:300])


def parse_nccl_log(text: str) -> Dict[str, Any]:
    """What NCCL chose, from NCCL_DEBUG=INFO output of one rank or of many ranks on several hosts (an
    mpirun log); lines of other programs are ignored.

    Returns {"version", "cuda", "plugin", "provider", "network", "network_from", "transport", "devices",
    "oob", "ib_no_device", "gdr", "gdr_used", "net_paths", "intra", "bootstrap", "env", "warnings",
    "net_faults", "failures", "nranks", "hosts", "per_host", "lines", "plugin_version"}:
      network     "IB" | "Socket" | a plugin's name ("IBext_v8", "AWS Libfabric"): "Using network X", else
                  the network that listed devices (IB before Socket, as NCCL tries them), else the one of
                  the NET channel lines, else the net plugin an error passed through
      network_from "using" | "devices" | "channels" | "error" | None: which of those said it
      provider    the libfabric provider aws-ofi-nccl selected ("efa"), else None
      plugin_version  the net plugin's banner, "<name> <version>" ("aws-ofi-nccl 1.14.0", "FasTrak 1.0.17",
                  "gIB 1.0.6", "GPUDirectTCPX 3.1.8"), else None
      net_faults  up to 10 lines (INFO or WARN) that show the network failing: timed out, refused, closed by
                  the peer, unreachable, a completion error
      failures    up to 10 of NCCL's own failures, {"stage": "bootstrap"|"proxy"|"connect"|"network",
                  "host", "level": "INFO"|"WARN", "line"}; an INFO one is a retry NCCL may survive
      lines       {"NET/<net>": its "Using" line, "ib_no_device", "gdr_disabled": the first such line}: the
                  evidence a finding quotes
      nranks      the communicator's size ("nranks N"), else the nccl-tests header's rank count, else None
      transport   "NET/" + network
      fabric      the fabric that network is (fabric_of): "efa", "tcpx", "tcpxo", "gib", "ib", "socket", None
      devices     the network's devices on every host, in the order first seen: IB "mlx5_0:1/IB" strings,
                  Socket {"name", "addr"} dicts
      per_host    {host: {"network", "devices", "oob", "bootstrap", "net_paths"}} for each host that listed
                  devices or connections: what that host's ranks used (hosts may name the same rail apart)
      gdr         {HCA name: True/False} from "GPU Direct RDMA Enabled/Disabled for HCA"
      gdr_used    True when a NET connection ran with /GDRDMA (or "GDR 1"), False when NET connections
                  were made without it, None when the log shows no NET connection (one node)
      intra       sorted intra-node transports seen: "P2P/IPC", "P2P/CUMEM", "SHM", "NVLS", ...
    Raises ParseError when the text holds no NCCL INFO line (NCCL_DEBUG=INFO not set, or not NCCL's
    output), or a "NET/... : Using" line names no device.
    """
    r = _Reader()
    for number, raw in enumerate(str(text).splitlines(), 1):
        _read_line(r, raw.rstrip(), number)
    if not r.infos:
        raise ParseError("NCCL log: no 'NCCL INFO' line (run with NCCL_DEBUG=INFO; NCCL prints to stdout "
                         "unless NCCL_DEBUG_FILE is set)")
    return _finish(r)


def _read_line(r: _Reader, line: str, number: int) -> None:
    out = r.out
    version = _NCCL_VERSION.search(line)
    if version and out["version"] is None:
        out["version"], out["cuda"] = version.group("version"), version.group("cuda")
    m = _NCCL_LINE.search(line)
    if not m:
        header = _TESTS_RANK.match(line)
        if header:
            r.tests_ranks.append(int(header.group("rank")))
        return
    name = (m.group("host") or "").rsplit(">:", 1)[-1].rsplit("]", 1)[-1]  # "[1,0]<stdout>:host", "[0] host"
    h = r.host(name)
    msg, level, src = m.group("msg").strip(), m.group("level"), m.group("src") or ""
    if any(f in msg for f in NET_FAULTS) and len(out["net_faults"]) < 10:
        out["net_faults"].append(msg[:300])
    stage = _failure(msg, src, level) if level == "WARN" or "Call to connect" in msg else None
    if stage and len(out["failures"]) < 10:
        out["failures"].append({"stage": stage, "host": name or None, "level": level, "line": msg[:300]})
    if level == "WARN":
        _on_warn(r, msg, src)
        return
    r.infos += 1
    nranks = _NRANKS.search(msg)
    if nranks and out["nranks"] is None and msg.startswith("comm "):
        out["nranks"] = int(nranks.group("n"))
    for pattern, handler in _INFO_LINES:
        found = pattern.match(msg)
        if found:
            handler(r, found, msg, h, number)
            return


def _network(listed: Mapping[str, List[Any]], chosen: Optional[str], paths: Sequence[str],
             raised: Sequence[str]) -> Tuple[Optional[str], Optional[str]]:
    """(network, how it was known): "Using network X", else the first network that listed devices (IB
    before Socket, as NCCL before 2.7 tried them), else the channels' "via NET/Socket/0", else the net
    plugin an error chain passed through."""
    if chosen is not None:
        return chosen, "using"
    found = next((n for n in listed if n != "Socket"), "Socket" if "Socket" in listed else None)
    if found:
        return found, "devices"
    if paths:
        return paths[0].split("/")[1], "channels"
    if raised:
        return raised[0], "error"
    return None, None


def _devices_of(listed: Mapping[str, List[Any]], network: Optional[str]) -> List[Any]:
    if network is None:
        return []
    return list(listed.get(network) or next((v for k, v in listed.items() if k.startswith(network[:2])), []))


#: The fabric a network name belongs to (its "Using network X"): aws-ofi-nccl names itself "AWS Libfabric"
#: (awsefaeks log in ../shared/realworld) or "Libfabric"; Google's plugins "GPUDirectTCPX_v7" (TCPX),
#: "FasTrak" (TCPXO), "gIB" (tests/fixtures/cloud_fabric/*.log cite their sources).
FABRICS = ((re.compile(r"^(AWS )?Libfabric$"), "efa"), (re.compile(r"^GPUDirectTCPX"), "tcpx"),
           (re.compile(r"^FasTrak"), "tcpxo"), (re.compile(r"^gIB"), "gib"), (re.compile(r"^IB"), "ib"),
           (re.compile(r"^(Fast)?Socket$"), "socket"))


def fabric_of(network: Optional[str], provider: Optional[str] = None) -> Optional[str]:
    """"efa" | "tcpx" | "tcpxo" | "gib" | "ib" | "socket" for a log's network, else None (unknown or none);
    aws-ofi-nccl over another libfabric provider than efa is that provider's name."""
    for pattern, fabric in FABRICS:
        if network and pattern.match(network):
            return provider if fabric == "efa" and provider not in (None, "efa") else fabric
    return None


def _finish(r: _Reader) -> Dict[str, Any]:
    """The per-host and whole-log answers from what the lines said."""
    out = r.out
    merged: Dict[str, List[Any]] = {}
    for h in r.by_host.values():
        for net, devs in h["listed"].items():
            merged.setdefault(net, []).extend(d for d in devs if d not in merged.get(net, []))
    out["network"], out["network_from"] = _network(merged, r.chosen, sorted(out["net_paths"]), r.raised)
    chosen = out["network"]
    out["transport"] = "NET/%s" % chosen if chosen else None
    out["fabric"] = fabric_of(chosen, out.get("provider"))
    out["devices"] = _devices_of(merged, chosen)
    for name, h in r.by_host.items():
        if h["oob"] is not None:
            out["oob"] = h["oob"]
        if h["bootstrap"]:
            out["bootstrap"] = h["bootstrap"]
        if not (h["listed"] or h["net_paths"] or h["oob"] or h["bootstrap"]):
            continue
        net = _network(h["listed"], h["chosen"], h["net_paths"], [])[0] or chosen
        out["per_host"][name] = {"network": net, "devices": _devices_of(h["listed"], net), "oob": h["oob"],
                                 "bootstrap": h["bootstrap"], "net_paths": sorted(h["net_paths"])}
    if out["nranks"] is None and r.tests_ranks:
        out["nranks"] = len(set(r.tests_ranks))
    out["gdr_used"] = any(r.net_gdr) if r.net_gdr else None
    out["intra"] = sorted(out["intra"])
    out["net_paths"] = sorted(out["net_paths"])
    return out


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
    lines: Dict[str, str] = {}
    env: Dict[str, str] = {}
    faults: List[str] = []
    failures: List[Dict[str, Any]] = []
    for log in logs:
        gdr.update(log.get("gdr") or {})
        for key, line in (log.get("lines") or {}).items():
            lines.setdefault(key, line)
        env.update(log.get("env") or {})
        faults.extend(f for f in log.get("net_faults") or [] if f not in faults)
        failures.extend(f for f in log.get("failures") or [] if f["line"] not in [g["line"] for g in failures])
    return {
        "version": seen("version"), "transport": seen("transport"), "fabric": seen("fabric"), "plugin": seen("plugin"),
        "plugin_version": seen("plugin_version"),
        "devices": devices,
        "socket_ifaces": sorted({d["name"] for log in logs if log.get("network") == "Socket"
                                 for d in log.get("devices") or [] if isinstance(d, dict)}),
        "oob": sorted({(log.get("oob") or {}).get("name") for log in logs if log.get("oob")}),
        "gdr": gdr, "gdr_used": seen("gdr_used"),
        "intra": sorted({t for log in logs for t in log.get("intra") or []}),
        "net_used": any(log.get("net_paths") for log in logs),
        "ranks": len(logs),
        "suspect_ifaces": suspect_ifaces(logs), "net_faults": faults[:5], "lines": lines, "env": env,
        "ib_no_device": any(log.get("ib_no_device") for log in logs),
        "failures": first_failures(failures),
    }


#: NCCL's stages in the order a failure in one causes the next: a bootstrap that cannot connect leaves no
#: connection to make; a connect that fails makes the proxy's Connect fail; a network error mid-run closes
#: the peers' sockets. The earliest stage is the cause a finding names first.
FAILURE_ORDER = ("bootstrap", "connect", "network", "proxy")


def first_failures(failures: Sequence[Mapping[str, Any]], keep: int = 5) -> List[Dict[str, Any]]:
    """Up to `keep` failures, NCCL's errors (WARN) before its retries (INFO), the cause's stage first."""
    ordered = sorted(failures, key=lambda f: (f.get("level") != "WARN", FAILURE_ORDER.index(f["stage"])
                                               if f.get("stage") in FAILURE_ORDER else len(FAILURE_ORDER)))
    return [dict(f) for f in ordered[:keep]]


def _host_views(log: Mapping[str, Any]) -> List[Mapping[str, Any]]:
    """The log's per-host entries; a log whose lines name no host is one host."""
    return list((log.get("per_host") or {}).values()) or [log]


def suspect_ifaces(logs: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The socket interfaces NCCL listed (its Socket network's devices, or its bootstrap) that cannot carry
    traffic between nodes (suspect_iface), each {"name", "addr", "reason", "role", "used", "hosts"}: role
    "net" (NCCL's socket transport; used: a channel of that host ran "via NET/Socket/<its index>") or
    "bootstrap". Read host by host: the index in a channel line is an index into that host's list."""
    out: Dict[str, Dict[str, Any]] = {}
    for log in logs:
        for host_name, host in _named_hosts(log):
            roles = [("net", host.get("devices") or [])] if host.get("network") == "Socket" else []
            roles.append(("bootstrap", host.get("bootstrap") or []))
            for role, ifaces in roles:
                for index, iface in enumerate(ifaces):
                    reason = suspect_iface(iface) if isinstance(iface, dict) else None
                    if not reason or (role == "bootstrap" and "net:%s" % iface["name"] in out):
                        continue
                    used = role == "net" and any(p.split("/")[2:3] == [str(index)] for p in host.get("net_paths") or []
                                                 if p.startswith("NET/Socket/"))
                    entry = out.setdefault("%s:%s" % (role, iface["name"]), {
                        "name": iface["name"], "addr": iface.get("addr"), "reason": reason, "role": role,
                        "used": False, "hosts": []})
                    entry["used"] = entry["used"] or used
                    if host_name and host_name not in entry["hosts"]:
                        entry["hosts"].append(host_name)
    return sorted(out.values(), key=lambda e: (e["role"] != "net", e["name"]))


def _named_hosts(log: Mapping[str, Any]) -> List[Tuple[Optional[str], Mapping[str, Any]]]:
    per_host = log.get("per_host") or {}
    return list(per_host.items()) if per_host else [(None, log)]


def hca_names(devices: Sequence[Any]) -> List[str]:
    """'mlx5_0:1/IB' -> 'mlx5_0:1' for each IB device NCCL listed (socket dicts are not HCAs)."""
    return [str(d).split("/", 1)[0] for d in devices if not isinstance(d, dict)]


def hca_mismatch(devices_by_host: Mapping[str, Sequence[Any]], spec: Optional[str]) -> Optional[Dict[str, Any]]:
    """When NCCL_IB_HCA names HCAs (`spec` without "^") and the hosts' NCCL listed different HCAs:
    {"spec", "groups": [[hosts, [HCA names]], ...]} (most hosts first); else None. NCCL pairs HCAs
    across ranks by their place in its list, so one name list for hosts that name the same rail apart
    (mlx5_0 here, mlx5_1 there) picks a different rail, or none, on some of them (NVIDIA/nccl#981, #1277)."""
    if not spec or not spec.strip() or spec.strip().startswith("^"):
        return None
    groups: Dict[Tuple[str, ...], List[str]] = {}
    for host, devices in devices_by_host.items():
        names = tuple(hca_names(devices))
        if names:
            groups.setdefault(names, []).append(host)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda g: (-len(g[1]), sorted(g[1])))
    return {"spec": spec.strip(), "groups": [[sorted(hosts), list(names)] for names, hosts in ordered]}


def ifname_allows(spec: Optional[str], name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME `spec` admits interface `name` (NCCL's syntax: comma list, "^" excludes,
    "=" exact match, else prefix match). No spec admits everything but lo and docker*, as NCCL does."""
    if not spec:
        return not (name == "lo" or name.startswith("docker"))
    return nccl_selects(spec.strip(), name)

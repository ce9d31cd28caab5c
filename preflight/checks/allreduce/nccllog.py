"""What NCCL chose, read from its NCCL_DEBUG=INFO output: network, devices, GPUDirect RDMA, intra-node paths.

Pure parsing, controller side: preflight.probe.bench_agent runs every nccl rank with NCCL_DEBUG_ENV and
sends each rank's log back; the allreduce check (preflight/checks/allreduce.py) turns what this module
reads into per-node findings.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

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
#   NET/OFI Selected Provider is efa                              aws-ofi-nccl (the libfabric provider)
#   Call to connect returned Connection timed out, retrying       misc/socket.cc (INFO, yet a network fault:
#                                                                 the peer's address does not answer)
# When the log has no "Using" line (an excerpt, or a failure before init ended), the network is read from
# the channel lines ("via NET/Socket/0") and then from the error chain: "transport/net_socket.cc:368 -> 6"
# is the socket plugin, "transport/net_ib.cc" / ib_plugin.c / "NET/IB :" WARN the IB one (NCCL prints the
# source file of every frame an error passes: misc/debug.cc NCCLCHECK). Checked against 15 real logs
# (../shared/realworld/nccl_info, tests/test_realworld_nccl.py) and fixtures modelled on them.
# Real logs in these formats are quoted in the NVIDIA/nccl issue tracker; tests/fixtures/allreduce/ holds
# fixtures modelled on them, each naming its source.

_NCCL_LINE = re.compile(r"(?P<host>\S*?):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE) ?(?P<msg>.*)$")
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\w.]+))?")
_NET_USING = re.compile(r"^NET/(?P<net>\w+) ?: Using (?P<devs>.*?)(?:\s*; OOB (?P<oob>\S*))?\s*$")
_NET_DEV = re.compile(r"\[(?P<index>\d+)\](?P<dev>\S+)")
_SOCK_DEV = re.compile(r"^(?P<name>[^:\s]+):(?P<addr>.*)<\d+>$")
_GDR_HCA = re.compile(r"^NET/(?P<net>\w+) ?: GPU Direct RDMA (?P<state>Enabled|Disabled) for HCA (?P<index>\d+) '(?P<name>[^']*)'")
_GDR_OLD = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU \S+ / HCA (?P<index>\d+)")
_CONNECT = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : \d+(?:\[\w+\])? -> \d+(?:\[\w+\])?(?: \[(?:send|receive)\])? via (?P<via>.+?)\s*$")
_RING_GDR = re.compile(r"Connected all rings.*\bGDR (?P<gdr>\d)")
_ENV_SET = re.compile(r"^(?P<var>NCCL_\w+) set (?:by environment )?to (?P<value>.*)$")
_NRANKS = re.compile(r"\bnranks (?P<n>\d+)\b", re.I)
_TESTS_RANK = re.compile(r"^#\s+Rank\s+(?P<rank>\d+) Group")
_PROVIDER = re.compile(r"^NET/OFI Selected Provider is (?P<provider>\S+)")
_ERR_FRAME = re.compile(r"^(?:transport/)?(?P<file>net_socket|net_ib|ib_plugin|p2p_plugin)\.cc?:\d+ -> \d+")
# Lines that show the network failing between nodes (NCCL misc/socket.cc, transport/net_ib.cc, ibvwrap.cc).
NET_FAULTS = ("Connection timed out", "Connection refused", "Connection closed by remote peer", "Broken pipe",
              "Network is unreachable", "No route to host", "Connection reset by peer", "Got completion from peer")
# Interfaces NCCL should never carry traffic over between nodes: a container's end of a veth pair, a bridge of
# a container runtime, loopback (their addresses do not route between hosts).
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


def parse_nccl_log(text: str) -> Dict[str, Any]:
    """What NCCL chose, from one rank's NCCL_DEBUG=INFO output (lines of other programs are ignored).

    Returns {"version", "cuda", "plugin", "provider", "network", "network_from", "transport", "devices",
    "oob", "ib_no_device", "gdr", "gdr_used", "net_paths", "intra", "bootstrap", "env", "warnings",
    "net_faults", "nranks", "hosts"}:
      network     "IB" | "Socket" | a plugin's name ("IBext_v8", "AWS Libfabric"): "Using network X", else
                  the network that listed devices (IB before Socket, as NCCL tries them), else the one of
                  the NET channel lines, else the net plugin an error passed through
      network_from "using" | "devices" | "channels" | "error" | None: which of those said it
      provider    the libfabric provider aws-ofi-nccl selected ("efa"), else None
      net_faults  up to 10 lines (INFO or WARN) that show the network failing: timed out, refused, closed by
                  the peer, unreachable, a completion error
      lines       {"NET/<net>": its "Using" line, "ib_no_device", "gdr_disabled": the first such line}: the
                  evidence a finding quotes
      nranks      the communicator's size ("nranks N"), else the nccl-tests header's rank count, else None
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
        "bootstrap": [], "env": {}, "warnings": [], "hosts": [], "provider": None, "network_from": None,
        "net_faults": [], "nranks": None, "lines": {},
    }
    tests_ranks: List[int] = []
    raised: List[str] = []
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
            header = _TESTS_RANK.match(line)
            if header:
                tests_ranks.append(int(header.group("rank")))
            continue
        host = m.group("host").rsplit(">:", 1)[-1].rsplit("]", 1)[-1]
        if host and host not in hosts:
            hosts.append(host)
        msg = m.group("msg").strip()
        fault = any(f in msg for f in NET_FAULTS)
        if fault and len(out["net_faults"]) < 10:
            out["net_faults"].append(msg[:300])
        where = re.search(r"\b(\w+)\.cc?:\d+ NCCL WARN", line)
        if m.group("level") == "WARN":
            if where and where.group(1) in ("ib_plugin", "p2p_plugin", "net_ib", "ibvwrap") or msg.startswith("NET/IB"):
                raised.append("IB")
            elif where and where.group(1) == "net_socket":
                raised.append("Socket")
            if len(out["warnings"]) < 10:
                out["warnings"].append(msg[:300])
            continue
        infos += 1
        frame = _ERR_FRAME.match(msg)
        if frame:
            raised.append("Socket" if frame.group("file") == "net_socket" else "IB")
            continue
        nranks = _NRANKS.search(msg)
        if nranks and out["nranks"] is None and msg.startswith("comm "):
            out["nranks"] = int(nranks.group("n"))
        provider = _PROVIDER.match(msg)
        if provider:
            out["provider"] = provider.group("provider")
            continue
        using = _NET_USING.match(msg)
        if using:
            net = using.group("net")
            devs = [d.group("dev") for d in _NET_DEV.finditer(using.group("devs"))]
            out["lines"].setdefault("NET/" + net, msg[:300])
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
            out["lines"].setdefault("ib_no_device", msg[:300])
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
            if gdr.group("state") == "Disabled":
                out["lines"].setdefault("gdr_disabled", msg[:300])
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
    if chosen is not None:
        out["network_from"] = "using"
    else:  # before NCCL 2.7: the first network that found devices (IB before Socket)
        chosen = next((n for n in listed if n != "Socket"), "Socket" if "Socket" in listed else None)
        out["network_from"] = "devices" if chosen else None
    if chosen is None and out["net_paths"]:  # "via NET/Socket/0": the network the connection used
        chosen, out["network_from"] = out["net_paths"][0].split("/")[1], "channels"
    if chosen is None and raised:  # the net plugin an error passed through
        chosen, out["network_from"] = raised[0], "error"
    if out["nranks"] is None and tests_ranks:
        out["nranks"] = len(set(tests_ranks))
    out["network"] = chosen
    out["transport"] = "NET/%s" % chosen if chosen else None
    if chosen is not None:
        out["devices"] = listed.get(chosen) or next((v for k, v in listed.items() if k.startswith(chosen[:2])), [])
    out["gdr_used"] = any(net_gdr) if net_gdr else None
    out["intra"] = sorted(out["intra"])
    out["net_paths"] = sorted(out["net_paths"])
    out["hosts"] = hosts
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
    for log in logs:
        gdr.update(log.get("gdr") or {})
        for key, line in (log.get("lines") or {}).items():
            lines.setdefault(key, line)
        env.update(log.get("env") or {})
        faults.extend(f for f in log.get("net_faults") or [] if f not in faults)
    return {
        "version": seen("version"), "transport": seen("transport"), "plugin": seen("plugin"), "devices": devices,
        "socket_ifaces": sorted({d["name"] for log in logs if log.get("network") == "Socket"
                                 for d in log.get("devices") or [] if isinstance(d, dict)}),
        "oob": sorted({(log.get("oob") or {}).get("name") for log in logs if log.get("oob")}),
        "gdr": gdr, "gdr_used": seen("gdr_used"),
        "intra": sorted({t for log in logs for t in log.get("intra") or []}),
        "net_used": any(log.get("net_paths") for log in logs),
        "ranks": len(logs),
        "suspect_ifaces": suspect_ifaces(logs), "net_faults": faults[:5], "lines": lines, "env": env,
        "ib_no_device": any(log.get("ib_no_device") for log in logs),
    }


def suspect_ifaces(logs: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The socket interfaces NCCL listed (its Socket network's devices, or its bootstrap) that cannot carry
    traffic between nodes (suspect_iface), each {"name", "addr", "reason", "role", "used"}: role "net"
    (NCCL's socket transport; used: a channel ran "via NET/Socket/<its index>") or "bootstrap"."""
    out: Dict[str, Dict[str, Any]] = {}
    for log in logs:
        roles = [("net", log.get("devices") or [])] if log.get("network") == "Socket" else []
        roles.append(("bootstrap", log.get("bootstrap") or []))
        for role, ifaces in roles:
            for index, iface in enumerate(ifaces):
                reason = suspect_iface(iface) if isinstance(iface, dict) else None
                if not reason:
                    continue
                used = role == "net" and any(p.split("/")[2:3] == [str(index)] for p in log.get("net_paths") or []
                                             if p.startswith("NET/Socket/"))
                if role == "bootstrap" and "net:%s" % iface["name"] in out:
                    continue
                entry = out.setdefault("%s:%s" % (role, iface["name"]), {
                    "name": iface["name"], "addr": iface.get("addr"), "reason": reason, "role": role, "used": False})
                entry["used"] = entry["used"] or used
    return sorted(out.values(), key=lambda e: (e["role"] != "net", e["name"]))


def ifname_allows(spec: Optional[str], name: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME `spec` admits interface `name` (NCCL's syntax: comma list, "^" excludes,
    "=" exact match, else prefix match). No spec admits everything but lo and docker*, as NCCL does."""
    if not spec:
        return not (name == "lo" or name.startswith("docker"))
    return nccl_selects(spec.strip(), name)

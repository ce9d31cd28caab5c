"""Which interface is each node's data network: the one choice mtu, ports, the env file and the bench share.

Controller only (never shipped to the nodes). `choose(view)` reads the nic check's facts (every node's
interfaces, from preflight/checks/nic/'s probe) and picks, per node, the one interface that NCCL's bootstrap,
gloo, the rendezvous port and the bandwidth test will use. It is the single source of truth for that
choice: the nic, mtu and ports rules, the NCCL env-file writer and the bench launcher all call it, so
they can never disagree about which interface "the data network" is.

Selection policy (see `choose`):

1. A node's `data_interface` inventory setting pins its interface; the pinned interface must exist, be up
   and hold an IPv4 address, or the node fails.
2. Otherwise candidates are interfaces that are up, hold a global IPv4 address, and are not loopback,
   container/VM bridges (docker*, virbr*, br-*, cni*, ...), container-side veths (veth*, cali*, ...),
   VPNs or tunnels. Kind alone never excludes a veth: a simulated node's real links are veths named eth0.
3. Candidate addresses are grouped by subnet. A subnet where some address is held by EVERY node
   (docker0's 172.17.0.1 on every host) on a virtual link is host-local, not a network between the
   nodes: excluded. The same address on only some of the nodes, or on every node's physical NIC (a
   two-node cluster), is an address conflict: those nodes fail, named together.
4. The data subnet is the best subnet held by every live node (or, failing that, by a strict majority, so
   that one node whose data NIC is down fails on its own instead of silently moving the whole cluster to
   the management network). A down interface still holds its configured address: a subnet configured on
   enough nodes counting down links stays the data network when it would win with its links up, or when
   the up-only choice would be the management network (2 of 2, or 2 of 4, data NICs down); the nodes
   whose link is down then fail ("data NIC down"). Ranking: highest typical (upper-median) speed, then
   MTU, then coverage, then not the management network (the subnet of the address the controller
   connected to: sshd's SSH_CONNECTION on the node, or the inventory host when it is an IP). A
   management port of 1 Gb/s or of unknown speed ranks below every other candidate. Subnets pinned by `data_interface` on some nodes come first.
5. Each node's interface is its best candidate in that subnet (speed, MTU, not management, name).
"""

from __future__ import annotations

import ipaddress
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import fold
from preflight.model import ClusterView, probe_error

#: The check whose facts (the node's interfaces) the choice reads.
CHECK_NAME = "nic"
#: Its name on the view (ClusterView.derived)
DERIVED = "datanet"

#: Interface-name prefixes that never carry the data network, with the reason shown in the report.
#: Interface-name prefixes that never carry the data network, with the reason shown in the report.
EXCLUDED_PREFIXES: Tuple[Tuple[str, str], ...] = (
    ("docker", "container bridge"),
    ("br-", "container bridge"),
    ("virbr", "VM bridge"),
    ("lxcbr", "container bridge"),
    ("lxdbr", "container bridge"),
    ("podman", "container bridge"),
    ("cni", "container network"),
    ("flannel", "container network"),
    ("cilium", "container network"),
    ("kube-", "container network"),
    ("weave", "container network"),
    ("vxlan.calico", "container network"),
    ("cali", "container veth"),
    ("veth", "container veth"),
    ("lxc", "container veth"),
    ("tailscale", "VPN"),
    ("wg", "VPN"),
    ("zt", "VPN"),
    ("tun", "tunnel"),
    ("tap", "tunnel"),
)
#: linkinfo kinds that are tunnels or overlays, whatever their name.
EXCLUDED_KINDS = {
    "tun": "tunnel",
    "wireguard": "VPN",
    "vxlan": "overlay",
    "geneve": "overlay",
    "ipip": "tunnel",
    "gre": "tunnel",
    "gretap": "tunnel",
    "sit": "tunnel",
    "dummy": "dummy interface",
}
#: A management port at or below this speed (Mb/s), or of unknown speed, never wins over another candidate.
SLOW_MGMT_MBPS = 1000


def speed_text(mbps: Optional[int]) -> str:
    """100000 → '100 Gb/s', 2500 → '2.5 Gb/s', 100 → '100 Mb/s', None → 'speed unknown'."""
    if mbps is None:
        return "speed unknown"
    if mbps >= 1000:
        return "%g Gb/s" % (mbps / 1000.0)
    return "%d Mb/s" % mbps


def excluded_reason(iface: Dict[str, Any]) -> Optional[str]:
    """Why this interface can never carry the data network (by name or kind), or None."""
    name, kind = iface["name"], iface.get("kind")
    if kind == "loopback" or name == "lo":
        return "loopback"
    for prefix, why in EXCLUDED_PREFIXES:
        if name.startswith(prefix):
            return why
    if kind in EXCLUDED_KINDS:
        return EXCLUDED_KINDS[kind]
    return None


def _ipv4(iface: Dict[str, Any]) -> List[ipaddress.IPv4Interface]:
    out = []
    for addr in iface.get("addresses") or []:
        try:
            ifa = ipaddress.ip_interface("%s/%s" % (addr["ip"], addr["prefixlen"]))
        except (KeyError, ValueError):
            continue
        if ifa.version == 4 and not (ifa.ip.is_loopback or ifa.ip.is_link_local or ifa.ip.is_unspecified):
            out.append(ifa)
    return out


@dataclass
class _Cand:
    node: str
    iface: Dict[str, Any]
    addr: ipaddress.IPv4Interface
    mgmt: bool

    @property
    def name(self) -> str:
        return self.iface["name"]

    def entry(self, pinned: bool) -> Dict[str, Any]:
        return {
            "iface": self.name,
            "ip": str(self.addr.ip),
            "prefixlen": self.addr.network.prefixlen,
            "mtu": self.iface.get("mtu"),
            "speed_mbps": self.iface.get("speed_mbps"),
            "kind": self.iface.get("kind"),
            "subnet": str(self.addr.network),
            "pinned": pinned,
            "management": self.mgmt,
        }


def _node_rank(c: _Cand) -> Tuple[Any, ...]:
    slow_mgmt = c.mgmt and (c.iface.get("speed_mbps") or 0) <= SLOW_MGMT_MBPS
    return (not slow_mgmt, c.iface.get("speed_mbps") or 0, c.iface.get("mtu") or 0, not c.mgmt, _neg_name(c.name))


def _neg_name(name: str) -> Tuple[int, ...]:
    """A key that sorts names in reverse, so that max() picks the alphabetically first name."""
    return tuple(-ord(ch) for ch in name) + (0,)


@dataclass
class Choice:
    """The data interface chosen per node, or why a node has none.

    nodes    {node: {iface, ip, prefixlen, mtu, speed_mbps, kind, subnet, pinned, management}}
    missing  {node: reason it has no data interface}
    skipped  {node: [(iface, why it was passed over)]} (up interfaces with an IPv4 address only)
    subnet   the data subnet ("198.19.0.0/16"), None when none qualified
    reason   the overall reason text
    """

    nodes: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    missing: Dict[str, str] = field(default_factory=dict)
    skipped: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)
    subnet: Optional[str] = None
    reason: str = ""

    def get(self, node: str) -> Optional[Dict[str, Any]]:
        return self.nodes.get(node)

    @property
    def names(self) -> List[str]:
        """The distinct chosen interface names, sorted."""
        return sorted({entry["iface"] for entry in self.nodes.values()})

    @property
    def uniform(self) -> bool:
        """True when every node with a choice uses the same interface name."""
        return len(self.names) <= 1

    def socket_ifname(self) -> Optional[str]:
        """An NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME value: '=eth1', or '=eth1,ens1f0' when names differ.

        The leading '=' asks NCCL for exact names (a bare 'eth1' would also match eth10).
        """
        return "=" + ",".join(self.names) if self.names else None

    def to_json(self) -> Dict[str, Any]:
        return {
            "nodes": self.nodes,
            "missing": self.missing,
            "skipped": {k: [list(p) for p in v] for k, v in self.skipped.items()},
            "subnet": self.subnet,
            "reason": self.reason,
        }


def _mgmt_ips(view: ClusterView, name: str, facts: Dict[str, Any]) -> set:
    ips = set()
    if facts.get("ssh_ip"):
        ips.add(str(facts["ssh_ip"]))
    try:
        ips.add(str(ipaddress.ip_address(view.node(name).host)))
    except ValueError:
        pass
    return ips


def of(view: ClusterView) -> Choice:
    """The data-network choice carried on the view: choose(view) once, on first use (ClusterView.derive).

    Every reader (the nic, mtu, ports and nccl_env rules and plans, the env file, the bench launcher)
    calls this, never choose(): the engine derives it once after phase 1 (it reads only phase-1 facts:
    nic interfaces, the ssh check's connection address, inventory settings) and carries it into the
    later views.
    """
    return view.derive(DERIVED, choose)


def choose(view: ClusterView) -> Choice:
    """Pick each live node's data interface (policy in the module docstring). Pure.

    The steps: the candidates (`_survey`), addresses every node shares or some nodes both hold
    (`_shared_addresses`), the data subnet (`_data_subnet`: a quorum's best, kept where down links are), each
    node's interface (`_node_choice`: pinned by the inventory, else its best in the data subnet), the reason."""
    choice = Choice()
    survey = _survey(view, choice)
    _shared_addresses(survey)
    data_net, down_nodes = _data_subnet(survey)
    choice.subnet = data_net
    for name in survey.nodes:
        entry, why = _node_choice(survey, name, data_net, down_nodes)
        if entry is None:
            choice.missing[name] = why
        else:
            choice.nodes[name] = entry
            _explain_skips(choice, name, survey.cands[name], survey.rejected)
    choice.reason = _reason(survey, data_net, down_nodes)
    return choice


@dataclass
class _Survey:
    """The live nodes' addresses as the choice weighs them.

    facts       {node: nic facts} of the nodes whose nic probe answered
    nodes       those of them that are live, in inventory order
    cands       {node: candidates on up interfaces}
    down        {node: candidates on interfaces that are down}: configured, not usable
    pinned      {node: the inventory's data_interface}
    host_local  {subnet: why}: subnets where some address is on every node (docker0's 172.17.0.1)
    conflicts   {node: {ip: "198.19.0.12 on eth1 is also on n003"}}
    by_subnet   {subnet: {node: its up candidates there}}
    rejected    {subnet: why it is not the data subnet}
    """

    facts: Dict[str, Dict[str, Any]]
    nodes: List[str]
    pinned: Dict[str, str]
    cands: Dict[str, List[_Cand]] = field(default_factory=dict)
    down: Dict[str, List[_Cand]] = field(default_factory=dict)
    host_local: Dict[str, str] = field(default_factory=dict)
    conflicts: Dict[str, Dict[str, str]] = field(default_factory=dict)
    by_subnet: Dict[str, Dict[str, List[_Cand]]] = field(default_factory=dict)
    rejected: Dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.nodes)

    def rank(self, net: str, holders: Optional[Dict[str, List[_Cand]]] = None) -> Tuple[Any, ...]:
        """How good a subnet is as the data network (higher wins)."""
        # Typical (upper-median) speed and MTU: one node's degraded link must not move the cluster off
        # its data network; that node is reported by the speed-drift and mtu rules instead. With
        # `holders` (up or down interfaces), a down link's unknown speed does not count.
        per_node = [_best(cs) for cs in (holders or self.by_subnet[net]).values()]
        speeds = [c.iface.get("speed_mbps") or 0 for c in per_node]
        if holders:
            speeds = [s for s in speeds if s] or [0]
        speed = statistics.median_high(speeds)
        mtu = statistics.median_high([c.iface.get("mtu") or 0 for c in per_node])
        mgmt = any(c.mgmt for c in per_node)
        slow_mgmt = mgmt and speed <= SLOW_MGMT_MBPS
        pins = sum(1 for c in per_node if self.pinned.get(c.node) == c.name)
        return (pins, not slow_mgmt, speed, mtu, len(per_node), not mgmt, _neg_name(net))


def _best(cs: List[_Cand]) -> _Cand:
    return max(cs, key=_node_rank)


def _survey(view: ClusterView, choice: Choice) -> _Survey:
    """Every live node's candidates: up, IPv4, not excluded by name or kind (the rest noted in
    choice.skipped; a node without nic facts in choice.missing)."""
    facts_by_node: Dict[str, Dict[str, Any]] = {}
    for name, facts in view.of(CHECK_NAME).items():
        if probe_error(CHECK_NAME, name, facts) is not None or not isinstance(facts.get("interfaces"), list):
            choice.missing[name] = "no interface facts (the nic probe failed)"
        else:
            facts_by_node[name] = facts
    nodes = [n.name for n in view.live if n.name in facts_by_node]
    pinned = {n: view.node(n).settings.get("data_interface") for n in nodes}
    survey = _Survey(facts_by_node, nodes, {n: p for n, p in pinned.items() if p})
    for name in nodes:
        mgmt_ips = _mgmt_ips(view, name, facts_by_node[name])
        skipped = choice.skipped.setdefault(name, [])
        survey.cands[name] = []
        for iface in facts_by_node[name]["interfaces"]:
            addrs = _ipv4(iface)
            if not addrs:
                continue
            why = excluded_reason(iface)
            if why == "loopback":
                continue
            if why:
                skipped.append((iface["name"], why))
                continue
            is_mgmt = any(str(a.ip) in mgmt_ips for a in addrs)
            if not iface.get("up"):
                skipped.append((iface["name"], "down"))
                survey.down.setdefault(name, []).extend(_Cand(name, iface, addr, is_mgmt) for addr in addrs)
                continue
            for addr in addrs:
                survey.cands[name].append(_Cand(name, iface, addr, is_mgmt))
    return survey


def _shared_addresses(survey: _Survey) -> None:
    """Fills the survey's host-local subnets, address conflicts and subnets.

    Host-local subnets: some address in them is held by EVERY node (docker0's 172.17.0.1) on a virtual
    link. The same address on only some of the nodes, or on every node's physical NIC (two hosts), is
    an address conflict between them, named on each of them."""
    cands = survey.cands
    holders_of_ip: Dict[str, set] = {}
    for name in survey.nodes:
        for c in cands[name]:
            holders_of_ip.setdefault(str(c.addr.ip), set()).add(name)
    for ip, holders in holders_of_ip.items():
        if len(holders) < 2:
            continue
        holding = [c for name in holders for c in cands[name] if str(c.addr.ip) == ip]
        if len(holders) == survey.total and not all(c.iface.get("physical") for c in holding):
            survey.host_local.setdefault(str(holding[0].addr.network), "same address %s on every node" % ip)
            continue
        for name in holders:
            iface_name = next(c.name for c in cands[name] if str(c.addr.ip) == ip)
            survey.conflicts.setdefault(name, {})[ip] = "%s on %s is also on %s" % (
                ip, iface_name, fold(holders - {name}))
    for name in survey.nodes:
        for c in cands[name]:
            survey.by_subnet.setdefault(str(c.addr.network), {}).setdefault(name, []).append(c)


def _data_subnet(survey: _Survey) -> Tuple[Optional[str], Dict[str, List[_Cand]]]:
    """(the data subnet, {node: its down candidates there}): the best subnet a quorum of nodes holds (all of
    one or two nodes, else a strict majority), kept where its links went down (_down_data_net). Fills
    survey.rejected with why every other subnet is not it."""
    total, by_subnet = survey.total, survey.by_subnet
    quorum = total if total <= 2 else total // 2 + 1
    qualified = [net for net, holders in by_subnet.items() if net not in survey.host_local and len(holders) >= quorum]
    rejected: Dict[str, str] = dict(survey.host_local)
    for net, holders in by_subnet.items():
        if net not in rejected and net not in qualified:
            rejected[net] = "only on %d of %d nodes" % (len(holders), total)
    data_net = max(qualified, key=survey.rank) if qualified else None
    data_net, down_nodes = _down_data_net(data_net, by_subnet, survey.down, survey.host_local, quorum, survey.rank)
    rejected.pop(data_net, None)
    survey.rejected = rejected
    return data_net, down_nodes


def _node_choice(survey: _Survey, name: str, data_net: Optional[str],
                 down_nodes: Dict[str, List[_Cand]]) -> Tuple[Optional[Dict[str, Any]], str]:
    """(one node's choice entry, '') or (None, why it has none): the inventory's data_interface when set,
    else its best candidate in the data subnet whose address no other node holds."""
    want = survey.pinned.get(name)
    if want:
        return _pinned_entry(name, want, survey.facts[name]["interfaces"], survey.cands[name], data_net)
    by_subnet = survey.by_subnet
    if data_net is None:
        return None, _no_subnet_reason(name, survey.cands[name], survey.rejected, survey.total)
    if name in down_nodes:
        return None, _down_reason(down_nodes[name], data_net, by_subnet.get(data_net) or {})
    if not by_subnet.get(data_net):  # up on no node: configured on the down nodes only
        return None, "no interface in the data subnet %s (configured on %s, down there)" % (data_net, fold(down_nodes))
    if name not in by_subnet[data_net]:
        return None, _not_in_subnet_reason(name, data_net, by_subnet[data_net], survey.facts[name])
    mine = by_subnet[data_net][name]
    conflicts = survey.conflicts.get(name, {})
    clean = [c for c in mine if str(c.addr.ip) not in conflicts]
    if clean:
        return _best(clean).entry(pinned=False), ""
    return None, "address conflict: " + "; ".join(conflicts[str(c.addr.ip)] for c in mine)


def _reason(survey: _Survey, data_net: Optional[str], down_nodes: Dict[str, List[_Cand]]) -> str:
    """'data subnet 198.19.0.0/16 on 4 of 4 nodes (100 Gb/s, mtu 9000); passed over ...', or why none."""
    by_subnet, rejected, total = survey.by_subnet, survey.rejected, survey.total
    if data_net is None:
        return "no subnet is shared by the nodes" + (
            " (%s)" % "; ".join("%s: %s" % kv for kv in sorted(rejected.items())) if rejected else ""
        )
    if not by_subnet.get(data_net):
        return "data subnet %s is configured on %d of %d nodes and down on every one" % (
            data_net,
            len(down_nodes),
            total,
        )
    holders = by_subnet[data_net]
    per_node = [_best(cs) for cs in holders.values()]
    speeds = sorted({c.iface.get("speed_mbps") for c in per_node}, key=lambda s: s or 0)
    reason = "data subnet %s on %d of %d nodes (%s, mtu %s)" % (
        data_net,
        len(holders),
        total,
        "/".join(speed_text(s) for s in speeds),
        "/".join(str(m) for m in sorted({c.iface.get("mtu") for c in per_node})),
    )
    others = [
        "%s (%s)" % (net, _subnet_note(net, by_subnet, rejected, data_net))
        for net in sorted(by_subnet)
        if net != data_net
    ]
    if others:
        reason += "; passed over " + ", ".join(others)
    if down_nodes:
        reason += "; down on %s" % fold(down_nodes)
    return reason


def _down_data_net(
    data_net: Optional[str],
    by_subnet: Dict[str, Dict[str, List[_Cand]]],
    down: Dict[str, List[_Cand]],
    host_local: Dict[str, str],
    quorum: int,
    subnet_rank: Any,
) -> Tuple[Optional[str], Dict[str, List[_Cand]]]:
    """(the data subnet, {node: its down candidates there}) once down links are counted as configured.

    A link going down must not move the cluster to another network: a subnet configured on a quorum of
    nodes (up or down) is the data network when it would outrank the up-only choice with its links up,
    or when the up-only choice is the management network and it is not. Its down nodes then fail.
    """
    configured: Dict[str, Dict[str, List[_Cand]]] = {}
    for name, cs in down.items():
        for c in cs:
            net = str(c.addr.network)
            if net not in host_local and name not in by_subnet.get(net, {}):
                configured.setdefault(net, {}).setdefault(name, []).append(c)
    best_net, best_rank = None, None
    for net, down_holders in configured.items():
        holders = dict(by_subnet.get(net, {}))
        holders.update(down_holders)
        if net == data_net or len(holders) < quorum:
            continue
        rank = subnet_rank(net, holders)
        if best_rank is None or rank > best_rank:
            best_net, best_rank = net, rank
    if best_net is None:
        return data_net, {n: cs for n, cs in configured.get(data_net, {}).items()} if data_net else {}
    if data_net is not None:
        current = subnet_rank(data_net)
        pinned_here = current[0] > 0  # the rank's first key counts data_interface pins in the subnet
        mgmt_here = any(c.mgmt for cs in by_subnet[data_net].values() for c in cs)
        mgmt_there = any(c.mgmt for cs in configured[best_net].values() for c in cs) or any(
            c.mgmt for cs in by_subnet.get(best_net, {}).values() for c in cs
        )
        if pinned_here or not ((mgmt_here and not mgmt_there) or best_rank > current):
            return data_net, {n: cs for n, cs in configured.get(data_net, {}).items()}
    return best_net, configured[best_net]


def _down_reason(cands: List[_Cand], data_net: str, up_holders: Dict[str, List[_Cand]]) -> str:
    """'data NIC down: eth1 198.19.0.12/16 is down (operstate DOWN); the data subnet 198.19.0.0/16 is up on n[001,004]'."""
    c = cands[0]
    where = "up on %s" % fold(up_holders) if up_holders else "down on every node that has it"
    return "data NIC down: %s %s/%d is down (operstate %s); the data subnet %s is %s" % (
        c.name,
        c.addr.ip,
        c.addr.network.prefixlen,
        c.iface.get("state") or "DOWN",
        data_net,
        where,
    )


def _subnet_note(
    net: str, by_subnet: Dict[str, Dict[str, List[_Cand]]], rejected: Dict[str, str], data_net: str
) -> str:
    if net in rejected:
        return rejected[net]
    cs = [c for cands in by_subnet[net].values() for c in cands]
    if any(c.mgmt for c in cs):
        return "management"
    mine = statistics.median_high([c.iface.get("speed_mbps") or 0 for c in cs])
    data = [c for cands in by_subnet[data_net].values() for c in cands]
    if mine < statistics.median_high([c.iface.get("speed_mbps") or 0 for c in data]):
        return "slower, %s" % speed_text(mine or None)
    return "ranked lower"


def _pinned_entry(
    name: str, want: str, interfaces: List[Dict[str, Any]], cands: List[_Cand], data_net: Optional[str]
) -> Tuple[Optional[Dict[str, Any]], str]:
    iface = next((i for i in interfaces if i["name"] == want), None)
    label = "data_interface %s (set in the inventory)" % want
    if iface is None:
        return None, "%s does not exist on this node" % label
    if not iface.get("up"):
        return None, "%s is down (operstate %s)" % (label, iface.get("state") or "?")
    addrs = _ipv4(iface)
    if not addrs:
        return None, "%s has no IPv4 address" % label
    mine = [c for c in cands if c.name == want]
    in_net = [c for c in mine if data_net and str(c.addr.network) == data_net]
    if in_net:
        return in_net[0].entry(pinned=True), ""
    if mine:
        return mine[0].entry(pinned=True), ""
    # Pinned but excluded by name/kind (e.g. a bridge named br-data): the user's word wins.
    return _Cand(name, iface, addrs[0], False).entry(pinned=True), ""


def _no_subnet_reason(name: str, cands: List[_Cand], rejected: Dict[str, str], total: int) -> str:
    if not cands:
        return "no up interface with an IPv4 address (other than loopback, bridges, container links)"
    parts = [
        "%s %s/%d: %s" % (c.name, c.addr.ip, c.addr.network.prefixlen, rejected.get(str(c.addr.network), "?"))
        for c in cands
    ]
    return "no interface in a subnet shared by the %d nodes (%s)" % (total, "; ".join(parts))


def _not_in_subnet_reason(name: str, data_net: str, holders: Dict[str, List[_Cand]], facts: Dict[str, Any]) -> str:
    names = sorted({cs[0].name for cs in holders.values()})
    net = ipaddress.ip_network(data_net)
    text = "no up interface in the data subnet %s (held by %s on %s)" % (
        data_net,
        "/".join(names),
        fold(holders),
    )
    notes = []
    for iface in facts["interfaces"]:
        in_net = any(a in net for a in (i.ip for i in _ipv4(iface)))
        if in_net and not iface.get("up"):
            notes.append("%s holds %s but is %s" % (iface["name"], data_net, str(iface.get("state", "down")).lower()))
        elif iface["name"] in names and not in_net:
            state = "up" if iface.get("up") else str(iface.get("state", "down")).lower()
            addrs = ", ".join("%s/%d" % (i.ip, i.network.prefixlen) for i in _ipv4(iface)) or "no IPv4 address"
            notes.append("%s is %s with %s" % (iface["name"], state, addrs))
    return text + ("; " + "; ".join(notes) if notes else "")


def _explain_skips(choice: Choice, name: str, cands: List[_Cand], rejected: Dict[str, str]) -> None:
    chosen = choice.nodes.get(name)
    skipped = choice.skipped.setdefault(name, [])
    seen = {n for n, _ in skipped}
    for c in cands:
        if chosen and c.name == chosen["iface"]:
            continue
        if c.name in seen:
            continue
        seen.add(c.name)
        net = str(c.addr.network)
        if c.mgmt:
            why = "management"
        elif net in rejected:
            why = rejected[net]
        elif chosen and net == chosen["subnet"]:
            why = "same subnet, ranked lower"
        elif chosen and (c.iface.get("speed_mbps") or 0) < (chosen["speed_mbps"] or 0):
            why = "slower, %s" % speed_text(c.iface.get("speed_mbps"))
        elif chosen and (c.iface.get("mtu") or 0) < (chosen["mtu"] or 0):
            why = "smaller mtu %s" % c.iface.get("mtu")
        else:
            why = "ranked lower"
        skipped.append((c.name, why))

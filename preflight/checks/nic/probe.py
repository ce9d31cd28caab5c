"""The nic check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import ipaddress
import json
import os

from preflight.node_model import ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional


def _load_json_list(text: str, source: str) -> List[Dict[str, Any]]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ParseError("%s: not valid JSON (%s)" % (source, exc)) from None
    if not isinstance(doc, list) or not all(isinstance(item, dict) for item in doc):
        raise ParseError("%s: expected a JSON list of interface objects" % source)
    return doc


def _ifname(item: Dict[str, Any], source: str) -> str:
    name = item.get("ifname")
    if not isinstance(name, str) or not name:
        raise ParseError("%s: interface entry without ifname: %.80r" % (source, item))
    return name


def parse_ip_addr(text: str) -> List[Dict[str, Any]]:
    """`ip -j [-d] addr show` → [{name, state, up, mtu, link_type, master, addresses: [{ip, prefixlen}]}].

    `up` means administratively up with carrier (flags UP and LOWER_UP, operstate UP or UNKNOWN: lo and
    some virtual links report UNKNOWN while working). IPv6 link-local addresses are left out.
    """
    source = "ip -j -d addr show"
    out = []
    for item in _load_json_list(text, source):
        name = _ifname(item, source)
        mtu = item.get("mtu")
        if not isinstance(mtu, int) or isinstance(mtu, bool):
            raise ParseError("%s: %s has no integer mtu" % (source, name))
        flags = item.get("flags") or []
        state = str(item.get("operstate", "UNKNOWN"))
        addresses = []
        for info in item.get("addr_info") or []:
            family, local, plen = info.get("family"), info.get("local"), info.get("prefixlen")
            if family not in ("inet", "inet6"):
                continue
            if not isinstance(local, str) or not isinstance(plen, int):
                raise ParseError("%s: %s has a malformed address entry %.80r" % (source, name, info))
            try:
                addr = ipaddress.ip_address(local)
            except ValueError:
                raise ParseError("%s: %s has an invalid address %r" % (source, name, local)) from None
            if addr.version == 6 and addr.is_link_local:
                continue
            addresses.append({"ip": local, "prefixlen": plen})
        out.append(
            {
                "name": name,
                "state": state,
                "up": "UP" in flags and "LOWER_UP" in flags and state in ("UP", "UNKNOWN"),
                "mtu": mtu,
                "link_type": item.get("link_type"),
                "master": item.get("master"),
                "addresses": addresses,
            }
        )
    return out


def parse_ip_link(text: str) -> Dict[str, Optional[str]]:
    """`ip -j -d link show` or `ip -j -d addr show` → {interface name: linkinfo.info_kind or None} (bridge, veth,
    bond, vlan, ipoib...)."""
    source = "ip -j -d addr show"
    kinds: Dict[str, Optional[str]] = {}
    for item in _load_json_list(text, source):
        info = item.get("linkinfo") or {}
        if not isinstance(info, dict):
            raise ParseError("%s: %s has a malformed linkinfo" % (source, _ifname(item, source)))
        kind = info.get("info_kind")
        kinds[_ifname(item, source)] = kind if isinstance(kind, str) else None
    return kinds


def parse_int_attr(text: Optional[str], what: str) -> Optional[int]:
    """A sysfs integer attribute; None when unreadable (EINVAL) or negative (-1: speed unknown)."""
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ParseError("%s: expected an integer, got %.40r" % (what, text)) from None
    return value if value >= 0 else None


def _ssh_server_ip() -> Optional[str]:
    """The node address the controller's SSH session arrived on (sshd's SSH_CONNECTION), if any."""
    parts = os.environ.get("SSH_CONNECTION", "").split()
    if len(parts) == 4:
        try:
            return str(ipaddress.ip_address(parts[2].split("%")[0]))
        except ValueError:
            return None
    return None


#: how long one `ip` may take (it is tried twice where the probe's deadline leaves room)
IP_TIMEOUT_S = 30.0


#: one command for both parsers: with -d, `ip addr show` prints each link's details (linkinfo: bridge, veth, bond,
#: vlan, ipoib...) as `ip -d link show` does (iproute2's ipaddress.c prints the link part of both through one
#: function); one process instead of `ip -j addr show` and `ip -j -d link show`, 3.5 ms of a node's CPU a run
IP_ARGV = ["ip", "-j", "-d", "addr", "show"]


def probe(ctx: Any) -> Dict[str, Any]:
    """The node's interfaces with their state, MTU, speed, kind and addresses."""
    # ip answers in milliseconds; 30 s is for a starved node (10 s was missed by 5 of 1,000 simulated nodes
    # sharing 2 cores at load 1,000), where a shorter limit says nothing about the interfaces
    res = ctx.run(IP_ARGV, timeout=IP_TIMEOUT_S)
    left = ctx.remaining()
    if res.timed_out and (left is None or left > IP_TIMEOUT_S + 10):
        # once more, as long again, when the probe's deadline leaves room: 30 s was still missed by 62 of
        # 1,000 simulated nodes at load 900 (and 373 in another run); a node whose ip hangs twice is an error
        res = ctx.run(IP_ARGV, timeout=IP_TIMEOUT_S)
        if res.timed_out:
            raise RuntimeError("%s timed out twice, after %gs each" % (" ".join(IP_ARGV), IP_TIMEOUT_S))
    if not res.ok:
        raise RuntimeError(
            "%s failed (rc %s): %s" % (" ".join(IP_ARGV), res.rc, (res.stderr or res.stdout).strip()[:200])
        )
    interfaces = parse_ip_addr(res.stdout)
    kinds = parse_ip_link(res.stdout)
    for iface in interfaces:
        name = iface["name"]
        base = ctx.sys_path("class", "net", name)
        arp_type = parse_int_attr(ctx.read(os.path.join(base, "type")), "%s/type" % name)
        iface["speed_mbps"] = parse_int_attr(ctx.read(os.path.join(base, "speed")), "%s/speed" % name)
        iface["arp_type"] = arp_type
        iface["physical"] = ctx.exists(os.path.join(base, "device"))
        kind = kinds.get(name)
        if kind is None and (arp_type == 772 or iface["link_type"] == "loopback"):
            kind = "loopback"
        elif kind is None and (arp_type == 32 or iface["link_type"] == "infiniband"):
            kind = "ipoib"
        iface["kind"] = kind
    return {"interfaces": interfaces, "ssh_ip": _ssh_server_ip()}

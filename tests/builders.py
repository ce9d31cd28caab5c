"""Facts and views that rule tests build: one place, so test modules never import from each other.

Each builder returns what the real probe returns (the same keys, JSON-serialisable), so a rule test
starts from facts a node could really send.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from preflight.model import ClusterView, NodeInfo


def names(n: int) -> list:
    """n001 ... n<n>."""
    return ["n%03d" % i for i in range(1, n + 1)]


def view(facts_by_node: Dict[str, Dict[str, Any]], gpus: int = 8, hosts: Optional[Dict[str, str]] = None,
         settings: Optional[Dict[str, Dict[str, Any]]] = None, **kw: Any) -> ClusterView:
    """A ClusterView over the nodes of facts_by_node ({node: {check: facts}}), the first one the head."""
    nodes = [
        NodeInfo(name, (hosts or {}).get(name, name), gpus, is_head=(i == 0), settings=(settings or {}).get(name, {}))
        for i, name in enumerate(facts_by_node)
    ]
    return ClusterView(nodes, dict(facts_by_node), **kw)


# ------------------------------------------------------------------------------------------------ nic


def iface(name: str, ip: Optional[str] = None, prefixlen: int = 24, mtu: int = 1500, speed: Optional[int] = 10000,
          kind: Optional[str] = None, up: bool = True, physical: bool = True) -> Dict[str, Any]:
    """One entry of the nic probe's interface list (preflight.checks.nic.probe)."""
    addresses = [] if ip is None else [{"ip": ip, "prefixlen": prefixlen}]
    return {
        "name": name,
        "state": "UP" if up else "DOWN",
        "up": up,
        "mtu": mtu,
        "speed_mbps": speed,
        "kind": kind,
        "link_type": "ether",
        "master": None,
        "arp_type": 1,
        "physical": physical,
        "addresses": addresses,
    }


def data_node(i: int, data_mtu: int = 9000, data_up: bool = True, name: str = "eth1") -> Dict[str, Any]:
    """nic facts of simulated node i: management eth0 192.0.2.i/24 (the ssh address), data 198.19.0.i/16."""
    return {
        "interfaces": [
            iface("eth0", "192.0.2.%d" % i, 24, 1500, 10000, "veth", physical=False),
            iface(name, "198.19.0.%d" % i, 16, data_mtu, 10000, "veth", up=data_up, physical=False),
        ],
        "ssh_ip": "192.0.2.%d" % i,
    }


# ------------------------------------------------------------------------------------------------ ib_hca


def ib_port(hca: str, state: str = "ACTIVE", phys: str = "LinkUp", rate: float = 400, layer: str = "ib",
            gid: Optional[int] = None, n: int = 1) -> Dict[str, Any]:
    """One entry of the ib_hca probe's port list."""
    return {
        "hca": hca,
        "port": n,
        "state": state,
        "phys_state": phys,
        "rate_gbps": rate,
        "width": "4X NDR" if rate == 400 else None,
        "link_layer": layer,
        "netdev": None,
        "roce_v2_gid_index": gid,
        "roce_v2_ip": None,
    }


# ------------------------------------------------------------------------------------------------ sim hooks


class StubNode:
    """The SimNode hooks tests/sim/gpu_hw.py uses, on a temporary directory (no namespaces, no sshd)."""

    def __init__(self, root: Any) -> None:
        self.bin_dir = str(root / "bin")
        self.sys_dir = str(root / "sys")
        os.makedirs(self.bin_dir)
        os.makedirs(self.sys_dir)

    def install_executable(self, name: str, text: str) -> str:
        path = os.path.join(self.bin_dir, name)
        with open(path, "w") as fh:
            fh.write(text)
        os.chmod(path, 0o755)
        return path

    def write_sys(self, relpath: str, text: str) -> str:
        path = os.path.join(self.sys_dir, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
        return path

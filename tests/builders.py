"""Facts and views that rule tests build: one place, so test modules never import from each other.

Each builder returns what the real probe returns (the same keys, JSON-serialisable), so a rule test
starts from facts a node could really send.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from preflight.model import ClusterView, NodeInfo
from tests.paths import REPO


def names(n: int) -> list:
    """n001 ... n<n>."""
    return ["n%03d" % i for i in range(1, n + 1)]


def view(facts_by_node: Mapping[str, Mapping[str, Any]], gpus: int = 8, hosts: Optional[Dict[str, str]] = None,
         settings: Optional[Dict[str, Dict[str, Any]]] = None, nodes: Optional[Sequence[Any]] = None,
         **kw: Any) -> ClusterView:
    """The one ClusterView builder of the tests: the view over `nodes` with facts_by_node ({node: {check: facts}}).

    `nodes` holds NodeInfo (kept as given) or names; by default the names of facts_by_node. A name becomes a
    NodeInfo with `gpus` GPUs, its host from `hosts` (else the name) and its settings from `settings`, the
    first node the head. kw: expect, cluster, unreachable, derived, as ClusterView takes them.
    """
    entries = list(facts_by_node) if nodes is None else list(nodes)
    infos = [
        entry if isinstance(entry, NodeInfo) else
        NodeInfo(entry, (hosts or {}).get(entry, entry), gpus, is_head=(i == 0),
                 settings=(settings or {}).get(entry, {}))
        for i, entry in enumerate(entries)
    ]
    return ClusterView(infos, dict(facts_by_node), **kw)


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


#: The InfiniBand rails of the real H100 capture (gpud's sys-class-infiniband-h100.0): mlx5_0,1,4-9.
H100_RAILS = ["mlx5_%d:1" % i for i in (0, 1, 4, 5, 6, 7, 8, 9)]


def h100_bf3_ports(ib_rate: float = 400) -> List[Dict[str, Any]]:
    """An H100 node's ports as the real capture has them: 8 InfiniBand NDR rails and a BlueField-3
    Ethernet port mlx5_bond_0 at 200 Gb/s (the front-end network)."""
    rails = [ib_port("mlx5_%d" % i, rate=ib_rate) for i in (0, 1, 4, 5, 6, 7, 8, 9)]
    return rails + [ib_port("mlx5_bond_0", rate=200, layer="roce")]


# ------------------------------------------------------------------------------------------------ nccl env


def mgmt_ip(i: int) -> str:
    """The management (ssh) address of env_view's node i."""
    return "10.0.0.%d" % (10 + i)


def data_ip(i: int) -> str:
    """The data-network address of env_view's node i."""
    return "10.1.0.%d" % (10 + i)


def env_view(n=3, data=None, torch="2.4.0+cu121", ib=None, ports=None, drop=(), master_port=29500, nccl=None, extra=None):
    """A ClusterView of n nodes with the facts the NCCL env derivation reads: lo, a 1 GbE management eno1, a
    100 GbE data interface (eth1 unless `data` names another per node), docker0 with the same address
    everywhere; ports verified unless `ports` overrides a node's facts; torch as given (a str, or {node:
    str|None}); ib {node: [ports]}; nccl: the nvidia-nccl-cu12 wheel's version (a str, or {node: str|None};
    None: no NCCL); extra {node: [more interfaces]}; the nodes in `drop` without facts."""
    node_names = names(n)
    data = data or {}
    ib = ib or {}
    ports = ports or {}
    infos, facts = [], {}
    for i, name in enumerate(node_names, 1):
        infos.append(NodeInfo(name, mgmt_ip(i), 8, is_head=(i == 1)))
        version = torch.get(name) if isinstance(torch, dict) else torch
        nccl_version = nccl.get(name) if isinstance(nccl, dict) else nccl
        if i == 1:
            port_facts = {"role": "listen", "port": master_port, "bind_ip": "0.0.0.0", "listening": True,
                          "peers": [{"ip": data_ip(j), "name": node_names[j - 1], "at_s": 0.1} for j in range(2, n + 1)]}
        else:
            port_facts = {"role": "connect", "host": data_ip(1), "port": master_port, "connected": True,
                          "handshake": True, "reply": "preflight-ok n001", "attempts": 1, "elapsed_s": 0.01, "error": None}
        facts[name] = {
            "ssh": {"memlock_soft": None},
            "nic": {
                "interfaces": [
                    dict(iface("lo", "127.0.0.1", 8, 65536, None, physical=False), kind="loopback", link_type="loopback"),
                    iface("eno1", mgmt_ip(i), 24, 1500, 1000),
                    iface(data.get(name, "eth1"), data_ip(i), 16, 9000, 100000),
                    iface("docker0", "172.17.0.1", 16, 1500, None, kind="bridge", physical=False),
                ] + list((extra or {}).get(name, [])),
                "ssh_ip": mgmt_ip(i),
            },
            "ib_hca": {"hcas": {}, "ports": ib.get(name, [])},
            "ports": ports.get(name, port_facts),
            "driver": {"torch": {"version": version, "cuda": None, "path": "/opt/torch"} if version else None,
                       "nccl_python": {"distribution": "nvidia-nccl-cu12", "version": nccl_version} if nccl_version else None,
                       "nccl_system": []},
        }
    for name in drop:
        del facts[name]
    return view(facts, nodes=infos, cluster={"master_port": master_port})


def roce_port(hca, gids, netdev="ens1f0np0"):
    """A RoCE port as the ib_hca probe reports it: every RoCE v2 IPv4 GID [(index, ip, ndev)], lowest first."""
    p = dict(ib_port(hca, rate=200, layer="roce", gid=gids[0][0] if gids else None), netdev=netdev)
    p["roce_v2_ip"] = gids[0][1] if gids else None
    p["roce_v2_gids"] = [{"index": i, "ip": ip, "ndev": ndev} for i, ip, ndev in gids]
    return p


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


# ------------------------------------------------------------------------------------------------ gpu


def gpu_expected(case: str) -> Dict[str, Any]:
    """The gpu facts of tests/fixtures/gpu/<case>.json (a deep copy: tests edit them)."""
    import copy

    from tests.fixture_cases import expected

    return copy.deepcopy(expected("gpu", case))


def gpu_with_links(facts: Dict[str, Any], case: str) -> Dict[str, Any]:
    """facts with each GPU's NVLink counts from tests/fixtures/gpu/<case>.nvlink.json."""
    from tests.fixture_cases import expected

    links = expected("gpu", case + ".nvlink")
    for g in facts["gpus"]:
        g["nvlink"] = links[g["uuid"]]
    return facts


def nvml_answers(case: str = "nvml_h100_hgx_550") -> Dict[str, Any]:
    """A recorded NVML session (tests/fixtures/gpu/nvml_*.json), for tests.sim.gpu_hw.FakeNVML."""
    import json

    from tests.fixture_cases import fixture_dir

    with open(os.path.join(fixture_dir("gpu"), case + ".json")) as fh:
        return json.load(fh)["answers"]


def gpu_rule(facts: Dict[str, Any], gpus_per_node: int = 8, shm: int = 16 << 30) -> list:
    """The gpu rule on one node holding facts (and a roomy /dev/shm)."""
    from preflight.checks.gpu import rule as gpu_rule
    node = NodeInfo("gpu-001", "198.18.0.1", gpus_per_node)
    return gpu_rule.rule(view({"gpu-001": {"gpu": facts, "ssh": {"shm_bytes": shm}}}, nodes=[node]))


def by_status(findings: list) -> Dict[Any, list]:
    out: Dict[Any, list] = {}
    for f in findings:
        out.setdefault(f.status, []).append(f.message)
    return out


def fake_nvidia_smi(bindir: str, xml_path: Optional[str] = None, nvlink_path: Optional[str] = None, rc: int = 0) -> None:
    """An nvidia-smi on PATH answering -q -x and nvlink --status from files."""
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "nvidia-smi")
    with open(path, "w") as fh:
        fh.write(
            "#!/bin/sh\n"
            'case "$*" in\n'
            '  "-q -x") cat "%s"; exit %d ;;\n'
            '  "nvlink --status") %s ;;\n'
            '  *) echo "unexpected arguments: $*" >&2; exit 2 ;;\n'
            "esac\n" % (xml_path, rc, 'cat "%s"' % nvlink_path if nvlink_path else "exit 3")
        )
    os.chmod(path, 0o755)


def assert_one_located_line(tmp_path: Any, capsys: Any, text: str, line: int, words: str) -> None:
    """`preflight check` on an inventory holding `text`: exit 2 and one `preflight: error: FILE:LINE:`
    line (FILE: alone when line is 0) that says `words`, never a traceback."""
    from preflight import cli

    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    rc = cli.main(["check", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    where = "%s:%d:" % (path, line) if line else "%s:" % path
    assert lines[0].startswith("preflight: error: " + where), lines[0]
    assert words in lines[0], lines[0]


def node_argv(cluster: Any, name: Any, *args: str,
              env: Optional[Dict[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """(argv, env) of `preflight node ARGS` (this tree's, not an installed script) inside a simulated node as
    slurmd runs it: in its namespace with its own hostname, its bin/ first on PATH, its sysfs root, no
    SSH_CONNECTION; `env` adds to that environment."""
    import sys

    node = cluster.node(name)
    full = {"PATH": "%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" % node.bin_dir,
            "PREFLIGHT_SYSFS_ROOT": node.sys_dir, "PREFLIGHT_NVML": "off", "HOME": "/root", "LANG": "C.UTF-8",
            "PYTHONPATH": REPO}
    full.update(env or {})
    argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', node.name, sys.executable, "-m",
            "preflight", "node"] + list(args)
    return argv, full


def node_check(cluster: Any, name: Any, *args: str, env: Optional[Dict[str, str]] = None) -> Any:
    """`preflight node ARGS` run inside a simulated node (node_argv): the CompletedProcess; a traceback fails
    the test."""
    argv, full = node_argv(cluster, name, *args, env=env)
    out = cluster.node_exec(name, argv, env=full, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    return out

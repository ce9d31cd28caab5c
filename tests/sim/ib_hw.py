"""Simulated InfiniBand/RoCE HCAs: sysfs trees in the kernel's formats, for fixtures and simulated nodes.

The probe reads HCAs only through the sysfs root (`class/infiniband/...`), so an HCA is simulated by
writing the files the RDMA core would publish. `hca_files` is the single writer: the fixture cases under
tests/fixtures/ib_hca/ were produced with it (`python tests/sim/ib_hw.py`), and `install_hcas` writes
the same trees into a simulated node's sysfs root.

    install_hcas(node)                                              # mlx5_0: 1 port ACTIVE, 400 Gb/s NDR
    install_hcas(node, ports=[{}, {}, {"state": "DOWN"}])           # mlx5_0..2, mlx5_2 port DOWN/Disabled
    install_hcas(node, ports=[{"link_layer": "roce", "netdev": "eth1", "ipv4": "198.19.0.3", "rate_gbps": 200}])
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

STATE_NUM = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_NUM = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
}
#: The error counters an mlx5 port publishes under ports/N/counters/ (see tests/fixtures/ib_errors).
ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
    "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped",
)
#: board_id (PSID) per hca_type: ConnectX-7 NDR (as the gpud H100 tree in ../shared/realworld has it); the
#: ConnectX-6 Dx one is a representative NVIDIA PSID (no capture of one was found).
BOARD_IDS = {"MT4129": "MT_0000000838", "MT4125": "MT_0000000359"}
#: Gb/s per lane for each IB speed name (what the kernel's rate_show multiplies by the width).
LANE_GBPS = {"SDR": 2.5, "DDR": 5, "QDR": 10, "FDR": 14, "EDR": 25, "HDR": 50, "NDR": 100, "XDR": 200}


@dataclass
class PortSpec:
    """One HCA port. mlx5 devices expose one port each, so each PortSpec becomes its own mlx5_N."""

    state: str = "ACTIVE"
    phys_state: Optional[str] = None  # default: LinkUp when ACTIVE, else Disabled
    rate_gbps: float = 400
    width: int = 4
    link_layer: str = "ib"  # "ib" | "roce"
    netdev: Optional[str] = None  # default: ibN for IB (IPoIB), none for RoCE
    ipv4: Optional[str] = None  # RoCE: the netdev's address, published as an IPv4-mapped RoCE v2 GID
    counters: Optional[Dict[str, int]] = None  # error counters to set (the others read 0)
    hca_type: str = "MT4129"  # the card model (ConnectX-7); MT4125 is a ConnectX-6 Dx

    @classmethod
    def of(cls, spec: Union["PortSpec", Mapping[str, Any], None]) -> "PortSpec":
        if spec is None:
            return cls()
        if isinstance(spec, PortSpec):
            return spec
        known = {f.name for f in fields(cls)}
        unknown = set(spec) - known
        if unknown:
            raise TypeError("unknown port options: %s" % ", ".join(sorted(unknown)))
        return cls(**dict(spec))


def rate_text(rate_gbps: float, width: int = 4) -> str:
    """The kernel's ports/N/rate: '400 Gb/sec (4X NDR)', '2.5 Gb/sec (1X SDR)'."""
    lane = rate_gbps / float(width)
    name = next((n for n, g in LANE_GBPS.items() if abs(g - lane) < 1e-9), None)
    shown = ("%d" % rate_gbps) if rate_gbps == int(rate_gbps) else ("%d.5" % int(rate_gbps))
    return "%s Gb/sec (%dX%s)" % (shown, width, " " + name if name else "")


def _guid(seed: int) -> str:
    raw = "%016x" % (0xB8CEF60300A1B200 + seed)
    return ":".join(raw[i : i + 4] for i in range(0, 16, 4))


def _mapped_gid(ipv4: str) -> str:
    a, b, c, d = (int(p) for p in ipv4.split("."))
    return "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % (a, b, c, d)


def hca_files(hca: str, port: Union[PortSpec, Mapping[str, Any], None] = None, seed: int = 0) -> Dict[str, str]:
    """{path relative to the sysfs root: content} for one single-port mlx5 HCA."""
    p = PortSpec.of(port)
    if p.state not in STATE_NUM:
        raise ValueError("state %r: use one of %s" % (p.state, ", ".join(STATE_NUM)))
    phys = p.phys_state or ("LinkUp" if p.state == "ACTIVE" else "Disabled")
    if phys not in PHYS_NUM:
        raise ValueError("phys_state %r: use one of %s" % (phys, ", ".join(PHYS_NUM)))
    base = "class/infiniband/%s" % hca
    pdir = base + "/ports/1"
    guid = _guid(seed)
    files = {
        base + "/node_guid": guid,
        base + "/sys_image_guid": guid,
        base + "/fw_ver": "28.39.1002",
        base + "/hca_type": p.hca_type,
        base + "/board_id": BOARD_IDS.get(p.hca_type, "MT_0000000838"),
        base + "/node_type": "1: CA",
        pdir + "/state": "%d: %s" % (STATE_NUM[p.state], p.state),
        pdir + "/phys_state": "%d: %s" % (PHYS_NUM[phys], phys),
        # A port without link reports the slowest rate, as mlx5 does.
        pdir + "/rate": rate_text(p.rate_gbps, p.width) if p.state == "ACTIVE" else rate_text(10, 4),
        pdir + "/link_layer": "InfiniBand" if p.link_layer == "ib" else "Ethernet",
        pdir + "/cap_mask": "0xa751e84a" if p.link_layer == "ib" else "0x04010000",
    }
    # counters/: the error counters at 0 (or as given), traffic counters with some traffic, as mlx5 shows them
    values = dict.fromkeys(ERROR_COUNTERS, 0)
    values.update({"port_rcv_data": 230539874932 + seed, "port_xmit_data": 230442669431 + seed,
                   "port_rcv_packets": 317548853 + seed, "port_xmit_packets": 315487941 + seed})
    values.update(p.counters or {})
    for name, value in values.items():
        files[pdir + "/counters/" + name] = str(value)
    netdev = p.netdev or ("ib%d" % seed if p.link_layer == "ib" else None)
    if netdev:
        files[base + "/device/net/%s/dev_port" % netdev] = "0"
    if p.link_layer == "ib":
        files[pdir + "/lid"] = "0x%x" % (0x10 + seed) if p.state == "ACTIVE" else "0xffff"
        files[pdir + "/sm_lid"] = "0x1" if p.state == "ACTIVE" else "0x0"
        files[pdir + "/gids/0"] = "fe80:0000:0000:0000:" + guid
        files[pdir + "/gids/1"] = "0000:0000:0000:0000:0000:0000:0000:0000"
    else:
        files[pdir + "/lid"] = "0x0"
        link_local = "fe80:0000:0000:0000:" + guid
        files[pdir + "/gids/0"] = link_local
        files[pdir + "/gid_attrs/types/0"] = "IB/RoCE v1"
        files[pdir + "/gids/1"] = link_local
        files[pdir + "/gid_attrs/types/1"] = "RoCE v2"
        if p.ipv4:
            files[pdir + "/gids/2"] = _mapped_gid(p.ipv4)
            files[pdir + "/gid_attrs/types/2"] = "IB/RoCE v1"
            files[pdir + "/gids/3"] = _mapped_gid(p.ipv4)
            files[pdir + "/gid_attrs/types/3"] = "RoCE v2"
        if netdev:
            for i in range(4 if p.ipv4 else 2):
                files[pdir + "/gid_attrs/ndevs/%d" % i] = netdev
        # An unused table entry: its type cannot be read (EINVAL), so no types/N file.
        files[pdir + "/gids/4"] = "0000:0000:0000:0000:0000:0000:0000:0000"
    return {path: text + "\n" for path, text in files.items()}


def cluster_files(ports: Iterable[Union[PortSpec, Mapping[str, Any], None]], first: int = 0) -> Dict[str, str]:
    """The files of mlx5_<first>, mlx5_<first+1>, ... one per port spec."""
    files: Dict[str, str] = {}
    for i, spec in enumerate(ports):
        files.update(hca_files("mlx5_%d" % (first + i), spec, seed=first + i))
    return files


def write_tree(root: str, files: Mapping[str, str]) -> None:
    """Write {relative path: content} under root."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)


def install_hcas(
    node: Any, ports: Optional[List[Union[PortSpec, Mapping[str, Any], None]]] = None, first: int = 0
) -> List[str]:
    """Write mlx5 HCAs into a simulated node's sysfs root via node.write_sys(relpath, text).

    ports: one spec per HCA (PortSpec or dict of its fields); default one ACTIVE 400 Gb/s NDR port.
    Returns the HCA names written.
    """
    specs = list(ports) if ports is not None else [PortSpec()]
    for rel, text in sorted(cluster_files(specs, first).items()):
        node.write_sys(rel, text)
    bin_dir = getattr(node, "bin_dir", None)  # a sysfs-only stand-in has no PATH to present
    if bin_dir and not os.path.exists(os.path.join(bin_dir, "journalctl")):
        # ib_errors reads the kernel log for link flaps: a simulated node never shows it the host's own log
        node.install_executable(
            "journalctl",
            "#!/bin/sh\n"
            "# journalctl (preflight simulator): a quiet kernel log of this boot, short-monotonic format\n"
            "echo '[    0.000000] %s kernel: Linux version 5.15.0-105-generic (preflight simulator)'\n"
            % getattr(node, "name", "ib-node"),
        )
    return ["mlx5_%d" % (first + i) for i in range(len(specs))]


def efa_name(index: int) -> str:
    """rdma-core's predictable name of the index-th EFA device of a p5-like node: rdmap16s0..rdmap19s0,
    rdmap32s0.. (PCI bus and slot; the p5 names listed in aws/eks-charts#1110 are of this form)."""
    return "rdmap%ds0" % (16 + (index // 4) * 16 + index % 4)


def efa_files(device: str, state: str = "ACTIVE", rate_gbps: float = 100) -> Dict[str, str]:
    """{path relative to the sysfs root: content} for one EFA device as the efa driver publishes it.

    Sources: link_layer "Unknown", node GUID 0, firmware 0.0.0.0, vendor 0x1d0f and part 0xefa0 (61344) in
    linux-rdma/rdma-core#884 (cat of ports/1/link_layer and ibv_devinfo of efa_0) and uccl-project/uccl#163
    (ibv_devinfo of rdmap16s27); ibstat of efa_0 "State: Active, Physical state: LinkUp, Rate: 100" in
    amzn/amzn-drivers#114; state/phys_state fixed at ACTIVE/LinkUp and speed 4X EDR in the kernel's
    drivers/infiniband/hw/efa/efa_verbs.c efa_query_port; the driver binding (device/driver -> efa) as
    NVIDIA/NVSentinel docs/nic-health-monitor.md reads it, here through the PCI function's uevent.
    """
    if state not in STATE_NUM:
        raise ValueError("state %r: use one of %s" % (state, ", ".join(STATE_NUM)))
    base = "class/infiniband/%s" % device
    pdir = base + "/ports/1"
    phys = "LinkUp" if state == "ACTIVE" else "Disabled"
    files = {
        base + "/node_guid": "0000:0000:0000:0000",
        base + "/sys_image_guid": "0000:0000:0000:0000",
        base + "/fw_ver": "0.0.0.0",
        base + "/hw_rev": "0xefa0",
        base + "/node_type": "1: CA",
        base + "/device/vendor": "0x1d0f",
        base + "/device/device": "0xefa0",
        base + "/device/uevent": "DRIVER=efa\nPCI_CLASS=20000\nPCI_ID=1D0F:EFA0\nPCI_SUBSYS_ID=1D0F:EFA0",
        pdir + "/state": "%d: %s" % (STATE_NUM[state], state),
        pdir + "/phys_state": "%d: %s" % (PHYS_NUM[phys], phys),
        pdir + "/rate": rate_text(rate_gbps, 4),
        pdir + "/link_layer": "Unknown",
        pdir + "/lid": "0x0",
        pdir + "/sm_lid": "0x0",
        pdir + "/gids/0": "fe80:0000:0000:0000:0000:0000:0000:0000",
    }
    return {path: text + "\n" for path, text in files.items()}


def install_efa(node: Any, count: int = 32, down: Iterable[int] = ()) -> List[str]:
    """Write `count` EFA devices (a p5.48xlarge has 32) into a simulated node's sysfs root; the indexes in
    `down` report DOWN. Returns the device names."""
    names = [efa_name(i) for i in range(count)]
    down = set(down)
    for i, name in enumerate(names):
        for rel, text in sorted(efa_files(name, state="DOWN" if i in down else "ACTIVE").items()):
            node.write_sys(rel, text)
    return names


#: The fixture cases under tests/fixtures/ib_hca/<case>/, regenerated by running this file.
FIXTURE_CASES: Dict[str, List[Dict[str, Any]]] = {
    "ndr_active_and_down": [{}, {"state": "DOWN", "phys_state": "Disabled"}],
    "ndr_polling": [{}, {}, {"state": "DOWN", "phys_state": "Polling"}],
    "roce": [{"link_layer": "roce", "netdev": "ens1f0np0", "ipv4": "198.19.0.11", "rate_gbps": 200}],
    "hdr_degraded": [{"rate_gbps": 200}, {"rate_gbps": 100, "width": 2}],
    # kvcache-ai/Mooncake#2039's H100 node, in small: ConnectX-7 InfiniBand rails ACTIVE at 400 beside a
    # ConnectX-6 Dx Ethernet port "State: Down, Physical state: Disabled, Rate: 40".
    "ib_rails_eth_spare": [{}, {"state": "DOWN", "phys_state": "Disabled", "link_layer": "roce", "hca_type": "MT4125",
                                "netdev": "enp27s0f1np1"}, {}],
}
#: The malformed case: a valid tree with one attribute corrupted.
MALFORMED = ("malformed", [{}], {"class/infiniband/mlx5_0/ports/1/state": "ACTIVE\n"})


#: EFA fixture cases: (EFA devices, mlx5 port specs beside them).
EFA_CASES: Dict[str, Any] = {"efa_p5_excerpt": (4, [])}


def efa_case_files(count: int, ports: List[Dict[str, Any]]) -> Dict[str, str]:
    files = cluster_files(ports)
    for i in range(count):
        files.update(efa_files(efa_name(i)))
    return files


def write_fixtures(root: str) -> None:
    for case, specs in FIXTURE_CASES.items():
        write_tree(os.path.join(root, case), cluster_files(specs))
    for case, (count, ports) in EFA_CASES.items():
        write_tree(os.path.join(root, case), efa_case_files(count, ports))
    case, specs, override = MALFORMED
    files = cluster_files(specs)
    files.update(override)
    write_tree(os.path.join(root, case), files)


if __name__ == "__main__":
    write_fixtures(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "ib_hca"))

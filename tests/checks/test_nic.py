"""nic: the ip -j parsers on recorded output, the probe on a sysfs tree, choose()'s policy, and the rule."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from preflight.derived import datanet
from preflight.checks.nic import probe as nic_probe
from preflight.checks.nic import rule as nic_rule
from preflight.model import ParseError, Status
from preflight.probe.context import NodeContext
from tests import fixture_cases as fc
from tests.builders import iface, view
from tests.paths import TESTS

FIXTURES = Path(TESTS) / "fixtures" / "nic"


# --------------------------------------------------------------------------------------------- parsers
# parse_* and probe cases (node snapshots with recorded `ip` output): tests/fixtures/nic/*.json, run by
# tests/checks/test_fixtures.py


def test_gpu_node_kinds_and_speeds():
    facts = fc.expected("nic", "gpu_node")
    by = {i["name"]: i for i in facts["interfaces"]}
    assert by["lo"]["kind"] == "loopback" and by["lo"]["speed_mbps"] is None
    assert by["docker0"]["kind"] == "bridge"
    assert by["bond0"]["kind"] == "bond" and by["bond0"]["speed_mbps"] == 50000
    assert by["ib0"]["kind"] == "ipoib" and by["ib0"]["arp_type"] == 32 and by["ib0"]["speed_mbps"] == 400000
    assert by["eno1"]["physical"] and by["eno1"]["speed_mbps"] == 1000
    assert by["ens1f0np0"]["speed_mbps"] == 200000 and by["ens1f0np0"]["mtu"] == 9000
    assert by["eno2"]["up"] is False and by["eno2"]["speed_mbps"] is None  # -1: no link
    assert by["ens2f0"]["master"] == "bond0"
    # IPv6 link-local addresses are dropped, ::1 kept.
    assert by["docker0"]["addresses"] == [{"ip": "172.17.0.1", "prefixlen": 16}]


@pytest.mark.parametrize(
    "text",
    [
        "",
        (FIXTURES / "gpu_node" / "ip-addr.json").read_text()[:700],  # truncated mid-object
        '{"ifname": "eth0"}',  # not a list
        '[{"ifname": "eth0", "mtu": "1500"}]',  # mtu not an integer
        '[{"mtu": 1500}]',  # no ifname
        '[{"ifname": "eth0", "mtu": 1500, "addr_info": [{"family": "inet", "local": "10.0.0.300", "prefixlen": 24}]}]',
        'Error: either "dev" is duplicate, or "addr" is a garbage.',
    ],
)
def test_parse_ip_addr_rejects_bad_output(text):
    with pytest.raises(ParseError):
        nic_probe.parse_ip_addr(text)


def test_parse_ip_link_rejects_truncated():
    with pytest.raises(ParseError):
        nic_probe.parse_ip_link((FIXTURES / "gpu_node" / "ip-link.json").read_text()[:-40])


def test_parse_int_attr():
    assert nic_probe.parse_int_attr("100000\n", "speed") == 100000
    assert nic_probe.parse_int_attr("-1", "speed") is None
    assert nic_probe.parse_int_attr(None, "speed") is None  # EINVAL on a virtual link
    with pytest.raises(ParseError):
        nic_probe.parse_int_attr("fast", "speed")


def test_probe_fails_clearly_without_ip(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="ip -j -d addr show failed"):
        nic_probe.probe(NodeContext(sysfs_root=str(tmp_path)))


def _slow_ip(tmp_path, monkeypatch, first_only):
    """An `ip` on PATH that hangs (the first call only, or every call), then runs the real one."""
    real = shutil.which("ip")
    if real is None:
        pytest.skip("iproute2 is not installed")
    hang = 'if [ ! -e %s/once ]; then : > %s/once; sleep 30; fi' % (tmp_path, tmp_path) if first_only else "sleep 30"
    (tmp_path / "ip").write_text("#!/bin/sh\necho \"$*\" >> %s/calls\n%s\nexec %s \"$@\"\n" % (tmp_path, hang, real))
    (tmp_path / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    monkeypatch.setattr(nic_probe, "IP_TIMEOUT_S", 1.0)


def test_an_ip_starved_once_is_run_again_and_its_answer_used(tmp_path, monkeypatch):
    """At 1,000 simulated nodes at load 900, 62 healthy nodes' `ip` missed 30 s: the node is busy, not its
    interfaces. A second try, as long, within the probe's deadline, answers."""
    _slow_ip(tmp_path, monkeypatch, first_only=True)
    facts = nic_probe.probe(NodeContext(sysfs_root="/sys"))
    assert any(i["name"] == "lo" for i in facts["interfaces"])
    assert (tmp_path / "calls").read_text().splitlines()[:2] == ["-j -d addr show", "-j -d addr show"]


def test_an_ip_that_hangs_twice_is_an_error_and_one_without_time_left_is_not_tried_again(tmp_path, monkeypatch):
    _slow_ip(tmp_path, monkeypatch, first_only=False)
    with pytest.raises(RuntimeError, match=r"ip -j -d addr show timed out twice, after 1s each"):
        nic_probe.probe(NodeContext(sysfs_root="/sys"))
    (tmp_path / "calls").unlink()
    with pytest.raises(RuntimeError, match=r"ip -j -d addr show failed \(rc -1\): timed out after 1s"):
        nic_probe.probe(NodeContext(sysfs_root="/sys", deadline=time.monotonic() + 5))
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


# ---------------------------------------------------------------------------------------------- choose


def lo():
    return iface("lo", "127.0.0.1", 8, 65536, None, "loopback", physical=False)


def sim_node(i, data_up=True, data_mtu=9000):
    """A simulated node: its links are veths eth0 (management, ssh) and eth1 (data), plus docker0."""
    return {
        "interfaces": [
            lo(),
            iface("eth0", "192.0.2.%d" % (10 + i), 24, 1500, 10000, "veth", physical=False),
            iface("eth1", "198.19.0.%d" % (10 + i), 16, data_mtu, 10000, "veth", up=data_up, physical=False),
            iface("docker0", "172.17.0.1", 16, 1500, 10000, "bridge", physical=False),
            iface("vethab12cd3", None, kind="veth", physical=False),
        ],
        "ssh_ip": "192.0.2.%d" % (10 + i),
    }


def view_of(facts_by_node, settings=None, hosts=None, **kw):
    return view({n: {"nic": f} for n, f in facts_by_node.items()}, settings=settings, hosts=hosts, **kw)


def three_sim(**over):
    facts = {"n%03d" % i: sim_node(i) for i in (1, 2, 3)}
    facts.update(over)
    return facts


def test_choose_picks_data_veth_over_management_and_docker():
    choice = datanet.choose(view_of(three_sim()))
    assert choice.missing == {}
    assert {n: e["iface"] for n, e in choice.nodes.items()} == {"n001": "eth1", "n002": "eth1", "n003": "eth1"}
    assert choice.nodes["n002"]["ip"] == "198.19.0.12" and choice.nodes["n002"]["prefixlen"] == 16
    assert choice.subnet == "198.19.0.0/16"
    assert choice.uniform and choice.socket_ifname() == "=eth1"
    assert dict(choice.skipped["n001"]) == {"docker0": "container bridge", "eth0": "management"}
    assert (
        choice.reason
        == "data subnet 198.19.0.0/16 on 3 of 3 nodes (10 Gb/s, mtu 9000); passed over 192.0.2.0/24 (management)"
    )


def test_rule_pass_message_names_interface_speed_mtu_and_skips():
    findings = nic_rule.rule(view_of(three_sim()))
    assert [f.status for f in findings] == [Status.PASS] * 3
    assert (
        findings[0].message
        == "eth1 198.19.0.11/16 mtu 9000 (10 Gb/s); skipped docker0 (container bridge), eth0 (management)"
    )


def test_management_wins_nothing_when_equal():
    # Same speed and MTU on both: the management interface must not be chosen.
    facts = {"n%03d" % i: sim_node(i, data_mtu=1500) for i in (1, 2)}
    choice = datanet.choose(view_of(facts))
    assert {e["iface"] for e in choice.nodes.values()} == {"eth1"}


def test_management_known_without_ssh_ip_from_inventory_host():
    facts = {"n%03d" % i: sim_node(i, data_mtu=1500) for i in (1, 2)}
    for f in facts.values():
        f["ssh_ip"] = None
    hosts = {"n001": "192.0.2.11", "n002": "192.0.2.12"}
    choice = datanet.choose(view_of(facts, hosts=hosts))
    assert {e["iface"] for e in choice.nodes.values()} == {"eth1"}
    assert ("eth0", "management") in choice.skipped["n001"]


def test_slow_management_port_loses_to_unknown_speed_data_interface():
    def node(i):
        return {
            "interfaces": [
                lo(),
                iface("eno1", "10.10.0.%d" % i, 24, 1500, 1000),
                iface("bond0", "10.20.0.%d" % i, 24, 1500, None, "bond", physical=False),
            ],
            "ssh_ip": "10.10.0.%d" % i,
        }

    choice = datanet.choose(view_of({"a": node(1), "b": node(2)}))
    assert {e["iface"] for e in choice.nodes.values()} == {"bond0"}


def gpu_node(i, ib_up=True):
    facts = fc.expected("nic", "gpu_node")
    for entry in facts["interfaces"]:
        for addr in entry["addresses"]:
            if addr["ip"].count(".") == 3 and not addr["ip"].startswith(("127.", "172.17.")):
                addr["ip"] = addr["ip"].rsplit(".", 1)[0] + ".%d" % (10 + i)
        if entry["name"] == "ib0" and not ib_up:
            entry["up"], entry["state"] = False, "DOWN"
    facts["ssh_ip"] = "10.10.0.%d" % (10 + i)
    return facts


def test_gpu_nodes_choose_fastest_shared_interface():
    view = view_of({"gpu-%03d" % i: gpu_node(i) for i in (1, 2, 3, 4)})
    choice = datanet.choose(view)
    assert {e["iface"] for e in choice.nodes.values()} == {"ib0"}  # 400 Gb/s IPoIB beats 200 GbE and the bond
    assert choice.nodes["gpu-003"]["speed_mbps"] == 400000
    skipped = dict(choice.skipped["gpu-001"])
    assert skipped["docker0"] == "container bridge"
    assert skipped["eno1"] == "management"
    assert skipped["ens1f0np0"].startswith("slower")
    assert "10.10.0.0/24 (management)" in choice.reason


def test_one_node_with_data_nic_down_fails_alone():
    view = view_of({"gpu-%03d" % i: gpu_node(i, ib_up=(i != 3)) for i in (1, 2, 3, 4)})
    choice = datanet.choose(view)
    assert set(choice.nodes) == {"gpu-001", "gpu-002", "gpu-004"}
    assert {e["iface"] for e in choice.nodes.values()} == {"ib0"}
    why = choice.missing["gpu-003"]
    assert "10.30.0.0/16" in why and "data NIC down: ib0 10.30.0.13/16 is down (operstate DOWN)" in why
    findings = {f.node: f for f in nic_rule.rule(view) if f.node}
    assert findings["gpu-003"].status == Status.FAIL
    assert findings["gpu-001"].status == Status.PASS


def test_identical_address_on_every_node_is_not_a_network():
    # A bridge with an innocuous name holding the same address everywhere (host-local) must not win.
    facts = three_sim()
    for f in facts.values():
        f["interfaces"].append(iface("br0", "10.88.0.1", 16, 9000, 100000, "bridge", physical=False))
    choice = datanet.choose(view_of(facts))
    assert {e["iface"] for e in choice.nodes.values()} == {"eth1"}
    assert ("br0", "same address 10.88.0.1 on every node") in choice.skipped["n001"]


def test_container_named_veth_excluded_but_plain_veth_kept():
    facts = {
        "a": {
            "interfaces": [
                lo(),
                iface("veth1234abc", "10.5.0.1", 24, 9000, 100000, "veth", physical=False),
                iface("eth0", "192.0.2.1", 24, 1500, 10000, "veth", physical=False),
            ],
            "ssh_ip": None,
        },
        "b": {
            "interfaces": [
                lo(),
                iface("veth9876fed", "10.5.0.2", 24, 9000, 100000, "veth", physical=False),
                iface("eth0", "192.0.2.2", 24, 1500, 10000, "veth", physical=False),
            ],
            "ssh_ip": None,
        },
    }
    choice = datanet.choose(view_of(facts))
    assert {e["iface"] for e in choice.nodes.values()} == {"eth0"}
    assert ("veth1234abc", "container veth") in choice.skipped["a"]


def test_pinned_interface_is_honoured_even_if_slower():
    facts = three_sim()
    settings = {n: {"data_interface": "eth0"} for n in facts}
    choice = datanet.choose(view_of(facts, settings=settings))
    assert {e["iface"] for e in choice.nodes.values()} == {"eth0"}
    assert all(e["pinned"] for e in choice.nodes.values())
    findings = nic_rule.rule(view_of(facts, settings=settings))
    assert "pinned by data_interface" in findings[0].message


@pytest.mark.parametrize(
    "pin, expect",
    [("eth7", "does not exist"), ("eth1", "is down"), ("eth2", "has no IPv4 address")],
)
def test_pinned_interface_absent_down_or_addressless_fails(pin, expect):
    facts = three_sim()
    facts["n002"]["interfaces"][2]["up"] = False
    facts["n002"]["interfaces"][2]["state"] = "DOWN"
    facts["n002"]["interfaces"].append(iface("eth2", None))
    view = view_of(facts, settings={"n002": {"data_interface": pin}})
    choice = datanet.choose(view)
    assert "n002" not in choice.nodes
    assert expect in choice.missing["n002"] and pin in choice.missing["n002"]
    failing = [f for f in nic_rule.rule(view) if f.status == Status.FAIL]
    assert [f.node for f in failing] == ["n002"]


def test_names_differ_warns_with_socket_ifname_list():
    facts = three_sim()
    for entry in facts["n003"]["interfaces"]:
        if entry["name"] == "eth1":
            entry["name"] = "ens1f0"
    view = view_of(facts)
    choice = datanet.choose(view)
    assert not choice.uniform and choice.socket_ifname() == "=ens1f0,eth1"
    warns = [f for f in nic_rule.rule(view) if f.status == Status.WARN]
    assert len(warns) == 1 and warns[0].node is None
    assert "ens1f0 on n003" in warns[0].message and "eth1 on n[001-002]" in warns[0].message


def test_slower_node_warns():
    facts = three_sim()
    facts["n002"]["interfaces"][2]["speed_mbps"] = 1000
    warns = [f for f in nic_rule.rule(view_of(facts)) if f.status == Status.WARN]
    assert [f.node for f in warns] == ["n002"]
    assert "1 Gb/s" in warns[0].message and "n[001,003]: 10 Gb/s" in warns[0].message


def test_no_qualifying_interface_fails_every_node():
    facts = {
        "a": {"interfaces": [lo(), iface("docker0", "172.17.0.1", 16, kind="bridge")], "ssh_ip": None},
        "b": {"interfaces": [lo(), iface("docker0", "172.17.0.1", 16, kind="bridge")], "ssh_ip": None},
    }
    findings = nic_rule.rule(view_of(facts))
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert "no up interface with an IPv4 address" in findings[0].message
    assert "docker0 (container bridge)" in findings[0].message


def test_unshared_subnets_fail_with_reason():
    facts = {
        "a": {"interfaces": [lo(), iface("eth1", "10.1.0.1", 24)], "ssh_ip": None},
        "b": {"interfaces": [lo(), iface("eth1", "10.2.0.1", 24)], "ssh_ip": None},
    }
    choice = datanet.choose(view_of(facts))
    assert choice.nodes == {} and choice.subnet is None
    assert "only on 1 of 2 nodes" in choice.missing["a"]


def test_single_node_picks_best_interface():
    choice = datanet.choose(view_of({"solo": gpu_node(1)}))
    assert choice.nodes["solo"]["iface"] == "ib0"


def test_probe_error_is_error_never_pass():
    facts = three_sim()
    facts["n002"] = {"probe_error": "RuntimeError: ip -j addr show failed (rc 1)"}
    view = view_of(facts)
    findings = {f.node: f for f in nic_rule.rule(view)}
    assert findings["n002"].status == Status.ERROR
    assert findings["n001"].status == Status.PASS  # quorum of the rest still picks eth1
    assert "n002" in datanet.choose(view).missing


def test_missing_facts_are_error():
    findings = nic_rule.rule(view({"a": {}}))
    assert [f.status for f in findings] == [Status.ERROR]


def test_choice_is_json_serialisable():
    json.dumps(datanet.choose(view_of(three_sim())).to_json())


def test_speed_text():
    assert datanet.speed_text(100000) == "100 Gb/s"
    assert datanet.speed_text(2500) == "2.5 Gb/s"
    assert datanet.speed_text(100) == "100 Mb/s"
    assert datanet.speed_text(None) == "speed unknown"


def test_speed_tie_has_no_majority_and_warns_once_naming_the_split():
    facts = {"n%03d" % i: sim_node(i) for i in (1, 2, 3, 4)}
    for name in ("n003", "n004"):
        facts[name]["interfaces"][2]["speed_mbps"] = 1000
    warns = [f for f in nic_rule.rule(view_of(facts)) if f.status == Status.WARN]
    assert [f.node for f in warns] == [None]
    assert warns[0].message == (
        "data interface speeds split evenly with no majority: 10 Gb/s on n[001-002] · 1 Gb/s on n[003-004]; "
        "the slowest link paces every collective"
    )


# ------------------------------------------------- issue 14: wrong verdicts about the data network


def _statuses(findings):
    return {f.node: f.status for f in findings if f.node}


@pytest.mark.parametrize("n, down", [(2, (1, 2)), (4, (2, 3))])
def test_data_nic_down_on_half_the_nodes_fails_them_instead_of_moving_to_management(n, down):
    """Two nodes (or 2 of 4) with their data NIC down: the data network stays the data network, and the
    nodes whose data NIC is down fail by name; the management network is never taken for it."""
    facts = {"n%03d" % i: sim_node(i, data_up=(i not in down)) for i in range(1, n + 1)}
    view = view_of(facts)
    choice = datanet.choose(view)
    assert choice.subnet == "198.19.0.0/16"
    assert all(not e["management"] for e in choice.nodes.values())
    assert set(choice.missing) == {"n%03d" % i for i in down}
    for i in down:
        why = choice.missing["n%03d" % i]
        assert "eth1 198.19.0.%d/16 is down" % (10 + i) in why and "198.19.0.0/16" in why
    findings = nic_rule.rule(view)
    statuses = _statuses(findings)
    assert [name for name, s in sorted(statuses.items()) if s == Status.FAIL] == ["n%03d" % i for i in down]
    assert all(s == Status.PASS for name, s in statuses.items() if int(name[1:]) not in down)


def test_data_nic_down_where_configured_and_absent_on_the_third_node_fails_all_three_by_name():
    """The data subnet down on the two nodes that have it and no data NIC at all on the third: the choice
    keeps the data subnet (never management) and names each node's fault; it used to raise KeyError (the
    third node's reason looked up the subnet's up holders, of which there are none)."""
    facts = {"n%03d" % i: sim_node(i, data_up=False) for i in (1, 2, 3)}
    facts["n003"]["interfaces"] = [i for i in facts["n003"]["interfaces"] if i["name"] != "eth1"]
    view = view_of(facts)
    choice = datanet.choose(view)
    assert choice.subnet == "198.19.0.0/16" and choice.nodes == {}
    assert "data NIC down: eth1 198.19.0.11/16 is down" in choice.missing["n001"]
    assert choice.missing["n003"] == "no interface in the data subnet 198.19.0.0/16 (configured on n[001-002], down there)"
    assert _statuses(nic_rule.rule(view)) == {"n001": Status.FAIL, "n002": Status.FAIL, "n003": Status.FAIL}


def test_data_nic_down_everywhere_with_a_fast_management_network_still_fails():
    """Even when the management port is as fast as the data port, a down data NIC is a failure."""
    facts = {"n%03d" % i: sim_node(i, data_up=False) for i in (1, 2)}
    for f in facts.values():
        for entry in f["interfaces"]:
            if entry["name"] == "eth1":
                entry["speed_mbps"] = None  # an administratively down link reports no speed
    findings = nic_rule.rule(view_of(facts))
    assert _statuses(findings) == {"n001": Status.FAIL, "n002": Status.FAIL}


def test_data_address_conflict_between_two_nodes_is_a_named_failure():
    """The same data address on two of three nodes is a conflict, not a host-local bridge."""
    facts = three_sim()
    facts["n003"]["interfaces"][2]["addresses"] = [{"ip": "198.19.0.12", "prefixlen": 16}]  # n002's
    view = view_of(facts)
    choice = datanet.choose(view)
    assert choice.subnet == "198.19.0.0/16"
    assert set(choice.nodes) == {"n001"}
    for node, other in (("n002", "n003"), ("n003", "n002")):
        assert "address conflict: 198.19.0.12 on eth1 is also on %s" % other in choice.missing[node]
    statuses = _statuses(nic_rule.rule(view))
    assert statuses == {"n001": Status.PASS, "n002": Status.FAIL, "n003": Status.FAIL}


def test_same_address_on_every_node_is_still_host_local():
    facts = three_sim()
    for f in facts.values():
        f["interfaces"].append(iface("br9", "10.99.0.1", 16, 9000, 100000, "bridge", physical=False))
    choice = datanet.choose(view_of(facts))
    assert choice.subnet == "198.19.0.0/16" and not choice.missing


def test_two_node_cluster_with_one_data_address_on_both_physical_nics_is_a_conflict():
    """Two nodes whose physical data NICs hold the same address: 'every node' here is two hosts in
    conflict, not a host-local bridge (bridges and container links are virtual)."""
    facts = {"n%03d" % i: sim_node(i) for i in (1, 2)}
    for f in facts.values():
        eth1 = f["interfaces"][2]
        eth1["physical"], eth1["kind"] = True, None
        eth1["addresses"] = [{"ip": "198.19.0.11", "prefixlen": 16}]
    choice = datanet.choose(view_of(facts))
    assert choice.subnet == "198.19.0.0/16" and choice.nodes == {}
    assert "address conflict: 198.19.0.11 on eth1 is also on n002" in choice.missing["n001"]
    assert _statuses(nic_rule.rule(view_of(facts))) == {"n001": Status.FAIL, "n002": Status.FAIL}

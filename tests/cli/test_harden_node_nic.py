"""Issue 26 item 13: `preflight node` as slurmd runs it (no inventory, or one without data_interface) must not pass a
node whose data NIC is down by falling back to the management interface; `expect.mtu` is enforced there.

Run inside a simulated node's namespace with its own hostname, the real `ip` on PATH and its sysfs root,
as slurmd runs a HealthCheckProgram (no SSH_CONNECTION: nothing says which interface is management).
Healthy twins: a node that simply has only a management NIC (a CPU-only login node), a spare port at the
standard MTU that is down, and the data NIC up.
"""

from __future__ import annotations

import subprocess

from preflight.checks.nic import rule as nic_rule
from tests.builders import node_check, view



def node_mode(cluster, *args):
    """`preflight node --only nic` in n001's namespace, as slurmd starts it: (rc, its log lines)."""
    out = node_check(cluster, "n001", "--gpus-per-node", "0", "--only", "nic", *args)
    return out.returncode, out.stdout.splitlines()


def nic_lines(lines):
    return [l for l in lines if l.startswith(("preflight: FAIL nic", "preflight: ERROR nic", "preflight: WARN nic"))]


#: as real hardware reads: a 1 GbE management port, a 100 GbE data NIC (-1: no link, its speed unknown)
MGMT_1G, DATA_UP, DATA_NO_LINK = {"eth0": 1000}, {"eth1": 100000}, {"eth1": -1}


def test_a_down_jumbo_data_nic_fails_the_node_alone_and_a_management_only_node_passes(sim_cluster, tmp_path):
    cluster = sim_cluster(1)
    cluster.nic_speeds("n001", dict(MGMT_1G, **DATA_UP))
    rc, lines = node_mode(cluster)
    assert rc == 0 and not nic_lines(lines), lines  # eth1 up at 9000: the data NIC
    cluster.heal("n001")

    cluster.data_link_down("n001")  # the cable pulled: eth1 keeps 198.19.0.3/16 and mtu 9000, no carrier
    cluster.nic_speeds("n001", dict(MGMT_1G, **DATA_NO_LINK))
    rc, lines = node_mode(cluster)
    print("\n".join(lines))
    assert rc == 1, lines
    (line,) = nic_lines(lines)
    assert line.startswith("preflight: FAIL nic: data NIC down: eth1 198.19.0.3/16 mtu 9000 is down"), line
    assert "eth0 198.18.0.3/16 mtu 1500" in line, line

    inv = tmp_path / "hosts.yaml"  # the fleet's inventory, without data_interface: expect.mtu names the data NIC
    inv.write_text("cluster:\n  expect:\n    mtu: 9000\nnodes: [n001, n002]\n")
    rc, lines = node_mode(cluster, "--inventory", str(inv))
    assert rc == 1 and "mtu 9000 is down" in nic_lines(lines)[0] and "expect.mtu 9000" in nic_lines(lines)[0], lines

    cluster.heal("n001")
    cluster.remove_data_nic("n001")  # healthy twin: a login node with only its management NIC
    cluster.nic_speeds("n001", MGMT_1G)
    rc, lines = node_mode(cluster)
    assert rc == 0 and not nic_lines(lines), lines
    rc, lines = node_mode(cluster, "--inventory", str(inv))  # ... unless the fleet expects jumbo frames
    assert rc == 1, lines
    (line,) = nic_lines(lines)
    assert "eth0 198.18.0.3/16 mtu 1500" in line and "expected 9000 (expect.mtu)" in line, line
    cluster.heal("n001")
    rc, lines = node_mode(cluster, "--inventory", str(inv))
    assert rc == 0 and not nic_lines(lines), lines


def test_a_spare_port_at_the_standard_mtu_that_is_down_is_not_a_data_nic(sim_cluster):
    cluster = sim_cluster(1)
    node = cluster.node("n001")
    cluster.data_link_down(node)
    cluster.nic_speeds(node, dict(MGMT_1G, **DATA_NO_LINK))
    subprocess.run(["ip", "-n", node.ns, "link", "set", "eth1", "mtu", "1500"], check=True)
    rc, lines = node_mode(cluster)
    assert rc == 0 and not nic_lines(lines), lines


# --- the rule on facts: the same decisions without namespaces -------------------------------------------------


def iface(name, ip, mtu, up=True, kind=None, speed=None):
    return {"name": name, "state": "UP" if up else "DOWN", "up": up, "mtu": mtu, "link_type": "ether", "master": None,
            "addresses": [{"ip": ip, "prefixlen": 16}], "speed_mbps": speed, "arp_type": 1, "physical": True,
            "kind": kind}


def judge(interfaces, expect=None, nodes=("n001",)):
    def on(i, ifaces):  # each node its own addresses: 10.x.0.5 on n001, 10.x.0.6 on n002
        return [dict(f, addresses=[{"ip": f["addresses"][0]["ip"][:-1] + str(5 + i), "prefixlen": 16}]) for f in ifaces]

    facts = {n: {"nic": {"interfaces": on(i, interfaces), "ssh_ip": None}} for i, n in enumerate(nodes)}
    return [f for f in nic_rule.rule(view(facts, gpus=0, expect=expect or {})) if f.node == "n001"]


def test_rule_down_jumbo_port_alone_fails_and_its_twins_pass():
    mgmt = iface("eno1", "10.0.0.5", 1500, speed=1000)
    data_down = iface("ens1f0", "10.1.0.5", 9000, up=False)
    (f,) = judge([mgmt, data_down])
    assert f.status.value == "fail" and f.message.startswith("data NIC down: ens1f0 10.1.0.5/16 mtu 9000 is down"), f
    assert f.action is None and f.expected and "ens1f0" in f.actual  # the check's action (fix_config) applies
    assert judge([mgmt])[0].status.value == "pass"  # management only
    assert judge([mgmt, iface("ens1f1", "10.2.0.5", 1500, up=False)])[0].status.value == "pass"  # spare, standard MTU
    assert judge([mgmt, iface("docker0", "172.17.0.1", 9000, up=False)])[0].status.value == "pass"  # a bridge
    up = judge([mgmt, iface("ens1f0", "10.1.0.5", 9000, speed=100000)])
    assert up[0].status.value == "pass" and up[0].actual == "ens1f0"


def test_rule_expect_mtu_is_enforced_on_a_node_alone_and_names_the_down_port_in_a_cluster():
    mgmt = iface("eno1", "10.0.0.5", 1500, speed=1000)
    (f,) = judge([mgmt], expect={"mtu": 9000})
    assert f.status.value == "fail" and "expected 9000 (expect.mtu)" in f.message, f
    assert judge([iface("ens1f0", "10.1.0.5", 9000)], expect={"mtu": 9000})[0].status.value == "pass"
    # in a cluster the mtu check judges the MTU; nic names only a down port that holds the expected MTU
    assert judge([mgmt], expect={"mtu": 9000}, nodes=("n001", "n002"))[0].status.value == "pass"
    (f,) = judge([mgmt, iface("ens1f0", "10.1.0.5", 9000, up=False)], expect={"mtu": 9000}, nodes=("n001", "n002"))
    assert f.status.value == "fail" and "ens1f0 10.1.0.5/16 mtu 9000 is down" in f.message, f

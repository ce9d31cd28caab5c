"""The nic probe runs one `ip -j -d addr show` where it ran `ip -j addr show` and `ip -j -d link show`: the real
iproute2 of this machine, in a network namespace of its own holding links of several kinds, gives both parsers the
same answers from the one command as from the two (one process less on every node, every run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from preflight.checks.nic import probe as nic_probe
from preflight.probe.context import NodeContext

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                                reason="needs root, unshare(1) and iproute2")

#: links of the kinds this kernel can make in a namespace (bridge, veth enslaved to it, vxlan), addresses on two;
#: each step checked (sh -e): a kind the kernel lacks fails the test rather than thinning it. The kernel reports a
#: link's operational state asynchronously (linkwatch: up to a second after `ip link set up`), so the commands
#: compared run only once the bridge and both veth ends are operationally UP; before that, two commands a moment
#: apart could see br0 DOWN, then UP (seen once in CI under load)
SETUP = """
ip link set lo up
ip link add br0 type bridge
ip link add v0 type veth peer name v1
ip link set v1 master br0
ip link add vx0 type vxlan id 42 dstport 4789 local 10.9.0.1
ip addr add 10.9.0.1/24 dev br0
ip addr add fd00::1/64 dev v0
ip link set br0 up
ip link set v0 up
ip link set v1 up
n=0
until [ "$(ip -br link show dev br0 | awk '{print $2}')" = UP ] && [ "$(ip -br link show dev v0 | awk '{print $2}')" = UP ] \
      && [ "$(ip -br link show dev v1 | awk '{print $2}')" = UP ]; do
    n=$((n + 1)); [ $n -lt 200 ] || { echo "br0, v0, v1 not operationally UP after 10 s" >&2; exit 1; }; sleep 0.05
done
"""


def _in_a_namespace(*commands: str) -> list:
    """The stdout of each `ip` command run in one fresh network namespace set up by SETUP (gone when it exits)."""
    script = SETUP + "\n".join("%s; echo ====" % c for c in commands)
    out = subprocess.run(["unshare", "-n", "sh", "-ec", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("====\n")[:len(commands)]


@needs_root
def test_one_ip_d_addr_gives_both_parsers_what_the_two_commands_gave():
    addr, link, both = _in_a_namespace("ip -j addr show", "ip -j -d link show", "ip -j -d addr show")
    kinds = nic_probe.parse_ip_link(both)
    assert kinds == nic_probe.parse_ip_link(link)
    assert {"br0": "bridge", "v0": "veth", "v1": "veth", "vx0": "vxlan", "lo": None}.items() <= kinds.items(), kinds
    assert nic_probe.parse_ip_addr(both) == nic_probe.parse_ip_addr(addr)
    assert {"ip": "10.9.0.1", "prefixlen": 24} in {i["name"]: i for i in nic_probe.parse_ip_addr(both)}["br0"]["addresses"]
    assert json.loads(both)[0]["ifname"] == "lo"


def test_the_probe_runs_ip_once(tmp_path, monkeypatch):
    """What the probe starts, read from a recording `ip` on PATH in front of the real one."""
    real = shutil.which("ip")
    if real is None:
        pytest.skip("iproute2 is not installed")
    (tmp_path / "ip").write_text("#!/bin/sh\necho \"$*\" >> %s/calls\nexec %s \"$@\"\n" % (tmp_path, real))
    (tmp_path / "ip").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    facts = nic_probe.probe(NodeContext(sysfs_root="/sys"))
    assert (tmp_path / "calls").read_text().splitlines() == ["-j -d addr show"]
    assert any(i["name"] == "lo" and i["kind"] == "loopback" for i in facts["interfaces"])

"""preflight.checks.allreduce.nccllog: what the NCCL log fixtures must cover, and NCCL_SOCKET_IFNAME's syntax.

Every case under tests/fixtures/allreduce runs through parse_nccl_log in tests/checks/test_fixtures.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.checks.allreduce import nccllog
from tests.paths import TESTS


_NCCL_FIXTURES = Path(TESTS) / "fixtures" / "allreduce"


_NCCL_CASES = sorted(p.stem for p in _NCCL_FIXTURES.glob("*.json"))


def test_nccl_fixtures_cover_the_four_paths():
    got = {c: json.loads((_NCCL_FIXTURES / (c + ".json")).read_text()).get("expected") for c in _NCCL_CASES}
    assert got["ib_gdr"]["transport"] == "NET/IB" and got["ib_gdr"]["gdr_used"] is True
    assert got["ib_no_gdr"]["gdr"] == {"mlx5_0": False, "mlx5_1": False} and got["ib_no_gdr"]["gdr_used"] is False
    assert got["socket_fallback"]["transport"] == "NET/Socket" and got["socket_fallback"]["ib_no_device"]
    assert got["wrong_interface"]["devices"] == [{"name": "lo", "addr": "127.0.0.1"}]
    assert got["old_2_4_socket"]["intra"] == ["SHM"] and got["old_2_4_socket"]["version"] == "2.4.7"
    assert "NVLS" in got["plugin_ibext_nvls"]["intra"]


@pytest.mark.parametrize("spec,name,ok", [
    ("=eth1", "eth1", True), ("=eth1", "eth10", False), ("eth", "eth10", True), ("^docker,lo", "eth0", True),
    ("^docker,lo", "docker0", False), (None, "lo", False), (None, "ens3", True), ("=eth1,ib0", "ib0", True)])
def test_ifname_syntax(spec, name, ok):
    assert nccllog.ifname_allows(spec, name) is ok


# ------------------------------------------------------------------ several hosts in one log (issue 40 item 8)

def _fixture_log(name):
    return nccllog.parse_nccl_log((_NCCL_FIXTURES / (name + ".log")).read_text())


def test_each_host_keeps_the_hcas_its_nccl_listed():
    """NVIDIA/nccl#981's shape: master lists mlx5_2/mlx5_3, worker mlx5_0/mlx5_1; both are kept, by host."""
    log = _fixture_log("multihost_hca_names_differ")
    assert {h: e["devices"] for h, e in log["per_host"].items()} == {
        "master": ["mlx5_2:1/IB", "mlx5_3:1/IB"], "worker": ["mlx5_0:1/IB", "mlx5_1:1/IB"]}
    assert log["devices"] == ["mlx5_2:1/IB", "mlx5_3:1/IB", "mlx5_0:1/IB", "mlx5_1:1/IB"]
    assert log["env"]["NCCL_IB_HCA"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"


def test_hosts_that_name_their_hcas_apart_are_named_when_nccl_ib_hca_names_them():
    log = _fixture_log("multihost_hca_names_differ")
    by_host = {h: e["devices"] for h, e in log["per_host"].items()}
    found = nccllog.hca_mismatch(by_host, log["env"]["NCCL_IB_HCA"])
    assert found == {"spec": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
                     "groups": [[["master"], ["mlx5_2:1", "mlx5_3:1"]], [["worker"], ["mlx5_0:1", "mlx5_1:1"]]]}
    # the twins: no NCCL_IB_HCA, or one that only excludes ports, leaves NCCL to pick on each host
    assert nccllog.hca_mismatch(by_host, None) is None
    assert nccllog.hca_mismatch(by_host, "^mlx5_4") is None
    # the same HCA on both hosts (NVIDIA/nccl-tests#133, verbatim) with NCCL_IB_HCA set: nothing to say
    same = _fixture_log("multihost_same_hca_roce")
    assert {h: e["devices"] for h, e in same["per_host"].items()} == {"nodea": ["mlx5_6:1/RoCE"],
                                                                      "nodeb": ["mlx5_6:1/RoCE"]}
    assert {h: e["oob"]["name"] for h, e in same["per_host"].items()} == {"nodea": "xgbe4", "nodeb": "xgbe0"}
    assert nccllog.hca_mismatch({h: e["devices"] for h, e in same["per_host"].items()}, "mlx5_6") is None


def test_a_veth_on_one_host_of_several_is_flagged_with_its_channels():
    """The second host's socket list came last; read as one list it hid the first host's veth, whose
    channels ("via NET/Socket/1") then pointed past the end of it and the log read clean."""
    log = _fixture_log("multihost_veth_on_one_host")
    (veth,) = nccllog.suspect_ifaces([log])
    assert (veth["name"], veth["role"], veth["used"], veth["hosts"]) == ("veth25f2e72", "net", True, ["gpu-005"])
    assert "has only an IPv6 link-local address (fe80::380d:bfff:fe5b:54d2)" in veth["reason"]
    # the twin: the other host, alone, uses its routable eth1
    text = "\n".join(line for line in (_NCCL_FIXTURES / "multihost_veth_on_one_host.log").read_text().splitlines()
                     if "gpu-006" in line)
    assert nccllog.suspect_ifaces([nccllog.parse_nccl_log(text)]) == []


def test_a_container_overlay_every_host_listed_is_named_with_its_hosts_and_only_warns():
    """NVIDIA/nccl#224, verbatim: gpu6 and gpu7 both list flannel.1 (Kubernetes' overlay) for sockets."""
    from preflight.model import Status

    log = _fixture_log("multihost_flannel_listed_mpirun")
    (flannel,) = nccllog.suspect_ifaces([log])
    assert (flannel["name"], flannel["used"], flannel["hosts"]) == ("flannel.1", False, ["gpu6", "gpu7"])
    text = (_NCCL_FIXTURES / "multihost_flannel_listed_mpirun.log").read_text()
    f, _ = _two_nodes([text, (_NCCL_FIXTURES / "socket_fallback.log").read_text()])
    assert f.status is Status.WARN and "NCCL listed for its sockets flannel.1: flannel.1 is a container/bridge " \
        "interface" in f.message, f.message


def test_nccl_own_failures_are_read_by_stage_and_a_harmless_warn_is_not_one():
    assert [(f["stage"], f["level"]) for f in _fixture_log("bootstrap_no_interface")["failures"]] == [
        ("bootstrap", "WARN")]
    assert [f["stage"] for f in _fixture_log("bootstrap_connect_no_route")["failures"]] == ["connect", "connect"]
    assert [f["stage"] for f in _fixture_log("ib_error_chain_unreachable")["failures"]] == ["connect", "proxy"]
    retry = _fixture_log("veth_link_local_timeout")["failures"]
    assert {(f["stage"], f["level"]) for f in retry} == {("connect", "INFO")}
    # NVIDIA/nccl#857 (a healthy socket-only host): a WARN NCCL survives is no failure, nor the proxy's INFO lines
    healthy = nccllog.parse_nccl_log(
        "ai:480850:480850 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
        "ai:480850:480850 [0] NCCL INFO NET/Socket : Using [0]eth0:162.30.2.40<0>\n"
        "spark-4440:24302:24310 [0] NCCL INFO [Proxy Service] Device 0 CPU core 0\n")
    assert healthy["failures"] == [] and healthy["warnings"] == ["Failed to open libibverbs.so[.1]"]


# --------------------------------------------------------------- the rule's words for them (checks/allreduce)

def _two_nodes(logs, env=None, failed=()):
    from preflight.checks.allreduce import rule as ar_rule
    from tests.allreduce_docs import GiB, cluster, eight_ranks_on, hung_entry

    docs = eight_ranks_on(2, 1, [GiB], time_s=0.01)
    for i, (d, text) in enumerate(zip(docs, logs)):
        d["ranks"][0]["nccl_log"] = text
        if i in failed:
            d["ranks"][0].update(hung_entry("init", None))
    view = cluster(docs, gpus=1, env=env or {})
    meta = view.cluster["allreduce"]
    return ar_rule.nccl_findings(view, meta, {n: d for n, d in zip(meta["nodes"], docs)})


def _host_lines(name, host):
    return "\n".join(line for line in (_NCCL_FIXTURES / (name + ".log")).read_text().splitlines()
                     if line.startswith(host) or line.startswith("NCCL version")) + "\n"


def test_the_nodes_whose_hcas_differ_are_named_when_nccl_ib_hca_names_them():
    master, worker = _host_lines("multihost_hca_names_differ", "master"), _host_lines("multihost_hca_names_differ", "worker")
    from preflight.model import Status

    found = [f for f in _two_nodes([master, worker]) if f.node is None]
    (f,) = found  # NCCL_IB_HCA read from the logs' "set by environment" line
    assert f.status is Status.WARN and f.action == "fix_config", f
    assert "NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3 names HCAs" in f.message
    assert "n001 mlx5_2:1,mlx5_3:1; n002 mlx5_0:1,mlx5_1:1" in f.message, f.message
    # the twins: the same names on both nodes, or names that differ with no NCCL_IB_HCA at all
    assert [f for f in _two_nodes([master, master]) if f.node is None] == []
    plain = [line for line in master.splitlines() if "NCCL_IB_HCA" not in line]
    other = [line for line in worker.splitlines() if "NCCL_IB_HCA" not in line]
    assert [f for f in _two_nodes(["\n".join(plain), "\n".join(other)]) if f.node is None] == []


def test_a_bootstrap_failure_fails_the_node_whose_rank_failed_and_warns_where_it_survived():
    from preflight.model import Status

    bootstrap = (_NCCL_FIXTURES / "bootstrap_no_interface.log").read_text()
    healthy = (_NCCL_FIXTURES / "socket_fallback.log").read_text()
    f, g = _two_nodes([bootstrap, healthy], failed=(0,))
    assert f.status is Status.FAIL and f.action == "fix_config", f
    assert "NCCL's bootstrap failed: \"Bootstrap : no socket interface found\" on ubuntu (its TCP rendezvous " \
           "between ranks: NCCL_SOCKET_IFNAME must name an interface every node can reach" in f.message, f.message
    assert g.status is Status.PASS, g.message
    f, _ = _two_nodes([bootstrap, healthy])
    assert f.status is Status.WARN and "NCCL's bootstrap failed" in f.message, f.message


def test_the_cause_stage_leads_and_the_proxy_that_followed_is_named_after_it():
    from preflight.model import Status

    f, _ = _two_nodes([(_NCCL_FIXTURES / "ib_error_chain_unreachable.log").read_text(),
                       (_NCCL_FIXTURES / "ib_gdr.log").read_text()], failed=(0,))
    assert f.status is Status.FAIL, f.message
    assert 'NCCL reported network faults between nodes: "Call to ibv_modify_qp failed with error Network is ' \
           'unreachable"' in f.message and "then its proxy failed" in f.message, f.message

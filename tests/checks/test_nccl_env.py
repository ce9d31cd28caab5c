"""nccl_env: the conf-file parser on real-format files, NCCL's precedence, the list matching, the rule."""

import os

import pytest

from preflight.checks.nccl_env import probe as nccl_env_probe
from preflight.checks.nccl_env import rule as nccl_env_rule
from preflight.model import Status
from preflight.probe import ncclconf
from preflight.probe.context import NodeContext
from tests.builders import env_view, ib_port as port, roce_port


def conf(path, role, *entries, malformed=()):
    return {"path": path, "role": role, "exists": True, "error": None,
            "entries": [{"key": k, "value": v, "line": i} for i, (k, v) in enumerate(entries, 1)],
            "malformed": list(malformed)}


def facts(environ=None, system=(), user=()):
    return {"environ": dict(environ or {}), "user": "root", "home": "/root",
            "files": [conf("/root/.nccl.conf", "user", *user), conf("/etc/nccl.conf", "system", *system)]}


def test_precedence_is_ncclS_environment_then_user_then_system():
    f = facts({"NCCL_DEBUG": "INFO"}, system=[("NCCL_DEBUG", "WARN"), ("NCCL_IB_TIMEOUT", "22")],
              user=[("NCCL_IB_TIMEOUT", "20"), ("NCCL_IB_TIMEOUT", "21")])
    assert ncclconf.effective(f) == {
        "NCCL_DEBUG": ("INFO", "environment"),
        "NCCL_IB_TIMEOUT": ("20", "/root/.nccl.conf:1"),
    }


@pytest.mark.parametrize(
    "spec, name, port_, hit",
    [
        ("=eth1", "eth1", None, True),
        ("=eth1", "eth10", None, False),
        ("eth", "eth1", None, True),
        ("eth0", "eth1", None, False),
        ("^docker,lo", "eth1", None, True),
        ("^eth", "eth1", None, False),
        ("=mlx5_0:1,mlx5_1:1", "mlx5_1", 1, True),
        ("mlx5_0:1", "mlx5_1", 1, False),
        ("mlx5", "mlx5_3", 1, True),
    ],
)
def test_nccl_list_matching(spec, name, port_, hit):
    assert nccl_env_rule.selects(spec, name, port_) is hit


def view_with(node_facts, ib=None):
    view = env_view(3, ib=ib)
    for name, f in node_facts.items():
        view.facts[name]["nccl_env"] = f
    return view


def by_node(findings):
    out = {}
    for f in findings:
        out.setdefault(f.node, []).append(f)
    return out


def test_same_settings_everywhere_pass():
    same = facts({"NCCL_DEBUG": "WARN"})
    out = by_node(nccl_env_rule.rule(view_with({n: same for n in ("n001", "n002", "n003")})))
    for name in ("n001", "n002", "n003"):
        assert [f.status for f in out[name]] == [Status.PASS]
        assert "NCCL_DEBUG=WARN (environment)" in out[name][0].message


def test_stale_socket_ifname_in_one_nodes_etc_nccl_conf_fails_naming_file_and_line():
    stale = facts(system=[("NCCL_DEBUG", "WARN"), ("NCCL_SOCKET_IFNAME", "eth0")])
    good = facts(system=[("NCCL_DEBUG", "WARN")])
    out = by_node(nccl_env_rule.rule(view_with({"n001": good, "n002": stale, "n003": good})))
    fails = [f for f in out["n002"] if f.status is Status.FAIL]
    assert len(fails) == 1, out["n002"]
    assert fails[0].message == (
        "n002: NCCL_SOCKET_IFNAME=eth0 (/etc/nccl.conf:2) does not select the data interface eth1 (recommended =eth1)"
    )
    assert fails[0].data == {"key": "NCCL_SOCKET_IFNAME", "value": "eth0", "source": "/etc/nccl.conf:2"}
    assert [f.status for f in out["n001"]] == [Status.PASS] and [f.status for f in out["n003"]] == [Status.PASS]


def test_a_prefix_that_selects_the_data_interface_is_no_contradiction():
    ok = facts(system=[("NCCL_SOCKET_IFNAME", "eth")])
    out = nccl_env_rule.rule(view_with({n: ok for n in ("n001", "n002", "n003")}))
    assert {f.status for f in out} == {Status.PASS}


def test_ib_disable_and_missing_hca_contradict_usable_ports():
    ports = [port("mlx5_0"), port("mlx5_1")]
    ib = {n: ports for n in ("n001", "n002", "n003")}
    bad = facts({"NCCL_IB_DISABLE": "1"}, system=[("NCCL_IB_HCA", "mlx5_0")])
    good = facts()
    out = by_node(nccl_env_rule.rule(view_with({"n001": good, "n002": bad, "n003": good}, ib=ib)))
    text = " | ".join(f.message for f in out["n002"] if f.status is Status.FAIL)
    assert "NCCL_IB_DISABLE=1 (environment) turns InfiniBand/RoCE off although mlx5_0:1,mlx5_1:1 are usable" in text
    assert "NCCL_IB_HCA=mlx5_0 (/etc/nccl.conf:1) leaves out the usable HCA port mlx5_1:1" in text


def test_drift_of_a_must_match_variable_fails_and_of_debug_warns():
    a = facts({"NCCL_PROTO": "Simple", "NCCL_DEBUG": "WARN"})
    b = facts({"NCCL_PROTO": "LL128", "NCCL_DEBUG": "INFO"})
    out = by_node(nccl_env_rule.rule(view_with({"n001": a, "n002": b, "n003": a})))
    statuses = sorted((f.status.value, f.data["key"]) for f in out["n002"])
    assert statuses == [("fail", "NCCL_PROTO"), ("warn", "NCCL_DEBUG")]
    proto = next(f for f in out["n002"] if f.data["key"] == "NCCL_PROTO")
    assert proto.message == "n002: NCCL_PROTO=LL128 (environment) differs from the other nodes (n[001,003]: NCCL_PROTO=Simple)"
    assert [f.status for f in out["n001"]] == [Status.PASS]


def test_a_tie_has_no_reference_and_names_every_differing_node():
    view = env_view(2)
    view.facts["n001"]["nccl_env"] = facts({"NCCL_ALGO": "Ring"})
    view.facts["n002"]["nccl_env"] = facts()
    out = nccl_env_rule.rule(view)
    assert {f.node for f in out if f.status is Status.FAIL} == {"n001", "n002"}
    assert all("no majority" in f.message for f in out if f.status is Status.FAIL)


def test_malformed_line_warns_and_missing_facts_error():
    view = view_with({"n001": facts(), "n003": facts()})
    view.facts["n001"]["nccl_env"]["files"][1]["malformed"] = [{"line": 3, "text": "export NCCL_DEBUG=INFO"}]
    out = by_node(nccl_env_rule.rule(view))
    assert out["n001"][0].status is Status.WARN and "/etc/nccl.conf:3 'export NCCL_DEBUG=INFO'" in out["n001"][0].message
    assert out["n002"][0].status is Status.ERROR


def test_probe_reads_conf_files_under_the_host_root(tmp_path, monkeypatch):
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nccl.conf").write_text("NCCL_SOCKET_IFNAME=eth0\n")
    user = tmp_path / home.lstrip("/")
    user.mkdir(parents=True)
    (user / ".nccl.conf").write_text("NCCL_DEBUG=INFO\n")
    monkeypatch.setenv("PREFLIGHT_HOST_ROOT", str(tmp_path))
    monkeypatch.setenv("NCCL_IB_TIMEOUT", "22")
    monkeypatch.delenv("NCCL_CONF_FILE", raising=False)
    f = nccl_env_probe.probe(NodeContext())
    assert f["environ"]["NCCL_IB_TIMEOUT"] == "22" and "PREFLIGHT_HOST_ROOT" not in f["environ"]
    assert ncclconf.effective(f)["NCCL_SOCKET_IFNAME"] == ("eth0", "/etc/nccl.conf:1")
    assert ncclconf.effective(f)["NCCL_DEBUG"] == ("INFO", "%s/.nccl.conf:1" % home)
    # NCCL_CONF_FILE replaces ~/.nccl.conf (NCCL 2.19+), /etc/nccl.conf is still read
    (tmp_path / "site.conf").write_text("NCCL_ALGO=Ring\n")
    monkeypatch.setenv("NCCL_CONF_FILE", "/site.conf")
    eff = ncclconf.effective(nccl_env_probe.probe(NodeContext()))
    assert eff["NCCL_ALGO"] == ("Ring", "/site.conf:1") and "NCCL_DEBUG" not in eff


# ------------------------------------------------------------------------------------------ issue 25.8


@pytest.mark.parametrize("key, a, b", [("NCCL_IB_TC", "106", "0"), ("NCCL_IB_SL", "3", "0"), ("NCCL_IB_FIFO_TC", "106", "0")])
def test_rdma_traffic_class_and_service_level_must_match(key, a, b):
    """A node on another traffic class / service level puts its RDMA traffic in the lossy queue: FAIL, not WARN."""
    same, other = facts(system=[(key, a)]), facts(system=[(key, b)])
    out = by_node(nccl_env_rule.rule(view_with({"n001": same, "n002": other, "n003": same})))
    assert [(f.status, f.data["key"]) for f in out["n002"]] == [(Status.FAIL, key)]
    assert "differs from the other nodes (n[001,003]: %s=%s)" % (key, a) in out["n002"][0].message
    # the healthy twin: the same class everywhere
    out = nccl_env_rule.rule(view_with({n: same for n in ("n001", "n002", "n003")}))
    assert {f.status for f in out} == {Status.PASS}


def two_homes(passwd_entries, home_entries):
    """Facts of a node whose account's home (/root) differs from $HOME (/scratch/job): two user files."""
    f = facts()
    f["home_env"] = "/scratch/job"
    f["files"] = [
        dict(conf("/root/.nccl.conf", "user", *passwd_entries), via=["passwd"]),
        dict(conf("/scratch/job/.nccl.conf", "user", *home_entries), via=["HOME"]),
        conf("/etc/nccl.conf", "system"),
    ]
    return f


@pytest.mark.parametrize("version, where", [((2, 30, 3), "/scratch/job/.nccl.conf:1"), ((2, 30, 2), "/root/.nccl.conf:1"),
                                            ((2, 21, 5), "/root/.nccl.conf:1"), (None, "/root/.nccl.conf:1")])
def test_user_conf_file_is_the_one_the_nodes_nccl_version_reads(version, where):
    """From NCCL 2.30.3 ~/.nccl.conf is found through $HOME, before through the account's home directory."""
    f = two_homes([("NCCL_IB_TC", "106")], [("NCCL_IB_TC", "0")])
    assert ncclconf.effective(f, version)["NCCL_IB_TC"][1] == where
    f["home_env"] = None  # HOME unset: the account's home directory on every version
    assert ncclconf.effective(f, (2, 30, 3))["NCCL_IB_TC"][1] == "/root/.nccl.conf:1"


def test_rule_reads_the_user_file_of_each_nodes_nccl_version():
    """The driver check's NCCL version decides: on 2.30.3 nodes the $HOME file (TC 0) is read, and it differs
    from the other nodes' TC 106 (read from the account's home on 2.21.5 nodes)."""
    view = env_view(3, nccl={"n001": "2.21.5", "n002": "2.30.3", "n003": "2.21.5"})
    for name in ("n001", "n002", "n003"):
        view.facts[name]["nccl_env"] = two_homes([("NCCL_IB_TC", "106")], [("NCCL_IB_TC", "0")])
    out = by_node(nccl_env_rule.rule(view))
    assert [(f.status, f.data["source"]) for f in out["n002"]] == [(Status.FAIL, "/scratch/job/.nccl.conf:1")]
    assert [f.status for f in out["n001"]] == [Status.PASS]


def test_probe_lists_the_home_and_the_account_home_files(tmp_path, monkeypatch):
    import pwd

    home = pwd.getpwuid(os.getuid()).pw_dir
    job = tmp_path / "scratch" / "job"
    job.mkdir(parents=True)
    (job / ".nccl.conf").write_text("NCCL_IB_SL=3\n")
    monkeypatch.setenv("PREFLIGHT_HOST_ROOT", str(tmp_path))
    monkeypatch.setenv("HOME", "/scratch/job")
    monkeypatch.delenv("NCCL_CONF_FILE", raising=False)
    f = nccl_env_probe.probe(NodeContext())
    assert [(x["path"], x.get("via"), x["exists"]) for x in f["files"]] == [
        (os.path.join(home, ".nccl.conf"), ["passwd"], False),
        ("/scratch/job/.nccl.conf", ["HOME"], True),
        ("/etc/nccl.conf", None, False),
    ]
    assert f["home_env"] == "/scratch/job"
    assert ncclconf.effective(f, (2, 30, 3))["NCCL_IB_SL"] == ("3", "/scratch/job/.nccl.conf:1")
    assert "NCCL_IB_SL" not in ncclconf.effective(f, (2, 29, 7))


def test_an_interface_list_that_also_selects_the_management_port_contradicts():
    """25.1: '=eno1,eth1' selects the data NIC eth1 and the management port eno1 (which holds an address):
    NCCL's bootstrap takes the first match, its socket transport every match. Its twin '=eth1,ens9' (ens9 not
    there) selects only the data NIC."""
    wide, exact = facts({"NCCL_SOCKET_IFNAME": "=eno1,eth1"}), facts({"NCCL_SOCKET_IFNAME": "=eth1,ens9"})
    out = by_node(nccl_env_rule.rule(view_with({n: wide for n in ("n001", "n002", "n003")})))
    fail = [f for f in out["n002"] if f.status is Status.FAIL]
    assert len(fail) == 1 and fail[0].message == (
        "n002: NCCL_SOCKET_IFNAME==eno1,eth1 (environment) also selects eno1 (10.0.0.12), not the data interface eth1: "
        "NCCL's bootstrap takes the first match in interface order and its socket transport spreads over every match "
        "(recommended =eth1)")
    out = nccl_env_rule.rule(view_with({n: exact for n in ("n001", "n002", "n003")}))
    assert {f.status for f in out} == {Status.PASS}


def test_per_node_values_the_env_file_asks_for_are_no_drift_and_a_wrong_one_contradicts():
    """NCCL 2.19 and the RoCE v2 GID at index 3 on n001, 5 on n002/n003: the env file gives per-node values;
    nodes that set them are not drift (the healthy-but-unusual twin), a node that sets another index fails."""

    ib = {n: [roce_port("mlx5_0", [(i, "10.1.0.%d" % (10 + k), "ens1f0np0")])]
          for k, (n, i) in enumerate((("n001", 3), ("n002", 5), ("n003", 5)), 1)}
    view = env_view(3, nccl="2.19.3", ib=ib)
    for name, index in (("n001", "3"), ("n002", "5"), ("n003", "5")):
        view.facts[name]["nccl_env"] = facts(system=[("NCCL_IB_GID_INDEX", index)])
    assert {f.status for f in nccl_env_rule.rule(view)} == {Status.PASS}
    view.facts["n003"]["nccl_env"] = facts(system=[("NCCL_IB_GID_INDEX", "3")])
    out = by_node(nccl_env_rule.rule(view))
    assert [(f.status, f.message) for f in out["n003"]] == [
        (Status.FAIL, "n003: NCCL_IB_GID_INDEX=3 (/etc/nccl.conf:1) is not the RoCE v2 GID index 5")]
    assert {f.status for f in out["n001"] + out["n002"]} == {Status.PASS}

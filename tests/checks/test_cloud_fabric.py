"""cloud_fabric (issue 37): EFA, GPUDirect-TCPX/TCPXO and gIB recognised from node facts and judged; their env
lines; ib_errors quiet on healthy EFA devices; each fabric's NCCL log read to its network.

Simulated nodes present each fabric through the interfaces real ones use (tests/sim/cloud_hw.py): a sysfs
tree, programs on PATH, files under the host root. The probe runs in-process on a stand-in node here (a
SimNode's class/net is its namespace's real sysfs, where no gVNIC can be made), and over SSH for EFA.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from preflight.checks.cloud_fabric import probe as cf_probe
from preflight.checks.cloud_fabric import efa_counters
from preflight.checks.cloud_fabric import rule as cf_rule
from preflight.checks.ib_errors import probe as ib_errors_probe
from preflight.checks.ib_errors import rule as ib_errors_rule
from preflight.checks.allreduce.nccllog import fabric_of, parse_nccl_log
from preflight.derived import envfabric
from preflight.derived.envvars import Derived
from preflight.model import ParseError, Status
from preflight.probe.context import NodeContext
from tests.builders import view

from tests.paths import TESTS

sys.path.insert(0, TESTS)  # `sim` importable however pytest was started
from sim import cloud_hw, ib_hw  # noqa: E402

FIXTURES = Path(TESTS) / "fixtures"


@pytest.fixture
def node_probe(tmp_path, monkeypatch):
    """probe(make) -> the cloud_fabric facts of a stand-in node that make(node) filled."""
    count = [0]

    def run(make, check=cf_probe):
        count[0] += 1
        node = cloud_hw.StandIn(tmp_path / ("n%d" % count[0]))
        make(node)
        monkeypatch.setenv("PREFLIGHT_HOST_ROOT", node.root_dir)
        monkeypatch.setenv("PATH", node.bin_dir + ":/usr/bin:/bin")
        return check.probe(NodeContext(sysfs_root=node.sys_dir, config={"interval_s": 0}))
    return run


def judged(facts_by_node):
    findings = cf_rule.rule(view({n: {"cloud_fabric": f} for n, f in facts_by_node.items()}))
    return {f.node: f for f in findings}


def env_of(facts_by_node):
    derived = Derived()
    v = view({n: {"cloud_fabric": f} for n, f in facts_by_node.items()})
    envfabric.cloud(v, list(facts_by_node), derived)
    return derived


# ------------------------------------------------------------------------------------------ AWS EFA


def test_a_p5_like_node_is_read_whole(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge"))
    assert facts["product_name"] == "p5.48xlarge" and len(facts["efa"]) == 32 and facts["hcas"] == []
    assert facts["plugins"] == {"efa": ["/opt/amazon/ofi-nccl/lib/libnccl-net.so"]}
    assert facts["fi_info"]["rc"] == 0 and facts["fi_info"]["providers"][0] == {
        "provider": "efa", "fabric": "efa", "domain": "rdmap16s0-rdm", "type": "FI_EP_RDM"}
    assert facts["rxdm"] == [] and facts["gve"] == []


def test_p5_nodes_with_the_plugin_pass_and_get_the_efa_env(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge"))
    found = judged({"n001": facts, "n002": facts})
    assert [f.status for f in found.values()] == [Status.PASS] * 2
    assert found["n001"].message.startswith("AWS EFA: 32 EFA devices on p5.48xlarge; aws-ofi-nccl /opt/amazon/ofi-nccl/lib/libnccl-net.so")
    env = env_of({"n001": facts, "n002": facts})
    assert env.as_dict() == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    assert all(line for var in env.variables for line in var.why)  # every line says where it comes from


def test_the_twin_without_the_ofi_plugin_fails_naming_the_socket_fallback(node_probe):
    good = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge"))
    bare = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", plugin=False))
    found = judged({"n001": good, "n002": bare})
    assert found["n001"].status is Status.PASS
    bad = found["n002"]
    assert (bad.status, bad.action) == (Status.FAIL, "fix_config")
    assert "aws-ofi-nccl not found (no libnccl-net*.so in /opt/amazon/ofi-nccl/lib" in bad.message
    assert "NCCL falls back to its socket transport at about a tenth of the fabric's bandwidth" in bad.message
    env = env_of({"n001": good, "n002": bare})
    assert "FI_PROVIDER" not in env.as_dict() and "aws-ofi-nccl not found on n002" in " ".join(env.notes)


def test_a_single_node_without_the_plugin_is_not_failed(node_probe):
    """The healthy twin: a node not meant for multi-node needs no net plugin."""
    bare = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", plugin=False))
    found = judged({"n001": bare})["n001"]
    assert found.status is Status.PASS and "not needed on a single-node run" in found.message


def test_an_instance_type_with_fewer_devices_by_design_passes_and_a_short_p5_fails(node_probe):
    p4d = node_probe(lambda n: cloud_hw.install_aws(n, "p4d.24xlarge", efa=4))
    short = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", efa=4))
    assert judged({"a": p4d, "b": p4d})["a"].status is Status.PASS
    bad = judged({"a": short, "b": short})["a"]
    assert bad.status is Status.FAIL and "4 EFA devices, expected 32 on p5.48xlarge" in bad.message
    other = node_probe(lambda n: cloud_hw.install_aws(n, "trn1.32xlarge", efa=8))
    unknown = judged({"a": other, "b": other})["a"]
    assert unknown.status is Status.PASS and "not in the documented table" in unknown.message
    assert "FI_EFA_USE_DEVICE_RDMA" not in env_of({"a": other, "b": other}).as_dict()


def test_fi_info_without_an_efa_provider_fails_and_no_fi_info_is_said(node_probe):
    none = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", fi_info=cloud_hw.FI_INFO_NONE))
    bad = judged({"a": none, "b": none})["a"]
    assert bad.status is Status.FAIL and "fi_info -p efa lists no efa provider (fi_getinfo: -61 (No data available))" in bad.message
    absent = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", fi_info=None))
    assert absent["fi_info"] is None
    ok = judged({"a": absent, "b": absent})["a"]
    assert ok.status is Status.PASS and "fi_info not found" in ok.message


# ---------------------------------------------------------------------------- Google TCPX / TCPXO / gIB


def test_an_a3_mega_like_node_passes_and_its_env_names_the_vendor_profile(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_google(n, "tcpxo", [8244] * 8))
    assert [i["name"] for i in facts["gve"]] == ["eth0"] + ["eth%d" % i for i in range(1, 9)]
    assert facts["rxdm"] == [{"pid": 4242, "comm": "fastrak_gpumem_", "fabric": "tcpxo"}]
    found = judged({"n001": facts, "n002": facts})
    assert [f.status for f in found.values()] == [Status.PASS] * 2
    assert found["n001"].message == ("GPUDirect-TCPXO: 8 GPU NICs at MTU 8244, RxDM pid 4242; the installer ships "
                                     "NCCL 2.21.5; the NCCL jobs load here is unknown")
    env = env_of({"n001": facts, "n002": facts})
    assert env.as_dict() == {} and "source /var/lib/tcpxo/lib64/nccl-env-profile.sh" in env.notes[0]


def test_the_a3_mega_twin_with_one_gpu_nic_at_1460_fails_naming_it(node_probe):
    good = node_probe(lambda n: cloud_hw.install_google(n, "tcpxo", [8244] * 8))
    bad = node_probe(lambda n: cloud_hw.install_google(n, "tcpxo", [8244] * 3 + [1460] + [8244] * 4))
    found = judged({"n001": good, "n002": bad})
    assert found["n001"].status is Status.PASS
    assert (found["n002"].status, found["n002"].action) == (Status.FAIL, "fix_config")
    assert "eth4 MTU 1460 (expected MTU 8244 on every GPU NIC" in found["n002"].message


def test_processes_are_read_for_the_rxdm_only_on_compute_engine(node_probe):
    """On a node with no sign of Compute Engine (its DMI, a gVNIC, a TCPX/TCPXO plugin) no /proc/PID/comm is
    read: a process named like the RxDM there is not taken for one (twin: on an A3 Mega it is, test above)."""
    def plain(node):
        node.write_host_file("/proc/1/comm", "systemd\n")
        node.write_host_file("/proc/4242/comm", "fastrak_gpumem_\n")
    facts = node_probe(plain)
    assert facts["rxdm"] == [] and facts["gve"] == [] and facts["product_name"] is None
    only_dmi = node_probe(lambda n: (plain(n), n.write_sys("class/dmi/id/product_name", "Google Compute Engine\n")))
    assert only_dmi["rxdm"] == [{"pid": 4242, "comm": "fastrak_gpumem_", "fabric": "tcpxo"}]


def test_rxdm_not_running_fails_across_nodes_but_not_on_one(node_probe):
    idle = node_probe(lambda n: cloud_hw.install_google(n, "tcpxo", [8244] * 8, rxdm=False))
    assert idle["rxdm"] == []
    bad = judged({"a": idle, "b": idle})["a"]
    assert bad.status is Status.FAIL and "receive-datapath manager (RxDM) is not running" in bad.message
    assert bad.actual.startswith("8 GPU NICs at MTU 8244, RxDM not running;")
    alone = judged({"a": idle})["a"]
    assert alone.status is Status.PASS and alone.message.count("RxDM not running (single-node run);") == 1


def test_a3_high_tcpx_needs_four_gpu_nics(node_probe):
    four = node_probe(lambda n: cloud_hw.install_google(n, "tcpx", [8244] * 4))
    three = node_probe(lambda n: cloud_hw.install_google(n, "tcpx", [8244] * 3))
    found = judged({"a": four, "b": three})
    assert found["a"].status is Status.PASS and found["a"].message.startswith("GPUDirect-TCPX: 4 GPU NICs")
    assert found["b"].status is Status.FAIL and "3 GPU NICs beside the host NIC, expected 4" in found["b"].message


def test_gib_ib_and_plain_nodes_and_a_run_split_across_fabrics(node_probe):
    def gib(n):
        n.write_host_file("/usr/local/gib/lib64/libnccl-net.so", "\x7fELF\n")
        n.write_host_file("/usr/local/gib/scripts/set_nccl_env.sh", "# set_nccl_env.sh\n")
        ib_hw.install_hcas(n, [{"link_layer": "roce", "rate_gbps": 400}])
    g = node_probe(gib)
    assert g["profiles"] == {"gib": "/usr/local/gib/scripts/set_nccl_env.sh"}
    assert judged({"a": g, "b": g})["a"].status is Status.PASS
    assert "source /usr/local/gib/scripts/set_nccl_env.sh" in env_of({"a": g, "b": g}).notes[0]
    ib = node_probe(lambda n: ib_hw.install_hcas(n))
    plain = node_probe(lambda n: None)
    found = judged({"a": ib, "b": plain})
    assert found["a"].status is Status.SKIP and "judged by ib_hca" in found["a"].message
    assert found["b"].status is Status.SKIP and None not in found
    efa = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge"))
    split = judged({"a": efa, "b": g})[None]
    assert split.status is Status.FAIL and split.message.startswith("the nodes are on different fabrics: AWS EFA: a; gIB")
    assert env_of({"a": efa, "b": g}).as_dict() == {}


def test_a_probe_error_is_an_error_not_a_pass():
    found = judged({"a": {"probe_error": "ParseError: fi_info line 1: ..."}})["a"]
    assert found.status is Status.ERROR


# ----------------------------------------------------------------------------------- ib_errors on EFA


def test_ib_errors_skips_healthy_efa_devices_instead_of_warning(node_probe):
    """The colleague's false WARN: every healthy EFA device said 'error counters unavailable' (EFA has
    hw_counters/, no counters/). Failed before this change (WARN), passes after (SKIP naming them)."""
    facts = node_probe(lambda n: ib_hw.install_efa(n, count=32), check=ib_errors_probe)
    assert facts["ports"] == [] and len(facts["efa"]) == 32
    found = ib_errors_rule.rule(view({"n001": {"ib_errors": facts}}))
    assert [f.status for f in found] == [Status.SKIP]
    assert found[0].message.startswith("only AWS EFA devices (32 devices)")


def test_ib_errors_still_reads_the_ib_ports_beside_efa(node_probe):
    def both(n):
        ib_hw.install_efa(n, count=2)
        ib_hw.install_hcas(n)
        for name in ("symbol_error", "link_downed", "port_rcv_errors"):
            n.write_sys("class/infiniband/mlx5_0/ports/1/counters/%s" % name, "0\n")
    facts = node_probe(both, check=ib_errors_probe)
    assert [p["hca"] for p in facts["ports"]] == ["mlx5_0"] and facts["efa"] == ["rdmap16s0", "rdmap17s0"]


# ----------------------------------------------------------------------------------- NCCL logs


@pytest.mark.parametrize("name, network, fabric", [
    ("efa_ofi_mpirun_prefixed", "AWS Libfabric", "efa"),
    ("tcpx_a3high_gpudirecttcpx", "GPUDirectTCPX_v7", "tcpx"),
    ("tcpxo_a3mega_fastrak", "FasTrak", "tcpxo"),
    ("gib_a3ultra", "gIB", "gib"),
    ("gib_plugin_missing_socket", "Socket", "socket"),
    # real captures (their .json names the source)
    ("efa_nccl1597_p5en_libfabric_real_excerpt", "Libfabric", "efa"),
    ("tcpx_lab18_a3high_real_excerpt", "GPUDirectTCPX_v7", "tcpx"),
    ("tcpxo_lab22_a3mega_real", "FasTrak", "tcpxo"),
    ("gib_dranet_a4_ray_real_excerpt", "gIB", "gib"),
])
def test_each_fabrics_nccl_log_reads_to_its_network(name, network, fabric):
    log = parse_nccl_log((FIXTURES / "allreduce" / (name + ".log")).read_text())
    assert (log["network"], log["fabric"]) == (network, fabric)


@pytest.mark.parametrize("line, provider, banner", [
    # aws-ofi-nccl 1.14+ (src/nccl_ofi_net.cpp: "Selected provider is %s, fabric is %s (found %d nics)")
    ("NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)", "efa", None),
    ("NET/OFI Selected Provider is efa (found 16 nics)", "efa", None),  # NVIDIA/nccl#1597
    # src/nccl_ofi_net.cpp: "Initializing " PACKAGE_STRING
    ("NET/OFI Initializing aws-ofi-nccl 1.14.0", None, "aws-ofi-nccl 1.14.0"),
    ("NET/OFI Initializing aws-ofi-nccl 1.7.3-aws", None, "aws-ofi-nccl 1.7.3-aws"),
    ("NET/GPUDirectTCPX ver. 3.1.8.", None, "GPUDirectTCPX 3.1.8"),  # skypilot-org/skypilot's TCPX example
])
def test_the_plugin_banner_and_the_provider_are_read(line, provider, banner):
    log = parse_nccl_log("ip-10-0-0-1:11:12 [0] NCCL INFO %s\n" % line)
    assert (log["provider"], log["plugin_version"]) == (provider, banner)


def test_a_line_cut_to_its_device_prefix_is_still_read_and_a_note_is_not():
    log = parse_nccl_log("## 8 Using network GPUDirectTCPX\n[3] NCCL INFO Using network GPUDirectTCPX_v7\n")
    assert log["network"] == "GPUDirectTCPX_v7" and log["hosts"] == []
    with pytest.raises(ParseError):
        parse_nccl_log("      8 Using network GPUDirectTCPX\n")


def test_fabric_names():
    assert fabric_of("Libfabric", "efa") == "efa" and fabric_of("AWS Libfabric", "tcp") == "tcp"
    assert fabric_of("IBext_v8") == "ib" and fabric_of("FastSocket") == "socket" and fabric_of(None) is None


# ----------------------------------------------------------------------------------- over SSH


def test_simulated_p5_nodes_over_ssh_one_without_the_plugin(sim_cluster, tmp_path):
    """Done-when, end to end: two p5-like nodes (32 EFA devices, DMI, fi_info on PATH), one without
    aws-ofi-nccl. The one with it passes, its twin FAILs naming the socket fall-back; the env file is for the
    healthy node: FI_PROVIDER=efa and FI_EFA_USE_DEVICE_RDMA=1 derived from n001 alone, no NCCL_IB_HCA."""
    from tests.e2e.test_catalogue import results, run_preflight

    cluster = sim_cluster(2)
    cloud_hw.install_aws(cluster.nodes[0], "p5.48xlarge")
    cloud_hw.install_aws(cluster.nodes[1], "p5.48xlarge", plugin=False)
    env_path = tmp_path / "p5.env"
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--only", "cloud_fabric", "--env-file", str(env_path))
    found = {r["node"]: r for r in results(doc, "cloud_fabric")}
    assert found["n001"]["status"] == "pass", found
    assert found["n002"]["status"] == "fail" and "aws-ofi-nccl not found" in found["n002"]["message"], found
    assert rc == 1
    env = env_path.read_text()
    assert "export NCCL_IB_HCA" not in env and "rdmap" not in env
    assert "export FI_PROVIDER='efa'" in env and "export FI_EFA_USE_DEVICE_RDMA='1'" in env
    assert "# cloud_fabric check: EFA devices and aws-ofi-nccl on n001\n" in env


@pytest.mark.parametrize("name, pinned", [
    ("tcpxo_a3mega_fastrak", "FasTrak"),            # NCCL 2.21.5
    ("gib_a3ultra", "gIB"),                          # NCCL 2.23.4
    ("efa_ofi_mpirun_prefixed", None),               # NCCL 2.9.9: no NCCL_NET before 2.10
    ("gib_plugin_missing_socket", None),             # NCCL's own Socket: nothing to pin
])
def test_the_proven_plugin_network_is_pinned_with_nccl_net(name, pinned):
    from preflight.checks.allreduce.nccllog import nccl_summary
    log = nccl_summary([parse_nccl_log((FIXTURES / "allreduce" / (name + ".log")).read_text())])
    derived = Derived(nodes=["n001", "n002"])
    variables, _notes = envfabric.with_proof(derived, {"n001": log, "n002": log})
    got = {v.key: v for v in variables}
    assert (got["NCCL_NET"].value if "NCCL_NET" in got else None) == pinned
    if pinned:
        assert "fails at init instead of falling back to sockets" in " ".join(got["NCCL_NET"].why)


def test_tcpx_nodes_get_a_note_not_a_made_up_script(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_google(n, "tcpx", [8244] * 4))
    note = env_of({"a": facts, "b": facts}).notes[0]
    assert note.startswith("tcpx: no vendor NCCL env script found beside the plugin (the TCPX plugin ships none)")


def test_an_efa_cluster_whose_proof_ran_over_sockets_is_said_not_proven(node_probe):
    """The commonest EFA failure seen at the proof: the NCCL log says Socket on nodes that are on EFA."""
    from preflight.checks.allreduce.nccllog import nccl_summary
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge"))
    derived = env_of({"n001": facts, "n002": facts})
    assert derived.fabric == "efa"
    derived.nodes = ["n001", "n002"]
    socket = nccl_summary([parse_nccl_log((FIXTURES / "allreduce" / "socket_fallback.log").read_text())])
    variables, notes = envfabric.with_proof(derived, {"n001": socket, "n002": socket})
    assert "NCCL_NET" not in {v.key for v in variables}
    assert notes[0].startswith("not proven for efa: the nodes are on efa (cloud_fabric), but the all-reduce's NCCL traffic went over NET/Socket")
    efa = nccl_summary([parse_nccl_log((FIXTURES / "allreduce" / "efa_ofi_mpirun_prefixed.log").read_text())])
    assert not any(n.startswith("not proven") for n in envfabric.with_proof(derived, {"n001": efa, "n002": efa})[1])


# ------------------------------------------------------------------------------------ EFA hw_counters


def _previous(node, facts):
    """The previous run's record of cloud_fabric on `node`, as the history hands it to the rule."""
    data = {"efa_counters": efa_counters.kept(facts["efa_counters"]), "at": facts["at"]}
    return {"started_at": "2026-11-27T08:00:00Z", "results": [{"check": "cloud_fabric", "node": node, "data": data}]}


def judged_since(facts_by_node, previous):
    v = view({n: {"cloud_fabric": f} for n, f in facts_by_node.items()}, cluster={"previous": previous})
    return {f.node: f for f in cf_rule.rule(v)}


def test_busy_healthy_efa_counters_pass_with_and_without_a_previous_reading(node_probe):
    """The healthy twin: traffic counters ~1e14, every fault counter 0."""
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={}))
    assert facts["efa_counters"]["rdmap16s0"]["port"]["rdma_read_resp_bytes"] == cloud_hw.BUSY
    assert facts["efa_counters"]["rdmap16s0"]["device"]["no_completion_cmds"] == 0
    alone = judged({"n001": facts, "n002": facts})["n001"]
    assert alone.status is Status.PASS and "nothing in fault counters" in alone.message
    assert "no previous reading" in alone.message and alone.data["efa_counters"]["rdmap16s0"]["rx_drops"] == 0
    later = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={i: {"tx_bytes": cloud_hw.BUSY * 2}
                                                                               for i in range(32)}))
    found = judged_since({"n001": later, "n002": later}, _previous("n001", facts))["n001"]
    assert found.status is Status.PASS and "no fault counter grew" in found.message, found.message


def test_errors_since_boot_alone_are_shown_not_judged(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={3: {"rx_drops": 12}}))
    found = judged({"n001": facts, "n002": facts})["n001"]
    assert found.status is Status.PASS and "%s rx_drops 12" % ib_hw.efa_name(3) in found.message


def test_a_device_that_stopped_completing_admin_commands_fails_reboot_and_drops_warn(node_probe):
    before = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={}))
    now = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={5: {"no_completion_cmds": 3},
                                                                             7: {"rx_drops": 40}}))
    found = judged_since({"n001": now, "n002": before}, _previous("n001", before))["n001"]
    assert found.status is Status.FAIL and found.action == "reboot"
    assert found.message.startswith("AWS EFA: no_completion_cmds (admin commands the device never completed) grew "
                                    "since 2026-11-27T08:00:00Z: %s +3; rx_drops" % ib_hw.efa_name(5)), found.message
    drops = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={7: {"rx_drops": 40}}))
    warned = judged_since({"n001": drops, "n002": before}, _previous("n001", before))["n001"]
    assert warned.status is Status.WARN and "%s +40" % ib_hw.efa_name(7) in warned.message and warned.action is None


def test_counters_lower_than_before_mean_a_reload_not_a_fault(node_probe):
    before = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={0: {"rx_drops": 50}}))
    now = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", counters={1: {"rx_drops": 2}}))
    found = judged_since({"n001": now, "n002": before}, _previous("n001", before))["n001"]
    assert found.status is Status.PASS and "driver was reloaded" in found.message


def test_a_garbled_hw_counter_is_a_parse_error_naming_the_file(node_probe):
    with pytest.raises(ParseError, match="rdmap16s0 port 1 hw_counters/rx_drops"):
        node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", efa=1, counters={0: {"rx_drops": "N/A"}}))


# ------------------------------------------------------------------------ plugin and NCCL versions


def judged_with_nccl(facts, nccl):
    driver = {"nccl_python": {"distribution": "nvidia-nccl-cu12", "version": nccl}, "nccl_system": []}
    v = view({n: {"cloud_fabric": facts, "driver": driver} for n in ("n001", "n002")})
    return {f.node: f for f in cf_rule.rule(v)}["n001"]


def test_aws_ofi_nccl_known_incompatible_with_its_nccl_fails_and_its_twins_do_not(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", ofi="1.14.0"))
    assert facts["plugin_versions"] == {"efa": "1.14.0"}
    old = judged_with_nccl(facts, "2.16.5")
    assert old.status is Status.FAIL and old.action == "fix_config"
    assert "aws-ofi-nccl 1.14.0 works with NCCL 2.17.1 and later (aws-ofi-nccl release notes), this node's jobs " \
           "load NCCL 2.16.5" in old.message
    ok = judged_with_nccl(facts, "2.21.5")
    assert ok.status is Status.PASS and "within its aws-ofi-nccl release notes (NCCL 2.17.1 and later)" in ok.message
    newer = judged_with_nccl(facts, "2.31.2")  # newer than any release tested: not known bad
    assert newer.status is Status.PASS
    before_ranges = judged_with_nccl(node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", ofi="1.4.0")), "2.16.5")
    assert before_ranges.status is Status.PASS and "compatibility unknown" in before_ranges.message
    older_plugin = judged_with_nccl(node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", ofi="1.7.3-aws")), "2.16.5")
    assert older_plugin.status is Status.PASS and "NCCL 2.4.8 and later" in older_plugin.message


def test_google_plugin_beside_its_own_nccl_or_another_is_said_never_failed(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_google(n, "tcpxo", [8244] * 8, nccl="2.21.5"))
    assert facts["bundled_nccl"] == {"tcpxo": ["2.21.5"]}
    own = judged_with_nccl(facts, "2.21.5")
    assert own.status is Status.PASS and own.message.endswith("jobs load NCCL 2.21.5, the one the installer ships (Google qualifies it)")
    other = judged_with_nccl(facts, "2.27.3")
    assert other.status is Status.PASS and "not the installer's 2.21.5" in other.message and "unknown" in other.message


def test_an_incompatible_plugin_on_a_single_node_run_is_said_not_failed(node_probe):
    facts = node_probe(lambda n: cloud_hw.install_aws(n, "p5.48xlarge", ofi="1.14.0"))
    driver = {"nccl_python": {"distribution": "nvidia-nccl-cu12", "version": "2.16.5"}, "nccl_system": []}
    alone = cf_rule.rule(view({"n001": {"cloud_fabric": facts, "driver": driver}}))[0]
    assert alone.status is Status.PASS and "a single-node run does not use it" in alone.message


def test_the_nccl_beside_gib_is_read_through_its_soname_link(node_probe):
    """gIB's lib64 is used through libnccl.so.2 (LD_PRELOAD=/usr/local/gib/lib64/libnccl.so.2 in users' manifests):
    the link's target names the version."""
    import os

    def gib(n):
        n.write_host_file("/usr/local/gib/lib64/libnccl-net.so", "\x7fELF\n")
        n.write_host_file("/usr/local/gib/lib64/libnccl.so.2.27.3", "\x7fELF\n")
        os.symlink("libnccl.so.2.27.3", os.path.join(n.root_dir, "usr/local/gib/lib64/libnccl.so.2"))
        ib_hw.install_hcas(n, [{"link_layer": "roce", "rate_gbps": 400}])
    facts = node_probe(gib)
    assert facts["bundled_nccl"] == {"gib": ["2.27.3"]}
    assert "jobs load NCCL 2.27.3, the one the installer ships" in judged_with_nccl(facts, "2.27.3").message

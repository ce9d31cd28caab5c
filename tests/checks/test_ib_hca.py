"""ib_hca: sysfs parsers on fixture trees, the rule's verdicts, usable_hcas, and the simulated-HCA writer."""

import sys
from pathlib import Path

import pytest

from preflight.checks.ib_hca import probe as ib_hca_probe
from preflight.checks.ib_hca import rule as ib_hca_rule
from preflight.model import ParseError, Status
from preflight.derived import rails as derived_rails
from preflight.probe.context import NodeContext
from tests import fixture_cases as fc
from tests.builders import ib_port as port
from tests.builders import H100_RAILS, h100_bf3_ports, view
from tests.paths import TESTS

sys.path.insert(0, str(Path(TESTS)))  # `sim` importable however pytest was started
from sim import ib_hw  # noqa: E402

FIXTURES = Path(TESTS) / "fixtures" / "ib_hca"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
GIB = 1 << 30


# --------------------------------------------------------------------------------------------- parsers


# probe cases on the fixture trees and parse_* cases: tests/fixtures/ib_hca/*.json, run by
# tests/checks/test_fixtures.py


def test_fixture_trees_match_the_writer():
    """The committed trees are what tests/sim/ib_hw.py writes (so sim nodes and fixtures agree)."""
    cases = dict(ib_hw.FIXTURE_CASES)
    for case, specs in cases.items():
        files = ib_hw.cluster_files(specs)
        on_disk = {
            str(p.relative_to(FIXTURES / case)): p.read_text()
            for p in (FIXTURES / case).rglob("*")
            if p.is_file() and p.name != "expected.json"
        }
        assert on_disk == files, case
    for case, (count, ports) in ib_hw.EFA_CASES.items():
        on_disk = {str(p.relative_to(FIXTURES / case)): p.read_text() for p in (FIXTURES / case).rglob("*") if p.is_file()}
        assert on_disk == ib_hw.efa_case_files(count, ports), case


def test_no_infiniband_class_means_no_ports(tmp_path):
    assert ib_hca_probe.probe(NodeContext(sysfs_root=str(tmp_path))) == {"hcas": {}, "ports": []}


@pytest.mark.parametrize(
    "text, table, expected",
    [
        ("4: ACTIVE", ib_hca_probe.STATES, "ACTIVE"),
        ("1: DOWN\n", ib_hca_probe.STATES, "DOWN"),
        ("5: LinkUp", ib_hca_probe.PHYS_STATES, "LinkUp"),
        ("3: Disabled", ib_hca_probe.PHYS_STATES, "Disabled"),
        ("2: Polling", ib_hca_probe.PHYS_STATES, "Polling"),
    ],
)
def test_parse_numbered(text, table, expected):
    assert ib_hca_probe.parse_numbered(text, table, "x") == expected


@pytest.mark.parametrize("text", ["ACTIVE", "4: DOWN", "9: WEIRD", "", None, "four: ACTIVE"])
def test_parse_numbered_rejects(text):
    with pytest.raises(ParseError):
        ib_hca_probe.parse_numbered(text, ib_hca_probe.STATES, "mlx5_0 port 1 state")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("400 Gb/sec (4X NDR)", (400.0, "4X NDR")),
        ("200 Gb/sec (4X HDR)\n", (200.0, "4X HDR")),
        ("2.5 Gb/sec (1X SDR)", (2.5, "1X SDR")),
        ("56 Gb/sec (4X FDR)", (56.0, "4X FDR")),
        ("10 Gb/sec (4X)", (10.0, "4X")),
    ],
)
def test_parse_rate(text, expected):
    assert ib_hca_probe.parse_rate(text, "rate") == expected


@pytest.mark.parametrize("text", ["fast", "400 Gbps", "", None, "400 Gb/sec (NDR)"])
def test_parse_rate_rejects(text):
    with pytest.raises(ParseError):
        ib_hca_probe.parse_rate(text, "rate")


def test_parse_link_layer_and_gid():
    assert ib_hca_probe.parse_link_layer("InfiniBand\n", "x") == "ib"
    assert ib_hca_probe.parse_link_layer("Ethernet", "x") == "roce"
    with pytest.raises(ParseError):
        ib_hca_probe.parse_link_layer("Omni-Path", "x")
    assert ib_hca_probe.parse_roce_gid("RoCE v2", "0000:0000:0000:0000:0000:ffff:c613:0003") == "198.19.0.3"
    assert ib_hca_probe.parse_roce_gid("RoCE v2", "::ffff:198.19.0.3") == "198.19.0.3"
    assert ib_hca_probe.parse_roce_gid("IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:c613:0003") is None
    assert ib_hca_probe.parse_roce_gid("RoCE v2", "fe80:0000:0000:0000:b8ce:f603:00a1:b200") is None
    with pytest.raises(ParseError):
        ib_hca_probe.parse_roce_gid("RoCE v2", "not-a-gid")


def test_natural_order_of_hcas(tmp_path):
    ib_hw.write_tree(str(tmp_path), ib_hw.cluster_files([{}] * 11))
    facts = ib_hca_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert [p["hca"] for p in facts["ports"]][:3] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert facts["ports"][-1]["hca"] == "mlx5_10"


# ------------------------------------------------------------------------------------------ sim writer


class FakeSimNode:
    """The two members of a simulated node install_hcas uses."""

    def __init__(self, root):
        self.sys_dir = str(root)

    def write_sys(self, relpath, text):
        ib_hw.write_tree(self.sys_dir, {relpath: text})


def test_install_hcas_is_read_back_by_the_probe(tmp_path):
    node = FakeSimNode(tmp_path)
    names = ib_hw.install_hcas(
        node,
        ports=[
            {},
            {"state": "DOWN", "phys_state": "Polling"},
            {"link_layer": "roce", "netdev": "eth1", "ipv4": "198.19.0.3", "rate_gbps": 200},
        ],
    )
    assert names == ["mlx5_0", "mlx5_1", "mlx5_2"]
    ports = ib_hca_probe.probe(NodeContext(sysfs_root=node.sys_dir))["ports"]
    assert [(p["state"], p["phys_state"], p["rate_gbps"], p["link_layer"]) for p in ports] == [
        ("ACTIVE", "LinkUp", 400, "ib"),
        ("DOWN", "Polling", 10, "ib"),
        ("ACTIVE", "LinkUp", 200, "roce"),
    ]
    assert (
        ports[2]["netdev"] == "eth1" and ports[2]["roce_v2_gid_index"] == 3 and ports[2]["roce_v2_ip"] == "198.19.0.3"
    )


def test_install_hcas_rejects_unknown_options(tmp_path):
    with pytest.raises(TypeError):
        ib_hw.install_hcas(FakeSimNode(tmp_path), ports=[{"speed": 400}])


def test_rate_text_matches_kernel_format():
    assert ib_hw.rate_text(400) == "400 Gb/sec (4X NDR)"
    assert ib_hw.rate_text(2.5, 1) == "2.5 Gb/sec (1X SDR)"
    assert ib_hw.rate_text(56) == "56 Gb/sec (4X FDR)"


# ----------------------------------------------------------------------------------------------- rules


def healthy(count=4, **kw):
    return {"hcas": {}, "ports": [port("mlx5_%d" % i, **kw) for i in range(count)]}


def view_of(ib_facts, memlock=None, expect=None, ssh=True):
    facts = {}
    for n, f in ib_facts.items():
        facts[n] = {"ib_hca": f}
        if ssh:
            facts[n]["ssh"] = {"memlock_soft": (memlock or {}).get(n)}
    return view(facts, expect=expect)


def by_status(findings, status):
    return [f for f in findings if f.status == status]


def test_all_healthy_passes():
    findings = ib_hca_rule.rule(view_of({"n001": healthy(), "n002": healthy()}))
    assert [f.status for f in findings] == [Status.PASS, Status.PASS]
    assert findings[0].message == "4 ports ACTIVE at 400 Gb/s (ib): mlx5_0:1, mlx5_1:1, mlx5_2:1, mlx5_3:1"


def test_no_hca_anywhere_skips():
    findings = ib_hca_rule.rule(view_of({"n001": {"hcas": {}, "ports": []}, "n002": {"hcas": {}, "ports": []}}))
    assert [(f.status, f.message) for f in findings] == [(Status.SKIP, "no InfiniBand/RoCE HCA")] * 2


@pytest.mark.parametrize("expect", [{"ib_hcas": 8}, {"ib_rate_gbps": 400}])
def test_no_hca_but_expected_fails(expect):
    findings = ib_hca_rule.rule(view_of({"n001": {"hcas": {}, "ports": []}}, expect=expect))
    assert [f.status for f in findings] == [Status.FAIL]
    assert "no InfiniBand/RoCE HCA (expected" in findings[0].message


def test_node_without_hcas_among_nodes_with_them_fails():
    findings = ib_hca_rule.rule(view_of({"n001": healthy(), "n002": {"hcas": {}, "ports": []}, "n003": healthy()}))
    fail = by_status(findings, Status.FAIL)
    assert [f.node for f in fail] == ["n002"] and "n[001,003] have them" in fail[0].message


def test_down_port_fails_with_expected_vs_actual():
    facts = healthy()
    facts["ports"][3] = port("mlx5_3", state="DOWN", phys="Disabled", rate=10)
    findings = ib_hca_rule.rule(view_of({"n001": healthy(), "n007": facts, "n003": healthy()}))
    fail = by_status(findings, Status.FAIL)
    assert fail[0].node == "n007"
    assert fail[0].message == "n007 mlx5_3 port 1: state DOWN, Disabled (expected ACTIVE at 400 Gb/s)"
    assert any("3 usable HCA ports" in f.message and "n[001,003] have 4" in f.message for f in fail)


def test_spare_down_port_only_warns_when_expected_count_is_met():
    facts = healthy(count=5)
    facts["ports"][4] = port("mlx5_4", state="DOWN", phys="Polling", rate=10)
    findings = ib_hca_rule.rule(view_of({"n001": facts}, expect={"ib_hcas": 4}))
    assert [f.status for f in findings] == [Status.WARN]
    assert "not needed" in findings[0].message


def test_rate_against_majority_and_expectation():
    slow = healthy()
    slow["ports"][1] = port("mlx5_1", rate=200)
    findings = ib_hca_rule.rule(view_of({"n001": healthy(), "n002": slow, "n003": healthy()}))
    fail = by_status(findings, Status.FAIL)
    assert fail[0].node == "n002"
    assert fail[0].message == "n002 mlx5_1 port 1: rate 200 Gb/s (expected 400 Gb/s, as this port on the other nodes)"
    findings = ib_hca_rule.rule(view_of({"n001": healthy()}, expect={"ib_rate_gbps": 200}))
    assert {f.status for f in findings} == {Status.FAIL}
    assert "(expected 200 Gb/s)" in findings[0].message


def test_fewer_active_ports_than_expected_count_fails():
    findings = ib_hca_rule.rule(view_of({"n001": healthy(count=7)}, expect={"ib_hcas": 8}))
    assert [f.message for f in by_status(findings, Status.FAIL)] == ["n001: 7 usable HCA ports (expected 8)"]


@pytest.mark.parametrize(
    "limit, status",
    [(None, Status.PASS), (8 << 20, Status.FAIL), (64 * 1024, Status.FAIL), (2 * GIB, Status.WARN)],
)
def test_memlock_limit(limit, status):
    findings = ib_hca_rule.rule(view_of({"n001": healthy()}, memlock={"n001": limit}))
    assert [f.status for f in findings] == [status]
    if status == Status.FAIL:
        assert "ulimit -l" in findings[0].message and findings[0].expected == "unlimited"


def test_memlock_unknown_is_error():
    findings = ib_hca_rule.rule(view_of({"n001": healthy()}, ssh=False))
    assert [f.status for f in findings] == [Status.ERROR]


def test_probe_error_is_error():
    findings = ib_hca_rule.rule(view_of({"n001": {"probe_error": "ParseError: mlx5_0 port 1 state"}, "n002": healthy()}))
    assert {f.node: f.status for f in findings} == {"n001": Status.ERROR, "n002": Status.PASS}


def test_usable_hcas_uniform_ib():
    facts = healthy()
    facts["ports"][2] = port("mlx5_2", state="DOWN", phys="Disabled", rate=10)
    usable = derived_rails.usable_hcas(view_of({"n001": healthy(), "n002": facts}))
    assert usable["nodes"]["n001"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert usable["nodes"]["n002"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_3:1"]
    assert usable["uniform"] is False and usable["link_layer"] == "ib" and usable["gid_index"] is None
    same = derived_rails.usable_hcas(view_of({"n001": healthy(), "n002": healthy()}))
    assert same["uniform"] is True and same["rate_gbps"] == {"ib": 400}


def test_usable_hcas_roce_gid_index():
    roce = {"hcas": {}, "ports": [port("mlx5_0", rate=200, layer="roce", gid=3)]}
    usable = derived_rails.usable_hcas(view_of({"n001": roce, "n002": roce}))
    assert usable["link_layer"] == "roce" and usable["gid_index"] == 3 and usable["uniform"]
    other = {"hcas": {}, "ports": [port("mlx5_0", rate=200, layer="roce", gid=1)]}
    assert derived_rails.usable_hcas(view_of({"n001": roce, "n002": other}))["gid_index"] is None


def test_usable_hcas_leaves_out_failed_probes():
    usable = derived_rails.usable_hcas(view_of({"n001": healthy(), "n002": {"probe_error": "x"}}))
    assert list(usable["nodes"]) == ["n001"]


def test_rule_on_fixture_facts():
    """ndr_active_and_down across two nodes: the DOWN port is named, the healthy node passes."""
    down = fc.expected("ib_hca", "ndr_active_and_down")
    polling = fc.expected("ib_hca", "ndr_polling")
    findings = ib_hca_rule.rule(view_of({"n001": down, "n002": polling}))
    messages = [f.message for f in by_status(findings, Status.FAIL)]
    assert "n001 mlx5_1 port 1: state DOWN, Disabled (expected ACTIVE at 400 Gb/s)" in messages
    assert "n002 mlx5_2 port 1: state DOWN, Polling (expected ACTIVE at 400 Gb/s)" in messages


def h100_bf3():
    return {"hcas": {}, "ports": h100_bf3_ports()}


def test_usable_hcas_mixed_layers_picks_the_majority_layer_and_says_what_it_left_out():
    usable = derived_rails.usable_hcas(view_of({"n001": h100_bf3(), "n002": h100_bf3()}))
    assert usable["nodes"] == {"n001": H100_RAILS, "n002": H100_RAILS}
    assert usable["uniform"] is True and usable["link_layer"] == "ib"
    assert usable["left_out"] == {
        "n001": [("mlx5_bond_0:1", "RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s")],
        "n002": [("mlx5_bond_0:1", "RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s")],
    }


def test_the_rule_and_the_rails_read_the_ports_once_per_view(monkeypatch):
    """The ib_hca rule judges each port by the same reading the rails (NCCL_IB_HCA, topology) come from: the
    port list, the fleet reference and each port's role are computed once on the view, not once per reader."""
    reads = []
    real = derived_rails.port_plan
    for module in (derived_rails, ib_hca_rule):  # wherever a port plan can be built from
        monkeypatch.setattr(module, "port_plan", lambda *a: reads.append(a) or real(*a), raising=False)
    v = view_of({"n001": h100_bf3(), "n002": h100_bf3()})
    findings = ib_hca_rule.rule(v)
    assert derived_rails.of(v)["nodes"] == {"n001": H100_RAILS, "n002": H100_RAILS}
    assert derived_rails.compute_hcas(v, "n001") == {p.split(":")[0] for p in H100_RAILS}
    assert len(reads) == 1
    # the rule's verdicts come from that reading: the BlueField port is named as not for NCCL in its PASS
    passes = {f.node: f.message for f in findings if f.status is Status.PASS}
    assert set(passes) == {"n001", "n002"} and "not for NCCL: mlx5_bond_0:1" in passes["n001"]


def test_usable_hcas_tied_layers_pick_nothing():
    """Two InfiniBand and two RoCE ports per node: no majority (the one tie rule), no rails chosen."""
    facts = {"hcas": {}, "ports": [port("mlx5_0"), port("mlx5_1"), port("mlx5_2", rate=200, layer="roce"),
                                   port("mlx5_3", rate=200, layer="roce")]}
    usable = derived_rails.usable_hcas(view_of({"n001": facts, "n002": facts}))
    assert usable["link_layer"] is None


def test_mixed_layers_pass_and_name_the_port_left_out_of_nccl():
    findings = ib_hca_rule.rule(view_of({"n001": h100_bf3(), "n002": h100_bf3()}))
    assert [f.status for f in findings] == [Status.PASS, Status.PASS]
    assert findings[0].message.startswith("8 ports ACTIVE at 400 Gb/s (ib): mlx5_0:1, mlx5_1:1, mlx5_4:1")
    assert findings[0].message.endswith(
        "; not for NCCL: mlx5_bond_0:1 (RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s)"
    )


def test_rate_tie_has_no_majority_and_fails_every_port_naming_the_split():
    # n001 at 400, n002 at 200: equally common, so neither is the reference (the old rule took 400).
    findings = ib_hca_rule.rule(view_of({"n001": healthy(count=2), "n002": healthy(count=2, rate=200)}))
    fail = by_status(findings, Status.FAIL)
    assert {f.node for f in fail} == {"n001", "n002"} and len(fail) == 4
    assert fail[0].message == (
        "n001 mlx5_0 port 1: rate 400 Gb/s (no majority: 400 Gb/s on 2 ports · 200 Gb/s on 2 ports; "
        "set expect.ib_rate_gbps)"
    )
    assert derived_rails.expected_rates(view_of({"n001": healthy(count=2), "n002": healthy(count=2, rate=200)})) == {"ib": None}


def test_port_count_tie_has_no_majority_and_fails_every_node():
    findings = ib_hca_rule.rule(view_of({"n001": healthy(count=4), "n002": healthy(count=3)}))
    fail = by_status(findings, Status.FAIL)
    assert [f.message for f in fail] == [
        "n001: 4 usable HCA ports (no majority: 4 on n001 · 3 on n002; set expect.ib_hcas)",
        "n002: 3 usable HCA ports (no majority: 4 on n001 · 3 on n002; set expect.ib_hcas)",
    ]


# ----------------------------------------------------------------- ports judged by their role (issue 40 #7)

CX7, CX6DX = "MT4129", "MT4125"  # sysfs hca_type, ibstat's "CA type"


def modelled(ports, models):
    """Facts with each HCA's hca_type, as the probe reads it."""
    return {"hcas": {p["hca"]: {"hca_type": m, "board_id": None} for p, m in zip(ports, models)}, "ports": ports}


def all_roce_h100(models=True, front_rate=100):
    """8 ConnectX-7 RoCE rails at 400 Gb/s and 4 frontend ports at 100 Gb/s, every port up: the all-RoCE shape
    of kvcache-ai/Mooncake#1999 (ibstat: ConnectX-7 "CA type: MT4129" Ethernet ports ACTIVE beside ConnectX-6
    Dx "MT4125" ones)."""
    rails = [port("mlx5_%d" % i, rate=400, layer="roce", gid=3) for i in range(8)]
    front = [port("mlx5_%d" % i, rate=front_rate, layer="roce", gid=3) for i in range(8, 12)]
    if not models:
        return {"hcas": {}, "ports": rails + front}
    return modelled(rails + front, [CX7] * 8 + [CX6DX] * 4)


FRONT = ["mlx5_%d:1" % i for i in range(8, 12)]


@pytest.mark.parametrize("models", [True, False])
def test_all_roce_node_with_frontend_ports_passes_and_the_frontend_is_not_a_rail(models):
    nodes = {n: all_roce_h100(models) for n in ("n001", "n002", "n003")}
    findings = ib_hca_rule.rule(view_of(nodes))
    assert [f.status for f in findings] == [Status.PASS] * 3, [f.message for f in findings]
    assert findings[0].message.startswith("8 ports ACTIVE at 400 Gb/s (roce): mlx5_0:1")
    assert "not for NCCL: mlx5_8:1 (RoCE at 100 Gb/s; the rails are RoCE at 400 Gb/s)" in findings[0].message
    usable = derived_rails.usable_hcas(view_of(nodes))
    assert usable["nodes"]["n002"] == ["mlx5_%d:1" % i for i in range(8)] and usable["uniform"]
    assert [label for label, _ in usable["left_out"]["n002"]] == FRONT and usable["gid_index"] == 3


def test_one_all_roce_node_passes_where_the_card_model_tells_the_frontend_apart():
    assert [f.status for f in ib_hca_rule.rule(view_of({"n001": all_roce_h100()}))] == [Status.PASS]
    # Alone and without a model, nothing tells a frontend port from a degraded rail: judged as rails.
    alone = ib_hca_rule.rule(view_of({"n001": all_roce_h100(models=False)}))
    assert [f.message for f in alone if f.status is Status.FAIL][0] == (
        "n001 mlx5_8 port 1: rate 100 Gb/s (expected 400 Gb/s, the rails' rate)")


def test_a_slow_frontend_or_rail_port_fails_against_the_same_port_on_the_other_nodes():
    slow = all_roce_h100()
    slow["ports"][9] = port("mlx5_9", rate=50, layer="roce", gid=3)
    slow["ports"][2] = port("mlx5_2", rate=200, layer="roce", gid=3)
    findings = ib_hca_rule.rule(view_of({"n001": all_roce_h100(), "n002": slow, "n003": all_roce_h100()}))
    fail = [f.message for f in by_status(findings, Status.FAIL)]
    assert "n002 mlx5_2 port 1: rate 200 Gb/s (expected 400 Gb/s, as this port on the other nodes)" in fail
    assert "n002 mlx5_9 port 1: rate 50 Gb/s (expected 100 Gb/s, as this port on the other nodes)" in fail
    assert {f.node for f in by_status(findings, Status.PASS)} == {"n001", "n003"}


def ib_node_with_spares(spare_phys="Disabled"):
    """8 ConnectX-7 InfiniBand rails ACTIVE at 400 Gb/s and 3 ConnectX-6 Dx Ethernet ports down: the H100
    node of kvcache-ai/Mooncake#2039 (ibstat: mlx5_0 "MT4129" InfiniBand Active 400; mlx5_1 "MT4125"
    Ethernet "State: Down, Physical state: Disabled, Rate: 40")."""
    rails = [port("mlx5_%d" % i) for i in (0, 2, 3, 4, 5, 6, 7, 8)]
    spares = [port("mlx5_%d" % i, state="DOWN", phys=spare_phys, rate=40, layer="roce") for i in (1, 9, 10)]
    return modelled(rails + spares, [CX7] * 8 + [CX6DX] * 3)


@pytest.mark.parametrize("nodes", [1, 2])
def test_disabled_spare_ethernet_ports_of_an_ib_node_are_a_note_not_a_fail(nodes):
    facts = {"n%03d" % (i + 1): ib_node_with_spares() for i in range(nodes)}
    findings = ib_hca_rule.rule(view_of(facts))
    assert [f.status for f in findings] == [Status.PASS] * nodes, [f.message for f in findings]
    assert findings[0].message.endswith("; spare, Disabled: mlx5_1:1, mlx5_9:1, mlx5_10:1")
    assert derived_rails.usable_hcas(view_of(facts))["nodes"]["n001"] == ["mlx5_%d:1" % i for i in (0, 2, 3, 4, 5, 6, 7, 8)]


@pytest.mark.parametrize("phys", ["Polling", "LinkErrorRecovery"])
def test_a_spare_port_training_or_recovering_keeps_its_fail(phys):
    findings = ib_hca_rule.rule(view_of({"n001": ib_node_with_spares(spare_phys=phys)}))
    assert by_status(findings, Status.FAIL) and all(phys in f.message for f in by_status(findings, Status.FAIL))


def test_a_disabled_rail_stays_a_fail():
    down = ib_node_with_spares()
    down["ports"][3] = port("mlx5_3", state="DOWN", phys="Disabled", rate=10)
    findings = ib_hca_rule.rule(view_of({"n001": ib_node_with_spares(), "n002": down}))
    assert "n002 mlx5_3 port 1: state DOWN, Disabled (expected ACTIVE at 400 Gb/s)" in [
        f.message for f in by_status(findings, Status.FAIL)]
    alone = ib_hca_rule.rule(view_of({"n001": down}))  # one node: a port of the rails' model and layer is a rail
    assert any("mlx5_3 port 1: state DOWN, Disabled" in f.message for f in by_status(alone, Status.FAIL))


def test_an_ib_port_disabled_on_every_node_is_a_spare_by_design():
    facts = healthy(count=5)
    facts["ports"][4] = port("mlx5_4", state="DOWN", phys="Disabled", rate=10)
    findings = ib_hca_rule.rule(view_of({"n001": facts, "n002": facts}))
    assert [f.status for f in findings] == [Status.PASS] * 2 and "spare, Disabled: mlx5_4:1" in findings[0].message


def test_expected_rate_applies_to_the_rails_not_the_frontend():
    nodes = {n: all_roce_h100() for n in ("n001", "n002")}
    assert [f.status for f in ib_hca_rule.rule(view_of(nodes, expect={"ib_rate_gbps": 400}))] == [Status.PASS] * 2
    assert derived_rails.usable_hcas(view_of(h100 := {"n001": h100_bf3(), "n002": h100_bf3()}, expect={"ib_rate_gbps": 400}))[
        "nodes"] == {n: H100_RAILS for n in h100}


# ---------------------------------------------------------------------------- EFA devices (issue 37)


def efa_facts(tmp_path, count=32, down=()):
    node = FakeSimNode(tmp_path)
    ib_hw.install_efa(node, count=count, down=down)
    return ib_hca_probe.probe(NodeContext(sysfs_root=node.sys_dir))


def test_a_p5_like_node_is_read_as_efa_and_passes_without_being_an_nccl_hca(tmp_path):
    facts = efa_facts(tmp_path)
    assert facts["ports"] == [] and len(facts["efa"]) == 32 and {p["kind"] for p in facts["efa"]} == {"efa"}
    assert facts["efa"][0]["device"] == "rdmap16s0" and facts["efa"][0]["rate_gbps"] == 100
    v = view_of({"n001": facts, "n002": facts})
    findings = ib_hca_rule.rule(v)
    assert [f.status for f in findings] == [Status.PASS] * 2
    assert findings[0].message.startswith("32 EFA devices ACTIVE at 100 Gb/s: rdmap16s0, rdmap17s0")
    assert "aws-ofi-nccl" in findings[0].message
    assert derived_rails.usable_hcas(v)["nodes"] == {"n001": [], "n002": []}
    from preflight.output.envfile import derive
    derived = derive(v)
    env = derived.as_dict()
    assert "NCCL_IB_HCA" not in env and env.get("NCCL_IB_DISABLE") == "1"
    why = " ".join(line for var in derived.variables if var.key == "NCCL_IB_DISABLE" for line in var.why)
    assert "AWS EFA devices on n[001-002]: NCCL reaches them only through the aws-ofi-nccl plugin" in why


def test_efa_devices_fewer_than_the_other_nodes_or_down_warn(tmp_path):
    full = efa_facts(tmp_path / "a")
    short = efa_facts(tmp_path / "b", count=31)
    down = efa_facts(tmp_path / "c", down=(5,))
    findings = {f.node: f for f in ib_hca_rule.rule(view_of({"n001": full, "n002": short, "n003": full, "n004": down}))}
    assert findings["n001"].status is Status.PASS
    assert (findings["n002"].status, findings["n002"].action) == (Status.WARN, "fix_config")
    assert "31 EFA devices where most EFA nodes have 32" in findings["n002"].message
    assert findings["n004"].status is Status.WARN and "not ACTIVE: rdmap33s0 (DOWN/Disabled)" in findings["n004"].message


def test_efa_is_known_by_its_vendor_where_uevent_names_no_driver_and_unknown_elsewhere_stays_an_error(tmp_path):
    files = ib_hw.efa_files("efa_0")
    del files["class/infiniband/efa_0/device/uevent"]
    ib_hw.write_tree(str(tmp_path / "v"), files)
    assert [p["device"] for p in ib_hca_probe.probe(NodeContext(sysfs_root=str(tmp_path / "v")))["efa"]] == ["efa_0"]
    other = ib_hw.hca_files("mlx5_0")
    other["class/infiniband/mlx5_0/ports/1/link_layer"] = "Unknown\n"
    other["class/infiniband/mlx5_0/device/uevent"] = "DRIVER=mlx5_core\n"
    ib_hw.write_tree(str(tmp_path / "m"), other)
    with pytest.raises(ParseError, match="link_layer: expected InfiniBand or Ethernet, got 'Unknown'"):
        ib_hca_probe.probe(NodeContext(sysfs_root=str(tmp_path / "m")))


def test_an_ib_node_has_no_efa_finding():
    findings = ib_hca_rule.rule(view_of({"n001": healthy()}))
    assert [f.status for f in findings] == [Status.PASS] and "EFA" not in findings[0].message


def test_simulated_p5_nodes_over_ssh_read_efa_and_write_no_nccl_ib_hca(sim_cluster, tmp_path):
    """Issue 37's first symptom, end to end: every EFA node ERRORed `ib_hca: probe failed: ParseError ...
    link_layer ... 'Unknown'`. Now each node's 32 EFA devices pass (the memlock FAIL is the sandbox's real
    8 MiB limit, judged for EFA as for HCAs) and the env file names no EFA device as an NCCL HCA."""
    from tests.e2e.test_catalogue import MEMLOCK, results, run_preflight

    cluster = sim_cluster(2)
    for node in cluster.nodes:
        ib_hw.install_efa(node, count=32)
    env_path = tmp_path / "p5.env"
    rc, doc, err = run_preflight(cluster, cluster.inventory(), "--only", "ib_hca", "--env-file", str(env_path))
    found = results(doc, "ib_hca")
    assert not [r for r in found if r["status"] == "error"], found
    passed = [r for r in found if r["status"] == "pass"]
    assert {r["node"] for r in passed} == {"n001", "n002"}, found
    assert all(r["message"].startswith("32 EFA devices ACTIVE at 100 Gb/s: rdmap16s0") for r in passed)
    assert all(MEMLOCK in r["message"] for r in found if r["status"] == "fail"), found
    env = env_path.read_text()
    assert "NCCL_IB_HCA" not in env and "rdmap" not in env


def test_the_real_mixed_node_shape_passes_naming_its_disabled_ethernet_spare():
    """The probe's facts of tests/fixtures/ib_hca/ib_rails_eth_spare (kvcache-ai/Mooncake#2039's H100 node):
    the Disabled ConnectX-6 Dx Ethernet port is a spare, not a FAIL; the InfiniBand rails are NCCL's."""
    facts = fc.expected("ib_hca", "ib_rails_eth_spare")
    v = view_of({"n001": facts, "n002": facts})
    findings = ib_hca_rule.rule(v)
    assert [f.status for f in findings] == [Status.PASS] * 2, [f.message for f in findings]
    assert findings[0].message == "2 ports ACTIVE at 400 Gb/s (ib): mlx5_0:1, mlx5_2:1; spare, Disabled: mlx5_1:1"
    assert derived_rails.usable_hcas(v)["nodes"]["n001"] == ["mlx5_0:1", "mlx5_2:1"]


def test_two_nodes_whose_frontend_port_differs_fail_naming_the_split_not_the_rails_rate():
    """Two nodes cannot say which of a frontend port's two rates is right: both are named with the split
    (the tie rule), never judged against the rails' 400 Gb/s; the rails stay PASS-clean."""
    slow = all_roce_h100()
    slow["ports"][9] = port("mlx5_9", rate=50, layer="roce", gid=3)
    fail = by_status(ib_hca_rule.rule(view_of({"n001": all_roce_h100(), "n002": slow})), Status.FAIL)
    assert [f.message for f in fail] == [
        "n001 mlx5_9 port 1: rate 100 Gb/s (this port differs across nodes, no majority: 100 Gb/s on 1 node · 50 Gb/s on 1 node)",
        "n002 mlx5_9 port 1: rate 50 Gb/s (this port differs across nodes, no majority: 100 Gb/s on 1 node · 50 Gb/s on 1 node)",
    ]

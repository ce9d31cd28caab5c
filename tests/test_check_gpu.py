"""gpu check: nvidia-smi XML / nvlink parsers over recorded fixtures, the NVML path, the probe, the rule."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest

from preflight.checks import gpu
from preflight.model import ClusterView, NodeInfo, ParseError, Status
from preflight.probe.context import NodeContext
from tests.builders import StubNode, fake_nvidia_smi
from tests.fixture_cases import fixture_dir, meta, read
from tests.sim.gpu_hw import FakeNVML

FIX = fixture_dir("gpu")
GiB = 1 << 30




def expected(case: str) -> dict:
    return copy.deepcopy(meta(os.path.join(FIX, case + ".xml"))["expected"])


def with_links(facts: dict, case: str) -> dict:
    links = meta(os.path.join(FIX, case + ".nvlink.txt"))["expected"]
    for g in facts["gpus"]:
        g["nvlink"] = links[g["uuid"]]
    return facts


# ---------------------------------------------------------------------------------------------- parsers

XML_CASES = sorted(glob.glob(os.path.join(FIX, "*.xml")))
NVLINK_CASES = sorted(glob.glob(os.path.join(FIX, "*.nvlink.txt")))


# parse_* cases: tests/fixtures/gpu/*.json, run by tests/test_fixtures.py


def test_recorded_commands_are_the_probes():
    for path in XML_CASES:
        assert meta(path)["command"] == "nvidia-smi -q -x"
    for path in NVLINK_CASES:
        assert meta(path)["command"] == "nvidia-smi nvlink --status"


def test_fixture_set_covers_both_generations_and_the_bad_cases():
    names = {os.path.basename(p) for p in XML_CASES}
    assert {"a100_hgx_535.xml", "h100_hgx_550.xml", "a100_ecc_remap_failure.xml", "h100_pcie_width_degraded.xml",
            "h100_missing_gpu.xml", "h100_truncated.xml"} <= names
    assert "<clocks_throttle_reasons>" in read(os.path.join(FIX, "a100_hgx_535.xml"))
    assert "<clocks_event_reasons>" in read(os.path.join(FIX, "h100_hgx_550.xml"))


def test_unknown_flag_value_is_a_parse_error():
    text = read(os.path.join(FIX, "h100_hgx_550.xml")).replace(
        "<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Maybe</persistence_mode>", 1
    )
    with pytest.raises(ParseError, match="persistence_mode is 'Maybe'"):
        gpu.parse_nvidia_smi_xml(text)


def test_wrong_root_is_a_parse_error():
    with pytest.raises(ParseError, match="root element is <html>"):
        gpu.parse_nvidia_smi_xml("<html><body/></html>")


def test_unknown_link_state_is_a_parse_error():
    text = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-65a98dec-49a9-1ada-b55d-8ca4a509be39)\n\t Link 0: Degraded\n"
    with pytest.raises(ParseError, match="line 2: 'Link 0: Degraded'"):
        gpu.parse_nvlink_status(text)


# ------------------------------------------------------------------------------------------------- NVML


def nvml_answers() -> dict:
    with open(os.path.join(FIX, "nvml_h100_hgx_550.json")) as fh:
        return json.load(fh)["answers"]


def test_nvml_and_nvidia_smi_produce_the_same_facts():
    facts = gpu.facts_from_nvml(FakeNVML(nvml_answers()))
    want = with_links(expected("h100_hgx_550"), "h100_hgx_550")
    want["source"] = "nvml"
    assert facts == want


def test_nvml_lost_gpu_and_fabric_error_and_hw_slowdown():
    answers = nvml_answers()
    answers["devices"][2]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    answers["devices"][5]["nvmlDeviceGetGpuFabricInfo"] = {"state": 3, "status": 9}
    answers["devices"][6]["nvmlDeviceGetCurrentClocksEventReasons"] = 0x8 | 0x40
    answers["devices"][7]["nvmlDeviceGetRemappedRows"] = [1, 2, 0, 1]
    facts = gpu.facts_from_nvml(FakeNVML(answers))
    assert facts["gpus"][2]["error"] == "GPU is lost" and facts["gpus"][2]["index"] == 2
    assert facts["gpus"][5]["fabric"]["status"] == "Driver Not Loaded"
    assert facts["gpus"][6]["clock_events"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert facts["gpus"][7]["remapped_rows_failure"] is True
    messages = [f.message for f in run_rule(facts) if f.status is Status.FAIL]
    assert "GPU 2 (?): NVML cannot read this GPU: GPU is lost" in messages
    assert "GPU 6 (0000:BA:00.0): clocks throttled by hw_slowdown, hw_thermal_slowdown (expected none active)" in messages


# ------------------------------------------------------------------------------------------------ probe




@pytest.fixture
def no_nvml(monkeypatch, tmp_path):
    """A loaded NVIDIA driver (its /proc directory exists) whose NVML library cannot be loaded."""
    import pynvml

    proc = tmp_path / "proc-driver-nvidia"
    proc.mkdir()
    monkeypatch.setattr(gpu, "NVIDIA_PROC", str(proc))

    def refuse():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", refuse)
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)


def test_probe_reads_nvidia_smi_when_nvml_is_unavailable(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "h100_hgx_550.xml"), os.path.join(FIX, "h100_hgx_550.nvlink.txt"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts.pop("nvml_error") == "NVML Shared Library Not Found"
    assert facts.pop("nvlink_unreadable") == []
    assert facts == with_links(expected("h100_hgx_550"), "h100_hgx_550")
    json.dumps(facts)  # facts travel as JSON


def test_nvml_is_not_loaded_without_an_nvidia_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "NVIDIA_PROC", str(tmp_path / "absent"))
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)
    nvml, why = gpu.load_nvml()
    assert nvml is None and why == "no NVIDIA kernel driver loaded (%s absent)" % (tmp_path / "absent")


def test_probe_without_nvlink_answer_leaves_links_unknown(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "a100_hgx_535.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert [g["nvlink"] for g in facts["gpus"]] == [None] * 8
    assert facts["source"] == "nvidia-smi"


def test_probe_env_switch_skips_nvml(tmp_path, monkeypatch):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "a100_hgx_535.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    monkeypatch.setenv("PREFLIGHT_NVML", "off")
    facts = gpu.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["nvml_error"] == "disabled by PREFLIGHT_NVML" and facts["source"] == "nvidia-smi"


def test_probe_without_nvidia_smi_or_nvml(tmp_path, monkeypatch, no_nvml):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    facts = gpu.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["source"] is None and facts["gpus"] == []
    assert facts["error"] == "nvidia-smi not found and NVML unavailable"


def test_probe_with_driver_not_loaded(tmp_path, monkeypatch, no_nvml):
    case = meta(os.path.join(FIX, "driver_not_loaded.xml"))
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "driver_not_loaded.xml"), rc=case["rc"])
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["error"].startswith("nvidia-smi failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate")


def test_probe_raises_on_truncated_output(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "h100_truncated.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    with pytest.raises(ParseError, match="not well-formed XML"):
        gpu.probe(NodeContext(sysfs_root=str(tmp_path)))


# ------------------------------------------------------------------------------------------------- rule


def run_rule(facts, gpus_per_node=8, shm=16 * GiB, ssh=True):
    node = NodeInfo("gpu-001", "10.0.0.1", gpus_per_node)
    entry = {"gpu": facts}
    if ssh:
        entry["ssh"] = {"shm_bytes": shm}
    return gpu.rule(ClusterView([node], {"gpu-001": entry}))


def by_status(findings):
    out = {}
    for f in findings:
        out.setdefault(f.status, []).append(f.message)
    return out


@pytest.mark.parametrize("case", ["h100_hgx_550", "a100_hgx_535"])
def test_rule_passes_healthy_nodes(case):
    findings = run_rule(with_links(expected(case), case))
    assert [(f.status, f.node) for f in findings] == [(Status.PASS, "gpu-001")]
    name = expected(case)["gpus"][0]["name"]
    assert findings[0].message == "8× %s, healthy" % name


def test_rule_fails_uncorrectable_ecc_and_remap_failure():
    found = by_status(run_rule(expected("a100_ecc_remap_failure")))
    assert found[Status.FAIL] == [
        "GPU 5 (0000:90:00.0): 2 uncorrectable ECC errors since boot (expected 0)",
        "GPU 5 (0000:90:00.0): row remapping failed (expected none): replace the GPU",
    ]
    assert Status.PASS not in found


def test_rule_warns_on_narrow_pcie_link():
    found = by_status(run_rule(expected("h100_pcie_width_degraded")))
    assert found == {Status.WARN: ["GPU 3 (0000:5D:00.0): PCIe link Gen5 x8 (expected Gen5 x16)"]}


def test_rule_ignores_idle_gen_downshift_but_flags_throttle_and_persistence():
    facts = expected("h100_throttled_no_persistence")
    assert facts["gpus"][1]["pcie"] == {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16}
    found = by_status(run_rule(facts))
    assert found[Status.FAIL] == [
        "GPU 6 (0000:BA:00.0): clocks throttled by hw_slowdown, hw_thermal_slowdown (expected none active)"
    ]
    assert found[Status.WARN] == [
        "GPU 0 (0000:18:00.0): persistence mode off (expected on: nvidia-smi -pm 1 or nvidia-persistenced)"
    ]


def test_rule_fails_missing_gpu():
    findings = run_rule(expected("h100_missing_gpu"))
    assert [(f.status, f.message, f.expected, f.actual) for f in findings] == [
        (Status.FAIL, "7 GPUs visible (expected 8)", "8", "7")
    ]


def test_rule_fails_gpu_that_lost_nvlinks():
    facts = expected("h100_hgx_550")
    links = meta(os.path.join(FIX, "h100_hgx_550_links_down.nvlink.txt"))["expected"]
    for g in facts["gpus"]:
        g["nvlink"] = links[g["uuid"]]
    found = by_status(run_rule(facts))
    assert found == {Status.FAIL: ["GPU 2 (0000:3A:00.0): 16/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3)"]}


def test_rule_fails_node_without_driver():
    facts = gpu.no_gpu_facts("nvidia-smi not found and NVML unavailable", "NVML Shared Library Not Found")
    findings = run_rule(facts)
    assert [(f.status, f.message) for f in findings] == [
        (Status.FAIL, "nvidia-smi not found and NVML unavailable (expected 8 GPUs)")
    ]


def test_rule_warns_small_shm_and_extra_gpus():
    found = by_status(run_rule(expected("h100_hgx_550"), gpus_per_node=4, shm=64 << 20))
    assert found[Status.WARN] == [
        "8 GPUs visible (expected 4): update gpus_per_node in the inventory",
        "/dev/shm is 64 MiB (expected >= 1 GiB: NCCL's SHM transport needs it; docker --shm-size)",
    ]


def test_rule_skips_cpu_only_and_errors_without_facts():
    nodes = [NodeInfo("cpu-1", "h1", 0), NodeInfo("gpu-1", "h2", 8), NodeInfo("gpu-2", "h3", 8)]
    facts = {"cpu-1": {}, "gpu-1": {"gpu": {"probe_error": "ParseError: truncated"}}, "gpu-2": {}}
    findings = gpu.rule(ClusterView(nodes, facts))
    assert [(f.node, f.status) for f in findings] == [
        ("cpu-1", Status.SKIP),
        ("gpu-1", Status.ERROR),
        ("gpu-2", Status.ERROR),
    ]
    assert findings[0].message == "CPU-only node (gpus_per_node: 0)"
    assert findings[1].message == "probe failed: ParseError: truncated"


def test_check_declaration():
    assert gpu.CHECK.name == "gpu" and "ssh" in gpu.CHECK.needs
    assert gpu.short_bus_id("00000000:4E:00.0") == "0000:4E:00.0"


# ------------------------------------------------------------------------------------ simulated hardware


def test_sim_install_gpus_healthy_matches_the_recording(tmp_path, monkeypatch, no_nvml):
    from tests.sim import gpu_hw

    node = StubNode(tmp_path)
    gpu_hw.install_gpus(node, "h100")
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    facts = gpu.probe(NodeContext(sysfs_root=node.sys_dir))
    facts.pop("nvml_error")
    assert facts.pop("nvlink_unreadable") == []
    assert facts == with_links(expected("h100_hgx_550"), "h100_hgx_550")
    ctx = NodeContext(sysfs_root=node.sys_dir)
    assert ctx.run(["nvidia-smi", "--bogus"]).rc == 2
    assert ctx.run(["nvidia-smi", "-L"]).stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")


def test_sim_install_gpus_with_faults(tmp_path, monkeypatch, no_nvml):
    from tests.sim import gpu_hw

    node = StubNode(tmp_path)
    gpu_hw.install_gpus(
        node, "a100", count=8, faults={1: "missing", 3: ["ecc", "pcie_width"], 5: "nvlink_down", 6: "hw_slowdown"}
    )
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    facts = gpu.probe(NodeContext(sysfs_root=node.sys_dir))
    assert len(facts["gpus"]) == 7 and facts["attached_gpus"] == 7
    found = by_status(run_rule(facts))
    assert found[Status.FAIL] == [
        "7 GPUs visible (expected 8)",
        # positions shift after the missing GPU: recorded GPU 3 is now index 2
        "GPU 2 (0000:4E:00.0): 2 uncorrectable ECC errors since boot (expected 0)",
        "GPU 4 (0000:90:00.0): 10/12 NVLinks active (expected 12 on NVIDIA A100-SXM4-80GB)",
        "GPU 5 (0000:B7:00.0): clocks throttled by hw_slowdown, hw_thermal_slowdown (expected none active)",
    ]
    assert found[Status.WARN] == ["GPU 2 (0000:4E:00.0): PCIe link Gen4 x8 (expected Gen4 x16)"]
    devices = sorted(os.listdir(os.path.join(node.sys_dir, "bus/pci/devices")))
    assert "0000:0f:00.0" not in devices and len(devices) == 7


def test_sim_rejects_unknown_fault(tmp_path):
    from tests.sim import gpu_hw

    with pytest.raises(ValueError, match="fault"):
        gpu_hw.install_gpus(StubNode(tmp_path), "h100", faults={0: "melted"})


def _topology_facts(gpu_bdfs, width=16):
    return {"devices": [{"kind": "gpu", "bdf": b, "name": None, "numa_node": 0, "bridges": [],
                         "link": {"cur_width": width, "max_width": 16, "cur_speed": 32.0, "max_speed": 32.0},
                         "slot": None} for b in gpu_bdfs]}


def _rule_with_topology(facts, topology):
    node = NodeInfo("gpu-001", "10.0.0.1", 8)
    entry = {"gpu": facts, "ssh": {"shm_bytes": 16 * GiB}, "topology": topology}
    return gpu.rule(ClusterView([node], {"gpu-001": entry}))


def test_narrow_pcie_link_is_left_to_topology_when_it_read_the_gpu():
    # One fact, one owner: topology read GPU 3's link from sysfs this run (and FAILs it there), so gpu
    # does not WARN the same link a second time from nvidia-smi.
    facts = expected("h100_pcie_width_degraded")
    bdfs = [g["pci_bus_id"] for g in facts["gpus"]]
    found = by_status(_rule_with_topology(facts, _topology_facts(bdfs)))
    assert list(found) == [Status.PASS], found


def test_narrow_pcie_link_is_still_warned_when_topology_did_not_see_the_gpu():
    facts = expected("h100_pcie_width_degraded")
    others = [g["pci_bus_id"] for g in facts["gpus"] if not g["pci_bus_id"].upper().endswith("5D:00.0")]
    warned = ["GPU 3 (0000:5D:00.0): PCIe link Gen5 x8 (expected Gen5 x16)"]
    assert by_status(_rule_with_topology(facts, _topology_facts(others))) == {Status.WARN: warned}
    assert by_status(_rule_with_topology(facts, {"probe_error": "did not finish within 30 s"})) == {Status.WARN: warned}
    no_link = _topology_facts([g["pci_bus_id"] for g in facts["gpus"]], width=None)  # sysfs without link attributes
    assert by_status(_rule_with_topology(facts, no_link)) == {Status.WARN: warned}

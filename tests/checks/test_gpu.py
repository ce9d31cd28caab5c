"""gpu check: the nvidia-smi XML / nvlink parsers over recorded fixtures, the NVML path against NVML's real
behaviour (issue 15: the fake NVML in tests/sim/gpu_hw.py writes GPU fabric info as bytes at nvml.h's
offsets, raises NVMLError with nvml.h return codes, and can block like a call wedged in the kernel), real
format variations (issue 12), the probe, and the rule."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys
import threading
import time

import pytest

from preflight import checks
from preflight.checks import gpu
from preflight.checks.driver import probe as driver_probe
from preflight.checks.gpu import probe as gpu_probe
from preflight.checks.gpu import rule as gpu_rule
from preflight.model import NodeInfo, ParseError, Status
from preflight.probe import gpu_facts, gpu_health, gpu_nvml, nvidia_smi, nvml_structs
from preflight.probe import nvml as probe_nvml
from preflight.probe.context import NodeContext
from tests.builders import StubNode, by_status, fake_nvidia_smi, gpu_expected as expected, gpu_rule as run_rule
from tests.builders import gpu_with_links as with_links, nvml_answers
from tests.fixture_cases import fixture_dir, meta, read
from tests.sim.gpu_hw import FakeNVML
from tests.paths import REPO
from tests import builders

FIX = fixture_dir("gpu")
GiB = 1 << 30
UUID = "5a1f0c3e-7b2d-4e6f-9a8b-0c1d2e3f4a5b"


def nvml_facts(answers):
    return gpu_nvml.facts_from_nvml(FakeNVML(answers))




# ---------------------------------------------------------------------------------------------- parsers

XML_CASES = sorted(glob.glob(os.path.join(FIX, "*.xml")))
NVLINK_CASES = sorted(glob.glob(os.path.join(FIX, "*.nvlink.txt")))


# parse_* cases: tests/fixtures/gpu/*.json, run by tests/checks/test_fixtures.py


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
        nvidia_smi.parse_nvidia_smi_xml(text)


def test_wrong_root_is_a_parse_error():
    with pytest.raises(ParseError, match="root element is <html>"):
        nvidia_smi.parse_nvidia_smi_xml("<html><body/></html>")


def test_unknown_link_state_is_a_parse_error():
    text = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-65a98dec-49a9-1ada-b55d-8ca4a509be39)\n\t Link 0: Degraded\n"
    with pytest.raises(ParseError, match="line 2: 'Link 0: Degraded'"):
        nvidia_smi.parse_nvlink_status(text)


# ------------------------------------------------------------------------------------------------- NVML


def test_nvml_and_nvidia_smi_produce_the_same_facts():
    facts = gpu_nvml.facts_from_nvml(FakeNVML(nvml_answers()))
    want = with_links(expected("h100_hgx_550"), "h100_hgx_550")
    want["source"] = "nvml"
    assert facts == want


def test_nvml_lost_gpu_and_fabric_error_and_hw_slowdown():
    answers = nvml_answers()
    answers["devices"][2]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    answers["devices"][5]["nvmlDeviceGetGpuFabricInfo"] = {"state": 3, "status": 9}
    answers["devices"][6]["nvmlDeviceGetCurrentClocksEventReasons"] = 0x8 | 0x40
    answers["devices"][7]["nvmlDeviceGetRemappedRows"] = [1, 2, 0, 1]
    facts = gpu_nvml.facts_from_nvml(FakeNVML(answers))
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
    monkeypatch.setattr(probe_nvml, "NVIDIA_PROC", str(proc))

    def refuse():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", refuse)
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)


def test_probe_reads_nvidia_smi_when_nvml_is_unavailable(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "h100_hgx_550.xml"), os.path.join(FIX, "h100_hgx_550.nvlink.txt"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts.pop("nvml_error") == "NVML Shared Library Not Found"
    assert facts.pop("nvlink_unreadable") == []
    # the health facts come from the same XML (judged by gpu_memory / gpu_state: tests/checks/test_gpu_health.py)
    assert facts.pop("health") == gpu_health.parse_health_xml(read(os.path.join(FIX, "h100_hgx_550.xml")))
    assert facts == with_links(expected("h100_hgx_550"), "h100_hgx_550")
    json.dumps(facts)  # facts travel as JSON


def test_nvml_is_not_loaded_without_an_nvidia_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(probe_nvml, "NVIDIA_PROC", str(tmp_path / "absent"))
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)
    nvml, why = probe_nvml.load_nvml()
    assert nvml is None and why == "no NVIDIA kernel driver loaded (%s absent)" % (tmp_path / "absent")


def test_probe_without_nvlink_answer_leaves_links_unknown(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "a100_hgx_535.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert [g["nvlink"] for g in facts["gpus"]] == [None] * 8
    assert facts["source"] == "nvidia-smi"


def test_probe_env_switch_skips_nvml(tmp_path, monkeypatch):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "a100_hgx_535.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    monkeypatch.setenv("PREFLIGHT_NVML", "off")
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["nvml_error"] == "disabled by PREFLIGHT_NVML" and facts["source"] == "nvidia-smi"


def test_probe_without_nvidia_smi_or_nvml(tmp_path, monkeypatch, no_nvml):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["source"] is None and facts["gpus"] == []
    assert facts["error"] == "nvidia-smi not found and NVML unavailable"


def test_probe_with_driver_not_loaded(tmp_path, monkeypatch, no_nvml):
    case = meta(os.path.join(FIX, "driver_not_loaded.xml"))
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "driver_not_loaded.xml"), rc=case["rc"])
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["error"].startswith("nvidia-smi failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate")


def test_probe_raises_on_truncated_output(tmp_path, monkeypatch, no_nvml):
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "h100_truncated.xml"))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    with pytest.raises(ParseError, match="not well-formed XML"):
        gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))


# ------------------------------------------------------------------------------------------------- rule


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
    facts = gpu_facts.no_gpu_facts("nvidia-smi not found and NVML unavailable", "NVML Shared Library Not Found")
    findings = run_rule(facts)
    assert [(f.status, f.message) for f in findings] == [
        (Status.FAIL, "nvidia-smi not found and NVML unavailable (expected 8 GPUs)")
    ]


def test_rule_warns_extra_gpus_and_leaves_shm_to_the_limits_check():
    # /dev/shm is judged once, by limits, against the GPU count (a 256 MiB container /dev/shm holds 2 GPUs'
    # segments): the gpu rule used to WARN below a flat 1 GiB as well, on healthy nodes too
    found = by_status(run_rule(expected("h100_hgx_550"), gpus_per_node=4, shm=64 << 20))
    assert found[Status.WARN] == ["8 GPUs visible (expected 4): update gpus_per_node in the inventory"]


def test_rule_skips_cpu_only_and_errors_without_facts():
    nodes = [NodeInfo("cpu-1", "h1", 0), NodeInfo("gpu-1", "h2", 8), NodeInfo("gpu-2", "h3", 8)]
    facts = {"cpu-1": {}, "gpu-1": {"gpu": {"probe_error": "ParseError: truncated"}}, "gpu-2": {}}
    findings = gpu_rule.rule(builders.view(facts, nodes=nodes))
    assert [(f.node, f.status) for f in findings] == [
        ("cpu-1", Status.SKIP),
        ("gpu-1", Status.ERROR),
        ("gpu-2", Status.ERROR),
    ]
    assert findings[0].message == "CPU-only node (gpus_per_node: 0)"
    assert findings[1].message == "probe failed: ParseError: truncated"


def test_check_declaration():
    assert gpu.CHECK.name == "gpu" and gpu.CHECK.needs == ()  # /dev/shm is the limits check's, so no ssh facts read
    assert gpu_facts.short_bus_id("00000000:4E:00.0") == "0000:4E:00.0"


# ------------------------------------------------------------------------------------ simulated hardware


def test_sim_install_gpus_healthy_matches_the_recording(tmp_path, monkeypatch, no_nvml):
    from tests.sim import gpu_hw

    node = StubNode(tmp_path)
    gpu_hw.install_gpus(node, "h100")
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    facts.pop("nvml_error")
    assert facts.pop("nvlink_unreadable") == []
    assert facts.pop("health")["gpus"]["00000000:18:00.0"]["remap"]["histogram"]["max"] == 2551
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
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
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
    return gpu_rule.rule(builders.view({"gpu-001": entry}, nodes=[node]))


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


# ------------------------------------------------------------------------------- 15.1 fabric byte layout


def test_fabric_struct_has_nvml_h_layout():
    s = nvml_structs.NvmlGpuFabricInfo
    offsets = {name: getattr(s, name).offset for name, _ in s._fields_}
    assert offsets == {"clusterUuid": 0, "status": 16, "cliqueId": 20, "state": 24}
    assert ctypes.sizeof(s) == 28


def test_fabric_state_read_from_the_bytes_nvml_writes():
    answers = nvml_answers()
    answers["devices"][3]["nvmlDeviceGetGpuFabricInfo"] = {"state": 2, "status": 0, "cliqueId": 7, "clusterUuid": UUID}
    answers["devices"][4]["nvmlDeviceGetGpuFabricInfo"] = {"state": 3, "status": 15, "cliqueId": 7, "clusterUuid": UUID}
    facts = nvml_facts(answers)
    assert facts["gpus"][0]["fabric"]["state"] == "Completed"
    assert facts["gpus"][0]["fabric"]["status"] == "Success"
    assert facts["gpus"][3]["fabric"] == {"state": "In Progress", "status": "N/A", "clique_id": 7, "cluster_uuid": UUID}
    assert facts["gpus"][4]["fabric"]["status"] == "GPU is lost"


def test_fabric_wrong_layout_would_read_nothing():
    """pynvml's pre-13.615 structure (80-byte clusterUuid) over the same bytes reads state 0: the test sees it."""
    fake = FakeNVML(nvml_answers())
    old = fake.c_nvmlGpuFabricInfo_t()
    fake.nvmlDeviceGetGpuFabricInfo(0, ctypes.pointer(old))
    assert old.state == 0  # what the old code read on every H100: "not supported"


# ------------------------------------------------------------------------------- 15.2 errors are findings


def test_only_not_supported_means_cannot_say():
    answers = nvml_answers()
    answers["devices"][1]["nvmlDeviceGetTotalEccErrors(UNCORRECTED,VOLATILE)"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    answers["devices"][2]["nvmlDeviceGetRemappedRows"] = {"error": "NVML_ERROR_CORRUPTED_INFOROM"}
    answers["devices"][3]["nvmlDeviceGetPersistenceMode"] = {"error": "NVML_ERROR_UNKNOWN"}
    answers["devices"][4]["nvmlDeviceGetSerial"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    facts = nvml_facts(answers)
    assert facts["gpus"][4]["serial"] is None and not facts["gpus"][4]["query_errors"]
    fails = by_status(run_rule(facts))[Status.FAIL]
    assert "GPU 1 (0000:2A:00.0): NVML nvmlDeviceGetTotalEccErrors failed: GPU is lost (expected an answer)" in fails
    assert "GPU 2 (0000:3A:00.0): NVML nvmlDeviceGetRemappedRows failed: Corrupted infoROM (expected an answer)" in fails
    assert "GPU 3 (0000:5D:00.0): NVML nvmlDeviceGetPersistenceMode failed: Unknown Error (expected an answer)" in fails
    assert len(fails) == 3


# ------------------------------------------------------------------------------- 15.3 throttle fallback


def test_throttle_reasons_on_drivers_before_r535():
    answers = nvml_answers()
    for dev in answers["devices"]:
        del dev["nvmlDeviceGetCurrentClocksEventReasons"]  # R470-R530: no such symbol
        dev["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x1
    answers["devices"][6]["nvmlDeviceGetCurrentClocksThrottleReasons"] = 0x8
    facts = nvml_facts(answers)
    assert facts["gpus"][0]["clock_events"] == ["gpu_idle"]
    assert facts["gpus"][6]["clock_events"] == ["hw_slowdown"]


# ------------------------------------------------------------------------------- 15.4 dead NVLinks


def test_nvml_error_at_link_0_on_sxm_gpu_fails():
    answers = nvml_answers()
    answers["devices"][4]["nvmlDeviceGetNvLinkState"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    facts = nvml_facts(answers)
    assert facts["gpus"][4]["nvlink"]["active"] == 0
    fails = by_status(run_rule(facts))[Status.FAIL]
    assert fails == ["GPU 4 (0000:9A:00.0): 0/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3; NVML: Not Supported at link 0)"]


def test_all_links_inactive_line_on_sxm_gpu_fails():
    text = open(os.path.join(FIX, "h100_hgx_550.nvlink.txt")).read().splitlines()
    facts = expected("h100_hgx_550")
    uuid = facts["gpus"][2]["uuid"]
    # GPU 2's section replaced by the one line the driver prints when every link is down
    out, skip = [], False
    for line in text:
        if line.startswith("GPU "):
            skip = uuid in line
            if skip:
                line = line + " NVML: Unable to retrieve NVLink information as all links are inActive"
            out.append(line)
        elif not skip:
            out.append(line)
    nvidia_smi.merge_nvlink(facts, nvidia_smi.parse_nvlink_status("\n".join(out) + "\n"))
    fails = by_status(run_rule(facts))[Status.FAIL]
    assert len(fails) == 1 and fails[0].startswith("GPU 2 (0000:3A:00.0): 0/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3; NVML: Unable to retrieve NVLink information as all links are inActive)")


def test_same_links_lost_on_every_gpu_fails_against_the_model():
    answers = nvml_answers()
    for dev in answers["devices"]:
        dev["nvmlDeviceGetNvLinkState"] = [1] * 16 + [0, 0]  # a dead NVSwitch: 2 links down on all 8
    fails = by_status(run_rule(nvml_facts(answers)))[Status.FAIL]
    assert len(fails) == 8
    assert fails[0] == "GPU 0 (0000:18:00.0): 16/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3)"


def test_pcie_gpu_without_nvlink_is_not_judged():
    links = nvidia_smi.parse_nvlink_status(open(os.path.join(FIX, "h100_pcie_no_nvlink.nvlink.txt")).read())
    facts = expected("h100_hgx_550")
    facts["gpus"] = facts["gpus"][:2]
    for g, uuid in zip(facts["gpus"], links):
        g["name"], g["uuid"] = "NVIDIA H100 PCIe", uuid
    nvidia_smi.merge_nvlink(facts, links)
    assert by_status(run_rule(facts, gpus_per_node=2)) .keys() == {Status.PASS}


def test_model_link_counts():
    assert gpu_rule.model_nvlinks("NVIDIA H100 80GB HBM3") == 18
    assert gpu_rule.model_nvlinks("NVIDIA H200") == 18
    assert gpu_rule.model_nvlinks("NVIDIA A100-SXM4-80GB") == 12
    assert gpu_rule.model_nvlinks("NVIDIA H100 PCIe") is None
    assert gpu_rule.model_nvlinks("NVIDIA A10G") is None


# ------------------------------------------------------------------------------- 15.5 wedged NVML


@pytest.fixture
def fake_pynvml(monkeypatch, tmp_path):
    proc = tmp_path / "proc-driver-nvidia"
    proc.mkdir()
    monkeypatch.setattr(probe_nvml, "NVIDIA_PROC", str(proc))
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)
    monkeypatch.setattr(probe_nvml, "NVML_BUDGET_S", 1.0)
    installed = []

    def install(answers):
        fake = FakeNVML(answers)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        installed.append(fake)
        return fake

    yield install
    for fake in installed:
        fake.release()
    probe_nvml.reset_nvml_wedge()


def _bounded(fn, *args):
    """fn(*args) in a thread; the test fails (instead of hanging) if it does not come back."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("v", fn(*args)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "%s did not return: a wedged NVML call held the probe" % fn.__name__
    return box["v"]


def test_wedged_nvml_call_costs_only_the_gpu_facts(tmp_path, monkeypatch, fake_pynvml):
    answers = nvml_answers()
    answers["devices"][5]["nvmlDeviceGetNvLinkState"] = {"block": True}
    fake_pynvml(answers)
    (tmp_path / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "module" / "nvidia" / "version").write_text("550.54.15\n")
    # nvidia-smi on a wedged driver hangs as well (ctx.run would wait its 60 s): it must not be called
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 300\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    ctx = NodeContext(sysfs_root=str(tmp_path))
    facts = _bounded(gpu_probe.probe, ctx)
    assert [g["index"] for g in facts["gpus"]] == [0, 1, 2, 3, 4, 5]  # what was read is kept
    assert "nvmlDeviceGetNvLinkState did not return within" in facts["gpus"][5]["error"]
    fails = by_status(run_rule(facts))[Status.FAIL]
    assert any("GPU 5" in m and "did not return" in m for m in fails)
    drv = _bounded(driver_probe.probe, ctx)  # the node's other facts still arrive
    assert drv["driver_version"] == "550.54.15" and drv["driver_source"] == "sysfs"
    assert drv["torch"] is not None and drv["torch"]["version"]
    assert "did not return within" in drv["nvml_error"]


# ------------------------------------------------------------------------------- 15.6 lenient nvlink


def test_one_unreadable_nvlink_line_keeps_the_xml_facts(tmp_path, monkeypatch):
    text = open(os.path.join(FIX, "h100_hgx_550.nvlink.txt")).read().replace(
        "Link 5: 26.562 GB/s", "Link 5: 26.562 GB/s (degraded)", 1
    )
    odd = tmp_path / "odd.nvlink.txt"
    odd.write_text(text)
    fake_nvidia_smi(str(tmp_path / "bin"), os.path.join(FIX, "h100_hgx_550.xml"), str(odd))
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    monkeypatch.setenv("PREFLIGHT_NVML", "off")
    facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["source"] == "nvidia-smi" and len(facts["gpus"]) == 8
    assert facts["nvlink_unreadable"] == ["line 7: 'Link 5: 26.562 GB/s (degraded)'"]
    assert facts["gpus"][0]["nvlink"] == {"active": 17, "inactive": 0, "unreadable": 1}
    found = by_status(run_rule(facts))
    assert Status.FAIL not in found
    assert found[Status.WARN] == [
        "nvidia-smi nvlink --status: 1 line not understood (line 7: 'Link 5: 26.562 GB/s (degraded)'); "
        "NVLink counts of GPU 0 (0000:18:00.0) are incomplete"
    ]


# ------------------------------------------------------------------------------- 12.1 legacy ECC


def test_legacy_ecc_layout_is_judged():
    facts = nvidia_smi.parse_nvidia_smi_xml(open(os.path.join(FIX, "p100_legacy_ecc_510.xml")).read())
    assert facts["gpus"][0]["ecc_uncorrectable_volatile"] == 0
    assert facts["gpus"][0]["ecc_uncorrectable_aggregate"] == 1
    bad = nvidia_smi.parse_nvidia_smi_xml(open(os.path.join(FIX, "p100_legacy_ecc_dbe.xml")).read())
    assert bad["gpus"][0]["ecc_uncorrectable_volatile"] == 2
    fails = by_status(run_rule(bad, gpus_per_node=1))[Status.FAIL]
    assert fails == ["GPU 0 (0000:04:00.0): 2 uncorrectable ECC errors since boot (expected 0)"]


# ------------------------------------------------------------------------------- 12.2 MIG


def _view(facts_by_node):
    nodes = [NodeInfo(n, "198.18.0.%d" % i, len(f["gpus"])) for i, (n, f) in enumerate(sorted(facts_by_node.items()), 1)]
    return builders.view({n: {"gpu": f, "ssh": {"shm_bytes": 16 * GiB}} for n, f in facts_by_node.items()}, nodes=nodes)


def test_mig_recorded_and_judged():
    mig = nvidia_smi.parse_nvidia_smi_xml(open(os.path.join(FIX, "a100_mig_enabled.xml")).read())
    g = mig["gpus"][0]
    assert g["mig_enabled"] is True and g["ecc_enabled"] is True and g["ecc_uncorrectable_volatile"] is None
    # one node alone: MIG is recorded, the unreadable volatile ECC counters are said, not passed silently
    alone = by_status(gpu_rule.rule(_view({"node01": mig})))
    assert alone[Status.WARN] == [
        "GPU 0 (0000:00:05.0): volatile ECC counters read N/A (MIG mode on): uncorrectable errors since boot unknown"
    ]
    # a multi-node job: MIG on is a launch problem, and it differs from the other nodes (drift)
    plain = expected("a100_hgx_535")
    plain["gpus"] = plain["gpus"][:1]
    found = gpu_rule.rule(_view({"node01": mig, "node02": plain, "node03": plain}))
    fails = [(f.node, f.message) for f in found if f.status is Status.FAIL]
    assert fails == [
        (
            "node01",
            "GPU 0 (0000:00:05.0): MIG mode enabled (expected disabled for a multi-node NCCL job; "
            "MIG disabled on node[02-03])",
        )
    ]


# ------------------------------------------------------------------------------- 12.5 PCIe width, fleet


def _narrow(facts, width, which=None):
    for g in facts["gpus"]:
        if which is None or g["index"] in which:
            g["pcie"]["width"] = width
    return facts


def test_pcie_width_shared_by_the_fleet_is_not_a_warning():
    a = _narrow(with_links(expected("h100_hgx_550"), "h100_hgx_550"), 8)
    b = _narrow(with_links(expected("h100_hgx_550"), "h100_hgx_550"), 8)
    found = gpu_rule.rule(_view({"node01": a, "node02": b}))
    assert [f.status for f in found] == [Status.PASS, Status.PASS]
    assert "PCIe x8 on every NVIDIA H100 80GB HBM3 (max x16)" in found[0].message


def test_pcie_width_below_its_peers_still_warns():
    a = _narrow(with_links(expected("h100_hgx_550"), "h100_hgx_550"), 8, which={3})
    b = with_links(expected("h100_hgx_550"), "h100_hgx_550")
    found = [(f.node, f.status, f.message) for f in gpu_rule.rule(_view({"node01": a, "node02": b})) if f.status is not Status.PASS]
    assert found == [("node01", Status.WARN, "GPU 3 (0000:5D:00.0): PCIe link Gen5 x8 (expected Gen5 x16)")]


def test_unknown_model_compared_with_the_node_gpus():
    """A model without a fixed link count (an NVL board bridged in pairs): only the node's other GPUs count."""
    facts = with_links(expected("h100_hgx_550"), "h100_hgx_550")
    for g in facts["gpus"]:
        g["name"] = "NVIDIA H100 NVL"
    facts["gpus"][5]["nvlink"] = {"active": 12, "inactive": 6}
    fails = by_status(run_rule(facts))[Status.FAIL]
    assert fails == ["GPU 5 (0000:AB:00.0): 12/18 NVLinks active (expected 18 like the other GPUs)"]


def test_wedged_nvml_in_the_node_runner_keeps_the_other_probes(tmp_path, monkeypatch, fake_pynvml):
    """Through the node-side runner (gpu and driver probes side by side, as the bundle runs them)."""
    from preflight.probe import runner

    answers = nvml_answers()
    answers["nvmlDeviceGetCount"] = {"block": True}
    fake_pynvml(answers)
    (tmp_path / "module" / "nvidia").mkdir(parents=True)
    (tmp_path / "module" / "nvidia" / "version").write_text("550.54.15\n")
    monkeypatch.setenv("PREFLIGHT_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    doc = _bounded(runner.run_probes, {"gpu": {}, "driver": {}}, 20.0)
    assert "probe_error" not in doc["gpu"] and "probe_error" not in doc["driver"]
    assert doc["gpu"]["source"] is None and "nvmlDeviceGetCount did not return within" in doc["gpu"]["error"]
    assert doc["driver"]["torch"]["version"] and doc["driver"]["driver_version"] == "550.54.15"
    failed = run_rule(doc["gpu"])
    assert [f.status for f in failed] == [Status.FAIL] and "did not return" in failed[0].message


def test_wedge_message_names_the_stuck_threads_call_not_anothers(fake_pynvml):
    """The gpu and driver probes call NVML side by side: a call the driver probe enters while the gpu
    probe's nvmlDeviceGetCount is stuck must not be named as the stuck one (it was, under load)."""
    answers = nvml_answers()
    answers["nvmlDeviceGetCount"] = {"block": True}
    nvml = fake_pynvml(answers)
    stuck = threading.Thread(target=lambda: box.setdefault("error", _catch(
        lambda: probe_nvml.bounded_nvml(lambda: gpu_nvml.facts_from_nvml(nvml), "GPU queries"))), daemon=True)
    box = {}
    stuck.start()
    while "nvmlDeviceGetCount" not in nvml.calls:
        time.sleep(0.01)
    assert probe_nvml.load_nvml()[0] is nvml  # another thread enters nvmlInit (it answers) while GetCount hangs
    stuck.join(10)
    assert "nvmlDeviceGetCount did not return within 1 s" in str(box["error"]), box


def _catch(fn):
    try:
        fn()
    except Exception as exc:
        return exc
    return None


def test_fabric_error_codes_from_the_c_entry_point():
    answers = nvml_answers()
    answers["devices"][0]["nvmlDeviceGetGpuFabricInfo"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}  # e.g. A100
    answers["devices"][1]["nvmlDeviceGetGpuFabricInfo"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    facts = nvml_facts(answers)
    assert facts["gpus"][0]["fabric"] is None and facts["gpus"][0]["query_errors"] == []
    assert facts["gpus"][1]["query_errors"] == ["NVML nvmlDeviceGetGpuFabricInfo failed: GPU is lost"]


# The structure as nvml.h declares it, compiled by the C compiler: the layout test that needs no GPU.
NVML_H_FABRIC = r"""
#include <string.h>
#define NVML_GPU_FABRIC_UUID_LEN 16
typedef int nvmlReturn_t;
typedef unsigned char nvmlGpuFabricState_t;
typedef struct {
    unsigned char        clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t         status;
    unsigned int         cliqueId;
    nvmlGpuFabricState_t state;
} nvmlGpuFabricInfo_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
    unsigned char uuid[16] = {0x5a,0x1f,0x0c,0x3e,0x7b,0x2d,0x4e,0x6f,0x9a,0x8b,0x0c,0x1d,0x2e,0x3f,0x4a,0x5b};
    memset(info, 0xff, sizeof *info);  /* padding the library leaves alone: garbage */
    memcpy(info->clusterUuid, uuid, 16);
    info->status = 0;
    info->cliqueId = 32766;
    info->state = 2;  /* NVML_GPU_FABRIC_STATE_IN_PROGRESS */
    return 0;
}
unsigned long fabric_info_size(void) { return sizeof(nvmlGpuFabricInfo_t); }
"""


def test_fabric_struct_against_a_compiled_nvml_h(tmp_path):
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the nvml.h structure")
    src = tmp_path / "fabric.c"
    src.write_text(NVML_H_FABRIC)
    lib_path = tmp_path / "libfabric.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib_path), str(src)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    lib.fabric_info_size.restype = ctypes.c_ulong
    assert lib.fabric_info_size() == ctypes.sizeof(nvml_structs.NvmlGpuFabricInfo)

    class Library:  # pynvml's shape: the C entry point by name, NVMLError by code
        NVMLError = FakeNVML.NVMLError
        NVML_ERROR_NOT_SUPPORTED = 3
        NVML_ERROR_FUNCTION_NOT_FOUND = 13

        @staticmethod
        def _nvmlGetFunctionPointer(name):
            return getattr(lib, name)

    g = gpu_facts.empty_gpu(0)
    fabric = gpu_nvml.nvml_fabric(Library, g, None)
    assert fabric == {"state": "In Progress", "status": "N/A", "clique_id": 32766, "cluster_uuid": UUID}


# ------------------------------------------------------------------ issue 26: healthy-but-unusual GPU nodes
# Each case goes through the real interfaces (FakeNVML as pynvml, nvidia-smi on PATH, a sysfs root) and has
# its faulty twin beside it, which must still FAIL with the right action.


def _sim_node(tmp_path, monkeypatch, profile="h100", count=8, faults=None, passthrough=False):
    from tests.sim import gpu_hw

    node = StubNode(tmp_path)
    gpu_hw.install_gpus(node, profile, count=count, faults=faults, passthrough=passthrough)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % node.bin_dir)
    return node


def _problems(findings):
    return [(f.status, f.message, f.action) for f in findings if f.status is not Status.PASS]


def test_slow_nvml_without_persistence_is_not_a_wedge(tmp_path, monkeypatch, fake_pynvml):
    """26.1: each GPU takes most of the per-call limit to open (no persistence mode): all are read, none
    fails; persistence off is a WARN naming the fix. The old single budget for the sequence called it a
    wedge and failed the GPU being read."""
    answers = nvml_answers()
    for dev in answers["devices"]:
        dev["nvmlDeviceGetHandleByIndex"] = {"delay": 0.3, "value": None}
        dev["nvmlDeviceGetPersistenceMode"] = 0
    monkeypatch.setattr(gpu_nvml, "SLOW_OPEN_S", 0.25)  # 1 s per GPU at real scale, as the budget is 1 s of 10
    fake_pynvml(answers)
    facts = _bounded(gpu_probe.probe, NodeContext(sysfs_root=str(tmp_path)))
    assert len(facts["gpus"]) == 8 and not any(g["error"] for g in facts["gpus"])
    assert facts["nvml_open_s"] >= 8 * 0.3 and facts["nvml_error"] is None
    found = by_status(run_rule(facts))
    assert Status.FAIL not in found
    assert "GPU 0 (0000:18:00.0): persistence mode off (expected on: nvidia-smi -pm 1 or nvidia-persistenced; "\
           "GPUs took seconds to open here)" in found[Status.WARN]


def test_nvml_slower_than_the_probe_budget_reads_what_it_can(tmp_path, monkeypatch, fake_pynvml):
    """26.1: still progressing when the sequence's time is up: the GPUs read are judged, the rest are named
    as not read (WARN), none is missing or failed."""
    monkeypatch.setattr(probe_nvml, "NVML_TOTAL_S", 1.5)
    answers = nvml_answers()
    for dev in answers["devices"]:
        dev["nvmlDeviceGetHandleByIndex"] = {"delay": 0.4, "value": None}
    fake_pynvml(answers)
    facts = _bounded(gpu_probe.probe, NodeContext(sysfs_root=str(tmp_path)))
    assert 1 <= len(facts["gpus"]) < 8 and facts["attached_gpus"] == 8 and "slow, not stuck" in facts["nvml_slow"]
    found = run_rule(facts)
    assert [f.status for f in found if f.status is Status.FAIL] == []
    warn = [f.message for f in found if f.status is Status.WARN]
    assert any("not read: NVML still answering after 1.5 s" in m and "nvidia-smi -pm 1" in m for m in warn), warn


def test_gpus_this_process_may_not_open_are_a_warn_not_a_pass(tmp_path, monkeypatch, fake_pynvml):
    """26.2, issue 40.10: a Slurm cgroup holding GPUs 0-1: NVML counts 8, the other 6 answer NO_PERMISSION
    (pynvml's NVMLError_NoPermission, "Insufficient Permissions": NVIDIA/nvidia-docker issue 393, a cgroup
    denying 2 of 4 GPUs). Not a PASS that checked a quarter of the node, not a FAIL: a WARN naming the GPUs
    not checked, why, and action retest."""
    answers = nvml_answers()
    for dev in answers["devices"][2:]:
        dev["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    fake_pynvml(answers)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    facts = _bounded(gpu_probe.probe, NodeContext(sysfs_root=str(tmp_path)))
    assert [bool(g.get("inaccessible")) for g in facts["gpus"]] == [False] * 2 + [True] * 6
    assert facts["access"]["SLURM_JOB_GPUS"] == "0,1"
    found = run_rule(facts)
    assert [(f.status, f.action) for f in found] == [(Status.WARN, "retest")]
    assert found[0].message.startswith("GPU 2-7 not checked: this process may not open them (NVML: Insufficient "
                                       "Permissions; a cgroup or container device limit")
    assert "SLURM_JOB_GPUS=0,1, CUDA_VISIBLE_DEVICES=0,1" in found[0].message
    assert "; 2 of 8 GPUs checked: run preflight where it may open every GPU" in found[0].message
    # the health checks judge the 2 GPUs read, and their PASS says the others were not
    from preflight.checks.gpu_memory import rule as gpu_memory_rule
    view = builders.view({"gpu-001": {"gpu": facts}}, nodes=[NodeInfo("gpu-001", "198.18.0.1", 8)])
    (memory,) = gpu_memory_rule.rule(view)
    assert memory.status is Status.PASS and memory.message.startswith("2 GPUs: ")
    assert memory.message.endswith("; GPU 2-7 not read: this process may not open them (see the gpu check)")
    # one GPU denied: named alone
    answers = nvml_answers()
    answers["devices"][5]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    found = run_rule(gpu_nvml.facts_from_nvml(FakeNVML(answers)))
    assert [f.status for f in found] == [Status.WARN]
    assert found[0].message.startswith("GPU 5 not checked: this process may not open it (NVML: Insufficient Permissions")
    # the healthy twin: every GPU opened, one PASS
    found = run_rule(gpu_nvml.facts_from_nvml(FakeNVML(nvml_answers())))
    assert [f.status for f in found] == [Status.PASS]
    # the faulty twin: a GPU the driver lost is a fault, whatever else this process may not open
    answers = nvml_answers()
    for dev in answers["devices"][2:]:
        dev["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    answers["devices"][1]["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    facts = gpu_nvml.facts_from_nvml(FakeNVML(answers))
    found = run_rule(facts)
    fails = [(f.message, f.action) for f in found if f.status is Status.FAIL]
    assert fails == [("GPU 1 (?): NVML cannot read this GPU: GPU is lost", None)]  # the check's action: isolate
    assert gpu.CHECK.action == "isolate"
    assert [f.message[:30] for f in found if f.status is Status.WARN] == ["GPU 2-7 not checked: this proc"]


def test_no_gpu_this_process_may_open_is_said_not_passed(fake_pynvml):
    answers = nvml_answers()
    for dev in answers["devices"]:
        dev["nvmlDeviceGetHandleByIndex"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    facts = gpu_nvml.facts_from_nvml(FakeNVML(answers))
    found = run_rule(facts)
    assert [f.status for f in found] == [Status.WARN]
    assert "none of the 8 GPUs is accessible to this process" in found[0].message


def test_partial_gpu_vm_without_nvlink_passes_and_bare_metal_twin_fails(tmp_path, monkeypatch, no_nvml):
    """26.3, 26.6 and issue 40.9: SXM GPUs of part of a baseboard, NVLink kept by the hypervisor (nvidia-smi
    prints NVML's all-links-inactive message under each GPU header). 2 GPUs (no bare-metal SXM board holds 2)
    and 4 in a VM: said in the PASS, never a FAIL. The same output from a whole board is every link down:
    FAIL, on 4 GPUs of bare metal (HGX 4-GPU boards link their GPUs directly) and on 8, VM or not."""
    whys = {None: "a VM or a partition of a baseboard", "dmi": "a VM: DMI sys_vendor 'QEMU'",
            "driver": "a VM: GPU virtualization mode Pass-Through"}

    def judged(count, vm):
        node = _sim_node(tmp_path / ("%d%s%d" % (count, vm, len(os.listdir(tmp_path)))), monkeypatch, count=count,
                         faults={i: "nvlink_all_down" for i in range(count)}, passthrough=vm == "driver")
        if vm == "dmi":
            node.write_sys("class/dmi/id/sys_vendor", "QEMU\n")
        facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
        assert facts["gpus"][0]["nvlink"] == {"active": 0, "inactive": 0, "error": NVLINK_ALL_INACTIVE}
        assert facts["nvlink_unreadable"] == [] and facts.get("virtual") == (whys[vm][6:] if vm else None)
        return facts, run_rule(facts, gpus_per_node=count)

    # the driver's own word (a GPU in Pass-Through mode) makes a 4-GPU VM whose DMI names no hypervisor
    for count, vm in ((2, None), (2, "dmi"), (4, "dmi"), (4, "driver")):
        facts, found = judged(count, vm)
        assert [f.status for f in found] == [Status.PASS], (count, vm)
        assert "no NVLink between the node's %d GPUs (%s: NCCL uses PCIe)" % (count, whys[vm]) in found[0].message
    for count, vm in ((4, None), (8, None), (8, "dmi"), (8, "driver")):
        facts, found = judged(count, vm)
        fails = by_status(found)[Status.FAIL]
        assert len(fails) == count, (count, vm)
        assert fails[0] == "GPU 0 (0000:18:00.0): 0/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3; %s)" % NVLINK_ALL_INACTIVE
    # one GPU of a 2-GPU VM without the links its peer has is still a fault
    facts, _ = judged(2, "dmi")
    facts["gpus"][1]["nvlink"] = {"active": 18, "inactive": 0}
    assert by_status(run_rule(facts, gpus_per_node=2))[Status.FAIL] == [
        "GPU 0 (0000:18:00.0): 0/0 NVLinks active (expected 18 like the other GPUs; %s)" % NVLINK_ALL_INACTIVE]


def test_one_gpu_sxm_vm_passes_preflight_node_as_a_new_user_runs_it(tmp_path, monkeypatch):
    """Issue 40.9, as a new user tries it: `preflight node` on a 1x H100 SXM VM whose NVLinks are inactive
    (the hypervisor gave one GPU: no peer, no NVSwitch). It used to FAIL "0/18 NVLinks active", action
    isolate, with or without a VM seen in DMI. Now: exit 0, no WARN or FAIL from any check."""
    import subprocess

    from tests.sim import gpu_hw

    node = StubNode(tmp_path)
    gpu_hw.install_gpus(node, "h100", count=1, faults={0: "nvlink_all_down"})
    env = {"PATH": "%s:/usr/bin:/bin" % node.bin_dir, "PREFLIGHT_SYSFS_ROOT": node.sys_dir, "PREFLIGHT_NVML": "off",
           "HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONPATH": REPO}
    for vm in (False, True):
        if vm:
            node.write_sys("class/dmi/id/sys_vendor", "QEMU\n")
        run = subprocess.run([sys.executable, "-m", "preflight", "node", "--gpus-per-node", "1", "--json", "-"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in run.stderr, run.stderr
        doc = json.loads(run.stdout)
        loud = [(r["check"], r["status"], r["message"]) for r in doc["results"] if r["status"] in ("warn", "fail", "error")]
        assert (run.returncode, loud) == (0, []), run.stderr
        (mine,) = [r for r in doc["results"] if r["check"] == "gpu"]
        assert mine["message"].startswith("1× NVIDIA H100 80GB HBM3, healthy; NVLink not judged: one GPU, no peer")


@pytest.mark.parametrize("links", [[0] * 18, {"error": "NVML_ERROR_NOT_SUPPORTED"}], ids=["inactive", "not_supported"])
def test_one_gpu_sxm_vm_through_nvml(links, tmp_path, monkeypatch, fake_pynvml):
    """Issue 40.9 on the NVML path (tests/fixtures/gpu/nvml_h100_1gpu_vm.json: fabric state Not Supported,
    leptonai/gpud PR 1140): gpu PASS, fabric_manager SKIP (not needed for one GPU), nvls SKIP. The twin: one
    GPU of an 8-GPU node (a job's cgroup shows this process one) with its links down is still a FAIL."""
    from preflight.checks.fabric_manager import probe as fabric_manager_probe
    from preflight.checks.fabric_manager import rule as fabric_manager_rule
    from preflight.checks.nvls import rule as nvls_rule
    answers = nvml_answers("nvml_h100_1gpu_vm")
    answers["devices"][0]["nvmlDeviceGetNvLinkState"] = links
    fake_pynvml(answers)
    ctx = NodeContext(sysfs_root=str(tmp_path))
    facts = {"gpu": _bounded(gpu_probe.probe, ctx), "fabric_manager": fabric_manager_probe.probe(ctx), "ssh": {"shm_bytes": 16 * GiB}}
    assert facts["gpu"]["gpus"][0]["fabric"] is None and facts["gpu"]["gpus"][0]["nvlink"]["active"] == 0
    view = builders.view({"gpu-001": facts}, nodes=[NodeInfo("gpu-001", "198.18.0.1", 1)])
    assert [(f.status, f.message) for f in gpu_rule.rule(view)] == [
        (Status.PASS, "1× NVIDIA H100 80GB HBM3, healthy; NVLink not judged: one GPU, no peer to link to (a VM: GPU "
                      "virtualization mode Pass-Through)")]
    assert [(f.status, f.message) for f in fabric_manager_rule.rule(view)] == [
        (Status.SKIP, "one GPU, no NVSwitch visible and no NVLink fabric state reported (a single GPU or a VM given "
                      "one): fabric manager not needed")]
    assert [f.status for f in nvls_rule.rule(view)] == [Status.SKIP]
    facts["gpu"]["access"] = {"SLURM_JOB_GPUS": "3"}
    held = builders.view({"gpu-001": facts}, nodes=[NodeInfo("gpu-001", "198.18.0.1", 8)])
    warn, fail = gpu_rule.rule(held)
    assert (warn.status, fail.status) == (Status.WARN, Status.FAIL)
    assert warn.message.startswith("7 of the node's 8 GPUs not checked: the job holds 1")
    assert fail.message.startswith("GPU 0 (0000:00:05.0): 0/18 NVLinks active (expected 18 on NVIDIA H100 80GB HBM3")


def test_nvlink_shape_by_gpus_held():
    assert [gpu_rule.nvlink_shape(n, False) for n in (1, 2, 4, 7, 8)] == ["no_peer", "peers", "model", "model", "model"]
    assert [gpu_rule.nvlink_shape(n, True) for n in (1, 2, 4, 7, 8)] == ["no_peer", "peers", "peers", "peers", "model"]
    # a job shown 1 GPU of an 8-GPU node is judged as the node it runs on
    assert gpu_rule.node_shape(8, {"gpus": [{}], "attached_gpus": 1}) == "model"


NVLINK_ALL_INACTIVE = "NVML: Unable to retrieve NVLink information as all links are inActive"


def test_one_hw_slowdown_sample_is_re_read_nvml():
    """26.4: the HW slowdown bit seen once (a clock change) and gone on the re-read: no FAIL. Held: FAIL."""
    answers = nvml_answers()
    answers["devices"][2]["nvmlDeviceGetCurrentClocksEventReasons"] = {"sequence": [0x8, 0x0]}
    answers["devices"][6]["nvmlDeviceGetCurrentClocksEventReasons"] = 0x8 | 0x40
    facts = with_links(gpu_nvml.facts_from_nvml(FakeNVML(answers)), "h100_hgx_550")
    assert facts["gpus"][2]["clock_events"] == [] and facts["gpus"][6]["clock_events"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert _problems(run_rule(facts)) == [
        (Status.FAIL, "GPU 6 (0000:BA:00.0): clocks throttled by hw_slowdown, hw_thermal_slowdown (expected none active)", None)]


def test_one_hw_slowdown_sample_is_re_read_nvidia_smi(tmp_path, monkeypatch, no_nvml):
    node = _sim_node(tmp_path, monkeypatch, faults={2: "hw_slowdown_blip", 6: "hw_slowdown"})
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    assert "hw_slowdown" not in facts["gpus"][2]["clock_events"]
    assert _problems(run_rule(facts)) == [
        (Status.FAIL, "GPU 6 (0000:BA:00.0): clocks throttled by hw_slowdown, hw_thermal_slowdown (expected none active)", None)]


def test_pending_row_remap_is_a_reset_at_convenience_failed_remap_isolates(tmp_path, monkeypatch, no_nvml):
    """26.5: NVIDIA: a pending remap takes effect at the next reset, future work unaffected: WARN, reset_gpu.
    A failed remap (or uncorrectable volatile ECC) is the GPU to replace: FAIL with the check's isolate."""
    node = _sim_node(tmp_path, monkeypatch, faults={1: "remap_pending", 4: "remap_failure", 5: "ecc"})
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    assert _problems(run_rule(facts)) == [
        (Status.WARN, "GPU 1 (0000:2A:00.0): row remapping pending (expected none): reset the GPU when it is idle "
                      "(nvidia-smi -r); running work is unaffected", "reset_gpu"),
        (Status.FAIL, "GPU 4 (0000:9A:00.0): row remapping failed (expected none): replace the GPU", None),
        (Status.FAIL, "GPU 5 (0000:AB:00.0): 2 uncorrectable ECC errors since boot (expected 0)", None),
    ]


def test_hung_nvml_init_names_it_without_running_nvidia_smi(tmp_path, monkeypatch, fake_pynvml):
    """26.7: nvmlInit does not return: nvidia-smi (which calls nvmlInit too) is not started; the facts name
    nvmlInit within the NVML budget, well inside the probe's."""
    answers = nvml_answers()
    answers["nvmlInit"] = {"block": True}
    fake_pynvml(answers)
    marker = tmp_path / "nvidia-smi-ran"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\ntouch %s\nexec sleep 300\n" % marker)
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % (tmp_path / "bin"))
    facts = _bounded(gpu_probe.probe, NodeContext(sysfs_root=str(tmp_path)))
    assert not marker.exists()  # the old code went on to nvidia-smi, and waited on it (60 s)
    assert facts["source"] is None and facts["error"].startswith("nvmlInit did not return within 1 s")
    fails = [f.message for f in run_rule(facts) if f.status is Status.FAIL]
    assert len(fails) == 1 and fails[0].startswith("nvmlInit did not return within 1 s")


def test_legacy_pynvml_package_is_not_shipped_as_nvidia_ml_py(tmp_path, monkeypatch):
    """26.9: the legacy `pynvml` 11.x package (a folder importing .nvml) first on the controller's path: the
    bundle ships nvidia-ml-py's pynvml.py found behind it, or says loudly that it has none."""
    import importlib

    from preflight.transport import bundle

    legacy = tmp_path / "legacy"
    (legacy / "pynvml").mkdir(parents=True)
    (legacy / "pynvml" / "__init__.py").write_text("from .nvml import *\n")
    (legacy / "pynvml" / "nvml.py").write_text("def nvmlInit():\n    pass\n")
    real = importlib.util.find_spec("pynvml").origin
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(sys, "path", [str(legacy)] + [p for p in sys.path])
    importlib.invalidate_caches()
    assert importlib.util.find_spec("pynvml").origin.endswith(os.path.join("pynvml", "__init__.py"))
    assert probe_nvml.pynvml_source() == (real, None)
    assert (real, "pynvml.py") in bundle._sources()
    # only the legacy package: nothing shipped, and the controller says so
    monkeypatch.setattr(sys, "path", [str(legacy)] + [p for p in sys.path if not os.path.isfile(os.path.join(p or ".", "pynvml.py"))])
    importlib.invalidate_caches()
    origin, why = probe_nvml.pynvml_source()
    assert origin is None and "legacy pynvml package" in why


def test_node_without_a_usable_pynvml_warns(tmp_path, monkeypatch, no_nvml):
    """26.9, node side: the pynvml a node imports is not nvidia-ml-py's: the GPUs are read with nvidia-smi and
    the node WARNs (it used to fall back silently)."""
    import types

    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    node = _sim_node(tmp_path, monkeypatch)
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    assert facts["source"] == "nvidia-smi" and "is not nvidia-ml-py's" in facts["nvml_error"]
    warn = [f.message for f in run_rule(facts) if f.status is Status.WARN]
    assert len(warn) == 1 and warn[0].startswith("NVML not used: pynvml at ")
    assert "install nvidia-ml-py on the controller" in warn[0]


def test_healthy_but_unusual_matrix_gives_no_fail(tmp_path, monkeypatch, no_nvml):
    """26 matrix: MIG on a single node, a PCIe node without NVSwitch or NVLink, a VM whose devices have
    numa_node -1: no FAIL or ERROR (hence no drain) from gpu, fabric_manager or topology."""
    from preflight.checks.fabric_manager import probe as fabric_manager_probe
    from preflight.checks.fabric_manager import rule as fabric_manager_rule
    from preflight.checks.gpudirect import probe as gpudirect_probe
    from preflight.checks.topology import probe as topology_probe
    from tests.sim import ib_hw, pci_hw

    mig = nvidia_smi.parse_nvidia_smi_xml(read(os.path.join(FIX, "a100_mig_enabled.xml")))
    assert [f.message for f in run_rule(mig, gpus_per_node=len(mig["gpus"])) if f.status.is_problem] == []
    pcie = expected("h100_hgx_550")
    pcie["gpus"] = pcie["gpus"][:2]
    links = nvidia_smi.parse_nvlink_status(read(os.path.join(FIX, "h100_pcie_no_nvlink.nvlink.txt")))
    for g, uuid in zip(pcie["gpus"], links):
        g["name"], g["uuid"], g["nvlink"], g["fabric"] = "NVIDIA H100 PCIe", uuid, links[uuid], None
    node = NodeInfo("gpu-001", "198.18.0.1", 2)
    view = builders.view({"gpu-001": {"gpu": pcie, "ssh": {"shm_bytes": 16 * GiB},
                                      "fabric_manager": {"nvswitches": []}}}, nodes=[node])
    assert [f.status for f in gpu_rule.rule(view)] == [Status.PASS]
    assert [f.status for f in fabric_manager_rule.rule(view)] == [Status.SKIP]
    sim = _sim_node(tmp_path, monkeypatch)
    ib_hw.install_hcas(sim, [{}] * 2)
    pci_hw.install_pcie(sim, vm=True)
    devices = os.path.join(sim.sys_dir, "bus", "pci", "devices")
    for bdf in os.listdir(devices):
        if os.path.exists(os.path.join(devices, bdf, "numa_node")):
            sim.write_sys("bus/pci/devices/%s/numa_node" % bdf, "-1\n")
    ctx = NodeContext(sysfs_root=sim.sys_dir)
    facts = {"gpu": gpu_probe.probe(ctx), "topology": topology_probe.probe(ctx), "fabric_manager": fabric_manager_probe.probe(ctx),
             "gpudirect": gpudirect_probe.probe(ctx), "ssh": {"shm_bytes": 16 * GiB}}
    assert facts["gpu"]["virtual"] and all(d["numa_node"] is None for d in facts["topology"]["devices"])
    vm = builders.view({"gpu-001": facts}, nodes=[NodeInfo("gpu-001", "198.18.0.1", 8)])
    for check in map(checks.get, ("gpu", "topology", "fabric_manager", "gpudirect")):  # fail or error would drain
        assert [f.message for f in check.rule(vm) if f.status.is_problem] == [], check.name


def test_slurm_job_holding_some_gpus_on_the_nvidia_smi_path(tmp_path, monkeypatch, no_nvml):
    """26.2 on the nvidia-smi path: inside a job's cgroup nvidia-smi lists only the GPUs the job holds. Those
    all there: no FAIL, and a WARN (issue 40.10: not a PASS) naming the GPUs not checked. One of them missing
    (the job holds 3, 2 listed): FAIL as before."""
    node = _sim_node(tmp_path, monkeypatch, count=2)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    found = run_rule(facts)
    assert [(f.status, f.action) for f in found] == [(Status.WARN, "retest")]
    assert found[0].message.startswith("6 of the node's 8 GPUs not checked: the job holds 2 (a cgroup or container "
                                       "device limit")
    assert "SLURM_JOB_GPUS=0,1" in found[0].message and "; 2 of 8 GPUs checked" in found[0].message
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1,2")
    facts = gpu_probe.probe(NodeContext(sysfs_root=node.sys_dir))
    assert by_status(run_rule(facts))[Status.FAIL] == ["2 GPUs visible (expected 8)"]


def test_pending_page_retirement_is_a_reset_not_an_isolate():
    """Pre-Ampere dynamic page retirement: the page is retired at the next reset; FAIL (it may be used until
    then), action reset_gpu, not the check's isolate. The healthy twin (none pending) passes."""
    facts = expected("p100_legacy_ecc_510")
    assert [f.status for f in run_rule(facts, gpus_per_node=1)] == [Status.PASS]
    facts["gpus"][0]["retired_pages_pending"] = True
    assert _problems(run_rule(facts, gpus_per_node=1)) == [
        (Status.FAIL, "GPU 0 (0000:04:00.0): page retirement pending (expected none): reset the GPU", "reset_gpu")]


def test_a_query_this_user_may_not_make_is_not_a_gpu_fault():
    """NO_PERMISSION on one query (a non-root run): said as unknown (WARN), never 'NVML failed' (FAIL,
    isolate); any other error on the same query is still a FAIL."""
    answers = nvml_answers()
    answers["devices"][3]["nvmlDeviceGetRemappedRows"] = {"error": "NVML_ERROR_NO_PERMISSION"}
    answers["devices"][4]["nvmlDeviceGetRemappedRows"] = {"error": "NVML_ERROR_UNKNOWN"}
    facts = gpu_nvml.facts_from_nvml(FakeNVML(answers))
    assert facts["gpus"][3]["query_errors"] == [] and facts["gpus"][3]["remapped_rows_pending"] is None
    assert _problems(run_rule(facts)) == [
        (Status.WARN, "GPU 3 (0000:5D:00.0): NVML nvmlDeviceGetRemappedRows: Insufficient Permissions to this user: "
                      "that fact unknown (run preflight as root)", None),
        (Status.FAIL, "GPU 4 (0000:9A:00.0): NVML nvmlDeviceGetRemappedRows failed: Unknown Error (expected an answer)", None),
    ]


def test_driver_library_mismatch_is_a_reboot_not_an_isolate(tmp_path, monkeypatch, no_nvml):
    """The driver was upgraded under a loaded kernel module: nvidia-smi cannot initialise NVML. The fix is a
    reboot (the GPUs are fine): FAIL with action reboot. The twin, no GPU found by the driver, keeps isolate."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bindir)
    for said, rc, action in (("Failed to initialize NVML: Driver/library version mismatch", 18, "reboot"),
                             ("No devices were found", 6, None)):
        smi.write_text("#!/bin/sh\necho '%s'\nexit %d\n" % (said, rc))
        smi.chmod(0o755)
        facts = gpu_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
        found = run_rule(facts)
        assert [(f.status, f.action) for f in found] == [(Status.FAIL, action)], found
        assert found[0].message.startswith("nvidia-smi failed (rc %d): %s (expected 8 GPUs)" % (rc, said))

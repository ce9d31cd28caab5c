"""gpu_memory and gpu_state (issue 21 items 1 and 4): the health facts the gpu probe reads through NVML (the
FakeNVML answers in pynvml's own types) or parses from nvidia-smi -q -x (recorded fixtures edited in place,
and the real captures in tests/realworld/test_gpu.py), and the rules with each fault's healthy twin."""

from __future__ import annotations

import os
import re

import pytest

from preflight import checks
from preflight.model import NodeInfo, ParseError, Status
from preflight.probe import gpu_health, gpu_nvml
from tests.builders import nvml_answers
from tests.fixture_cases import fixture_dir, read
from tests.sim.gpu_hw import FakeNVML
from tests import builders

H100_XML = read(os.path.join(fixture_dir("gpu"), "h100_hgx_550.xml"))
P100_XML = read(os.path.join(fixture_dir("gpu"), "p100_legacy_ecc_510.xml"))


def first_gpu(xml: str, old: str, new: str) -> str:
    """The fixture with `old` replaced by `new` inside its first <gpu> only."""
    start = xml.index("<gpu id=")
    end = xml.index("</gpu>", start)
    block = xml[start:end]
    assert old in block, old
    return xml[:start] + block.replace(old, new, 1) + xml[end:]


def xml_facts(xml: str):
    from preflight.probe.nvidia_smi import parse_nvidia_smi_xml

    facts = parse_nvidia_smi_xml(xml)
    facts["health"] = gpu_health.parse_health_xml(xml)
    return facts


#: the checks as the engine runs them (declaration and rule bound)
GPU_MEMORY, GPU_STATE = checks.get("gpu_memory"), checks.get("gpu_state")


def judge(check, *node_facts):
    """check's rule over nodes n1, n2, ... each holding these gpu facts."""
    nodes = [NodeInfo("n%d" % (i + 1), "198.18.0.%d" % (i + 1), len(f["gpus"])) for i, f in enumerate(node_facts)]
    view = builders.view({n.name: {"gpu": f} for n, f in zip(nodes, node_facts)}, nodes=nodes)
    return check.rule(view)


def problems(findings):
    return [(f.node, f.status, f.action, f.message) for f in findings if f.status is not Status.PASS]


# ------------------------------------------------------------------------------------- nvidia-smi XML


def test_xml_health_of_a_healthy_hgx_node():
    health = gpu_health.parse_health_xml(H100_XML)
    assert health["source"] == "nvidia-smi" and health["window_s"] is None and len(health["gpus"]) == 8
    g = health["gpus"]["00000000:18:00.0"]
    assert g["remap"] == {"corr": 0, "unc": 0, "histogram": {"max": 2551, "high": 0, "partial": 0, "low": 0, "none": 0}}
    assert g["retired_pages"] is None and g["ce_volatile"] == 0
    assert (g["compute_mode"], g["processes"], g["power_limit_w"], g["default_power_limit_w"]) == ("Default", [], 700.0, 700.0)
    assert (g["apps_clock_mhz"], g["default_apps_clock_mhz"], g["reset_required"], g["drain_and_reset"]) == (1755, 1755, False, False)
    for check in (GPU_MEMORY, GPU_STATE):
        assert [f.status for f in judge(check, xml_facts(H100_XML))] == [Status.PASS]


def retired(sbe, dbe):
    """The P100 fixture (driver 510, legacy ECC layout; its page counts N/A) with these retired pages."""
    xml = first_gpu(P100_XML, "<retired_count>N/A</retired_count>", "<retired_count>%d</retired_count>" % sbe)
    return first_gpu(xml, "<retired_count>N/A</retired_count>", "<retired_count>%d</retired_count>" % dbe)


def test_xml_legacy_layout_reads_retired_pages_and_single_bit_total():
    g = next(iter(gpu_health.parse_health_xml(retired(0, 0))["gpus"].values()))
    assert g["remap"] is None and g["retired_pages"] == {"sbe": 0, "dbe": 0} and g["ce_volatile"] is not None
    g = next(iter(gpu_health.parse_health_xml(P100_XML)["gpus"].values()))
    assert g["retired_pages"] is None  # N/A: not judged


def test_xml_value_it_does_not_understand_is_a_parse_error():
    bad = first_gpu(H100_XML, "<row_remapper_histogram_none>0 bank(s)", "<row_remapper_histogram_none>some")
    with pytest.raises(ParseError, match="row_remapper_histogram_none is 'some'"):
        gpu_health.parse_health_xml(bad)


# ---------------------------------------------------------------------------------------------- NVML

#: NVML_GPU_FABRIC_HEALTH_MASK_*: degraded bandwidth, route recovery, route unhealthy, access timeout recovery
#: FALSE (2 in bits 0-1, 2-3, 4-5, 6-7), incorrect configuration NONE (1 in bits 8-11).
HEALTHY_MASK = 2 | 2 << 2 | 2 << 4 | 2 << 6 | 1 << 8


def health_answers(per_gpu=None):
    """The recorded H100 session plus healthy health answers on every GPU; per_gpu {index: {key: answer}}."""
    answers = nvml_answers()
    for i, dev in enumerate(answers["devices"]):
        dev.update({
            "nvmlDeviceGetRowRemapperHistogram": {"max": 2551, "high": 0, "partial": 0, "low": 0, "none": 0},
            "nvmlDeviceGetTotalEccErrors(CORRECTED,VOLATILE)": 0,
            "nvmlDeviceGetComputeMode": 0,
            "nvmlDeviceGetComputeRunningProcesses": [],
            "nvmlDeviceGetPowerManagementLimit": 700000,
            "nvmlDeviceGetPowerManagementDefaultLimit": 700000,
            "nvmlDeviceGetApplicationsClock(GRAPHICS)": 1755,
            "nvmlDeviceGetDefaultApplicationsClock(GRAPHICS)": 1755,
            "nvmlDeviceGetFieldValues": {"230": 0, "94": 0},
            "nvmlDeviceGetUtilizationRates": {"gpu": 0, "memory": 0},
            # an R550 driver: nvmlGpuFabricInfo_v2 (no summary); every health bit FALSE, configuration NONE
            "nvmlDeviceGetGpuFabricInfoV": {"versions": [2], "state": 3, "healthMask": HEALTHY_MASK},
        })
        dev.update((per_gpu or {}).get(i, {}))
    return answers


def nvml_facts(answers, window_s=0.05):
    fake, seen = FakeNVML(answers), {"gpus": []}
    facts = gpu_nvml.facts_from_nvml(fake, seen)
    facts["health"] = gpu_health.health_from_nvml(fake, facts["gpus"], seen["handles"], window_s)
    return facts


def test_nvml_and_xml_health_agree_on_the_healthy_node():
    facts = nvml_facts(health_answers())
    xml = gpu_health.parse_health_xml(H100_XML)["gpus"]
    assert facts["health"]["error"] is None and facts["health"]["window_s"] >= 0.05
    for bus, nvml in facts["health"]["gpus"].items():
        assert nvml.pop("ce_volatile_after") == 0 and nvml.pop("pcie_replay_after") == 0  # the second read: NVML only
        want = dict(xml[bus], recovery_action="None", reset_required=None, drain_and_reset=None)
        del want["ce_volatile_after"], want["pcie_replay_after"]
        assert nvml == want


def test_corrected_error_storm_isolates_a_trickle_warns_an_old_burst_passes():
    answers = health_answers({
        1: {"nvmlDeviceGetTotalEccErrors(CORRECTED,VOLATILE)": {"sequence": [4_000_000_000, 4_000_009_000]}},
        2: {"nvmlDeviceGetTotalEccErrors(CORRECTED,VOLATILE)": {"sequence": [10, 12]}},
        3: {"nvmlDeviceGetTotalEccErrors(CORRECTED,VOLATILE)": 3_000_000_000},
    })
    facts = nvml_facts(answers, window_s=0.5)
    found = problems(judge(GPU_MEMORY, facts))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "isolate"), (Status.WARN, None)]
    assert found[0][3].startswith("GPU 1 (0000:2A:00.0): 9000 corrected ECC errors in 0.5 s")
    assert found[1][3].startswith("GPU 2 (0000:3A:00.0): 2 corrected ECC errors in 0.5 s")
    # the twin: billions since the last reset, none arriving now, is an old burst named in the PASS
    quiet = health_answers({3: {"nvmlDeviceGetTotalEccErrors(CORRECTED,VOLATILE)": 3_000_000_000}})
    [finding] = judge(GPU_MEMORY, nvml_facts(quiet))
    assert finding.status is Status.PASS and "3000000000 corrected ECC errors since the last reset, none during" in finding.message


def test_bank_without_spare_rows_warns_to_plan_replacement_low_banks_pass():
    empty = {"nvmlDeviceGetRowRemapperHistogram": {"max": 2541, "high": 5, "partial": 2, "low": 1, "none": 2},
             "nvmlDeviceGetRemappedRows": [3, 17, 0, 0]}
    [finding] = problems(judge(GPU_MEMORY, nvml_facts(health_answers({4: empty}))))
    assert finding[1] is Status.WARN and "GPU 4" in finding[3] and "2 memory banks of 2551 with no spare row left" in finding[3]
    assert "17 uncorrectable" in finding[3] and "row-remap failure" in finding[3]
    low = {"nvmlDeviceGetRowRemapperHistogram": {"max": 2547, "high": 2, "partial": 1, "low": 1, "none": 0}}
    [twin] = judge(GPU_MEMORY, nvml_facts(health_answers({4: low})))
    assert twin.status is Status.PASS and "1 bank with few spare rows" in twin.message


def test_pre_ampere_retired_page_limit_isolates_a_few_pages_pass():
    found = problems(judge(GPU_MEMORY, xml_facts(retired(60, 4))))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "isolate")]
    assert "64 pages retired (60 single-bit, 4 double-bit; the limit is 64)" in found[0][3]
    [twin] = judge(GPU_MEMORY, xml_facts(retired(3, 0)))
    assert twin.status is Status.PASS and "3 pages retired" in twin.message


def test_nvml_retired_pages_on_a_pre_ampere_answer():
    answers = health_answers({0: {"nvmlDeviceGetRemappedRows": {"error": "NVML_ERROR_NOT_SUPPORTED"},
                                    "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT)": [0x1000, 0x2000],
                                    "nvmlDeviceGetRetiredPages(DOUBLE_BIT)": [0x3000]}})
    g = nvml_facts(answers)["health"]["gpus"]["00000000:18:00.0"]
    assert g["remap"] is None and g["retired_pages"] == {"sbe": 2, "dbe": 1}


def test_no_health_facts_is_an_error_not_a_pass_and_cpu_nodes_skip():
    facts = xml_facts(H100_XML)
    del facts["health"]
    nodes = [NodeInfo("n1", "198.18.0.1", 8), NodeInfo("cpu1", "198.18.0.2", 0)]
    view = builders.view({"n1": {"gpu": facts}, "cpu1": {}}, nodes=nodes)
    for check in (GPU_MEMORY, GPU_STATE):
        statuses = {f.node: f.status for f in check.rule(view)}
        assert statuses == {"n1": Status.ERROR, "cpu1": Status.SKIP}


def test_health_reads_that_wedge_keep_the_gpu_facts_and_are_said_once():
    facts = xml_facts(H100_XML)
    facts["health"]["error"] = "nvmlDeviceGetComputeRunningProcesses did not return within 10 s"
    assert [f.status for f in judge(GPU_MEMORY, facts)] == [Status.WARN, Status.PASS]
    assert [f.status for f in judge(GPU_STATE, facts)] == [Status.PASS]


# ------------------------------------------------------------------------------------------ gpu_state


def test_leftover_process_holding_memory_is_named_with_pid_command_and_memory():
    procs = [{"pid": 4242, "usedGpuMemory": 61 << 30}, {"pid": 4243, "usedGpuMemory": None}]
    answers = health_answers({5: {"nvmlDeviceGetComputeRunningProcesses": procs}})
    answers["processNames"] = {"4242": "python3 train.py"}
    [found] = problems(judge(GPU_STATE, nvml_facts(answers)))
    assert found[1:3] == (Status.FAIL, "check_app")
    assert "GPU 5 (0000:AB:00.0): 1 process holding 62464 MiB of GPU memory: pid 4242 python3 train.py (62464 MiB)" in found[3]
    # the twin: a process without reported memory (an MPS-managed or WDDM client) is named, not failed
    idle = health_answers({5: {"nvmlDeviceGetComputeRunningProcesses": [{"pid": 4243, "usedGpuMemory": None}]}})
    [twin] = judge(GPU_STATE, nvml_facts(idle))
    assert twin.status is Status.PASS and "1 process without reported memory" in twin.message


def test_process_in_another_pid_namespace_is_named_by_pid():
    answers = health_answers({0: {"nvmlDeviceGetComputeRunningProcesses": [{"pid": 77, "usedGpuMemory": 1 << 30}]}})
    [found] = problems(judge(GPU_STATE, nvml_facts(answers)))
    assert "pid 77 (not visible here) (1024 MiB)" in found[3]


def test_this_probe_is_never_its_own_leftover():
    answers = health_answers({0: {"nvmlDeviceGetComputeRunningProcesses": [{"pid": os.getpid(), "usedGpuMemory": 1 << 29}]}})
    assert [f.status for f in judge(GPU_STATE, nvml_facts(answers))] == [Status.PASS]


def test_compute_mode_prohibited_fails_exclusive_warns_unless_the_site_runs_it():
    answers = health_answers({0: {"nvmlDeviceGetComputeMode": 2}, 1: {"nvmlDeviceGetComputeMode": 3}})
    found = problems(judge(GPU_STATE, nvml_facts(answers)))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "fix_config"), (Status.WARN, "fix_config")]
    assert "compute mode Prohibited" in found[0][3] and "compute mode Exclusive_Process" in found[1][3]
    site = health_answers({i: {"nvmlDeviceGetComputeMode": 3} for i in range(8)})
    [twin] = judge(GPU_STATE, nvml_facts(site))
    assert twin.status is Status.PASS and "compute mode Exclusive_Process on the NVIDIA H100 80GB HBM3 GPUs" in twin.message


def test_recovery_action_maps_to_reset_or_reboot_and_old_reset_status_to_reset():
    answers = health_answers({2: {"nvmlDeviceGetFieldValues": {"230": 1}}, 3: {"nvmlDeviceGetFieldValues": {"230": 2}},
                                4: {"nvmlDeviceGetFieldValues": {"226": 1}}})
    found = problems(judge(GPU_STATE, nvml_facts(answers)))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "reset_gpu"), (Status.FAIL, "reboot"), (Status.FAIL, "reset_gpu")]
    assert "recovery action 'Reset'" in found[0][3] and "'Reboot'" in found[1][3] and "reset required" in found[2][3]
    xml = first_gpu(H100_XML, "<drain_and_reset_recommended>No", "<drain_and_reset_recommended>Yes")
    [found] = problems(judge(GPU_STATE, xml_facts(xml)))
    assert found[1:3] == (Status.FAIL, "reset_gpu") and "drain and reset recommended" in found[3]


def test_recovery_action_from_xml_of_r575_and_later():
    xml = first_gpu(H100_XML, "<gpu_reset_status>", "<gpu_recovery_action>Drain and Reset</gpu_recovery_action>\n<gpu_reset_status>")
    [found] = problems(judge(GPU_STATE, xml_facts(xml)))
    assert found[1:3] == (Status.FAIL, "reset_gpu") and "'Drain and Reset'" in found[3]


def test_power_cap_and_low_application_clock_warn_as_drift_site_policy_passes():
    answers = health_answers({6: {"nvmlDeviceGetPowerManagementLimit": 400000},
                                7: {"nvmlDeviceGetApplicationsClock(GRAPHICS)": 1110}})
    found = problems(judge(GPU_STATE, nvml_facts(answers)))
    assert [(s, a) for _, s, a, _ in found] == [(Status.WARN, "fix_config"), (Status.WARN, "fix_config")]
    assert "GPU 6 (0000:BA:00.0): power limit 400 W (expected the default 700 W: nvidia-smi -pl 700)" in found[0][3]
    assert "GPU 7 (0000:DB:00.0): applications clock 1110 MHz (expected the default 1755 MHz" in found[1][3]
    # the twin: every GPU of the run capped alike (a site's power policy), or a clock raised above default
    policy = health_answers({i: {"nvmlDeviceGetPowerManagementLimit": 500000,
                                   "nvmlDeviceGetApplicationsClock(GRAPHICS)": 1980} for i in range(8)})
    results = judge(GPU_STATE, nvml_facts(policy), nvml_facts(policy))
    assert [f.status for f in results] == [Status.PASS, Status.PASS]
    assert "power limit 500 W on the NVIDIA H100 80GB HBM3 GPUs (default 700 W)" in results[0].message


def test_one_node_capped_where_the_others_are_not_warns():
    capped = health_answers({i: {"nvmlDeviceGetPowerManagementLimit": 500000} for i in range(8)})
    results = judge(GPU_STATE, nvml_facts(health_answers()), nvml_facts(health_answers()), nvml_facts(capped))
    assert {(f.node, f.status) for f in results} == {("n1", Status.PASS), ("n2", Status.PASS), ("n3", Status.WARN)}


def test_realworld_style_blackwell_deprecated_clocks_are_not_judged():
    xml = first_gpu(H100_XML, "<graphics_clock>1755 MHz</graphics_clock>",
                    "<graphics_clock>Requested functionality has been deprecated</graphics_clock>")
    g = gpu_health.parse_health_xml(xml)["gpus"]["00000000:18:00.0"]
    assert g["apps_clock_mhz"] is None and re.search("deprecated", xml)


# --------------------------------------------------------------------------------------- nvlink_errors


def links(before, after, **other):
    """FieldValues answers: the recovery action plus NVLink counters (unsigned long long), read twice."""
    def one(c):
        return dict({"230": 0, "94": 0}, **{fid: {"ull": v} for fid, v in zip(("38", "45", "52", "59"), c)})
    return {"nvmlDeviceGetFieldValues": {"sequence": [one(before), one(after)]}, **other}


def test_nvlink_replay_or_crc_storm_isolates_a_few_crc_warn():
    from preflight.checks.nvlink_errors import rule as nvlink_errors_rule
    answers = health_answers({i: links((0, 0, 0, 0), (0, 0, 0, 0)) for i in range(8)})
    answers["devices"][1].update(links((5, 0, 7, 0), (5, 0, 9, 0)))      # 2 replays now
    answers["devices"][2].update(links((0, 0, 0, 0), (400, 20, 0, 0)))   # 420 CRC in the window
    answers["devices"][3].update(links((0, 0, 0, 0), (3, 0, 0, 0)))      # a few CRC
    found = problems(nvlink_errors_rule.rule(view_of(nvml_facts(answers, window_s=0.5))))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "isolate"), (Status.FAIL, "isolate"), (Status.WARN, None)]
    assert "GPU 1 (0000:2A:00.0): NVLink 2 replay errors in 0.5 s" in found[0][3]
    assert "GPU 2 (0000:3A:00.0): 420 NVLink CRC errors in 0.5 s" in found[1][3]


def test_nvlink_errors_since_boot_with_none_now_pass():
    from preflight.checks.nvlink_errors import rule as nvlink_errors_rule
    answers = health_answers({i: links((90000, 10, 3, 1), (90000, 10, 3, 1)) for i in range(8)})
    [finding] = nvlink_errors_rule.rule(view_of(nvml_facts(answers)))
    assert finding.status is Status.PASS and "8 GPUs: no NVLink replay" in finding.message
    assert "90014 NVLink errors since boot, none during the window" in finding.message


def test_nvlink_errors_not_judged_without_counters_or_on_nvidia_smi():
    from preflight.checks.nvlink_errors import rule as nvlink_errors_rule
    [pcie] = nvlink_errors_rule.rule(view_of(nvml_facts(health_answers())))  # no NVLink fields answered
    assert pcie.status is Status.SKIP and "no GPU reports NVLink error counters" in pcie.message
    [smi] = nvlink_errors_rule.rule(view_of(xml_facts(H100_XML)))
    assert smi.status is Status.SKIP and "nvidia-smi (one sample)" in smi.message


def view_of(*node_facts):
    nodes = [NodeInfo("n%d" % (i + 1), "198.18.0.%d" % (i + 1), len(f["gpus"])) for i, f in enumerate(node_facts)]
    return builders.view({n.name: {"gpu": f} for n, f in zip(nodes, node_facts)}, nodes=nodes)


# ------------------------------------------------------------------------------------------- gpu_pcie


def replays(before, after):
    return {"nvmlDeviceGetFieldValues": {"sequence": [{"230": 0, "94": before}, {"230": 0, "94": after}]}}


def test_pcie_replays_during_the_window_isolate_a_few_warn_old_ones_pass():
    from preflight.checks.gpu_pcie import rule as gpu_pcie_rule
    answers = health_answers({1: replays(10, 40), 2: replays(10, 11), 3: replays(5000, 5000)})
    found = problems(gpu_pcie_rule.rule(view_of(nvml_facts(answers, window_s=0.5))))
    assert [(s, a) for _, s, a, _ in found] == [(Status.FAIL, "isolate"), (Status.WARN, None)]
    assert "GPU 1 (0000:2A:00.0): 30 PCIe replays in 0.5 s (40 since boot" in found[0][3]
    [twin] = gpu_pcie_rule.rule(view_of(nvml_facts(health_answers({3: replays(5000, 5000)}))))
    assert twin.status is Status.PASS and "5000 PCIe replays since boot, none during the window" in twin.message


def test_pcie_generation_judged_under_load_only():
    from preflight.checks.gpu_pcie import rule as gpu_pcie_rule
    low = {"nvmlDeviceGetCurrPcieLinkGeneration": 3}
    busy = health_answers({2: dict(low, nvmlDeviceGetUtilizationRates={"gpu": 97, "memory": 60})})
    [found] = problems(gpu_pcie_rule.rule(view_of(nvml_facts(busy))))
    assert found[1] is Status.WARN and "GPU 2 (0000:3A:00.0): PCIe Gen3 while 97% busy (expected Gen5)" in found[3]
    idle = health_answers({2: low})  # the twin: an idle GPU downshifts its link
    [twin] = gpu_pcie_rule.rule(view_of(nvml_facts(idle)))
    assert twin.status is Status.PASS and "PCIe generation not judged at idle" in twin.message


# ---------------------------------------------------------------------------- fabric health (GB200/GB300)


def tray_view(facts, imex_channels=("channel0",)):
    node = NodeInfo("tray1", "198.18.0.1", len(facts["gpus"]))
    fm = {"nvswitches": [], "service": None, "service_error": None, "fm_version": None, "driver_version": "570.86.15",
          "imex": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}, "imex_error": None,
          "imex_channels": list(imex_channels)}
    return builders.view({"tray1": {"gpu": facts, "fabric_manager": fm}}, nodes=[node])


def gb200_answers(per_gpu=None, versions=(3, 2)):
    answers = health_answers()
    del answers["devices"][4:]
    for i, dev in enumerate(answers["devices"]):
        dev["nvmlDeviceGetName"] = "NVIDIA GB200"
        dev["nvmlDeviceGetGpuFabricInfo"] = {"state": 3, "status": 0, "cliqueId": 32766,
                                              "clusterUuid": "8f3e2d1c-4b5a-4c6d-9e8f-0a1b2c3d4e5f"}
        dev["nvmlDeviceGetGpuFabricInfoV"] = {"versions": list(versions), "state": 3, "healthMask": HEALTHY_MASK,
                                               "healthSummary": 1}
        dev["nvmlDeviceGetGpuFabricInfoV"].update((per_gpu or {}).get(i, {}))
    return answers


def test_fabric_health_mask_degraded_or_misconfigured_fails_healthy_tray_passes():
    from preflight.checks.fabric_manager import rule as fabric_manager_rule
    bad = gb200_answers({1: {"healthMask": HEALTHY_MASK & ~0x3 | 1, "healthSummary": 3},
                         2: {"healthMask": HEALTHY_MASK & ~0xF00 | 5 << 8}})
    facts = nvml_facts(bad)
    assert facts["health"]["gpus"]["00000000:2A:00.0"]["fabric_health"]["summary"] == "Limited Capacity"
    found = [(f.status, f.action, f.message) for f in fabric_manager_rule.rule(tray_view(facts)) if f.status is not Status.PASS]
    assert [(s, a) for s, a, _ in found] == [(Status.FAIL, "isolate"), (Status.FAIL, "fix_config")]
    assert "GPU 1 (0000:2A:00.0): NVLink fabric bandwidth degraded" in found[0][2]
    assert "NVLink fabric configuration incorrect: insufficient NVLinks" in found[1][2]
    # the twin: a driver that only knows v2 (no summary) on a healthy tray
    good = [f.status for f in fabric_manager_rule.rule(tray_view(nvml_facts(gb200_answers(versions=(2,)))))]
    assert good == [Status.PASS]


def test_mnnvl_tray_without_an_imex_channel_fails():
    from preflight.checks.fabric_manager import rule as fabric_manager_rule
    found = [f for f in fabric_manager_rule.rule(tray_view(nvml_facts(gb200_answers()), imex_channels=()))
             if f.status is Status.FAIL]
    assert len(found) == 1 and "no IMEX channel under /dev/nvidia-caps-imex-channels" in found[0].message

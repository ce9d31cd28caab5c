"""Real captures (../shared/realworld, beside the checkout) through the GPU-side parsers and the gpu rule.

Each capture must parse without raising, its facts must agree with what the capture says (GPU count,
driver version, product names, link counts, versions), and the gpu rule must not warn on a healthy
capture: every non-PASS finding must be one the capture's own state explains (listed in EXPLAINED with
the reason). The captures are public data and are not committed here; when the folder is absent every
test here skips with the reason (PREFLIGHT_REALWORLD=DIR points elsewhere).

Run ``python -m tests.realworld.test_gpu`` for the counts (captures, parsed, agreeing, judged quiet).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Dict, List, Tuple

import pytest

from preflight import checks
from preflight.checks.driver import probe as driver_probe
from preflight.checks.fabric_manager import probe as fabric_manager_probe
from preflight.checks.gpu import rule as gpu_rule
from preflight.checks.nvls import rule as nvls_rule
from preflight.model import NodeInfo, Status
from preflight.probe import gpu_facts, gpu_health, nvidia_smi
from tests.paths import REPO
from tests import builders

REAL = os.environ.get("PREFLIGHT_REALWORLD") or os.path.normpath(os.path.join(REPO, "..", "shared", "realworld"))
HAVE = os.path.isdir(REAL)
pytestmark = pytest.mark.skipif(not HAVE, reason="no real captures at %s (they sit beside the checkout in CI)" % REAL)


def _files(folder: str, pattern: str = "*") -> List[str]:
    return sorted(glob.glob(os.path.join(REAL, folder, pattern))) if HAVE else []


def _read(path: str) -> str:
    with open(path, errors="replace") as fh:
        return fh.read()


def _tag(text: str, tag: str) -> List[str]:
    return re.findall(r"<%s>([^<]*)</%s>" % (tag, tag), text)


# ------------------------------------------------------------------------------------ per-capture checks
# Each returns a list of disagreements (empty: the facts agree with the capture); a raise is a parse failure.


def check_xml(path: str) -> List[str]:
    text = _read(path)
    facts = nvidia_smi.parse_nvidia_smi_xml(text)
    bad = []
    if len(facts["gpus"]) != len(re.findall(r"<gpu id=", text)):
        bad.append("gpus %d != <gpu> elements %d" % (len(facts["gpus"]), len(re.findall(r"<gpu id=", text))))
    if facts["attached_gpus"] != int(_tag(text, "attached_gpus")[0]):
        bad.append("attached_gpus")
    if facts["driver_version"] != _tag(text, "driver_version")[0]:
        bad.append("driver_version")
    if [g["name"] for g in facts["gpus"]] != _tag(text, "product_name"):
        bad.append("product names")
    if [g["uuid"] for g in facts["gpus"]] != _tag(text, "uuid")[: len(facts["gpus"])]:
        bad.append("uuids")
    # the re-read parser (nvidia-smi -q -x -d PERFORMANCE) reads the same reasons as the full parser
    by_bus = nvidia_smi.clock_events_by_bus(text)
    if by_bus != {g["pci_bus_id"]: g["clock_events"] for g in facts["gpus"]}:
        bad.append("clock_events_by_bus disagrees with parse_nvidia_smi_xml")
    header = driver_probe.parse_smi_header(text)
    if header[0] != facts["driver_version"]:
        bad.append("driver_probe.parse_smi_header disagrees on the driver version")
    mig = _tag(text, "current_mig")
    if mig and mig[0] in ("Enabled", "Disabled"):
        if facts["gpus"][0].get("mig_enabled") != (mig[0] == "Enabled"):
            bad.append("mig_enabled %r but the capture says %s" % (facts["gpus"][0].get("mig_enabled"), mig[0]))
    return bad


def check_nvlink(path: str) -> List[str]:
    text = _read(path)
    parsed = nvidia_smi.parse_nvlink_status(text)
    bad = []
    heads = re.findall(r"^GPU \d+: .* \(UUID: (GPU-[0-9a-f-]+)\)", text, re.M)
    if sorted(parsed) != sorted(heads):
        bad.append("GPUs %s != %s" % (sorted(parsed), sorted(heads)))
    active = len(re.findall(r"Link \d+: [\d.]+ GB/s", text))
    inactive = len(re.findall(r"Link \d+: <inactive>", text))
    got_a = sum((c or {}).get("active", 0) for c in parsed.values())
    got_i = sum((c or {}).get("inactive", 0) for c in parsed.values())
    if (got_a, got_i) != (active, inactive):
        bad.append("links active/inactive %d/%d != %d/%d" % (got_a, got_i, active, inactive))
    # The model's NVLink count (gpu_rule.MODEL_NVLINKS, from NVIDIA's datasheets) against a real machine's.
    for name, uuid in re.findall(r"^GPU \d+: (.*) \(UUID: (GPU-[0-9a-f-]+)\)$", text, re.M):
        model, links = gpu_rule.model_nvlinks(name), parsed.get(uuid)
        if model is not None and links is not None and links["active"] + links["inactive"] != model:
            bad.append("%s: %d links in the capture, model table says %d" % (name, links["active"] + links["inactive"], model))
    return bad


def judge_nvlink(path: str) -> List[Any]:
    """The gpu rule on a node whose only facts are the capture's GPUs and their links."""
    text = _read(path)
    links = nvidia_smi.parse_nvlink_status(text)
    gpus = []
    for index, (name, uuid) in enumerate(re.findall(r"^GPU \d+: (.*) \(UUID: (GPU-[0-9a-f-]+)\)$", text, re.M)):
        g = gpu_facts.empty_gpu(index)
        g.update({"name": name, "uuid": uuid, "pci_bus_id": "00000000:%02X:00.0" % (index + 1), "nvlink": links[uuid]})
        gpus.append(g)
    facts = {"source": "nvidia-smi", "error": None, "nvml_error": None, "driver_version": None, "cuda_version": None,
             "attached_gpus": len(gpus), "gpus": gpus, "nvlink_unreadable": []}
    node = NodeInfo("node01", "198.18.0.1", max(1, len(gpus)))
    view = builders.view({"node01": {"gpu": facts, "ssh": {"shm_bytes": 16 << 30}}}, nodes=[node])
    return [f for f in gpu_rule.rule(view) if f.status != Status.PASS]


def check_fm_version(path: str) -> List[str]:
    text = _read(path)
    want = re.search(r"(\d+\.\d+\.\d+)", text).group(1)
    got = fabric_manager_probe.parse_fm_version(text)
    return [] if got == want else ["%s != %s" % (got, want)]


def check_proc_version(path: str) -> List[str]:
    text = _read(path)
    want = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text).group(1)
    got = driver_probe.parse_proc_version(text)
    return [] if got == want else ["%s != %s" % (got, want)]


def check_torch(path: str) -> List[str]:
    text = _read(path)
    got = driver_probe.parse_torch_version_py(text)
    want = os.path.basename(path).split("_")[0][len("torch-"):]
    return [] if got["version"] == want else ["%s != %s" % (got["version"], want)]


def check_ldconfig(path: str) -> List[str]:
    text = _read(path)
    got = driver_probe.parse_ldconfig(text)
    want = int(re.match(r"(\d+) libs found", text).group(1))
    return [] if len(got) == want else ["%d entries != %d in the header" % (len(got), want)]


def check_systemctl(stem: str) -> List[str]:
    """A systemctl capture as the fabric_manager probe sees it (stdout, stderr, rc)."""
    out, err = _read(stem + ".stdout"), _read(stem + ".stderr")
    rc = int(_read(stem + ".rc").strip())
    if rc == 0:
        fabric_manager_probe.parse_systemctl_show(out)
        return []
    why = fabric_manager_probe.service_error(out, err, rc)
    bad = []
    if "\n" in why or "\r" in why:
        bad.append("service_error carries a raw line break: %r" % why)
    if not why:
        bad.append("no reason")
    return bad


def _systemctl_stems() -> List[str]:
    return sorted({p.rsplit(".", 1)[0] for p in _files("systemctl_show")})


CASES: List[Tuple[str, Any, str]] = (
    [("nvidia_smi_xml", check_xml, p) for p in _files("nvidia_smi_xml", "*.xml")]
    + [("nvidia_smi_nvlink", check_nvlink, p) for p in _files("nvidia_smi_nvlink")]
    + [("fm_version", check_fm_version, p) for p in _files("fm_version")]
    + [("proc_driver_version", check_proc_version, p) for p in _files("proc_driver_version")]
    + [("torch_version_py", check_torch, p) for p in _files("torch_version_py")]
    + [("ldconfig", check_ldconfig, p) for p in _files("ldconfig")]
    + [("systemctl_show", check_systemctl, s) for s in _systemctl_stems()]
)


def _id(case: Tuple[str, Any, str]) -> str:
    return "%s/%s" % (case[0], os.path.basename(case[2]))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_capture_parses_and_agrees(case):
    _folder, check, path = case
    assert check(path) == []


# -------------------------------------------------------------------------------------- the rule, quiet

#: capture -> substrings of the non-PASS findings its own state explains (anything else is a false alarm).
EXPLAINED: Dict[str, List[str]] = {
    # MIG on (the capture says so); volatile ECC then reads N/A, which the rule must say it cannot judge.
    "netdata_a100-sxm4-mig.xml": ["MIG", "volatile ECC"],
    "telegraf_a100-sxm4-v12.xml": ["MIG", "volatile ECC", "visible"],  # attached_gpus 4, one <gpu> listed
    # Captured while a workload ran (llama-server, python, a browser): gpu_state names each process holding
    # GPU memory, which is what it is for (a node so held before a job is not free). Not a false alarm.
    "telegraf_dual_a5000-v13.xml": ["of GPU memory: pid 100477 /root/src/llama.cpp/build/bin/llama-server"],
    "telegraf_pro-6000-maxq-blackwell-v13.xml": ["of GPU memory: pid 116860 /root/src/llama.cpp/build/bin/llama-server"],
    "telegraf_rtx-4000-sff-ada-v13.xml": ["of GPU memory: pid 4937 python (160 MiB), pid 34626 /usr/lib/chromium"],
    "telegraf_tesla-t4.xml": ["of GPU memory: pid 5762 python (1005 MiB)"],
}


def judge_xml(path: str) -> List[Any]:
    """The gpu rule and the rules judging its health facts (gpu_memory, gpu_state, gpu_pcie) on one capture."""
    facts = nvidia_smi.parse_nvidia_smi_xml(_read(path))
    facts["nvml_error"] = None
    facts["health"] = gpu_health.parse_health_xml(_read(path))
    if gpu_facts.guest_mode(facts):  # as the probe marks a node whose driver runs in a VM
        facts["virtual"] = gpu_facts.guest_mode(facts)
    node = NodeInfo("node01", "198.18.0.1", max(1, len(facts["gpus"])))
    view = builders.view({"node01": {"gpu": facts, "ssh": {"shm_bytes": 16 << 30}}}, nodes=[node])
    return [f for check in map(checks.get, ("gpu", "gpu_memory", "gpu_state", "gpu_pcie")) for f in check.rule(view) if f.status != Status.PASS]


XMLS = _files("nvidia_smi_xml", "*.xml")


@pytest.mark.parametrize("path", XMLS, ids=[os.path.basename(p) for p in XMLS])
def test_rule_is_quiet_on_a_healthy_capture(path):
    allowed = EXPLAINED.get(os.path.basename(path), [])
    unexplained = [f.message for f in judge_xml(path) if not any(a in f.message for a in allowed)]
    assert unexplained == []


def test_the_driver_says_which_captures_come_from_a_vm():
    """Issue 40.9: the GPU virtualization mode is the VM signal a node's DMI may not give. Pass-Through on the
    VM captures (netdata's A100-SXM4 VM with MIG, telegraf's AWS A10G and T4), VGPU on the P4 guest, none on
    bare metal (telegraf's A100-SXM4 and dual-GPU workstations)."""
    modes = {os.path.basename(p): gpu_facts.guest_mode(nvidia_smi.parse_nvidia_smi_xml(_read(p))) for p in XMLS}
    assert modes["netdata_a100-sxm4-mig.xml"] == "GPU virtualization mode Pass-Through"
    assert modes["telegraf_a10g.xml"] == modes["telegraf_tesla-t4.xml"] == "GPU virtualization mode Pass-Through"
    assert modes["telegraf_tesla_p4.xml"] == "GPU virtualization mode VGPU"
    assert modes["telegraf_a100-sxm4-v12.xml"] is None and modes["telegraf_dual_a5000-v13.xml"] is None
    assert sum(1 for m in modes.values() if m) == 7, modes


#: fabric_manager facts of an HGX baseboard (4 NVSwitch PCI functions, the service active) and of a machine
#: without NVSwitch: a capture says nothing about the sysfs beside it, so nvls is judged under both.
SWITCHED = {"nvswitches": ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"],
            "service": {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}, "service_error": None,
            "imex": None, "imex_error": "systemctl not found"}
NO_SWITCH = {"nvswitches": [], "service": None, "service_error": None, "imex": None, "imex_error": "systemctl not found"}


def judge_nvls(facts: Dict[str, Any], fabric: Dict[str, Any], nccl: str = "2.29.2") -> List[Any]:
    node = NodeInfo("node01", "198.18.0.1", max(1, len(facts["gpus"])))
    driver_facts = {"nccl_system": [{"soname": "libnccl.so.2", "path": "/usr/lib/libnccl.so." + nccl, "version": nccl}]}
    node_facts = {"gpu": facts, "fabric_manager": dict(fabric, driver_version=facts.get("driver_version")),
                  "driver": driver_facts}
    return nvls_rule.rule(builders.view({"node01": node_facts}, nodes=[node]))


@pytest.mark.parametrize("path", XMLS, ids=[os.path.basename(p) for p in XMLS])
def test_nvls_is_quiet_on_every_capture_with_or_without_nvswitches(path):
    """No capture is an NVLS-capable NVSwitch node (consumer, PCIe, A100 parts): not applicable, never a WARN."""
    facts = nvidia_smi.parse_nvidia_smi_xml(_read(path))
    for fabric in (NO_SWITCH, SWITCHED):
        found = [(f.status, f.message) for f in judge_nvls(facts, fabric)]
        assert [s for s, _ in found] == [Status.SKIP], found


def test_nvls_passes_the_hgx_h100_capture_whose_fabric_is_completed():
    """gpud's 8x H100 `nvidia-smi -q` (R535): every GPU's Fabric State Completed, Status Success. preflight reads
    XML or NVML, not this text: the product name, driver and fabric lines are taken out here as the XML holds them."""
    text = _read(os.path.join(REAL, "nvidia_smi_q_d", "gpud_h100x8_535.161.08_full-q.txt"))
    names = re.findall(r"^    Product Name\s+: (.+)$", text, re.M)
    fabric = re.findall(r"^    Fabric\n\s+State\s+: (.+)\n\s+Status\s+: (.+)$", text, re.M)
    assert len(names) == len(fabric) == 8
    gpus = [dict(gpu_facts.empty_gpu(i), name=n, pci_bus_id="00000000:%02X:00.0" % (0x18 + i), mig_enabled=False,
                 fabric={"state": st, "status": ss, "clique_id": 0, "cluster_uuid": None})
            for i, (n, (st, ss)) in enumerate(zip(names, fabric))]
    facts = {"source": "nvidia-smi", "error": None, "driver_version": re.search(r"Driver Version\s+: (\S+)", text).group(1),
             "cuda_version": None, "attached_gpus": 8, "gpus": gpus}
    found = [(f.status, f.message) for f in judge_nvls(facts, SWITCHED)]
    assert found == [(Status.PASS, "NVLS prerequisites met on 8 GPUs: 4 NVSwitches, every GPU's NVLink fabric Completed; "
                                   "NCCL 2.29.2 uses it (NCCL_NVLS_ENABLE unset (2: when CUDA reports multicast))")]
    found = [(f.status, f.message) for f in judge_nvls(facts, dict(SWITCHED, service=dict(SWITCHED["service"], ActiveState="failed")))]
    assert found[0][0] is Status.WARN and "nvidia-fabricmanager failed" in found[0][1]


NVLINKS = [p for p in _files("nvidia_smi_nvlink") if os.path.getsize(p)]


@pytest.mark.parametrize("path", NVLINKS, ids=[os.path.basename(p) for p in NVLINKS])
def test_rule_is_quiet_on_healthy_nvlink_capture(path):
    assert [f.message for f in judge_nvlink(path)] == []


def counts() -> Dict[str, int]:
    out = {"captures": len(CASES), "parsed": 0, "agreeing": 0, "xml_judged": len(XMLS), "xml_quiet": 0}
    for _folder, check, path in CASES:
        try:
            bad = check(path)
        except Exception:
            continue
        out["parsed"] += 1
        out["agreeing"] += not bad
    for path in XMLS:
        allowed = EXPLAINED.get(os.path.basename(path), [])
        try:
            noisy = [f for f in judge_xml(path) if not any(a in f.message for a in allowed)]
        except Exception:
            continue
        out["xml_quiet"] += not noisy
    return out


if __name__ == "__main__":
    print(counts())

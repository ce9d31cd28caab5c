"""nvls check and NCCL_NVLS_ENABLE in the env file: node facts from real-format fixtures (gpu facts parsed from
recorded nvidia-smi XML, systemctl show outputs of nvidia-fabricmanager / nvidia-imex, nccl.conf text through
nccl_env's parser), the faulty case and each healthy-but-unusual twin. NVLS never drains: no FAIL anywhere."""

from __future__ import annotations

import copy
import os

import pytest

from preflight.checks.nccl_env import probe as nccl_env_probe
from preflight.checks.nvls import rule as check_rule
from preflight.model import NodeInfo, Status
from preflight.derived import ncclenv
from preflight.output import envfile
from tests.builders import gpu_expected
from tests.fixture_cases import fixture_dir, meta
from tests import builders

FM = fixture_dir("fabric_manager")
SWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]


def unit(case):
    """systemctl show's properties for a recorded case (tests/fixtures/fabric_manager/<case>.txt)."""
    return copy.deepcopy(meta(os.path.join(FM, case + ".txt"))["expected"])


def fm_facts(service="systemctl_show_active", switches=SWITCHES, imex=None, channels=None, driver="550.54.15"):
    facts = {"nvswitches": list(switches), "service": unit(service) if service else None,
             "service_error": None if service else "systemctl not found", "fm_version": driver if service else None,
             "driver_version": driver, "imex": unit(imex) if imex else None,
             "imex_error": None if imex else "systemctl not found"}
    if channels is not None:
        facts["imex_channels"] = channels
    return facts


def driver_facts(nccl):
    if nccl is None:
        return {"nccl_system": [], "nccl_python": None}
    return {"nccl_system": [{"soname": "libnccl.so.2", "path": "/usr/lib/x86_64-linux-gnu/libnccl.so.%s" % nccl,
                             "version": nccl}], "nccl_python": None}


def env_facts(conf="", environ=None):
    """nccl_env facts with /etc/nccl.conf holding `conf` (nccl_env's parser reads it as NCCL does)."""
    system = dict(nccl_env_probe.parse_nccl_conf(conf), path="/etc/nccl.conf", role="system", exists=bool(conf), error=None)
    return {"environ": dict(environ or {}), "user": "root", "home": "/root", "home_env": "/root", "files": [system]}


def node_facts(gpu="h100_hgx_550", fm=None, nccl="2.29.2", conf="", environ=None, edit=None):
    gpus = gpu_expected(gpu)
    if edit:
        edit(gpus)
    return {"gpu": gpus, "fabric_manager": fm if fm is not None else fm_facts(), "driver": driver_facts(nccl),
            "nccl_env": env_facts(conf, environ)}


def judge(facts, gpus_per_node=8):
    view = builders.view({"n001": facts}, gpus=gpus_per_node)
    return [(f.status, f.message, f.action) for f in check_rule.rule(view)]


def one(facts, gpus_per_node=8):
    found = judge(facts, gpus_per_node)
    assert len(found) == 1, found
    assert found[0][0] is not Status.FAIL  # NVLS is a performance feature: never a drain
    return found[0]


# ------------------------------------------------------------------------------------------ HGX H100


def test_hgx_h100_with_its_fabric_programmed_passes():
    status, msg, _ = one(node_facts())
    assert status is Status.PASS
    assert msg == ("NVLS prerequisites met on 8 GPUs: 4 NVSwitches, every GPU's NVLink fabric Completed; NCCL 2.29.2 "
                   "uses it (NCCL_NVLS_ENABLE unset (2: when CUDA reports multicast))")


@pytest.mark.parametrize("nccl,then", [
    ("2.29.2", "NCCL 2.29.2 fails the communicator's init instead of falling back when its multicast setup fails"),
    ("2.28.9", "NCCL 2.28.9 falls back without NVLS (slower collectives); NCCL 2.29 and later fail at init on this"),
    (None, "NCCL's version is unknown here: NCCL 2.29 and later fail at init on this"),
])
def test_fabric_manager_down_makes_nvls_a_config_warning_never_a_drain(nccl, then):
    facts = node_facts(gpu="h100_fabric_in_progress", fm=fm_facts("systemctl_show_failed"), nccl=nccl)
    status, msg, action = one(facts)
    assert (status, action) == (Status.WARN, "fix_config")
    assert msg.startswith("NVLS (NVLink SHARP) cannot work on this node (4 NVSwitches): NVLink fabric not Completed "
                          "(GPU 0 In Progress, GPU 1 In Progress")
    assert "; nvidia-fabricmanager failed; " in msg and then in msg
    assert msg.endswith("Set NCCL_NVLS_ENABLE=0 (the recommended env file does) or fix the fabric (see fabric_manager)")


def test_forced_nvls_on_a_broken_fabric_fails_init_with_any_nccl():
    facts = node_facts(gpu="h100_fabric_in_progress", fm=fm_facts("systemctl_show_failed"), nccl="2.21.5",
                       conf="# site\nNCCL_NVLS_ENABLE=1\n")
    status, msg, _ = one(facts)
    assert status is Status.WARN and "NCCL_NVLS_ENABLE=1 (/etc/nccl.conf:2) forces NVLS: NCCL fails at init" in msg


def test_nvls_turned_off_on_the_node_is_not_applicable():
    facts = node_facts(gpu="h100_fabric_in_progress", fm=fm_facts("systemctl_show_failed"),
                       environ={"NCCL_NVLS_ENABLE": "0"})
    assert one(facts)[:2] == (Status.SKIP, "not applicable: NCCL_NVLS_ENABLE=0 (environment): NCCL does not use NVLS")


def test_container_without_systemctl_is_judged_by_the_gpus_fabric_state():
    assert one(node_facts(fm=fm_facts(service=None)))[0] is Status.PASS


def test_unreadable_service_and_no_gpu_fabric_state_is_not_judged_not_passed():
    def no_fabric(g):
        for gpu in g["gpus"]:
            gpu["fabric"] = None
    status, msg, _ = one(node_facts(fm=fm_facts(service=None), edit=no_fabric))
    assert (status, msg) == (Status.SKIP, "NVLS not judged (4 NVSwitches): nvidia-fabricmanager state unreadable "
                                          "(systemctl not found) and no GPU fabric state")


def test_driver_before_r530_has_no_multicast():
    def old(g):
        g["driver_version"] = "525.147.05"
        for gpu in g["gpus"]:
            gpu["fabric"] = None
    status, msg, _ = one(node_facts(fm=fm_facts(driver="525.147.05"), edit=old))
    assert status is Status.SKIP and "driver 525.147.05 predates CUDA multicast (R530)" in msg


def test_driver_version_unknown_is_not_judged():
    facts = node_facts(fm=fm_facts(driver=None), edit=lambda g: g.update(driver_version=None))
    assert one(facts)[:2] == (Status.SKIP, "NVLS not judged (4 NVSwitches): driver version unknown")


def test_nccl_before_2_17_has_no_nvls():
    assert one(node_facts(nccl="2.16.5"))[:2] == (Status.SKIP, "not applicable: NCCL 2.16.5 predates NVLS (2.17)")


# --------------------------------------------------------------------------- healthy-but-unusual twins


def test_pcie_h100_is_not_applicable_and_forcing_nvls_there_warns():
    def pcie(g):
        for gpu in g["gpus"]:
            gpu["name"], gpu["fabric"] = "NVIDIA H100 PCIe", None
    fm = fm_facts(service=None, switches=[])
    status, msg, _ = one(node_facts(fm=fm, edit=pcie))
    assert (status, msg) == (Status.SKIP, "not applicable: no NVSwitch fabric (PCIe or NVLink-bridge GPUs, or a VM "
                                          "without NVLink): NCCL has no NVLS here")
    status, msg, action = one(node_facts(fm=fm, edit=pcie, conf="NCCL_NVLS_ENABLE=1\n"))
    assert (status, action) == (Status.WARN, "fix_config")
    assert msg.startswith("NCCL_NVLS_ENABLE=1 (/etc/nccl.conf:1) forces NVLS where there is none (no NVSwitch fabric")


def test_hgx_a100_has_no_nvlink_sharp():
    status, msg, _ = one(node_facts(gpu="a100_hgx_535", fm=fm_facts(driver="535.129.03")))
    assert status is Status.SKIP
    assert msg == ("not applicable: NVIDIA A100-SXM4-80GB on 4 NVSwitches: NVLink SHARP needs a third-generation "
                   "NVSwitch (Hopper or later)")


def test_partial_gpu_vm_without_nvlink_and_a_one_gpu_vm_are_not_applicable():
    def vm(keep):
        def edit(g):
            g["gpus"] = g["gpus"][:keep]
            g["attached_gpus"] = keep
            g["virtual"] = "kvm"
            for gpu in g["gpus"]:
                gpu["fabric"], gpu["nvlink"] = None, {"active": 0, "inactive": 0}
        return edit
    fm = fm_facts(service=None, switches=[])
    assert one(node_facts(fm=fm, edit=vm(2)), gpus_per_node=2)[0] is Status.SKIP
    status, msg, _ = one(node_facts(fm=fm_facts(service=None, switches=[]), edit=lambda g: g.update(gpus=g["gpus"][:1])),
                         gpus_per_node=1)
    assert (status, msg) == (Status.SKIP, "not applicable: 1 GPU: NCCL uses NVLS only with 2 or more GPUs on a node")


def test_vm_with_a_shared_nvswitch_partition_passes_on_its_fabric_state():
    status, msg, _ = one(node_facts(fm=fm_facts(service=None, switches=[]),
                                    edit=lambda g: g.update(gpus=g["gpus"][:4], virtual="kvm")), gpus_per_node=4)
    assert status is Status.PASS and "NVLink fabric managed outside this OS" in msg


def test_mig_is_not_applicable():
    def mig(g):
        for gpu in g["gpus"]:
            gpu["mig_enabled"] = True
    assert one(node_facts(edit=mig))[:2] == (Status.SKIP, "not applicable: MIG enabled: MIG instances have no GPU-to-GPU NVLink (MIG user guide), so NCCL has no NVLS")


# ---------------------------------------------------------------------------------- GB200 NVL72 trays


def tray(imex="imex_systemctl_show_active", channels=("channel0",), gpu="gb200_tray_570"):
    return node_facts(gpu=gpu, fm=fm_facts(service=None, switches=[], imex=imex, driver="570.133.20",
                                           channels=list(channels)))


def test_gb200_tray_with_imex_and_its_channel_passes():
    status, msg, _ = one(tray(), gpus_per_node=4)
    assert status is Status.PASS
    assert "multi-node NVLink fabric (cluster 8f3e2d1c-4b5a-4c6d-9e8f-0a1b2c3d4e5f)" in msg


@pytest.mark.parametrize("facts,unmet", [
    (dict(imex="imex_systemctl_show_not_found"), "nvidia-imex not installed"),
    (dict(channels=()), "no IMEX channel under /dev/nvidia-caps-imex-channels"),
    (dict(gpu="gb200_tray_fabric_in_progress"), "NVLink fabric not Completed"),
])
def test_gb200_tray_without_imex_or_fabric_warns(facts, unmet):
    status, msg, action = one(tray(**facts), gpus_per_node=4)
    assert (status, action) == (Status.WARN, "fix_config") and unmet in msg


def test_gb200_tray_whose_imex_state_is_unreadable_is_not_judged():
    status, msg, _ = one(tray(imex=None), gpus_per_node=4)
    assert status is Status.SKIP and msg.endswith("nvidia-imex state unreadable (systemctl not found)")


# ------------------------------------------------------------------------------------------ no facts


def test_cpu_node_skips_and_missing_facts_are_an_error_to_retest():
    view = builders.view({"c": {}, "g": {"gpu": {"probe_error": "boom"}, "fabric_manager": fm_facts()}},
                         nodes=[NodeInfo("c", "c", 0), NodeInfo("g", "g", 8)])
    found = [(f.node, f.status, f.action) for f in check_rule.rule(view)]
    assert found == [("c", Status.SKIP, None), ("g", Status.ERROR, "retest")]


# ------------------------------------------------------------------------------------------ env file


def env_view(states):
    """Nodes whose facts also carry what the env file needs for the data network (nic) and the rendezvous."""

    base = builders.env_view(n=len(states))
    for name, facts in zip(sorted(base.facts), states):
        base.facts[name].update(facts)
    return base


def test_env_file_turns_nvls_off_while_a_node_cannot_use_it(tmp_path):
    broken = node_facts(gpu="h100_fabric_in_progress", fm=fm_facts("systemctl_show_failed"))
    view = env_view([node_facts(), broken, node_facts()])
    derived = ncclenv.derive(view)
    var = [v for v in derived.variables if v.key == "NCCL_NVLS_ENABLE"]
    assert len(var) == 1 and var[0].value == "0" and not var[0].default
    assert var[0].why[0].startswith("nvls check: NVLS (NVLink SHARP) cannot work on n002: NVLink fabric not Completed")
    assert "NCCL 2.29.2: from 2.29 a failed NVLS multicast bind fails the job's init" in var[0].why[1]
    assert var[0].why[2] == ("this also turns NVLS off on n[001,003], where it works: fix the fabric on n002 "
                             "(fabric_manager) to get it back")
    from tests.derived.test_envfile import check_sources_cleanly, report

    text = envfile.render(report(view, env=derived))
    assert "\nexport NCCL_NVLS_ENABLE='0'\n" in text
    check_sources_cleanly(text, tmp_path)


def test_env_file_leaves_nvls_to_nccl_where_it_works_or_does_not_apply():
    def pcie(g):
        for gpu in g["gpus"]:
            gpu["name"], gpu["fabric"] = "NVIDIA H100 PCIe", None
    view = env_view([node_facts(), node_facts(fm=fm_facts(service=None, switches=[]), edit=pcie)])
    assert "NCCL_NVLS_ENABLE" not in ncclenv.derive(view).as_dict()

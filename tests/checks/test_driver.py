"""driver check: version parsers over recorded fixtures, the probe against fake executables, the drift rule."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from preflight.checks.driver import probe as driver_probe
from preflight.checks.driver import rule as driver_rule
from preflight.model import NodeInfo, Status
from preflight.derived import versions
from preflight.probe.context import NodeContext
from tests.fixture_cases import fixture_dir, read
from tests import builders

FIX = fixture_dir("driver")
GPU_FIX = fixture_dir("gpu")




# ---------------------------------------------------------------------------------------------- parsers


# parse_* cases: tests/fixtures/driver/*.json, run by tests/checks/test_fixtures.py


@pytest.mark.parametrize(
    "path,version",
    [
        ("/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5", "2.21.5"),
        ("/opt/nccl/lib/libnccl.so.2", None),
        ("/usr/lib/x86_64-linux-gnu/libnccl.so", None),
    ],
)
def test_nccl_version_from_filename(path, version):
    assert driver_probe.nccl_version_from_filename(path) == version


# ------------------------------------------------------------------------------------------------ probe


def write_exe(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o755)


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    """A node: fake nvidia-smi and ldconfig on PATH, an NCCL library, a torch and an nvidia-nccl-cu12 on sys.path."""
    import pynvml

    def refuse():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", refuse)
    monkeypatch.delenv("PREFLIGHT_NVML", raising=False)
    bindir, libdir, site = tmp_path / "bin", tmp_path / "lib", tmp_path / "site"
    for d in (bindir, libdir, site / "torch", site / "nvidia_nccl_cu12-2.20.5.dist-info"):
        d.mkdir(parents=True)
    (libdir / "libnccl.so.2.21.5").write_text("")
    os.symlink("libnccl.so.2.21.5", str(libdir / "libnccl.so.2"))
    os.symlink("libnccl.so.2", str(libdir / "libnccl.so"))
    listing = read(os.path.join(FIX, "ldconfig_nccl_apt.txt")).replace("/lib/x86_64-linux-gnu/libnccl", str(libdir / "libnccl"))
    (tmp_path / "ldconfig.txt").write_text(listing)
    write_exe(str(bindir / "ldconfig"), '#!/bin/sh\n[ "$1" = -p ] && cat "%s"\n' % (tmp_path / "ldconfig.txt"))
    write_exe(
        str(bindir / "nvidia-smi"),
        '#!/bin/sh\n[ "$*" = "-q -x" ] && exec cat "%s"\nexit 2\n' % os.path.join(GPU_FIX, "h100_hgx_550.xml"),
    )
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text(read(os.path.join(FIX, "torch_version_2.3.0_cu121.py")))
    (site / "nvidia_nccl_cu12-2.20.5.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: 2.20.5\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bindir)
    return tmp_path


def test_probe_reads_all_versions_without_importing_torch(node_env):
    facts = driver_probe.probe(NodeContext(sysfs_root=str(node_env / "sys")))
    assert "torch" not in sys.modules
    assert facts["driver_version"] == "550.54.15" and facts["driver_source"] == "nvidia-smi"
    assert facts["cuda_version"] == "12.4"
    assert facts["nccl_system"] == [
        {"soname": "libnccl.so.2", "path": str(node_env / "lib" / "libnccl.so.2.21.5"), "version": "2.21.5"},
        {"soname": "libnccl.so", "path": str(node_env / "lib" / "libnccl.so.2.21.5"), "version": "2.21.5"},
    ]
    assert facts["nccl_python"] == {"distribution": "nvidia-nccl-cu12", "version": "2.20.5"}
    assert facts["torch"] == {"version": "2.3.0+cu121", "cuda": "12.1", "path": str(node_env / "site" / "torch")}
    assert versions.nccl_version(facts) == "2.20.5"  # the wheel's NCCL is the one torch loads
    json.dumps(facts)


def test_probe_falls_back_to_sysfs_then_proc(node_env, monkeypatch):
    os.unlink(str(node_env / "bin" / "nvidia-smi"))
    sysroot = node_env / "sys"
    (sysroot / "module" / "nvidia").mkdir(parents=True)
    (sysroot / "module" / "nvidia" / "version").write_text("535.129.03\n")
    facts = driver_probe.probe(NodeContext(sysfs_root=str(sysroot)))
    assert (facts["driver_version"], facts["driver_source"], facts["cuda_version"]) == ("535.129.03", "sysfs", None)
    os.unlink(str(sysroot / "module" / "nvidia" / "version"))
    monkeypatch.setattr(driver_probe, "PROC_VERSION", os.path.join(FIX, "proc_version_550_open.txt"))
    facts = driver_probe.probe(NodeContext(sysfs_root=str(sysroot)))
    assert (facts["driver_version"], facts["driver_source"]) == ("550.54.15", "proc")


def test_probe_on_a_node_without_driver_nccl_or_torch(tmp_path, monkeypatch):
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(12)))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(driver_probe, "PROC_VERSION", str(tmp_path / "absent"))
    monkeypatch.setattr(driver_probe, "LDCONFIG_CANDIDATES", ("ldconfig",))
    monkeypatch.setattr(driver_probe, "_torch", lambda: None)
    facts = driver_probe.probe(NodeContext(sysfs_root=str(tmp_path)))
    assert facts["driver_version"] is None and facts["nccl_system"] == [] and facts["torch"] is None


def test_probe_reads_the_real_torch_of_this_python():
    from importlib import metadata

    try:
        want = metadata.version("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("torch not installed here")
    assert driver_probe._torch()["version"] == want


# ------------------------------------------------------------------------------------------------- rule


def facts(drv="550.54.15", cuda="12.4", nccl="2.21.5", torch="2.3.0+cu121", torch_cuda="12.1"):
    return {
        "driver_version": drv,
        "driver_source": "nvml" if drv else None,
        "cuda_version": cuda,
        "nccl_system": [],
        "nccl_python": {"distribution": "nvidia-nccl-cu12", "version": nccl} if nccl else None,
        "torch": {"version": torch, "cuda": torch_cuda, "path": "/x/torch"} if torch else None,
    }


def view(per_node, gpus=None, expect=None):
    gpus = gpus or {}
    nodes = [NodeInfo(n, n, gpus.get(n, 8)) for n in per_node]
    return builders.view({n: {"driver": f} for n, f in per_node.items()}, nodes=nodes, expect=expect)


def statuses(findings):
    return [(f.node, f.status, f.message) for f in findings]


def test_rule_passes_identical_nodes():
    found = driver_rule.rule(view({"gpu-%03d" % i: facts() for i in range(1, 4)}))
    assert statuses(found) == [
        ("gpu-%03d" % i, Status.PASS, "driver 550.54.15, CUDA 12.4, NCCL 2.21.5, torch 2.3.0+cu121") for i in range(1, 4)
    ]


def test_rule_names_the_driver_outlier_and_the_majority():
    per_node = {"gpu-%03d" % i: facts() for i in range(1, 64)}
    per_node["gpu-064"] = facts(drv="535.104.05", cuda="12.2")
    found = driver_rule.rule(view(per_node))
    fails = [f for f in found if f.status is Status.FAIL]
    assert statuses(fails[:2]) == [
        ("gpu-064", Status.FAIL, "driver 535.104.05 (majority 550.54.15 on 63 nodes)"),
        ("gpu-064", Status.FAIL, "CUDA 12.2 (majority 12.4 on 63 nodes)"),
    ]
    assert fails[0].expected == "550.54.15" and fails[0].actual == "535.104.05"
    cluster = [f for f in fails if f.node is None]
    assert [f.message for f in cluster] == [
        "driver drift: gpu-[001-063]: driver 550.54.15 · gpu-064: driver 535.104.05",
        "CUDA drift: gpu-[001-063]: CUDA 12.4 · gpu-064: CUDA 12.2",
    ]
    assert sum(f.status is Status.PASS for f in found) == 63


def test_rule_compares_with_expect():
    found = driver_rule.rule(view({"a": facts(), "b": facts()}, expect={"nccl_version": "2.21.5", "torch_version": "2.4.0+cu121"}))
    assert statuses(found) == [
        ("a", Status.FAIL, "torch 2.3.0+cu121 (expected 2.4.0+cu121)"),
        ("b", Status.FAIL, "torch 2.3.0+cu121 (expected 2.4.0+cu121)"),
    ]


def test_rule_tie_has_no_majority():
    found = driver_rule.rule(view({"a": facts(nccl="2.18.3"), "b": facts(nccl="2.21.5")}))
    assert [m for _, s, m in statuses(found) if s is Status.FAIL and _] == [
        "NCCL 2.18.3 (no majority: 2.21.5 on b)",
        "NCCL 2.21.5 (no majority: 2.18.3 on a)",
    ]


def test_rule_fails_gpu_node_without_driver_and_missing_torch():
    found = driver_rule.rule(view({"a": facts(), "b": facts(), "c": facts(drv=None, cuda=None, torch=None)}))
    assert [m for n, s, m in statuses(found) if n == "c"] == [
        "no NVIDIA driver found (expected one for 8 GPUs)",
        "torch not found (majority 2.3.0+cu121 on 2 nodes)",
    ]


def test_rule_not_found_is_never_the_reference():
    found = driver_rule.rule(view({"a": facts(torch=None), "b": facts(torch=None), "c": facts()}))
    assert [(n, m) for n, s, m in statuses(found) if s is Status.FAIL and n] == [
        ("a", "torch not found (most common: 2.3.0+cu121 on 1 node)"),
        ("b", "torch not found (most common: 2.3.0+cu121 on 1 node)"),
    ]


def test_rule_cpu_only_nodes_compare_torch_public_version():
    per_node = {"gpu-1": facts(), "gpu-2": facts(), "cpu-1": facts(drv=None, cuda=None, nccl=None, torch="2.3.0+cpu", torch_cuda=None)}
    found = driver_rule.rule(view(per_node, gpus={"cpu-1": 0}))
    assert statuses(found)[-1] == ("cpu-1", Status.PASS, "torch 2.3.0 (CPU-only node: driver, CUDA and NCCL do not apply)")
    assert all(s is Status.PASS for _, s, _ in statuses(found))
    per_node["cpu-1"]["torch"]["version"] = "2.2.2+cpu"
    found = driver_rule.rule(view(per_node, gpus={"cpu-1": 0}))
    assert ("cpu-1", Status.FAIL, "torch 2.2.2 (majority 2.3.0 on 2 nodes)") in statuses(found)


def test_rule_cpu_only_without_torch_skips():
    found = driver_rule.rule(view({"cpu-1": facts(drv=None, cuda=None, nccl=None, torch=None)}, gpus={"cpu-1": 0}))
    assert statuses(found) == [("cpu-1", Status.SKIP, "CPU-only node (gpus_per_node: 0) without torch: nothing to compare")]


def test_rule_fails_torch_built_for_newer_cuda_major_than_driver():
    found = driver_rule.rule(view({"a": facts(cuda="11.8", torch="2.3.0+cu121", torch_cuda="12.1")}))
    assert statuses(found) == [
        ("a", Status.FAIL, "torch 2.3.0+cu121 is built for CUDA 12.1 but the driver supports CUDA 11.8 (expected a driver for CUDA 12.x)")
    ]


def test_rule_errors_on_missing_or_failed_probe():
    nodes = [NodeInfo("a", "a", 8), NodeInfo("b", "b", 8), NodeInfo("c", "c", 8)]
    found = driver_rule.rule(builders.view({"a": {"driver": {"probe_error": "boom"}}, "b": {}, "c": {"driver": facts()}}, nodes=nodes))
    assert statuses(found) == [
        ("a", Status.ERROR, "probe failed: boom"),
        ("b", Status.ERROR, "no facts gathered for this check"),
        ("c", Status.PASS, "driver 550.54.15, CUDA 12.4, NCCL 2.21.5, torch 2.3.0+cu121"),
    ]


def test_rule_uses_system_nccl_without_wheel():
    f = facts(nccl=None)
    f["nccl_system"] = [{"soname": "libnccl.so.2", "path": "/usr/lib/libnccl.so.2.19.3", "version": "2.19.3"}]
    found = driver_rule.rule(view({"a": f}))
    assert "NCCL 2.19.3" in found[0].message


def test_nccl_wheel_found_by_its_dist_info_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert driver_probe._nccl_python() is None
    (tmp_path / "nvidia_nccl_cu11-2.14.3.dist-info").mkdir()
    assert driver_probe._nccl_python() == {"distribution": "nvidia-nccl-cu11", "version": "2.14.3"}
    (tmp_path / "nvidia_nccl_cu12-2.21.5.dist-info").mkdir()  # cu12 is looked for first
    assert driver_probe._nccl_python() == {"distribution": "nvidia-nccl-cu12", "version": "2.21.5"}


def test_the_dist_info_name_test_answers_as_the_pattern_it_replaced():
    """_nccl_python reads folder names with string tests, not a pattern compiled per distribution on every node:
    the same answers as re.match(r"^nvidia_nccl_cu12-([^-]+)\\.dist-info$", name, re.I), odd names included."""
    old = re.compile(r"^nvidia_nccl_cu12-([^-]+)\.dist-info$", re.I)
    for name in ("nvidia_nccl_cu12-2.21.5.dist-info", "NVIDIA_NCCL_CU12-2.21.5.DIST-INFO", "nvidia_nccl_cu12-.dist-info",
                 "nvidia_nccl_cu12-2.21-5.dist-info", "nvidia_nccl_cu12-2.21.5.egg-info", "nvidia_nccl_cu123-1.dist-info",
                 "nvidia_nccl_cu12-2.21.5+local.dist-info", "xnvidia_nccl_cu12-2.21.5.dist-info", "nvidia_nccl_cu12-2.21.5"):
        found = old.match(name)
        assert driver_probe._dist_info_version(name, "nvidia_nccl_cu12-") == (found.group(1) if found else None), name


def test_ldconfig_only_the_lines_asked_for_are_parsed_and_judged():
    """The probe asks for the libnccl lines only: they come back as the whole parse has them, and a line it did
    not ask for is not judged (an odd one fails the whole parse); the header is still checked either way."""
    text = read(os.path.join(FIX, "ldconfig_nccl_apt.txt"))
    whole = driver_probe.parse_ldconfig(text)
    nccl = [entry for entry in whole if "libnccl.so" in entry[0] + entry[1]]
    assert nccl and len(nccl) < len(whole)
    odd = text.replace("\tlibz.so.1 (libc6,x86-64) => ", "\tlibz.so.1 [libc6] -> ", 1)
    with pytest.raises(driver_probe.ParseError, match="unexpected"):
        driver_probe.parse_ldconfig(odd)
    assert driver_probe.parse_ldconfig(odd, only="libnccl.so") == nccl
    with pytest.raises(driver_probe.ParseError, match="first line"):
        driver_probe.parse_ldconfig("\n".join(text.splitlines()[1:]), only="libnccl.so")

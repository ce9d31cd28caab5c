"""driver: every node runs the same NVIDIA driver, CUDA driver, NCCL and torch versions (or the ones expected).

Sources, first that answers wins:

- driver / CUDA version: NVML (nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion), else the
  header of ``nvidia-smi -q -x``, else ``<sysfs>/module/nvidia/version`` (the loaded kernel module),
  else ``/proc/driver/nvidia/version``. ``PREFLIGHT_NVML=off`` skips NVML, as in the gpu check.
- NCCL: every ``libnccl.so*`` in ``ldconfig -p``, its version read from the real file name the soname
  link resolves to (libnccl.so.2 -> libnccl.so.2.21.5); and the ``nvidia-nccl-cu11/12/13`` Python
  distribution (the NCCL torch wheels load) through importlib.metadata.
- torch: ``torch/version.py`` located with importlib.util.find_spec and read as text: importing torch
  costs seconds per node, and the controller must never need it.

Facts schema::

    driver_version  "550.54.15" | None      driver_source  "nvml"|"nvidia-smi"|"sysfs"|"proc"|None
    cuda_version    "12.4" | None           (highest CUDA version the driver supports; NVML / nvidia-smi only)
    nccl_system     [{"soname": "libnccl.so.2", "path": "/usr/lib/...", "version": "2.21.5"|None}, ...]
    nccl_python     {"distribution": "nvidia-nccl-cu12", "version": "2.21.5"} | None
    torch           {"version": "2.3.0+cu121", "cuda": "12.1"|None, "path": ".../torch"} | None

Rule. The NCCL a job uses is the Python distribution's when there is one (torch wheels load it), else
the system library's. Each value is compared with ``expect:`` (keys driver_version, cuda_version,
nccl_version, torch_version) when given, else with the majority of the nodes it applies to; a node
that differs FAILs naming the majority value and how many nodes hold it, and one cluster-wide finding
folds every value's node set. With no majority (a tie) every differing node fails.

- GPU nodes: driver, CUDA, NCCL, torch. A GPU node without a driver FAILs. A torch built for a newer
  CUDA major version than the driver supports FAILs (CUDA minor-version compatibility covers minors).
- CPU-only nodes (gpus_per_node 0): driver, CUDA and NCCL do not apply (said in the PASS message);
  torch is still compared, on its public version only (2.3.0 for 2.3.0+cpu and 2.3.0+cu121), because
  the gloo all-reduce runs with torch there too. ``expect: torch_version`` with a local part (+cu121)
  is compared in full on GPU nodes and by its public part on CPU-only nodes.
- A value missing on some nodes but present on others is drift: the nodes lacking it fail ("torch not
  found (majority 2.3.0 on 63 nodes)"); "not found" is never the reference. Missing everywhere is not
  judged. A GPU node without a driver fails once for that, not again for CUDA drift.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import fold, majority, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Setting, Status, probe_error
from preflight.probe.nvml import bounded_nvml, load_nvml, nvml_shutdown, nvml_wedged

NAME = "driver"
PROC_VERSION = "/proc/driver/nvidia/version"
NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")
LDCONFIG_CANDIDATES = ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig")
NOT_FOUND = "not found"


# --------------------------------------------------------------------------------------------- probe


def probe(ctx: Any) -> Dict[str, Any]:
    """Driver, CUDA, NCCL and torch versions as this node's python and loader see them."""
    facts: Dict[str, Any] = {"driver_version": None, "driver_source": None, "cuda_version": None}
    facts.update(_driver(ctx))
    facts["nccl_system"] = _nccl_system(ctx)
    facts["nccl_python"] = _nccl_python()
    facts["torch"] = _torch()
    return facts


def _driver(ctx: Any) -> Dict[str, Any]:
    nvml, nvml_error = load_nvml()
    if nvml is not None:
        try:
            cuda, version = bounded_nvml(
                lambda: (nvml.nvmlSystemGetCudaDriverVersion(), nvml.nvmlSystemGetDriverVersion()), "driver version",
                call_name="nvmlSystemGetCudaDriverVersion/nvmlSystemGetDriverVersion",
            )
            return {
                "driver_version": version.decode() if isinstance(version, bytes) else str(version),
                "driver_source": "nvml",
                "cuda_version": "%d.%d" % (cuda // 1000, (cuda % 1000) // 10),
            }
        except Exception as exc:  # NVML initialised but cannot answer (or is stuck): fall back, and say why
            nvml_error = "NVML query failed: %s" % (exc,)
        finally:
            if not nvml_wedged():
                nvml_shutdown(nvml)
    if not nvml_wedged():  # a wedged driver hangs nvidia-smi too: go straight to the files
        smi = ctx.run(["nvidia-smi", "-q", "-x"], timeout=60.0)
        if smi.ok:
            driver, cuda = parse_smi_header(smi.stdout)
            found = {"driver_version": driver, "driver_source": "nvidia-smi", "cuda_version": cuda}
            if nvml_error:
                found["nvml_error"] = nvml_error
            return found
    found = {"nvml_error": nvml_error} if nvml_wedged() else {}
    module = ctx.read(ctx.sys_path("module", "nvidia", "version"))
    if module:
        found.update({"driver_version": parse_module_version(module), "driver_source": "sysfs"})
        return found
    proc = ctx.read(PROC_VERSION)
    if proc:
        found.update({"driver_version": parse_proc_version(proc), "driver_source": "proc"})
    return found


def _nccl_system(ctx: Any) -> List[Dict[str, Any]]:
    for program in LDCONFIG_CANDIDATES:
        res = ctx.run([program, "-p"], timeout=15.0)
        if res.rc != 127:
            break
    if not res.ok:
        return []
    out = []
    for soname, path in parse_ldconfig(res.stdout):
        if not soname.startswith("libnccl.so"):
            continue
        real = os.path.realpath(path)
        out.append({"soname": soname, "path": real, "version": nccl_version_from_filename(real)})
    return out


def _nccl_python() -> Optional[Dict[str, str]]:
    """The nvidia-nccl-cu* wheel importable here: its `<name>-<version>.dist-info` folder on sys.path.

    Read from the folder name (the wheel spec's normalized name and version), the first sys.path entry
    that holds one winning, as for importlib.metadata.version(); importing importlib.metadata instead
    costs 20-30 ms of CPU on every node.
    """
    listings = []
    for entry in sys.path:
        try:
            listings.append(os.listdir(entry or "."))
        except OSError:
            continue
    for dist in NCCL_DISTRIBUTIONS:
        pattern = re.compile(r"^%s-([^-]+)\.dist-info$" % re.sub(r"[-_.]+", "_", dist), re.I)
        for names in listings:
            for name in sorted(names):
                found = pattern.match(name)
                if found:
                    return {"distribution": dist, "version": found.group(1)}
    return None


def _torch() -> Optional[Dict[str, Any]]:
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    path = os.path.join(root, "version.py")
    try:
        with open(path, "r", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    facts = parse_torch_version_py(text)
    facts["path"] = root
    return facts


# ------------------------------------------------------------------------------------------- parsers


def parse_smi_header(text: str) -> Tuple[str, Optional[str]]:
    """(driver_version, cuda_version) from the header of `nvidia-smi -q -x`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ParseError("nvidia-smi -q -x: not well-formed XML (%s)" % exc)
    driver = root.findtext("driver_version")
    if root.tag != "nvidia_smi_log" or not driver:
        raise ParseError("nvidia-smi -q -x: no <nvidia_smi_log><driver_version>")
    cuda = (root.findtext("cuda_version") or "").strip()
    return driver.strip(), (None if cuda in ("", "N/A") else cuda)


_VERSION = r"(\d+\.\d+(?:\.\d+)?)"


def parse_module_version(text: str) -> str:
    """The loaded kernel module's version from <sysfs>/module/nvidia/version ("550.54.15")."""
    value = text.strip()
    if not re.match(r"^%s$" % _VERSION, value):
        raise ParseError("module/nvidia/version: %r is not a driver version" % value)
    return value


def parse_proc_version(text: str) -> str:
    """The driver version from /proc/driver/nvidia/version (proprietary and open kernel modules)."""
    first = text.splitlines()[0] if text.strip() else ""
    match = re.match(r"^NVRM version: NVIDIA UNIX .*?Kernel Module(?: for \S+)?\s+%s\s" % _VERSION, first + " ")
    if not match:
        raise ParseError("/proc/driver/nvidia/version: first line %r is not an NVRM version line" % first)
    return match.group(1)


_LDCONFIG_LINE = re.compile(r"^\s+(\S+) \(([^)]*)\) => (\S.*)$")


def parse_ldconfig(text: str) -> List[Tuple[str, str]]:
    """[(soname, path)] from `ldconfig -p`."""
    lines = text.splitlines()
    if not lines or not re.match(r"^\d+ libs found in cache ", lines[0]):
        raise ParseError("ldconfig -p: first line %r is not 'N libs found in cache ...'" % (lines[0] if lines else ""))
    out = []
    for number, line in enumerate(lines[1:], 2):
        if not line.strip() or line.startswith("Cache generated by"):
            continue
        match = _LDCONFIG_LINE.match(line)
        if not match:
            raise ParseError("ldconfig -p line %d: unexpected %r" % (number, line))
        out.append((match.group(1), match.group(3)))
    return out


def nccl_version_from_filename(path: str) -> Optional[str]:
    """'2.21.5' from .../libnccl.so.2.21.5; None when the file name carries no full version."""
    match = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", path)
    return match.group(1) if match else None


def parse_torch_version_py(text: str) -> Dict[str, Any]:
    """{"version", "cuda"} from torch/version.py (plain or annotated assignments)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise ParseError("torch/version.py: not python (%s)" % exc)
    values: Dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    version = values.get("__version__")
    if not isinstance(version, str):
        raise ParseError("torch/version.py: no __version__ string")
    cuda = values.get("cuda")
    if cuda is not None and not isinstance(cuda, str):
        raise ParseError("torch/version.py: cuda is %r, expected a string or None" % (cuda,))
    return {"version": version, "cuda": cuda}


# ---------------------------------------------------------------------------------------------- rule


def nccl_version(facts: Dict[str, Any]) -> Optional[str]:
    """The NCCL a torch job on this node loads: the Python distribution's, else the system library's."""
    if facts.get("nccl_python"):
        return facts["nccl_python"]["version"]
    versions = sorted({lib["version"] for lib in facts.get("nccl_system") or [] if lib.get("version")})
    return " + ".join(versions) if versions else None


def public(version: Optional[str]) -> Optional[str]:
    return None if version is None else version.split("+", 1)[0]


#: (key, label, applies to CPU-only nodes)
ITEMS = (
    ("driver_version", "driver", False),
    ("cuda_version", "CUDA", False),
    ("nccl_version", "NCCL", False),
    ("torch_version", "torch", True),
)


def _values(node: Any, facts: Dict[str, Any]) -> Dict[str, Optional[str]]:
    torch = facts.get("torch") or {}
    gpu = node.gpus_per_node > 0
    return {
        "driver_version": facts.get("driver_version") if gpu else None,
        "cuda_version": facts.get("cuda_version") if gpu else None,
        "nccl_version": nccl_version(facts) if gpu else None,
        # full on GPU nodes only when every compared node is a GPU node (decided in rule)
        "torch_version": torch.get("version"),
    }


def _compare(
    key: str, label: str, values: Dict[str, str], expect: Optional[str]
) -> Tuple[Dict[str, Tuple[str, str, str]], Optional[Finding]]:
    """({node: (message, expected, actual)} for nodes that differ, cluster-wide summary finding or None)."""
    bad: Dict[str, Tuple[str, str, str]] = {}
    if not values:
        return bad, None
    groups: Dict[str, List[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    if expect is not None:
        for node, value in values.items():
            if value != expect:
                bad[node] = ("%s %s (expected %s)" % (label, value, expect), expect, value)
        return bad, None
    if len(groups) == 1 or set(groups) == {NOT_FOUND}:
        return bad, None
    # "not found" is never the reference: the nodes lacking a value are the ones to fix.
    ranked = sorted(groups.items(), key=lambda kv: (kv[0] == NOT_FOUND, -len(kv[1]), kv[0]))
    top_value, top_nodes = ranked[0]
    tie = majority([v for v in values.values() if v != NOT_FOUND])[0] is None
    word = "majority " if len(top_nodes) * 2 > len(values) else "most common: "
    for value, nodes in ranked:
        if value == top_value and not tie:
            continue
        for node in nodes:
            if tie and value != NOT_FOUND:
                others = "; ".join("%s on %s" % (v, fold(n)) for v, n in ranked if v != value)
                bad[node] = ("%s %s (no majority: %s)" % (label, value, others), "one version", value)
            else:
                bad[node] = (
                    "%s %s (%s%s on %s)" % (label, value, word, top_value, plural(len(top_nodes), "node")),
                    top_value,
                    value,
                )
    summary = " · ".join("%s: %s %s" % (fold(nodes), label, value) for value, nodes in ranked)
    cluster = Finding(NAME, None, Status.FAIL, "%s drift: %s" % (label, summary), data={"versions": {v: fold(n) for v, n in ranked}})
    return bad, cluster


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    live: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
    for node in view.live:
        facts = view.facts[node.name].get(NAME)
        err = probe_error(NAME, node.name, facts)
        if err:
            out.append(err)
        else:
            live[node.name] = (node, facts)
    per_node: Dict[str, Dict[str, Optional[str]]] = {n: _values(node, f) for n, (node, f) in live.items()}
    all_gpu = all(node.gpus_per_node > 0 for node, _ in live.values())
    if not all_gpu:  # mixed or CPU-only cluster: torch compared on its public version
        for values in per_node.values():
            values["torch_version"] = public(values["torch_version"])
    problems: Dict[str, List[Tuple[str, str, str]]] = {n: [] for n in live}
    cluster: List[Finding] = []
    for name, (node, facts) in live.items():
        if node.gpus_per_node > 0 and not facts.get("driver_version"):
            problems[name].append(
                ("no NVIDIA driver found (expected one for %d GPUs)" % node.gpus_per_node, "a driver", NOT_FOUND)
            )
    for key, label, on_cpu in ITEMS:
        expect = view.expect.get(key)
        expect = None if expect is None else str(expect)
        applies = {n: v for n, v in per_node.items() if on_cpu or live[n][0].gpus_per_node > 0}
        if key in ("driver_version", "cuda_version"):  # a missing driver is reported above, not as drift
            applies = {n: v for n, v in applies.items() if v["driver_version"]}
        values = {n: (v[key] or NOT_FOUND) for n, v in applies.items()}
        if expect is not None and key == "torch_version" and not all_gpu:
            expect = public(expect)
        if expect is None and not any(v != NOT_FOUND for v in values.values()):
            continue
        bad, summary = _compare(key, label, values, expect)
        for name, problem in bad.items():
            problems[name].append(problem)
        if summary:
            cluster.append(summary)
    for name, (node, facts) in live.items():
        problems[name].extend(_cuda_compat(facts) if node.gpus_per_node > 0 else [])
        if problems[name]:
            for message, expected, actual in problems[name]:
                out.append(Finding(NAME, name, Status.FAIL, message, expected=expected, actual=actual))
        else:
            out.append(_pass(node, facts, per_node[name]))
    return out + cluster


def _cuda_compat(facts: Dict[str, Any]) -> List[Tuple[str, str, str]]:
    torch = facts.get("torch") or {}
    built, driver = torch.get("cuda"), facts.get("cuda_version")
    if not built or not driver:
        return []
    try:
        if int(built.split(".")[0]) > int(driver.split(".")[0]):
            return [
                (
                    "torch %s is built for CUDA %s but the driver supports CUDA %s (expected a driver for CUDA %s.x)"
                    % (torch.get("version"), built, driver, built.split(".")[0]),
                    "CUDA >= %s" % built,
                    driver,
                )
            ]
    except ValueError:
        pass
    return []


def _pass(node: Any, facts: Dict[str, Any], values: Dict[str, Optional[str]]) -> Finding:
    torch = values["torch_version"]
    if node.gpus_per_node == 0:
        if torch is None:
            return Finding(
                NAME, node.name, Status.SKIP, "CPU-only node (gpus_per_node: 0) without torch: nothing to compare"
            )
        return Finding(
            NAME,
            node.name,
            Status.PASS,
            "torch %s (CPU-only node: driver, CUDA and NCCL do not apply)" % torch,
            actual=torch,
        )
    parts = ["driver %s" % values["driver_version"]]
    if values["cuda_version"]:
        parts.append("CUDA %s" % values["cuda_version"])
    parts.append("NCCL %s" % (values["nccl_version"] or NOT_FOUND))
    parts.append("torch %s" % (torch or NOT_FOUND))
    return Finding(NAME, node.name, Status.PASS, ", ".join(parts), actual=values["driver_version"])


CHECK = Check(
    name=NAME,
    claim="Every node runs the same NVIDIA driver, CUDA driver, NCCL and torch versions (or the expected ones)",
    why="Mixed driver or NCCL versions across nodes make NCCL hang or fail at init (protocol mismatch); a "
    "torch built for a newer CUDA than the driver cannot use the GPU.",
    fix="Install the expected driver (and the matching nvidia-fabricmanager) and reboot; pin the same torch "
    "and nvidia-nccl-cu12 in every node's environment (pip install torch==X nvidia-nccl-cu12==Y).",
    probe=probe,
    rule=rule,
    action="fix_config",
    reads="NVML driver and CUDA versions (else nvidia-smi -q -x, else /sys/module/nvidia/version), libnccl in "
    "ldconfig -p, the nvidia-nccl-cu* wheel's dist-info name and torch/version.py (torch is not imported)",
    takes="< 0.1 s (nvidia-smi, when NVML is absent, up to a few seconds)",
    order=30,
    settings=tuple(Setting("expect." + key, "version", "the %s every node runs (else the cluster majority)" % what)
                   for key, what in (("driver_version", "NVIDIA driver"), ("cuda_version", "CUDA driver version"),
                                     ("nccl_version", "NCCL"), ("torch_version", "torch"))),
)

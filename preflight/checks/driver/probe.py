"""The driver check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import re

from preflight.node_model import ParseError
from preflight.probe import sitedirs
from preflight.probe.lazy_re import lazy
from preflight.probe.nvml import bounded_nvml, load_nvml, nvml_shutdown, nvml_wedged

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional, Tuple

PROC_VERSION = "/proc/driver/nvidia/version"
NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")
LDCONFIG_CANDIDATES = ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig")
#: what every NCCL_DISTRIBUTIONS name's dist-info folder starts with (normalized, lower case)
_NCCL_PREFIX = "nvidia_nccl_cu"


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
    for soname, path in parse_ldconfig(res.stdout, only="libnccl.so"):
        if not soname.startswith("libnccl.so"):
            continue
        real = os.path.realpath(path)
        out.append({"soname": soname, "path": real, "version": nccl_version_from_filename(real)})
    return out


def _nccl_python() -> Optional[Dict[str, str]]:
    """The nvidia-nccl-cu* wheel importable here: its `<name>-<version>.dist-info` folder on the import path.

    Read from the folder name (the wheel spec's normalized name and version), the first entry of the path
    site gives this python (sitedirs.search_path: the probe runs without site) that holds one winning, as for
    importlib.metadata.version(); importing importlib.metadata instead costs 20-30 ms of CPU on every node.
    """
    listings = []
    for entry in sitedirs.search_path():
        try:  # only the names these distributions can have (a site-packages folder lists hundreds)
            listings.append([n for n in os.listdir(entry or ".") if n[:len(_NCCL_PREFIX)].lower() == _NCCL_PREFIX])
        except OSError:
            continue
    for dist in NCCL_DISTRIBUTIONS:
        prefix = dist.replace("-", "_") + "-"  # the wheel spec's normalized name: these names hold only '-'
        for names in listings:
            for name in sorted(names):
                version = _dist_info_version(name, prefix)
                if version:
                    return {"distribution": dist, "version": version}
    return None


def _dist_info_version(name: str, prefix: str) -> Optional[str]:
    """The version of a `<prefix><version>.dist-info` folder name (case-insensitive, no '-' in the version), or
    None: the string test a pattern per distribution compiled on every node did."""
    low = name.lower()
    if not (low.startswith(prefix) and low.endswith(".dist-info")):
        return None
    version = name[len(prefix):-len(".dist-info")]
    return version if version and "-" not in version else None


def _torch() -> Optional[Dict[str, Any]]:
    try:
        spec = sitedirs.find_spec("torch")
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


def parse_smi_header(text: str) -> Tuple[str, Optional[str]]:
    """(driver_version, cuda_version) from the header of `nvidia-smi -q -x`."""
    import xml.etree.ElementTree as ET  # here, not at the top: a node without GPUs never parses XML
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


def parse_ldconfig(text: str, only: str = "") -> List[Tuple[str, str]]:
    """[(soname, path)] from `ldconfig -p`; with `only`, just the lines that contain it (the probe wants the
    few libnccl lines of hundreds: a line it does not want is neither parsed nor judged)."""
    lines = text.splitlines()
    if not lines or not re.match(r"^\d+ libs found in cache ", lines[0]):
        raise ParseError("ldconfig -p: first line %r is not 'N libs found in cache ...'" % (lines[0] if lines else ""))
    out = []
    for number, line in enumerate(lines[1:], 2):
        if not line.strip() or line.startswith("Cache generated by") or only not in line:
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


#: one line of torch/version.py as PyTorch's build writes it (tools/generate_torch_version.py): a name, an optional
#: annotation, a one-line string literal without escapes, or None
_TORCH_LINE = lazy(r"(__version__|cuda)[ \t]*(?::[^=]*)?=[ \t]*(?:'([^'\\]*)'|\"([^\"\\]*)\"|(None))[ \t]*(?:#.*)?")
_NAME = lazy(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_torch_version_py(text: str) -> Dict[str, Any]:
    """{"version", "cuda"} from torch/version.py (plain or annotated assignments)."""
    values = _generated_values(text)
    if values is None:
        values = _ast_values(text)
    version = values.get("__version__")
    if not isinstance(version, str):
        raise ParseError("torch/version.py: no __version__ string")
    cuda = values.get("cuda")
    if cuda is not None and not isinstance(cuda, str):
        raise ParseError("torch/version.py: cuda is %r, expected a string or None" % (cuda,))
    return {"version": version, "cuda": cuda}


def _generated_values(text: str) -> Optional[Dict[str, Any]]:
    """__version__ and cuda read line by line as _ast_values reads them, where every line that assigns them is a
    plain one-line literal assignment and the file compiles; None where only the syntax tree can tell (a string
    spanning lines, a continued line, any other statement that names them). Importing ast costs a node with torch
    3-5 ms of CPU a run; compile() is the interpreter's own."""
    if "'''" in text or '"""' in text or "\\\n" in text:
        return None
    values: Dict[str, Any] = {}
    for line in text.splitlines():
        name = _NAME.match(line)
        if name is None or name.group() not in ("__version__", "cuda"):
            continue
        found = _TORCH_LINE.fullmatch(line)
        if found is None:
            return None
        literal = found.group(2) if found.group(2) is not None else found.group(3)
        values[found.group(1)] = None if found.group(4) else literal
    try:
        compile(text, "torch/version.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None  # _ast_values says why
    return values


def _ast_values(text: str) -> Dict[str, Any]:
    """{name: constant} of the module's top-level plain and annotated assignments of a constant."""
    import ast  # here, not at the top: only a version.py that is not as PyTorch generates it needs its syntax tree

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
    return values

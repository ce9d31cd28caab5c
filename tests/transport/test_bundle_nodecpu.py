"""What a node's phase-1 run imports: not the controller's vocabulary (preflight.model's dataclasses and the
inspect, ast-free machinery they pull in) nor the other modules a node never needs; issue 38 item 4 cut them
(docs/speed.md), and this keeps them cut."""

from __future__ import annotations

import ast
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

from preflight import checks
from preflight.probe.lazy_re import Lazy, lazy
from preflight.transport import bundle

#: modules a probe run must not import: the declarations' vocabulary (preflight.model: dataclasses, inspect,
#: the check declarations), a thread pool and logging (plain threads), platform (its regexes at import), typing
#: (8-14 ms of a node's CPU: node modules import it under `if TYPE_CHECKING:`, their annotations postponed), ast
#: (torch/version.py as PyTorch generates it is read line by line; where torch is installed, as on this machine),
#: zipfile and the pathlib and urllib.parse it imports (the bootstrap reads the bundle's zip itself: 12 ms)
NOT_ON_A_NODE = ("preflight.model", "dataclasses", "inspect", "concurrent.futures", "logging", "platform", "typing",
                 "ast", "zipfile", "pathlib", "urllib.parse")

#: run before the bootstrap: record the programs the process starts (its audit events), and at its os._exit write
#: the names of the modules it imported and those programs
RECORD = ("import os,sys\n_e=os._exit;_s=[]\n"
          "sys.addaudithook(lambda e,a:_s.append(os.path.basename(str(a[1][0]))) if e=='subprocess.Popen' else None)\n"
          "def _x(c):\n with open(%r,'w') as fh:fh.write(repr((sorted(sys.modules),_s)))\n"
          " _e(c)\nos._exit=_x\n")


def probe_run(tmp_path) -> tuple:
    """(the modules imported, the programs started) by the bootstrap, started as the transports start it
    (bundle.bootstrap_argv), running every check's probe, fed as a transport feeds it."""
    import ast as _ast

    names = [name for name in checks.module_names() if checks.has_probe(name)]
    config = {"mode": "probe", "checks": {n: {} for n in names}, "probe_timeout_s": 60, "deadline_s": 120}
    blob = bundle.base_zip()
    payload = json.dumps(config).encode() + b"\n" + str(len(blob)).encode() + b"\n" + blob
    out = tmp_path / "modules"
    argv = bundle.bootstrap_argv(sys.executable)
    argv[-1] = RECORD % str(out) + argv[-1]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd="/")
    try:
        proc.stdin.write(payload)
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith(b"preflight-result "):
                break
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)
    result = bundle.parse_output(line)["result"]
    assert set(result["facts"]) == set(names), result  # every probe ran and answered
    modules, started = _ast.literal_eval(out.read_text())
    return set(modules), started


def modules_of_a_probe_run(tmp_path) -> set:
    """The modules imported by the bootstrap running every check's probe (probe_run)."""
    return probe_run(tmp_path)[0]


def test_a_probe_run_does_not_import_the_controllers_vocabulary(tmp_path):
    imported = modules_of_a_probe_run(tmp_path)
    assert "preflight.probe.runner" in imported and "preflight.checks.xid.probe" in imported  # it did run
    assert not [m for m in NOT_ON_A_NODE if m in imported], sorted(m for m in NOT_ON_A_NODE if m in imported)
    if not os.path.isdir("/proc/driver/nvidia"):  # ctypes is for NVML's structures (preflight.probe.nvml_structs)
        assert "ctypes" not in imported and "_ctypes" not in imported


def test_a_probe_run_starts_no_site_no_pth_code_and_one_ip(tmp_path):
    """The node CPU cuts that a profile would not show as a test failure: `site` and what the machine's
    .pth files import (python3 -S), bz2/lzma that zipfile would load, the second `ip` and programs that are not
    there (nvidia-smi, dcgmi... on this machine without a GPU: no process started for them)."""
    imported, started = probe_run(tmp_path)
    # site itself is imported (sitedirs reads its functions) but never run: nothing a .pth file imports is here
    ran = [m for m in imported if m in ("sitecustomize", "usercustomize", "_distutils_hack", "certifi", "bz2", "lzma",
                                        "_lzma") or m.startswith("__editable__")]
    assert not ran, ran
    assert started.count("ip") == 1, started
    missing = sorted({p for p in started if p != "sh" and not shutil.which(p) and not os.path.exists(p)})
    assert not missing, "started though no PATH entry holds them: %s" % missing
    assert "sh" in started and "ldconfig" in started  # the watchdog, and the library cache NCCL is looked up in


def test_the_declarations_travel_as_empty_packages_and_the_vocabulary_stays_home():
    zf = zipfile.ZipFile(io.BytesIO(bundle.base_zip()))
    names = set(zf.namelist())
    assert "preflight/model.py" not in names and "preflight/node_model.py" in names
    for name in ["preflight/checks/__init__.py"] + ["preflight/checks/%s/__init__.py" % c for c in ("xid", "nic")]:
        assert zf.read(name) == b"", name
    assert zf.read("preflight/checks/xid/probe.py") == open(os.path.join(os.path.dirname(checks.__file__), "xid",
                                                                        "probe.py"), "rb").read()


def test_a_node_module_that_imports_a_declaration_by_name_gets_it_whole(tmp_path, monkeypatch):
    """A probe that reads a name from its package (from preflight.checks.xid import X) finds it on the node."""
    real = bundle._imported
    monkeypatch.setattr(bundle, "_imported", lambda root, rel: real(root, rel) + (
        ["preflight/checks/xid/__init__.py"] if rel == "preflight/checks/nic/probe.py" else []))
    sources = dict((name, path) for path, name in bundle._sources())
    assert sources["preflight/checks/xid/__init__.py"].endswith("checks/xid/__init__.py")
    assert sources["preflight/checks/nic/__init__.py"] == os.devnull
    assert sources["preflight/model.py"].endswith("preflight/model.py")  # what that declaration imports travels too


def test_a_lazy_pattern_compiles_on_its_first_use_and_answers_as_re_does():
    pat = lazy(r"Xid \((\S+)\): (\d+)", 0)
    assert isinstance(pat, Lazy) and pat._compiled is None and pat.pattern == r"Xid \((\S+)\): (\d+)"
    assert pat._compiled is None  # reading .pattern compiled nothing
    assert pat.search("NVRM: Xid (PCI:0000:44:00): 79, off the bus").groups() == ("PCI:0000:44:00", "79")
    assert pat._compiled is not None
    assert pat.findall("Xid (a): 1 Xid (b): 2") == [("a", "1"), ("b", "2")]


#: counts, in a probe process of its own, what the run opened and listed under the sysfs root (audit hooks: the
#: interpreter's own record of every open() and os.listdir(), no stand-in for the context's reads)
COUNT_READS = r'''
import json, os, sys
root, names = sys.argv[1], json.loads(sys.argv[2])
seen = []
def hook(event, args):
    if event in ("open", "os.listdir") and isinstance(args[0], str) and args[0].startswith(root):
        seen.append([event, os.path.relpath(args[0], root)])
from preflight.probe.runner import run_probes
records = {}
sys.addaudithook(hook)
facts = run_probes(names, 60, records)
print(json.dumps({"seen": seen, "facts": facts, "events": {n: r["events"] for n, r in records.items()}}))
'''

#: the probes that list the PCI bus (and class/infiniband, and the hypervisor's files)
PCI_PROBES = ("pcie", "topology", "gpudirect", "fabric_manager", "xid", "gpu")


def _pci_tree(root):
    """A GPU, a ConnectX HCA (with its class/infiniband entry) and an NVSwitch on a bus laid out as the kernel does."""
    sys_dir = root / "sys"
    for bdf, vendor, klass, parent in (("0000:17:00.0", "0x1000", "0x060400", ""),
                                      ("0000:18:00.0", "0x10de", "0x030200", "0000:17:00.0"),
                                      ("0000:19:00.0", "0x15b3", "0x020700", "0000:17:00.0"),
                                      ("0000:05:00.0", "0x10de", "0x068000", "")):
        real = sys_dir / "devices" / "pci0000:16" / parent / bdf
        real.mkdir(parents=True)
        (real / "vendor").write_text(vendor + "\n")
        (real / "class").write_text(klass + "\n")
        link = sys_dir / "bus" / "pci" / "devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(real, link.parent))
    hca = sys_dir / "class" / "infiniband" / "mlx5_0"
    hca.mkdir(parents=True)
    (hca / "device").symlink_to(os.path.relpath(sys_dir / "bus" / "pci" / "devices" / "0000:19:00.0", hca))
    return str(sys_dir)


def _probe_run(sys_dir, names):
    """What a probe process running `names` over this sysfs root opened and listed there, its facts, its recordings."""
    env = dict(os.environ, PREFLIGHT_SYSFS_ROOT=sys_dir, PATH="/nonexistent",  # no nvidia-smi, lspci, systemctl
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(checks.__file__))))
    config = {n: ({"window_s": 0.01} if n == "pcie" else {}) for n in names}
    out = subprocess.run([sys.executable, "-c", COUNT_READS, sys_dir, json.dumps(config)], env=env, cwd="/",
                         capture_output=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_the_pci_bus_is_walked_once_per_probe_run_and_every_probe_records_the_walk(tmp_path):
    sys_dir = _pci_tree(tmp_path)
    run = _probe_run(sys_dir, PCI_PROBES)
    listed = [path for event, path in run["seen"] if event == "os.listdir"]
    vendors = [path for event, path in run["seen"] if event == "open" and path.endswith("/vendor")]
    assert listed.count("bus/pci/devices") == 1, listed  # five probes asked for it
    assert listed.count("class/infiniband") == 1, listed  # topology and gpudirect asked
    assert sorted(vendors) == sorted("bus/pci/devices/%s/vendor" % b for b in
                                     ("0000:17:00.0", "0000:18:00.0", "0000:19:00.0", "0000:05:00.0")), vendors
    assert run["facts"]["fabric_manager"]["nvswitches"] == ["0000:05:00.0"], run["facts"]["fabric_manager"]
    assert run["facts"]["xid"]["nvidia"] is True
    for name in ("pcie", "topology", "gpudirect", "fabric_manager", "xid"):  # each capture replays on its own
        assert {"kind": "listdir", "path": os.path.join(sys_dir, "bus", "pci", "devices"),
                "entries": ["0000:05:00.0", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0"]} in run["events"][name], name


def test_a_probe_run_alone_gives_the_facts_it_gives_beside_the_others(tmp_path):
    """The twin: sharing the walk changes no probe's facts (each probe run alone walks the bus itself)."""
    sys_dir = _pci_tree(tmp_path)
    together = _probe_run(sys_dir, PCI_PROBES)["facts"]
    for name in PCI_PROBES:
        alone = _probe_run(sys_dir, [name])["facts"][name]
        for facts in (alone, together[name]):
            facts.pop("uptime_s", None)  # read from /proc/uptime at each run
        assert alone == together[name], name


#: node-side patterns compiled at import, each because the text it parses is on every node (or it runs outside a
#: probe run); any other is a Lazy (preflight.probe.lazy_re), compiled where its text is found
COMPILED_AT_IMPORT = {
    ("preflight/probe/pci.py", "BDF"): "every bus/pci/devices entry",
    ("preflight/checks/driver/probe.py", "_LDCONFIG_LINE"): "every line of ldconfig -p",
    ("preflight/checks/limits/probe.py", "_LIMIT"): "every line of /proc/self/limits",
    ("preflight/checks/mtu/probe.py", "_STATS"): "every ping's summary (phase 2)",
    ("preflight/checks/mtu/probe.py", "_LOSS"): "every ping's summary (phase 2)",
    ("preflight/checks/mtu/probe.py", "_RTT"): "every ping's summary (phase 2)",
    ("preflight/checks/ports/probe.py", "_TCP_LINE"): "every line of /proc/net/tcp (phase 2)",
    ("preflight/common.py", "_UNPRINTABLE"): "the controller's escaping of all node text",
    ("preflight/probe/bench_agent.py", "_NCCL_DEBUG_LINE"): "the all-reduce's agent, not a probe run",
    ("preflight/probe/bench_worker.py", "_SOURCE_LOCATION"): "the all-reduce's ranks, not a probe run",
}


def test_node_side_patterns_are_compiled_where_their_text_is_found():
    root = os.path.dirname(os.path.dirname(checks.__file__))
    found = set()
    for rel in sorted(set(bundle_modules(root))):
        with open(os.path.join(os.path.dirname(root), rel)) as fh:
            tree = ast.parse(fh.read())
        for stmt in tree.body:
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                continue
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "compile"
                   and getattr(c.func.value, "id", None) == "re" for c in ast.walk(stmt)):
                found.add((rel, getattr(target, "id", "?")))
    extra = sorted(found - set(COMPILED_AT_IMPORT))
    assert not extra, "compiled at import on every node: %s; use preflight.probe.lazy_re.lazy(...) (or list it in " \
                      "COMPILED_AT_IMPORT with the reason its text is on every node)" % extra
    assert found, "the walk found no pattern at all: it no longer reads the node modules"


def bundle_modules(root):
    """The node-side modules a bundle carries: every check's probe.py and preflight/probe/, common and node_model."""
    rels = ["preflight/common.py", "preflight/node_model.py"]
    for folder, pattern in (("checks", "*/probe.py"), ("probe", "*.py")):
        rels += [os.path.relpath(p, os.path.dirname(root)) for p in glob.glob(os.path.join(root, folder, pattern))]
    return rels

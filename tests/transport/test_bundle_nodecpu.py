"""What a node's phase-1 run imports: not the controller's vocabulary (preflight.model's dataclasses and the
inspect, ast-free machinery they pull in) nor the other modules a node never needs; issue 38 item 4 cut them
(docs/speed.md), and this keeps them cut."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

from preflight import checks
from preflight.probe.lazy_re import Lazy, lazy
from preflight.transport import bundle

#: modules a probe run must not import: the declarations' vocabulary (preflight.model: dataclasses, inspect,
#: the check declarations), a thread pool and logging (plain threads), platform (its regexes at import)
NOT_ON_A_NODE = ("preflight.model", "dataclasses", "inspect", "concurrent.futures", "logging", "platform")

#: run before the bootstrap: at its os._exit, write the names of the modules the process imported
RECORD = ("import os,sys\n_e=os._exit\ndef _x(c):\n with open(%r,'w') as fh:fh.write('\\n'.join(sorted(sys.modules)))\n"
          " _e(c)\nos._exit=_x\n")


def modules_of_a_probe_run(tmp_path) -> set:
    """The modules imported by `python -c BOOTSTRAP` running every check's probe, fed as a transport feeds it."""
    names = [name for name in checks.module_names() if checks.has_probe(name)]
    config = {"mode": "probe", "checks": {n: {} for n in names}, "probe_timeout_s": 60, "deadline_s": 120}
    blob = bundle.base_zip()
    payload = json.dumps(config).encode() + b"\n" + str(len(blob)).encode() + b"\n" + blob
    out = tmp_path / "modules"
    proc = subprocess.Popen([sys.executable, "-c", RECORD % str(out) + bundle.BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
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
    return set(out.read_text().split())


def test_a_probe_run_does_not_import_the_controllers_vocabulary(tmp_path):
    imported = modules_of_a_probe_run(tmp_path)
    assert "preflight.probe.runner" in imported and "preflight.checks.xid.probe" in imported  # it did run
    assert not [m for m in NOT_ON_A_NODE if m in imported], sorted(m for m in NOT_ON_A_NODE if m in imported)


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

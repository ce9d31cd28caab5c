"""Guards on the catalogue: what adding a check must not forget, named when it is forgotten."""

from __future__ import annotations

import difflib
import importlib
import os
import subprocess
import sys
import zipfile

from preflight import checks
from preflight.transport import bundle
from preflight.model import Check
from preflight.output.report import checks_markdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_declares_a_check_named_after_it():
    wrong = []
    for name in checks.module_names():
        module = importlib.import_module("preflight.checks." + name)
        check = getattr(module, "CHECK", None)
        if not isinstance(check, Check):
            wrong.append("checks/%s.py exports no CHECK = Check(...)" % name)
        elif check.name != name:
            wrong.append("checks/%s.py declares CHECK.name %r: it must be the module's name" % (name, check.name))
    assert not wrong, "\n".join(wrong)


def test_check_names_are_the_modules_in_declared_order():
    assert sorted(checks.CHECK_NAMES) == checks.module_names()
    orders = [checks.get(n).order for n in checks.CHECK_NAMES]
    assert orders == sorted(orders)
    clashes = sorted({o for o in orders if orders.count(o) > 1})
    assert not clashes, "two checks declare the same order %s: pick a free one" % clashes
    assert checks.CHECK_NAMES[0] == "ssh"  # nothing is known of a node without it


def test_needs_name_existing_checks_that_run_earlier():
    position = {n: i for i, n in enumerate(checks.CHECK_NAMES)}
    wrong = [
        "%s needs %s, which %s" % (name, dep, "does not exist" if dep not in position else "runs later")
        for name in checks.CHECK_NAMES
        for dep in checks.get(name).needs
        if position.get(dep, len(position)) >= position[name]
    ]
    assert not wrong, "\n".join(wrong)


def test_every_check_explains_itself():
    for name, check in checks.catalogue().items():
        for field in ("claim", "why", "fix"):
            assert getattr(check, field).strip(), "%s: empty %s" % (name, field)


def readme_table() -> str:
    with open(os.path.join(REPO, "README.md")) as fh:
        text = fh.read()
    start = text.index("\n", text.index("<!-- generated from the CHECK declarations")) + 1
    return text[start:text.index("<!-- end of the check table -->")]


def test_readme_check_table_matches_the_declarations():
    have, want = readme_table(), checks_markdown()
    if have != want:
        drift = [
            line[1:].split("|")[1].strip() if line.count("|") > 2 else line[1:]
            for line in difflib.ndiff(have.splitlines(), want.splitlines())
            if line.startswith("+ ")
        ]
        raise AssertionError(
            "README.md's check table drifted from the CHECK declarations (rows: %s); regenerate it with "
            "`preflight checks --markdown`" % ", ".join(drift)
        )


def test_checks_markdown_escapes_pipes_and_keeps_one_row_per_check():
    rows = checks_markdown().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == list(checks.CHECK_NAMES)
    assert all(r.count(" | ") == 3 for r in rows)


def test_every_bundled_module_imports_with_the_standard_library_alone(tmp_path):
    """python3 -I -S with only the bundle zip on sys.path: a stray top-level import fails here, not on a node."""
    path = tmp_path / "bundle.zip"
    path.write_bytes(bundle.base_zip())
    modules = [
        n[:-3].replace("/", ".").replace(".__init__", "")
        for n in zipfile.ZipFile(str(path)).namelist()
        if n.endswith(".py")
    ]
    assert "preflight.probe.runner" in modules and "preflight.checks.nic" in modules
    code = (
        "import importlib, sys\n"
        "sys.path[:] = [%r] + [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]\n"
        "for m in %r:\n"
        "    importlib.import_module(m)\n"
        "bad = [n for n, m in sys.modules.items() if getattr(m, '__file__', None) and 'site-packages' in m.__file__]\n"
        "assert not bad, bad\n"
        "print('ok', len(%r))\n" % (str(path), sorted(modules), modules)
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, cwd=str(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout


def test_the_bundle_holds_no_controller_only_module():
    names = zipfile.ZipFile(__import__("io").BytesIO(bundle.base_zip())).namelist()
    for controller in ("preflight/datanet.py", "preflight/allreduce/plan.py", "preflight/allreduce/run.py", "preflight/cli.py"):
        assert controller not in names

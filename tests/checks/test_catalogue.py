"""Guards on the catalogue: what adding a check must not forget, named when it is forgotten."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import zipfile

from preflight import checks
from preflight.transport import bundle
from preflight.model import Check
from tests.paths import REPO



def test_every_module_declares_a_check_named_after_it():
    wrong = []
    for name in checks.module_names():
        module = importlib.import_module("preflight.checks." + name)
        check = getattr(module, "CHECK", None)
        if not isinstance(check, Check):
            wrong.append("checks/%s/__init__.py exports no CHECK = Check(...)" % name)
        elif check.name != name:
            wrong.append("checks/%s/__init__.py declares CHECK.name %r: it must be the folder's name" % (name, check.name))
    assert not wrong, "\n".join(wrong)


def test_check_names_are_the_modules_in_declared_order():
    assert sorted(checks.CHECK_NAMES) == checks.module_names()
    orders = [checks.get(n).order for n in checks.CHECK_NAMES]
    assert orders == sorted(orders)
    clashes = sorted({o for o in orders if orders.count(o) > 1})
    assert not clashes, "two checks declare the same order %s: pick a free one" % clashes
    assert checks.CHECK_NAMES[0] == "ssh"  # nothing is known of a node without it


def test_a_declaration_is_data_and_the_folder_holds_the_code():
    """CHECK in checks/<name>/__init__.py binds no code (the catalogue binds it from the folder) and imports only
    the vocabulary (and the node-side library, where two checks share one Setting), so reading every declaration
    stays cheap; rule.py has rule(), probe.py probe(), stage.py run()."""
    wrong = []
    for name in checks.module_names():
        declared = checks.entry(name)
        for field in ("probe", "rule", "plan", "prepare", "crossnode"):
            if getattr(declared, field) is not None:
                wrong.append("checks/%s/__init__.py: CHECK.%s is set; define it in the folder's %s.py instead" % (
                    name, field, {"probe": "probe", "crossnode": "stage"}.get(field, "rule")))
        folder = os.path.join(REPO, "preflight", "checks", name)
        with open(os.path.join(folder, "__init__.py")) as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module not in ("__future__", "preflight.model", "preflight.probe"):
                wrong.append("checks/%s/__init__.py:%d imports %s: a declaration imports only preflight.model and preflight.probe" % (
                    name, node.lineno, node.module))
            elif isinstance(node, ast.Import):
                wrong.append("checks/%s/__init__.py:%d imports %s: a declaration imports only preflight.model" % (
                    name, node.lineno, ", ".join(a.name for a in node.names)))
        bound = checks.get(name)
        if not os.path.isfile(os.path.join(folder, "rule.py")):
            wrong.append("checks/%s has no rule.py with rule(view)" % name)
        if checks.has_probe(name) != (bound.probe is not None):
            wrong.append("checks/%s/probe.py defines no probe(ctx)" % name)
        if checks.has_stage(name) != (bound.crossnode is not None):
            wrong.append("checks/%s/stage.py defines no run(...)" % name)
    assert not wrong, "\n".join(wrong)


def test_help_and_node_import_only_the_checks_they_run(tmp_path):
    """`preflight --help` and `preflight checks` import no check's code (declarations only); `preflight node --only
    ssh` ssh's alone."""
    script = tmp_path / "mods.py"
    script.write_text(
        "import runpy, sys\n"
        "sys.argv = ['preflight'] + sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module('preflight', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('MODS %s\\n' % ','.join(sorted(m for m in sys.modules if m.count('.') > 2 and m.startswith('preflight.checks.'))))\n")
    bundle.base_zip()  # built once per source change (it reads every probe); what is measured is a run
    env = dict(os.environ, PYTHONPATH=REPO)
    for argv, want in ((["--help"], ""), (["checks"], ""), (["checks", "--markdown"], ""),
                       (["node", "--only", "ssh"], "preflight.checks.ssh.probe,preflight.checks.ssh.rule")):
        out = subprocess.run([sys.executable, str(script)] + argv, env=env, capture_output=True, text=True, timeout=120)
        mods = [line for line in out.stderr.splitlines() if line.startswith("MODS ")]
        assert mods == ["MODS " + want], (argv, out.stderr[-2000:])


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
    for controller in ("preflight/derived/datanet.py", "preflight/checks/allreduce/plan.py", "preflight/checks/allreduce/stage.py", "preflight/cli/__init__.py"):
        assert controller not in names


# --- check settings: declared on the Check, validated by the inventory from the catalogue ------------------


def test_settings_are_well_formed_and_clash_with_no_run_key():
    from preflight import inventory
    from preflight.model import SETTING_KINDS, Setting

    wrong = []
    for name, check in checks.catalogue().items():
        for s in check.settings:
            if not isinstance(s, Setting):
                wrong.append("%s: settings holds %r, not a Setting" % (name, s))
                continue
            where = "%s: setting %s" % (name, s.key)
            if s.kind not in SETTING_KINDS:
                wrong.append("%s: kind %r is none of %s" % (where, s.kind, ", ".join(SETTING_KINDS)))
            if s.kind in ("int", "number") and not s.low < s.high:
                wrong.append("%s: give its range (low < high)" % where)
            parts = s.key.split(".")
            if not (len(parts) == 1 or (len(parts) == 2 and parts[0] == "expect")) or not all(p.isidentifier() for p in parts):
                wrong.append("%s: a key is `name` (under cluster:) or `expect.name`" % where)
            if parts[0] in inventory.CLUSTER_KEYS and len(parts) == 1:
                wrong.append("%s: %r is the run's own cluster key" % (where, s.key))
            if not s.doc.strip():
                wrong.append("%s: empty doc" % where)
    assert not wrong, "\n".join(wrong)


def test_a_key_two_checks_read_is_declared_alike():
    first = {}
    wrong = []
    for name, check in checks.catalogue().items():
        for s in check.settings:
            if s.key in first and first[s.key][1] != s:
                wrong.append("%s and %s declare %s differently: declare it alike (one shared Setting)" % (first[s.key][0], name, s.key))
            first.setdefault(s.key, (name, s))
    assert not wrong, "\n".join(wrong)
    assert checks.readers("xid_window_s") == ["xid", "ib_errors"]


#: what a rule may read from the view that no inventory key of a check supplies: the run's own keys
#: (inventory.CLUSTER_KEYS) and what the engine or the CLI adds (the previous run's report for --history,
#: --dcgm-level)
ENGINE_KEYS = ("previous", "dcgm_level", "tier")


def test_every_inventory_key_a_check_reads_is_declared_on_it():
    """A rule reading view.expect["x"] / view.cluster.get("x") (or prepare's cluster.get("x")) must declare it:
    otherwise the inventory refuses the key the check asks users to write."""
    import re

    from preflight import inventory

    pattern = re.compile(r"""\b(view\.expect|view\.cluster|cluster)(?:\.get\(|\[)\s*["'](\w+)["']""")
    wrong = []
    for name, check in checks.catalogue().items():
        folder = os.path.join(REPO, "preflight", "checks", name)
        source = ""
        for part in sorted(os.listdir(folder)):
            if part.endswith(".py"):
                with open(os.path.join(folder, part)) as fh:
                    source += fh.read()
        declared = {s.key for s in check.settings}
        for holder, key in sorted(set(pattern.findall(source))):
            full = "expect." + key if holder.endswith("expect") else key
            if full.startswith("expect.") or (key not in inventory.CLUSTER_KEYS and key not in ENGINE_KEYS):
                if full not in declared:
                    wrong.append("checks/%s reads %s but its CHECK declares no Setting(%r, ...)" % (name, full, full))
    assert not wrong, "\n".join(wrong)


def _valid(setting):
    return {"bool": True, "int": int(setting.low), "number": setting.high, "version": "1.2.3",
            "paths": ["/shared//a/"]}[setting.kind]


def _inventory_text(setting, value):
    import yaml

    key = setting.key.split(".")
    cluster = {key[0]: {key[1]: value}} if len(key) == 2 else {key[0]: value}
    return yaml.safe_dump({"cluster": cluster, "nodes": ["n1"]}, default_flow_style=False)


def test_the_inventory_accepts_every_declared_setting_by_its_kind_and_defaults_the_rest(tmp_path):
    from preflight import inventory

    for key, setting in checks.settings().items():
        path = tmp_path / (key + ".yaml")
        path.write_text(_inventory_text(setting, _valid(setting)))
        inv = inventory.load(str(path))
        got = inv.expect[key.split(".")[1]] if key.startswith("expect.") else inv.cluster[key]
        assert got == ({"paths": ["/shared/a"]}.get(setting.kind, _valid(setting))), (key, got)
    bare = tmp_path / "bare.yaml"
    bare.write_text("nodes: [n1]\n")
    inv = inventory.load(str(bare))
    assert inv.expect == {}
    for key, setting in checks.settings().items():
        if "." not in key:
            assert inv.cluster[key] == (list(setting.default) if isinstance(setting.default, tuple) else setting.default), key


def test_a_wrong_kind_for_any_declared_setting_is_one_located_line(tmp_path, capsys):
    from tests.builders import assert_one_located_line

    for key, setting in checks.settings().items():
        bad = {"bool": "yes please", "int": "many", "number": "fast", "version": ["1"], "paths": "relative/dir"}[setting.kind]
        text = _inventory_text(setting, bad)
        line = text.splitlines().index(next(l for l in text.splitlines() if l.strip().startswith(key.split(".")[-1] + ":"))) + 1
        assert_one_located_line(tmp_path, capsys, text, line, key.split(".")[-1] if setting.kind != "paths" else "absolute")


def test_an_undeclared_check_key_is_refused_with_a_suggestion(tmp_path, capsys):
    from tests.builders import assert_one_located_line

    assert_one_located_line(tmp_path, capsys, "cluster:\n  shared_path: [/x]\nnodes: [n1]\n", 2, "did you mean 'shared_paths'")
    assert_one_located_line(tmp_path, capsys, "cluster:\n  expect:\n    mtus: 9000\nnodes: [n1]\n", 3, "did you mean 'mtu'")

"""Guards for the package's shape (ARCHITECTURE.md, "Layout" and "Imports point one way").

Read from the sources with `ast`, nothing is imported: every `import`/`from … import` in preflight/,
module level or inside a function (a lazy import is still a dependency), becomes an edge between
modules. Each test names the offending file and line, so a failure says what to move.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest
from tests.paths import REPO

ROOT = REPO
PKG = os.path.join(ROOT, "preflight")

# Modules allowed past MAX_LINES, each with the reason it reads better whole.
MAX_LINES = 600
LONG_OK = {
    "preflight/probe/bench_agent.py": "one job (the rank supervisor) with its protocol written at the top",
}

# Third-party packages and the only places allowed to import them.
CONFINED = {
    "fabric": ("preflight/transport/",),
    "paramiko": ("preflight/transport/",),
    "invoke": ("preflight/transport/",),
    "rich": ("preflight/cli/", "preflight/output/report.py"),
    "pynvml": ("preflight/probe/",),
    "torch": ("preflight/probe/",),
}

# What travels to the nodes in the probe bundle: standard library (and preflight's node modules) only.
NODE_SIDE = ("preflight/__init__.py", "preflight/common.py", "preflight/model.py", "preflight/probe/",
             "preflight/checks/__init__.py")


def node_side(rel: str) -> bool:
    """What travels to the nodes: the vocabulary, probe/, the catalogue, and each check's declaration and probe."""
    parts = rel.split("/")
    in_check = len(parts) == 4 and parts[1] == "checks" and parts[3] in ("__init__.py", "probe.py")
    return rel.startswith(NODE_SIDE) or rel in NODE_SIDE or in_check


def check_of(mod: str) -> Optional[str]:
    """The check a module belongs to (preflight.checks.<name>[.part]), None outside check folders."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["preflight", "checks"] else None
NODE_OPTIONAL = {"pynvml", "torch"}  # imported lazily on the node, where present


def _modules() -> Dict[str, str]:
    """{dotted module name: path relative to ROOT} for every .py file under preflight/."""
    out = {}
    for dirpath, _dirs, files in os.walk(PKG):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            dotted = rel[:-3].replace(os.sep, ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[: -len(".__init__")]
            out[dotted] = rel
    return out


MODULES = _modules()


def _tree(rel: str) -> ast.Module:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        return ast.parse(fh.read(), rel)


def _resolve(current: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from X import …` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    is_pkg = MODULES.get(current, "").endswith("__init__.py")
    base = current.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The statements that run when the module is imported: the body, into if/try, not into functions."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            todo.extend(stmt for h in getattr(node, "handlers", []) for stmt in h.body)


def imports(mod: str, import_time_only: bool = False) -> Iterator[Tuple[int, str, Optional[str]]]:
    """(line, imported module, imported name or None) for every import in module `mod` (or only those
    that run when it is imported: the rule halves of checks import controller code inside functions)."""
    tree = _tree(MODULES[mod])
    for node in (_top_level(tree) if import_time_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(mod, node)
            for alias in node.names:
                sub = "%s.%s" % (target, alias.name)
                if sub in MODULES:
                    yield node.lineno, sub, None  # `from pkg import module`
                else:
                    yield node.lineno, target, alias.name


def _edges() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {m: set() for m in MODULES}
    for mod in MODULES:
        for _line, target, _name in imports(mod):
            if target in MODULES and target != mod:
                graph[mod].add(target)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_init(target: str, mod: str) -> bool:
    """A package's __init__ imported by its own submodule (`from preflight import checks` inside checks/x)."""
    return mod.startswith(target + ".")


def test_no_import_circle():
    graph = _edges()
    # a submodule importing its own package's __init__ is how packages work, not a circle between jobs
    for mod, targets in graph.items():
        graph[mod] = {t for t in targets if not _is_package_init(t, mod)}
    circles = _cycles(graph)
    assert not circles, "import circles (make the dependency point one way): " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_check_imports_another_check():
    """A check's folder imports its own parts, never another check's or the catalogue: what two checks share
    belongs in preflight/probe/ (node side) or preflight/derived/ (controller side)."""
    wrong = []
    for mod in MODULES:
        mine = check_of(mod)
        if mine is None:
            continue
        for line, target, _name in imports(mod):
            theirs = check_of(target)
            if theirs is not None and theirs != mine:
                wrong.append("%s:%d imports %s (shared code belongs in preflight/probe/ or preflight/derived/)"
                             % (MODULES[mod], line, target))
            elif target == "preflight.checks":
                wrong.append("%s:%d imports the catalogue (a check must not reach its siblings)" % (MODULES[mod], line))
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_no_private_name_crosses_a_module():
    wrong = []
    for mod in MODULES:
        for line, target, name in imports(mod):
            if target.startswith("preflight") and target != mod and name and name.startswith("_") and name != "__version__":
                wrong.append("%s:%d imports private %s.%s" % (MODULES[mod], line, target, name))
        # `import preflight.x as m` / `from preflight import m` then `m._private`
        aliases = {}
        for node in ast.walk(_tree(MODULES[mod])):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, node)
                for alias in node.names:
                    if "%s.%s" % (target, alias.name) in MODULES:
                        aliases[alias.asname or alias.name] = "%s.%s" % (target, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(_tree(MODULES[mod])):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != mod):
                wrong.append("%s:%d uses private %s.%s" % (MODULES[mod], node.lineno, aliases[node.value.id], node.attr))
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_third_party_packages_stay_in_their_layer():
    wrong = []
    for mod, rel in MODULES.items():
        for line, target, _name in imports(mod):
            top = target.split(".")[0]
            allowed = CONFINED.get(top)
            if allowed is not None and not rel.startswith(allowed):
                wrong.append("%s:%d imports %s (only %s may)" % (rel, line, top, ", ".join(allowed)))
    assert not wrong, "\n".join(wrong)


def test_node_side_code_needs_only_the_standard_library():
    """What the bundle imports on a node (module level) is the standard library and node modules only."""
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for mod, rel in MODULES.items():
        if not node_side(rel):
            continue
        for line, target, _name in imports(mod, import_time_only=True):
            top = target.split(".")[0]
            if top in stdlib or top in NODE_OPTIONAL or top == "__future__":
                continue
            if top == "preflight" and node_side(MODULES.get(target, "")):
                continue
            wrong.append("%s:%d imports %s, which the nodes do not have" % (rel, line, target))
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("rel", sorted(MODULES.values()))
def test_module_is_one_job(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        lines = sum(1 for _ in fh)
    if rel in LONG_OK:
        return
    assert lines <= MAX_LINES, "%s has %d lines (> %d): it is usually two jobs; split it by job, or add it to LONG_OK with the reason" % (
        rel, lines, MAX_LINES)


def test_disk_layout_is_the_import_layout():
    """No package-dir mapping: every package under preflight/ is the folder of the same name."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        text = fh.read()
    assert "package-dir" not in text
    for dirpath, dirs, files in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if any(f.endswith(".py") for f in files):
            assert "__init__.py" in files, "%s has modules but no __init__.py" % os.path.relpath(dirpath, ROOT)


# --- layers: one declared order, like import-linter's layers contract ---------------------------------------

#: The layers, lowest first. A module may import its own layer and the layers below, never one above: a
#: back-arrow fails here with the file and line. Patterns are tried in order (the first that matches names the
#: layer), so a check folder's declaration, probe and stage are placed before the folder's other modules.
LAYERS = (
    ("vocabulary", ("preflight/__init__.py", "preflight/model.py", "preflight/common.py", "preflight/errors.py",
                    "preflight/located_yaml.py")),
    ("node side", ("preflight/probe/*", "preflight/checks/__init__.py", "preflight/checks/*/__init__.py",
                   "preflight/checks/*/probe.py")),
    ("inventory", ("preflight/inventory.py",)),
    ("derived", ("preflight/derived/*",)),
    ("stages", ("preflight/checks/*/stage.py",)),  # placed here for matching order; ranked below
    ("rules", ("preflight/checks/*/*",)),
    ("transport", ("preflight/transport/*", "preflight/slurm/*", "preflight/k8s/*")),
    ("engine", ("preflight/engine.py",)),
    ("actions, outputs, history", ("preflight/actions/*", "preflight/output/*", "preflight/history/*")),
    ("cli", ("preflight/cli/*", "preflight/__main__.py")),
)
#: the order the layers stand in (LAYERS lists stages early only so that stage.py matches before rules' glob)
ORDER = ("vocabulary", "node side", "inventory", "derived", "rules", "transport", "stages", "engine",
         "actions, outputs, history", "cli")


def layer_of(rel: str) -> Optional[str]:
    """The layer of a module (its path relative to the repository), None when no pattern places it."""
    import fnmatch

    for name, patterns in LAYERS:
        if any(fnmatch.fnmatchcase(rel, p) for p in patterns):
            return name
    return None


def back_arrows() -> List[str]:
    """Every import (module level or inside a function) from a module to one in a higher layer."""
    wrong = []
    for mod, rel in sorted(MODULES.items()):
        here = layer_of(rel)
        for line, target, _name in imports(mod):
            there = layer_of(MODULES.get(target, ""))
            if here and there and ORDER.index(there) > ORDER.index(here):
                wrong.append("%s:%d imports %s: layer %r may not import %r (move the shared code down a layer)"
                             % (rel, line, target, here, there))
    return wrong


def test_every_module_has_a_layer():
    unplaced = [rel for rel in MODULES.values() if layer_of(rel) is None]
    assert not unplaced, "place these in tests/test_structure.py LAYERS: %s" % ", ".join(sorted(unplaced))


def test_imports_point_down_the_layers():
    wrong = back_arrows()
    assert not wrong, "\n".join(wrong)


def test_a_planted_back_arrow_is_caught(monkeypatch):
    """The guard itself fails: a derived module importing a check's rule, and a rule importing the CLI."""
    planted = {"preflight.derived.datanet": [(1, "preflight.checks.ib_hca.rule", None)],
               "preflight.checks.mtu.rule": [(1, "preflight.cli", None)]}
    real = imports
    monkeypatch.setitem(globals(), "imports", lambda mod, *a: list(real(mod, *a)) + planted.get(mod, []))
    found = back_arrows()
    assert any("derived/datanet.py:1 imports preflight.checks.ib_hca.rule" in w for w in found), found
    assert any("mtu/rule.py:1 imports preflight.cli:" in w for w in found), found


# --- functions stay short -----------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 80
#: functions past MAX_FUNCTION_LINES today, each with why it is still long: debt to split into named steps, not
#: a licence. A new long function fails; a listed one that shrinks below the limit must leave the list.
LONG_FUNCTIONS = {
    "preflight/checks/allreduce/rule.py:rank_findings": "the per-rank judgement: figures, sweep cut, stragglers, wording",
    "preflight/checks/fabric_manager/rule.py:_node": "one node's fabric states, NVSwitch and VM shapes",
    "preflight/checks/mtu/rule.py:rule": "reference, per-path judgement and the blame of one end",
    "preflight/checks/nccl_env/rule.py:rule": "reference env, per-node comparison and wording",
    "preflight/checks/ports/probe.py:_listen_claimed": "the head's listener and its claim in one socket lifetime",
    "preflight/checks/ports/rule.py:rule": "reference, per-node judgement and the head's overload evidence",
    "preflight/derived/datanet.py:choose": "the data-network choice: pinned, inventory, routes, majority",
    "preflight/derived/envfabric.py:gid": "NCCL_IB_GID_INDEX: the GID table's per-node agreement",
    "preflight/engine.py:run": "one run's phases in order (gather, derive, judge, cross-node, act)",
    "preflight/inventory.py:load": "the inventory's top-level keys, validated in file order",
    "preflight/slurm/allocation.py:allocate": "salloc, its wait and its failure modes",
    "preflight/slurm/fleet.py:_collect": "one srun step's output, parts and failures",
    "preflight/transport/ssh.py:run_bundle": "one SSH session's protocol: connect, send, read, deadline, kill",
}


def long_functions() -> Dict[str, int]:
    out = {}
    for rel in MODULES.values():
        for node in ast.walk(_tree(rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > MAX_FUNCTION_LINES:
                    out["%s:%s" % (rel, node.name)] = length
    return out


def test_functions_stay_short():
    found = long_functions()
    new = ["%s (%d lines)" % (k, v) for k, v in sorted(found.items()) if k not in LONG_FUNCTIONS]
    assert not new, ("over %d lines: split into named steps (reference, per-node judgement, wording): %s"
                     % (MAX_FUNCTION_LINES, "; ".join(new)))
    fixed = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not fixed, "now short (or gone): remove from LONG_FUNCTIONS: %s" % ", ".join(fixed)


def test_no_merge_conflict_marker_is_committed():
    """A merge left half-resolved (a `<<<<<<<` line in .ci/run breaks CI before one test runs) fails here by file
    and line, whatever the file type."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: %s" % listed.stderr.decode(errors="replace").strip())
    wrong = []
    for rel in listed.stdout.decode().split("\0"):
        path = os.path.join(ROOT, rel)
        if not rel or not os.path.isfile(path) or rel.startswith("tests/fixtures/"):
            continue
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, 1):
                if line.startswith((b"<<<<<<< ", b">>>>>>> ")):
                    wrong.append("%s:%d: %s" % (rel, number, line[:40].decode(errors="replace").rstrip()))
    assert not wrong, "merge conflict markers:\n" + "\n".join(wrong)

"""Guards for the package's shape (ARCHITECTURE.md, "Layout" and "Imports point one way").

Read from the sources with `ast` by tests/structure.py (the walker benchmarks/structure_metrics.py prints the
figures with), nothing is imported: every `import`/`from … import` in preflight/, module level or inside a
function (a lazy import is still a dependency), becomes an edge between modules. Each test names the
offending file and line, so a failure says what to move.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from typing import Dict, Iterator, List, Set, Tuple

import pytest
from tests.paths import REPO
from tests.structure import Shape, check_of

ROOT = REPO
PKG = os.path.join(ROOT, "preflight")

# Modules allowed past MAX_LINES, each with the reason it reads better whole.
MAX_LINES = 600
LONG_OK = {
    "preflight/probe/bench_agent.py": "one job (the rank supervisor) with its protocol written at the top",
    "preflight/probe/bench_worker.py": "one rank's program, sent whole as source on stdin (a split needs its own "
                                       "shipping, as bench_compute's), its protocol written at the top",
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
NODE_SIDE = ("preflight/__init__.py", "preflight/common.py", "preflight/model.py", "preflight/node_model.py", "preflight/probe/",
             "preflight/checks/__init__.py")


def node_side(rel: str) -> bool:
    """What travels to the nodes: the vocabulary, probe/, the catalogue, and each check's declaration and probe."""
    parts = rel.split("/")
    in_check = len(parts) == 4 and parts[1] == "checks" and parts[3] in ("__init__.py", "probe.py")
    return rel.startswith(NODE_SIDE) or rel in NODE_SIDE or in_check


NODE_OPTIONAL = {"pynvml", "torch"}  # imported lazily on the node, where present


#: this checkout's modules, imports, layers and functions (tests/structure.py: the walker the figures use too)
SHAPE = Shape(ROOT)
MODULES = SHAPE.modules


def _tree(rel: str) -> ast.Module:
    return SHAPE.tree(rel)


def imports(mod: str, import_time_only: bool = False):
    """(line, imported module, imported name or None) for every import in module `mod` (Shape.imports)."""
    return SHAPE.imports(mod, import_time_only)


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
    graph = SHAPE.edges()
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
                target = SHAPE.resolve(mod, node)
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

# The layers, lowest first, are tests/structure.py's LAYERS and ORDER (the figures read the same table).


def layer_of(rel: str):
    """The layer of a module (its path relative to the repository), None when no pattern places it."""
    return SHAPE.layer_of(rel)


def test_every_module_has_a_layer():
    unplaced = [rel for rel in MODULES.values() if layer_of(rel) is None]
    assert not unplaced, "place these in tests/structure.py LAYERS: %s" % ", ".join(sorted(unplaced))


def test_imports_point_down_the_layers():
    wrong = SHAPE.back_arrows()
    assert not wrong, "\n".join(wrong)


def test_a_planted_back_arrow_is_caught(monkeypatch):
    """The guard itself fails: a derived module importing a check's rule, and a rule importing the CLI."""
    planted = {"preflight.derived.datanet": [(1, "preflight.checks.ib_hca.rule", None)],
               "preflight.checks.mtu.rule": [(1, "preflight.cli", None)]}
    real = SHAPE.imports
    monkeypatch.setattr(SHAPE, "imports", lambda mod, *a: list(real(mod, *a)) + planted.get(mod, []))
    found = SHAPE.back_arrows()
    assert any("derived/datanet.py:1 imports preflight.checks.ib_hca.rule" in w for w in found), found
    assert any("mtu/rule.py:1 imports preflight.cli:" in w for w in found), found


# --- functions stay short -----------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 80
#: functions past MAX_FUNCTION_LINES today, each with why it is still long: debt to split into named steps, not
#: a licence. A new long function fails; a listed one that shrinks below the limit must leave the list.
LONG_FUNCTIONS = {
    "preflight/slurm/allocation.py:allocate": "salloc, its wait and its failure modes",
    "preflight/slurm/fleet.py:_collect": "one srun step's output, parts and failures",
}


def long_functions() -> Dict[str, int]:
    return SHAPE.long_functions(MAX_FUNCTION_LINES)


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


# --- every file a docstring or comment cites exists ------------------------------------------------------------

#: a path as prose cites one: folders and a file name with its extension (`tests/sim/slurm.py`, `checks/xid/rule.py`)
CITED = re.compile(r"(?<![\w./-])([\w-]+(?:/[\w.-]+)+\.(?:py|md|json|sh|yaml|toml))")


def _bases() -> List[str]:
    """The folders a citation may start from: the root, preflight/, preflight/checks/ and tests/."""
    return [ROOT, PKG, os.path.join(PKG, "checks"), os.path.join(ROOT, "tests")]


def missing_citations(text: str, here: str) -> List[str]:
    """The paths `text` (written in the folder `here`) cites that are ours and do not exist. A path is ours when
    its first folder is preflight, tests, benchmarks or a folder of preflight/, preflight/checks/ or tests/, so
    another project's file named in a citation (NVIDIA/NVSentinel docs/nic-health-monitor.md) is not judged."""
    ours = {"preflight", "tests", "benchmarks"}  # not docs/: other projects' docs/ are cited by the same name
    for base in _bases()[1:]:
        ours.update(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    ours.discard("docs")  # tests/docs/ is ours, but a cited docs/... is another project's (ours are checked by tests/docs)
    missing = []
    for path in CITED.findall(text):
        if path.split("/")[0] not in ours:
            continue
        if not any(os.path.exists(os.path.join(base, path)) for base in _bases() + [here]):
            missing.append(path)
    return missing


def _prose(rel: str) -> Iterator[Tuple[int, str]]:
    """(line, text) of every comment and docstring of a source file."""
    import io
    import tokenize

    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        source = fh.read()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_every_file_a_docstring_or_comment_cites_exists():
    """A citation that outlived a move (a check's module named after the check became a folder) points readers
    nowhere: named here by file and line, with the path to correct."""
    wrong = []
    for top in ("preflight", "tests"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "fixtures")]
            for name in sorted(f for f in files if f.endswith(".py")):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                for line, text in _prose(rel):
                    wrong.extend("%s:%d cites %s, which does not exist" % (rel, line, p)
                                 for p in missing_citations(text, dirpath))
    assert not wrong, "\n".join(wrong)


def test_a_stale_citation_is_caught_and_another_projects_file_is_not():
    here = os.path.join(ROOT, "tests")
    assert missing_citations("see checks/xid.py and tests/sim/slurm.py", here) == ["checks/xid.py"]
    assert missing_citations("as preflight/derived/nowhere.py derives it", here) == ["preflight/derived/nowhere.py"]
    assert missing_citations("NVIDIA/NVSentinel docs/nic-health-monitor.md, torch/version.py", here) == []


# --- the walk of a rule's facts (the figure benchmarks/structure_metrics.py prints) ----------------------------


def test_a_rules_walk_follows_calls_and_callbacks_and_counts_a_climb(monkeypatch):
    gpu_memory = SHAPE.walk("gpu_memory")
    assert gpu_memory.stops[0] == "preflight.checks.gpu_memory.rule:rule"
    assert "preflight.derived.gpus:per_health_node" in gpu_memory.stops and gpu_memory.climbs == []
    nccl_env = SHAPE.walk("nccl_env")
    # datanet.of hands choose to view.derive: a callback is a stop though nothing calls it by name
    assert "preflight.derived.datanet:choose" in nccl_env.stops, nccl_env.stops
    real = SHAPE.rank
    # planted: derived/ ranked above the rules, so the rule reading gpus climbs a layer
    monkeypatch.setattr(SHAPE, "rank", lambda rel: 99 if rel.startswith("preflight/derived/") else real(rel))
    climbs = SHAPE.walk("gpu_memory").climbs
    assert climbs == ["preflight.checks.gpu_memory.rule:rule -> preflight.derived.gpus:per_health_node"], climbs

"""Print the shape figures of a preflight checkout: back-arrows, in-function imports, long functions, bundle size.

    python3 benchmarks/structure_metrics.py [ROOT]      (ROOT: a checkout, default this one)

Read from the sources with `ast` (nothing of ROOT is imported except to build the bundle), so it measures an
old checkout as well as this one, side by side:

    back-arrows       imports (module level or inside a function) from a module to one in a higher layer,
                      with the layers of tests/test_structure.py (LAYERS below maps the older flat tree too)
    in-function       distinct (file, imported preflight module) pairs whose import sits inside a function
    functions > 80    functions and methods longer than 80 lines (decorators and docstring included)
    check -> check    a check's code importing another check's
    bundle            the probe bundle's size in bytes (python3 -c 'import preflight.transport.bundle ...')
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Dict, Iterator, List, Optional, Tuple

#: (path prefix, layer) in the order tried: the first prefix that matches names a file's layer. Lower layers
#: are imported by higher ones, never the reverse. The older flat tree's top-level modules are mapped to the
#: layer their job belongs to, so an old checkout is measured against the same order.
LAYERS: List[Tuple[str, int]] = [
    ("preflight/__init__.py", 0), ("preflight/model.py", 0), ("preflight/common.py", 0), ("preflight/errors.py", 0),
    ("preflight/located_yaml.py", 0),
    ("preflight/probe/", 1), ("preflight/checks/__init__.py", 1), ("preflight/check_index.py", 1),
    ("preflight/inventory.py", 2),
    ("preflight/derived/", 3), ("preflight/datanet.py", 3), ("preflight/gpus.py", 3), ("preflight/rails.py", 3),
    ("preflight/nvls.py", 3), ("preflight/output/envfabric.py", 3), ("preflight/output/envvars.py", 3),
    ("preflight/allreduce/run.py", 6), ("preflight/allreduce/", 4),
    ("preflight/transport/", 5), ("preflight/slurm/", 5), ("preflight/k8s/", 5),
    ("preflight/engine.py", 7),
    ("preflight/actions/", 8), ("preflight/output/", 8), ("preflight/history/", 8),
    ("preflight/cli", 9), ("preflight/nodecheck.py", 9), ("preflight/__main__.py", 9),
]
#: inside a check folder: the declaration and probe are node side (1), the rule and the modules it reads are
#: controller side (4), a stage (the cross-node run, which drives a transport) 6
CHECK_PARTS = {"__init__.py": 1, "probe.py": 1, "stage.py": 6}


def layer(rel: str) -> Optional[int]:
    """The layer of a file (path relative to ROOT), None when it is outside every layer."""
    parts = rel.split("/")
    if rel.startswith("preflight/checks/") and len(parts) == 4:
        return CHECK_PARTS.get(parts[3], 4)
    if rel.startswith("preflight/checks/") and len(parts) == 3 and rel != "preflight/checks/__init__.py":
        return 4  # the older tree: one module holds a check's probe and rule; judged as its rule
    for prefix, value in LAYERS:
        if rel.startswith(prefix):
            return value
    return None


def modules(root: str) -> Dict[str, str]:
    """{dotted name: path relative to root} of every module under root/preflight."""
    out = {}
    for dirpath, dirs, files in os.walk(os.path.join(root, "preflight")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                dotted = rel[:-3].replace(os.sep, ".")
                out[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = rel
    return out


def imports(tree: ast.Module, mod: str, mods: Dict[str, str]) -> Iterator[Tuple[int, str, bool]]:
    """(line, imported preflight module, inside a function) for every import of a preflight module."""
    def walk(node: ast.AST, in_def: bool) -> Iterator[Tuple[int, str, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = in_def or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, alias.name, in_def
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = mod.split(".") if mods.get(mod, "").endswith("__init__.py") else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - child.level + 1] + ([base] if base else []))
                for alias in child.names:
                    sub = base + "." + alias.name
                    yield child.lineno, sub if sub in mods else base, in_def
            yield from walk(child, inner)

    for line, target, in_def in walk(tree, False):
        if target.split(".")[0] == "preflight":
            while target not in mods and "." in target:
                target = target.rsplit(".", 1)[0]
            yield line, target, in_def


def check_of(rel: str) -> Optional[str]:
    parts = rel.split("/")
    if rel.startswith("preflight/checks/") and rel != "preflight/checks/__init__.py":
        return parts[2][:-3] if len(parts) == 3 else parts[2]
    return None


def measure(root: str) -> Dict[str, object]:
    mods = modules(root)
    back, in_function, long_fns, check_deps = [], set(), [], set()
    for mod, rel in sorted(mods.items()):
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), rel)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > 80:
                    long_fns.append("%s:%s %d" % (rel, node.name, node.end_lineno - first + 1))
        for line, target, in_def in imports(tree, mod, mods):
            if target == mod or target not in mods:
                continue
            if in_def:
                in_function.add((rel, target))
            here, there = layer(rel), layer(mods[target])
            if here is not None and there is not None and there > here:
                back.append("%s:%d -> %s" % (rel, line, target))
            mine, theirs = check_of(rel), check_of(mods[target])
            if mine and theirs and mine != theirs:
                check_deps.add("%s -> %s" % (mine, theirs))
    return {"back": back, "in_function": sorted(in_function), "long": long_fns, "check_deps": sorted(check_deps),
            "bundle": bundle_size(root), "modules": len(mods)}


def bundle_size(root: str) -> Optional[int]:
    code = "import preflight.transport.bundle as b; print(len(b.build_zip()) if hasattr(b, 'build_zip') else len(b._build_zip()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root, PREFLIGHT_CACHE_DIR=os.devnull))
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def main(argv: List[str]) -> int:
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    m = measure(root)
    print("checkout            %s" % root)
    print("modules             %d" % m["modules"])
    print("back-arrows         %d" % len(m["back"]))
    for line in m["back"]:
        print("    " + line)
    print("in-function imports %d (distinct file -> preflight module)" % len(m["in_function"]))
    print("functions > 80      %d" % len(m["long"]))
    for line in m["long"]:
        print("    " + line)
    print("check -> check      %d %s" % (len(m["check_deps"]), ", ".join(m["check_deps"])))
    print("bundle bytes        %s" % m["bundle"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

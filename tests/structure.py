"""The shape of a preflight checkout, read from its sources with `ast` (nothing of it is imported).

One walker for the guards (tests/test_structure.py) and the figures (benchmarks/structure_metrics.py, which
measures an older checkout with the same code, side by side):

    imports         every `import`/`from … import` in preflight/, module level or inside a function (a lazy
                    import is still a dependency), resolved to the preflight module it names
    layers          LAYERS and ORDER: the declared order; back_arrows() lists every import pointing up it
    long functions  functions and methods longer than a limit (decorators and docstring included)
    walks           walk(check): from a check's rule(view), every preflight function it reaches through calls
                    and function references (a callback handed to view.derive counts), static and depth-first

A walk's stops are the distinct functions reached (the rule included), its files the distinct files they
live in, its climbs the calls on it whose callee stands in a higher layer than its caller (a fact read by
going back up the layers, the back-arrow of a call), its depth the longest chain of calls.
"""

from __future__ import annotations

import ast
import fnmatch
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

#: The layers, lowest first. A module may import its own layer and the layers below, never one above: a
#: back-arrow fails tests/test_structure.py with the file and line. Patterns are tried in order (the first that
#: matches names the layer), so a check folder's declaration, probe and stage are placed before the folder's
#: other modules.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("vocabulary", ("preflight/__init__.py", "preflight/model.py", "preflight/node_model.py", "preflight/common.py", "preflight/errors.py",
                    "preflight/located_yaml.py")),
    ("node side", ("preflight/probe/*", "preflight/checks/__init__.py", "preflight/checks/*/__init__.py",
                   "preflight/checks/*/probe.py")),
    ("backend declarations", ("preflight/transport/backends.py",)),  # data, read by the inventory and the parser
    ("inventory", ("preflight/inventory.py",)),
    ("derived", ("preflight/derived/*",)),
    ("stages", ("preflight/checks/*/stage.py",)),  # placed here for matching order; ranked below
    ("rules", ("preflight/checks/*/*",)),
    ("actions", ("preflight/actions/*",)),  # the drain policy: pure, over findings; the appliers sit in transport
    ("transport", ("preflight/transport/*", "preflight/slurm/*", "preflight/k8s/*")),
    ("engine", ("preflight/engine.py",)),
    ("outputs, history", ("preflight/output/*", "preflight/history/*")),
    ("cli", ("preflight/cli/*", "preflight/__main__.py")),
)
#: the order the layers stand in (LAYERS lists stages early only so that stage.py matches before rules' glob)
ORDER = ("vocabulary", "node side", "backend declarations", "inventory", "derived", "rules", "actions", "transport",
         "stages", "engine", "outputs, history", "cli")

Layers = Sequence[Tuple[str, Sequence[str]]]


def modules(root: str) -> Dict[str, str]:
    """{dotted module name: path relative to root} for every .py file under root/preflight."""
    out = {}
    for dirpath, dirs, files in os.walk(os.path.join(root, "preflight")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            dotted = rel[:-3].replace("/", ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[: -len(".__init__")]
            out[dotted] = rel
    return out


def check_of(mod: str) -> Optional[str]:
    """The check a module belongs to (preflight.checks.<name>[.part]), None outside check folders."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["preflight", "checks"] else None


@dataclass
class Walk:
    """A rule's walk: its stops in depth-first order, and the calls on it that climb a layer."""

    check: str
    stops: List[str]
    files: List[str]
    climbs: List[str]
    depth: int

    def line(self) -> str:
        return "%s: %d stops in %d files, %d climbs, %d deep" % (self.check, len(self.stops), len(self.files),
                                                                 len(self.climbs), self.depth)


class Shape:
    """One checkout's modules, imports, layers and functions. `before`/`after` are extra (layer, patterns)
    tried before/after LAYERS: an older tree's modules mapped onto today's layers (benchmarks/structure_metrics.py)."""

    def __init__(self, root: str, before: Layers = (), after: Layers = ()) -> None:
        self.root = root
        self.modules = modules(root)
        self.layers = list(before) + list(LAYERS) + list(after)
        self._trees: Dict[str, ast.Module] = {}
        self._names: Dict[str, Dict[str, Tuple[str, Optional[str]]]] = {}
        self._functions: Optional[Dict[str, Tuple[str, ast.AST]]] = None
        self._calls: Dict[str, List[str]] = {}

    # ------------------------------------------------------------------------------------------- imports

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            with open(os.path.join(self.root, rel), encoding="utf-8") as fh:
                self._trees[rel] = ast.parse(fh.read(), rel)
        return self._trees[rel]

    def resolve(self, current: str, node: ast.ImportFrom) -> str:
        """The absolute module a `from X import …` names (relative imports resolved)."""
        if not node.level:
            return node.module or ""
        base = current.split(".")
        base = base if self.modules.get(current, "").endswith("__init__.py") else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    @staticmethod
    def top_level(tree: ast.Module) -> Iterator[ast.AST]:
        """The statements that run when the module is imported: the body, into if/try, not into functions."""
        todo = list(tree.body)
        while todo:
            node = todo.pop()
            yield node
            if isinstance(node, (ast.If, ast.Try)):
                todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
                todo.extend(stmt for h in getattr(node, "handlers", []) for stmt in h.body)

    def imports(self, mod: str, import_time_only: bool = False) -> Iterator[Tuple[int, str, Optional[str]]]:
        """(line, imported module, imported name or None) for every import in module `mod` (or only those
        that run when it is imported)."""
        tree = self.tree(self.modules[mod])
        for node in (self.top_level(tree) if import_time_only else ast.walk(tree)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                target = self.resolve(mod, node)
                for alias in node.names:
                    sub = "%s.%s" % (target, alias.name)
                    if sub in self.modules:
                        yield node.lineno, sub, None  # `from pkg import module`
                    else:
                        yield node.lineno, target, alias.name

    def edges(self) -> Dict[str, Set[str]]:
        """{module: the preflight modules it imports}."""
        graph: Dict[str, Set[str]] = {m: set() for m in self.modules}
        for mod in self.modules:
            for _line, target, _name in self.imports(mod):
                if target in self.modules and target != mod:
                    graph[mod].add(target)
        return graph

    def in_function_imports(self) -> List[Tuple[str, str]]:
        """Distinct (file, imported preflight module) pairs whose import sits inside a function."""
        found = set()
        for mod, rel in self.modules.items():
            for fn in ast.walk(self.tree(rel)):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.update((rel, t) for t in self._import_targets(mod, node) if t != mod)
        return sorted(found)

    def _import_targets(self, mod: str, node: ast.AST) -> List[str]:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = self.resolve(mod, node)
            names = ["%s.%s" % (base, a.name) if "%s.%s" % (base, a.name) in self.modules else base for a in node.names]
        out = []
        for name in names:
            while name not in self.modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in self.modules:
                out.append(name)
        return out

    # -------------------------------------------------------------------------------------------- layers

    def layer_of(self, rel: str) -> Optional[str]:
        """The layer of a module (its path relative to the repository), None when no pattern places it."""
        for name, patterns in self.layers:
            if any(fnmatch.fnmatchcase(rel, p) for p in patterns):
                return name
        return None

    def rank(self, rel: str) -> Optional[int]:
        layer = self.layer_of(rel)
        return None if layer is None else ORDER.index(layer)

    def back_arrows(self) -> List[str]:
        """Every import (module level or inside a function) from a module to one in a higher layer."""
        wrong: List[str] = []
        for mod, rel in sorted(self.modules.items()):
            here = self.rank(rel)
            for line, target in sorted({(line, target) for line, target, _name in self.imports(mod)}):
                there = self.rank(self.modules.get(target, ""))
                if here is not None and there is not None and there > here:
                    wrong.append("%s:%d imports %s: layer %r may not import %r (move the shared code down a layer)"
                                 % (rel, line, target, ORDER[here], ORDER[there]))
        return wrong

    def long_functions(self, limit: int) -> Dict[str, int]:
        """{"file:function": lines} of every function or method longer than `limit` lines."""
        out = {}
        for rel in self.modules.values():
            for node in ast.walk(self.tree(rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    length = node.end_lineno - first + 1
                    if length > limit:
                        out["%s:%s" % (rel, node.name)] = length
        return out

    def check_deps(self) -> List[str]:
        """"a -> b" for every check whose code imports another check's (an older tree's one-module checks too)."""
        found = set()
        for mod in self.modules:
            mine = check_of(mod)
            for _line, target, _name in self.imports(mod):
                theirs = check_of(target) if target in self.modules else None
                if mine and theirs and mine != theirs:
                    found.add("%s -> %s" % (mine, theirs))
        return sorted(found)

    # --------------------------------------------------------------------------------------------- walks

    def functions(self) -> Dict[str, Tuple[str, ast.AST]]:
        """{"module:function" or "module:Class.method": (file, node)} of every function in preflight/."""
        if self._functions is not None:
            return self._functions
        out: Dict[str, Tuple[str, ast.AST]] = {}
        for mod, rel in self.modules.items():
            for node in self.tree(rel).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out["%s:%s" % (mod, node.name)] = (rel, node)
                elif isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            out["%s:%s.%s" % (mod, node.name, item.name)] = (rel, item)
        self._functions = out
        return out

    def _names_of(self, mod: str) -> Dict[str, Tuple[str, Optional[str]]]:
        """{name bound in mod: (module, symbol or None for the module itself)}: its imports and its own defs."""
        if mod in self._names:
            return self._names[mod]
        names: Dict[str, Tuple[str, Optional[str]]] = {}
        tree = self.tree(self.modules[mod])
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = (alias.name, None)
                    else:
                        names[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = self.resolve(mod, node)
                for alias in node.names:
                    sub = "%s.%s" % (base, alias.name)
                    names[alias.asname or alias.name] = (sub, None) if sub in self.modules else (base, alias.name)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = (mod, node.name)
        self._names[mod] = names
        return names

    def _symbol(self, mod: str, name: str, funcs: Dict[str, Tuple[str, ast.AST]], hops: int = 0) -> Optional[str]:
        """The function `name` means in module `mod`, following re-exports (`from x import f` in a package)."""
        if "%s:%s" % (mod, name) in funcs:
            return "%s:%s" % (mod, name)
        if mod not in self.modules or hops > 5:
            return None
        bound = self._names_of(mod).get(name)
        if bound is None or bound == (mod, name) or bound[1] is None:
            return None
        return self._symbol(bound[0], bound[1], funcs, hops + 1)

    def _reference(self, mod: str, cls: Optional[str], expr: ast.AST, funcs) -> Optional[str]:
        """The preflight function an expression (a name or a dotted attribute chain) refers to, if any."""
        chain: List[str] = []
        while isinstance(expr, ast.Attribute):
            chain.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        chain.reverse()
        if expr.id == "self" and cls and len(chain) == 1:
            key = "%s:%s.%s" % (mod, cls, chain[0])
            return key if key in funcs else None
        bound = self._names_of(mod).get(expr.id)
        if bound is None:
            return None
        target, symbol = bound
        if symbol is not None:
            return self._symbol(target, symbol, funcs) if not chain else None
        while len(chain) > 1 and "%s.%s" % (target, chain[0]) in self.modules:
            target = "%s.%s" % (target, chain.pop(0))
        return self._symbol(target, chain[0], funcs) if len(chain) == 1 else None

    def calls(self, key: str, funcs: Dict[str, Tuple[str, ast.AST]]) -> List[str]:
        """The preflight functions `key` calls or hands on as a reference, in source order, once each."""
        if key in self._calls:
            return self._calls[key]
        rel, fn = funcs[key]
        mod, qual = key.split(":")
        cls = qual.split(".")[0] if "." in qual else None
        found: List[Tuple[int, int, str]] = []
        for node in ast.walk(fn):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                target = self._reference(mod, cls, node, funcs)
                if target and target != key:
                    found.append((node.lineno, node.col_offset, target))
        out: List[str] = []
        for _line, _col, target in sorted(found):
            if target not in out:
                out.append(target)
        self._calls[key] = out
        return out

    def walk(self, check: str) -> Optional[Walk]:
        """The walk of a check's rule (None when the check has no rule function)."""
        funcs = self.functions()
        start = next((k for k in ("preflight.checks.%s.rule:rule" % check, "preflight.checks.%s:rule" % check)
                      if k in funcs), None)
        if start is None:
            return None
        stops: List[str] = []
        climbs: List[str] = []
        depth = 0
        todo: List[Tuple[str, Optional[str], int]] = [(start, None, 1)]
        while todo:
            key, caller, level = todo.pop()
            if key in stops:
                continue
            stops.append(key)
            depth = max(depth, level)
            if caller is not None:
                here, there = self.rank(funcs[caller][0]), self.rank(funcs[key][0])
                if here is not None and there is not None and there > here:
                    climbs.append("%s -> %s" % (caller, key))
            todo.extend((callee, key, level + 1) for callee in reversed(self.calls(key, funcs)) if callee not in stops)
        files = sorted({funcs[k][0] for k in stops})
        return Walk(check, stops, files, climbs, depth)

    def checks(self) -> List[str]:
        """The check names of this checkout: folders (or, in an older tree, modules) under preflight/checks."""
        return sorted({check_of(m) for m in self.modules if check_of(m)})

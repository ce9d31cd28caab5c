"""The check catalogue: every folder here is one check, found by discovery (no list to edit).

    preflight/checks/<name>/
        __init__.py   CHECK, the declaration (preflight.model.Check: name, claim, why, fix, needs, settings, ...);
                      data only, cheap to import: the catalogue, the CLI and the docs read it directly
        probe.py      probe(ctx) -> facts: the node half, standard library only (+ pynvml), and its parsers;
                      shipped to the nodes in the probe bundle
        rule.py       rule(view) -> [Finding]: the controller half, pure; optionally plan(view) (a phase-2
                      check's per-node probe configs) and prepare(settings, node, is_head) (a phase-1 config)
        stage.py      optional: run(...) and summary(...), a test run across the nodes after the node checks
                      (the all-reduce); its rule judges what it gathered

The catalogue is every such folder, in the order its CHECK declares: adding a check is adding its folder (and
its fixtures); tests/checks/test_catalogue.py names what a new one forgot. Standard library only: this module travels
to the nodes with the declarations and probes (preflight.transport.bundle), though only the controller lists
the folders.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Dict, List, Sequence

from preflight.model import Check, CrossNode, Setting

#: the code parts a check folder may hold, each a module of that name
PARTS = ("probe", "rule", "stage")

_declarations: List[Dict[str, Check]] = []
_loaded: Dict[str, Check] = {}


def module_names() -> List[str]:
    """The check folders in this package, by name."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(n for n in os.listdir(here)
                  if not n.startswith(("_", ".")) and os.path.isfile(os.path.join(here, n, "__init__.py")))


def has_part(name: str, part: str) -> bool:
    """True when check `name` has a `part` module (probe, rule or stage), found without importing it."""
    return importlib.util.find_spec("%s.%s.%s" % (__name__, name, part)) is not None


def has_probe(name: str) -> bool:
    """A probe runs on the nodes for this check."""
    return has_part(name, "probe")


def has_stage(name: str) -> bool:
    """A cross-node test runs for this check after the node checks."""
    return has_part(name, "stage")


def entries() -> Dict[str, Check]:
    """Every check's declaration (CHECK, no code imported), in CHECK_NAMES order: the order checks run and report."""
    if not _declarations:
        found = [importlib.import_module("%s.%s" % (__name__, name)).CHECK for name in module_names()]
        _declarations.append({c.name: c for c in sorted(found, key=lambda c: (c.order, c.name))})
    return _declarations[0]


def entry(name: str) -> Check:
    """The declaration of check `name` (KeyError: no such check)."""
    return entries()[name]


def __getattr__(name: str) -> object:
    """CHECK_NAMES: stable check names, in the order they run and are reported."""
    if name == "CHECK_NAMES":
        return tuple(entries())
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def get(name: str) -> Check:
    """Check `name` with its code bound (controller side): the declaration plus probe, rule, plan, prepare and
    crossnode read from its folder's probe.py, rule.py and stage.py."""
    if name not in _loaded:
        declared = entry(name)
        rule = importlib.import_module("%s.%s.rule" % (__name__, name))
        code = {"rule": rule.rule, "plan": getattr(rule, "plan", None), "prepare": getattr(rule, "prepare", None)}
        if has_probe(name):
            code["probe"] = importlib.import_module("%s.%s.probe" % (__name__, name)).probe
        if has_stage(name):
            stage = importlib.import_module("%s.%s.stage" % (__name__, name))
            code["crossnode"] = CrossNode(run=stage.run, summary=getattr(stage, "summary", None),
                                          warm=getattr(stage, "warm", None))
        _loaded[name] = dataclasses.replace(declared, **code)
    return _loaded[name]


def catalogue() -> Dict[str, Check]:
    """Every check with its code bound, in CHECK_NAMES order (imports every check's rule)."""
    return {name: get(name) for name in entries()}


def closure(names: Sequence[str]) -> List[str]:
    """The selected checks plus every check their rules need, in CHECK_NAMES order."""
    table = entries()
    wanted = set(names)
    todo = list(names)
    while todo:
        for dep in table[todo.pop()].needs:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [n for n in table if n in wanted]


def settings() -> Dict[str, Setting]:
    """Every inventory key a check declares ({"mtu_full_mesh": Setting, "expect.mtu": Setting, ...}), sorted.

    Two checks may read one key (xid and ib_errors: xid_window_s); they declare it alike, which
    tests/checks/test_catalogue.py guards, and the first declaration (in CHECK_NAMES order) is the one used.
    """
    out: Dict[str, Setting] = {}
    for check in entries().values():
        for setting in check.settings:
            out.setdefault(setting.key, setting)
    return dict(sorted(out.items()))


def readers(key: str) -> List[str]:
    """The checks that declare inventory key `key`, in CHECK_NAMES order."""
    return [name for name, c in entries().items() if any(s.key == key for s in c.settings)]

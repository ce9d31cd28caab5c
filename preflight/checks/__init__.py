"""The check catalogue. One module per check; each exports CHECK (a preflight.model.Check).

Standard library only at import time: these modules travel to the
nodes in the probe bundle (their probe halves run there), and the controller imports the same files
for their rule halves.

The catalogue is every module here (not starting with "_"), in the order its CHECK declares: adding a
check is adding its module (and its fixtures); tests/test_catalogue.py names what a new one forgot.
CHECK_NAMES is computed on first use, on the controller only (the nodes never need it).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List, Tuple

from preflight.model import Check, Setting

_names: List[Tuple[str, ...]] = []


def module_names() -> List[str]:
    """The check modules in this package, by file name."""
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(n[:-3] for n in os.listdir(here) if n.endswith(".py") and not n.startswith("_"))


def _discover() -> Tuple[str, ...]:
    found = [importlib.import_module(__name__ + "." + name).CHECK for name in module_names()]
    return tuple(c.name for c in sorted(found, key=lambda c: (c.order, c.name)))


def __getattr__(name: str) -> Any:
    """CHECK_NAMES: stable check names, in the order they run and are reported."""
    if name == "CHECK_NAMES":
        if not _names:
            _names.append(_discover())
        return _names[0]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def get(name: str) -> Check:
    """The CHECK declared by module preflight.checks.<name>."""
    if name not in __getattr__("CHECK_NAMES"):
        raise KeyError(name)
    return importlib.import_module(__name__ + "." + name).CHECK


def catalogue() -> Dict[str, Check]:
    """Every check, in CHECK_NAMES order."""
    return {name: get(name) for name in __getattr__("CHECK_NAMES")}


def closure(names: List[str]) -> List[str]:
    """The selected checks plus every check their rules need, in CHECK_NAMES order."""
    wanted = set(names)
    todo = list(names)
    while todo:
        for dep in get(todo.pop()).needs:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [n for n in __getattr__("CHECK_NAMES") if n in wanted]


def settings() -> Dict[str, Setting]:
    """Every inventory key a check declares ({"mtu_full_mesh": Setting, "expect.mtu": Setting, ...}), sorted.

    Two checks may read one key (xid and ib_errors: xid_window_s); they declare it alike, which
    tests/test_catalogue.py guards, and the first declaration (in CHECK_NAMES order) is the one used.
    """
    out: Dict[str, Setting] = {}
    for check in catalogue().values():
        for setting in check.settings:
            out.setdefault(setting.key, setting)
    return dict(sorted(out.items()))


def readers(key: str) -> List[str]:
    """The checks that declare inventory key `key`, in CHECK_NAMES order."""
    return [name for name, check in catalogue().items() if any(s.key == key for s in check.settings)]

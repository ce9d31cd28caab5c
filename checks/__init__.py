"""The check catalogue. One module per check; each exports CHECK (a preflight.model.Check).

Installed as `preflight.checks`. Standard library only at import time: these modules travel to the
nodes in the probe bundle (their probe halves run there), and the controller imports the same files
for their rule halves.
"""

from __future__ import annotations

import importlib
from typing import Dict, List

from preflight.model import Check

#: Stable check names, in the order they run and are reported.
CHECK_NAMES = (
    "ssh",
    "gpu",
    "driver",
    "fabric_manager",
    "xid",
    "nic",
    "ib_hca",
    "gpudirect",
    "topology",
    "mtu",
    "ports",
    "allreduce",
)


def get(name: str) -> Check:
    """The CHECK declared by module preflight.checks.<name>."""
    if name not in CHECK_NAMES:
        raise KeyError(name)
    return importlib.import_module("preflight.checks." + name).CHECK


def catalogue() -> Dict[str, Check]:
    """Every check, in CHECK_NAMES order."""
    return {name: get(name) for name in CHECK_NAMES}


def closure(names: List[str]) -> List[str]:
    """The selected checks plus every check their rules need, in CHECK_NAMES order."""
    wanted = set(names)
    todo = list(names)
    while todo:
        for dep in get(todo.pop()).needs:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return [n for n in CHECK_NAMES if n in wanted]

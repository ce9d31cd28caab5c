"""A small runner for the fixture format in tests/fixtures/<check>/<case>.json (until the shared one lands).

"input" names a file beside the json (its text is passed) or a directory ({relative path: text} of every
file under it is passed, so parsers of sysfs trees stay pure); "args" are extra positional arguments.
"""

from __future__ import annotations

import glob
import importlib
import json
import os

from tests.recorded import fixture_dir


def cases(check: str):
    return sorted(glob.glob(os.path.join(fixture_dir(check), "*.json")))


def load_input(path: str, case: dict):
    if "stdout" in case:
        return case["stdout"]
    src = os.path.join(os.path.dirname(path), case["input"])
    if os.path.isdir(src):
        tree = {}
        for root, _dirs, files in os.walk(src):
            for name in files:
                full = os.path.join(root, name)
                with open(full) as fh:
                    tree[os.path.relpath(full, src)] = fh.read()
        return tree
    with open(src) as fh:
        return fh.read()


def run_case(check: str, path: str):
    """(parse function, its input, the case) for one fixture json."""
    with open(path) as fh:
        case = json.load(fh)
    if "input" not in case and "stdout" not in case:
        case["input"] = os.path.splitext(os.path.basename(path))[0] + ".txt"
    module = importlib.import_module("preflight.checks." + check)
    return getattr(module, case["parser"]), load_input(path, case), case

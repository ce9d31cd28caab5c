"""Run tests/fixtures/<check>/<case>.json cases (the shared fixture format) against checks/<check>.py.

{"parser": name, "command": ..., "source": ..., "input": file or directory beside the json,
 "expected": facts | "error": substring of the ParseError}. A file input is passed as its text, a
directory as {file name: text} (a sysfs directory such as ports/1/counters/).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, List

import pytest

from preflight.model import ParseError

FIXTURES = Path(__file__).parent / "fixtures"


def cases(check: str) -> List[Any]:
    return [pytest.param(p, id=p.stem) for p in sorted((FIXTURES / check).glob("*.json"))]


def load_input(case: Path) -> Any:
    doc = json.loads(case.read_text())
    target = case.parent / doc["input"]
    if target.is_dir():
        return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.is_file()}
    data = target.read_bytes()
    return data.decode("utf-8", errors="replace")


def run(check: str, case: Path) -> None:
    doc = json.loads(case.read_text())
    for key in ("parser", "command", "source", "input"):
        assert doc.get(key), "%s: missing %r" % (case.name, key)
    assert ("expected" in doc) != ("error" in doc), "%s: give expected or error" % case.name
    parser = getattr(importlib.import_module("preflight.checks." + check), doc["parser"])
    given = load_input(case)
    if "error" in doc:
        with pytest.raises(ParseError) as info:
            parser(given)
        assert doc["error"] in str(info.value)
    else:
        assert parser(given) == doc["expected"]


def assert_good_and_bad(check: str, parsers: List[str]) -> None:
    """Every parse_* function of the check has at least one good and one bad case."""
    seen = {}
    for case in sorted((FIXTURES / check).glob("*.json")):
        doc = json.loads(case.read_text())
        seen.setdefault(doc["parser"], set()).add("error" if "error" in doc else "expected")
    for name in parsers:
        assert seen.get(name) == {"error", "expected"}, (name, seen.get(name))

"""Reading recorded fixtures: tests/fixtures/<probe>/<case>.<ext> beside <case>.json (command + expected)."""

from __future__ import annotations

import json
import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture_dir(probe: str) -> str:
    return os.path.join(FIXTURES, probe)


def meta(path: str) -> dict:
    """The side .json of a recorded output: the command that produced it and the expected facts/error."""
    with open(os.path.splitext(path)[0] + ".json") as fh:
        return json.load(fh)


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()

"""`preflight checks`: every check with what it reads on a node, how long it takes, its default action, and
what each action means."""

from __future__ import annotations

import io
import contextlib

from preflight import checks, cli
from preflight.model import ACTION_MEANINGS, ACTIONS

#: Checks whose declaration does not say yet what it reads and how long it takes (their modules are being
#: restructured elsewhere): declare Check(reads=..., takes=...) there and remove the name here.
PENDING: set = set()


def test_every_check_says_what_it_reads_and_how_long_it_takes():
    missing = {n for n, c in checks.catalogue().items() if not (c.reads.strip() and c.takes.strip())}
    assert missing - PENDING == set(), "declare reads= and takes= in the CHECK of: %s" % sorted(missing - PENDING)
    assert PENDING - missing == set(), "these now declare reads/takes: remove them from PENDING: %s" % sorted(PENDING - missing)


def test_every_action_has_a_meaning():
    assert list(ACTION_MEANINGS) == list(ACTIONS)


def test_the_listing_shows_reads_time_action_and_the_action_legend(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["checks"]) == 0
    text = out.getvalue()
    for name, check in checks.catalogue().items():
        row = next((line for line in text.splitlines() if line.strip().startswith(name + " ")), None)
        assert row is not None, "no row for %s" % name
        assert check.action in row and (check.takes or "?") in row, row
    assert "dcgmi diag -r LEVEL -j, where dcgmi is installed" in text and "1 s window" in text
    for action, meaning in ACTION_MEANINGS.items():
        assert "%-10s %s" % (action, meaning) in text

"""Every recorded parser case under tests/fixtures (format: tests/fixture_cases.py), and the guards on them."""

from __future__ import annotations

import inspect
import os
import re

import pytest

from preflight import checks
from preflight.model import ParseError
from tests import fixture_cases as fc

CASES = list(fc.case_files())


@pytest.mark.parametrize("path", CASES, ids=fc.case_id)
def test_case(path, tmp_path, monkeypatch):
    doc = fc.load(path)
    assert ("expected" in doc) != ("error" in doc), "%s: give expected or error, not both or neither" % path
    parser, args, env = fc.prepare(path, doc, str(tmp_path / "bin"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if "error" in doc:
        # a parse_* function fails only with ParseError; a probe fails with whatever its node state raises
        with pytest.raises(ParseError if doc["parser"].startswith("parse_") else Exception, match=doc["error"]):
            parser(*args)
    else:
        assert fc.as_json(parser(*args)) == doc["expected"]


# ------------------------------------------------------------------------------------------------ guards


def parse_functions():
    """(check, name) of every parse_* function the check folders define (probe.py, rule.py, stage.py)."""
    out = []
    for name in checks.CHECK_NAMES:
        for module in fc.check_modules(name):
            for fname, fn in inspect.getmembers(module, inspect.isfunction):
                if fname.startswith("parse_") and fn.__module__ == module.__name__:
                    out.append((name, fname))
    assert out, "no parse_* function found in any check folder: the guard below would check nothing"
    return out


def test_every_parser_has_a_good_and_a_bad_case():
    kinds = {}
    for path in CASES:
        doc = fc.load(path)
        kinds.setdefault((fc.check_of(path), doc["parser"]), set()).add("bad" if "error" in doc else "good")
    missing = [
        "%s.%s: no %s case" % (check, fname, kind)
        for check, fname in parse_functions()
        for kind in ("good", "bad")
        if kind not in kinds.get((check, fname), set())
    ]
    assert not missing, "add tests/fixtures/<check>/<case>.json cases:\n" + "\n".join(missing)


def test_every_case_is_well_formed():
    problems = []
    for path in CASES:
        doc = fc.load(path)
        where = os.path.relpath(path, fc.ROOT)
        if fc.find_parser(fc.check_of(path), doc["parser"])[1] is None:
            problems.append("%s: %s is not a function of checks/%s/" % (where, doc["parser"], fc.check_of(path)))
        for key in ("command", "source"):
            if not doc.get(key):
                problems.append("%s: no %r" % (where, key))
        unknown = set(doc) - fc.KEYS
        if unknown:
            problems.append("%s: unknown keys %s" % (where, sorted(unknown)))
        if "input" in doc and not os.path.exists(fc.input_path(path, doc)):
            problems.append("%s: input %s does not exist" % (where, doc["input"]))
        if "error" in doc:
            re.compile(doc["error"])
    assert not problems, "\n".join(problems)


def test_no_fixture_in_an_old_convention():
    """A json directly in tests/fixtures/<check>/ is a case, an input named by one, or a recorded NVML session."""
    named = {fc.input_path(p, fc.load(p)) for p in CASES if "input" in fc.load(p)}
    stray = []
    for check in sorted(os.listdir(fc.ROOT)):
        base = os.path.join(fc.ROOT, check)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if not name.endswith(".json") or path in CASES or path in named:
                continue
            doc = fc.load(path)
            if not (isinstance(doc, dict) and "answers" in doc):
                stray.append(os.path.relpath(path, fc.ROOT))
    assert not stray, "not in the fixture format (see tests/fixture_cases.py): %s" % stray


def test_the_runner_fails_a_wrong_expectation(tmp_path, monkeypatch):
    """The runner can fail: a case whose expected facts are wrong does not pass."""
    path = next(p for p in CASES if fc.check_of(p) == "mtu" and "expected" in fc.load(p))
    doc = fc.load(path)
    parser, args, _env = fc.prepare(path, doc, str(tmp_path / "bin"))
    wrong = dict(doc["expected"], received=-1)
    assert fc.as_json(parser(*args)) != wrong


def test_replayed_commands_answer_only_what_was_recorded(tmp_path, monkeypatch):
    snapshot = tmp_path / "node"
    snapshot.mkdir()
    (snapshot / "commands.json").write_text('[{"argv": ["ip", "-j", "addr", "show"], "rc": 0, "stdout": "[]", "stderr": ""}]')
    assert fc.install_replay(str(snapshot), str(tmp_path / "bin")) == ["ip"]
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    from preflight.probe.context import NodeContext

    ctx = NodeContext(sysfs_root=str(snapshot))
    ok = ctx.run(["ip", "-j", "addr", "show"])
    assert (ok.rc, ok.stdout) == (0, "[]")
    other = ctx.run(["ip", "-j", "link", "show"])
    assert other.rc == 127 and "no recorded result" in other.stderr

"""The fixture format: one JSON file per parser case, under tests/fixtures/<check>/<case>.json.

    {
      "parser":  "parse_ping",            a function of the check's folder, preflight/checks/<check>/ (probe.py
                                         first, then rule.py, stage.py: parse_*, probe, ...)
      "command": "ping -M do -s 8972 ...", what produced the input on a node
      "source":  "...",                    where the format / the sample comes from
      "description": "...",                optional: what the case shows
      one input:
        "input": "<file>"                  a file beside the json: parser(text, *args)
        "input": "<dir>"                   a node snapshot: parser(NodeContext(sysfs_root=...)); the
                                           sysfs root is <dir>/sys when it exists, else <dir>;
                                           <dir>/commands.json, when present, holds recorded command
                                           results [{argv, rc, stdout | stdout_file, stderr}] that are
                                           replayed by executables on PATH (the interface a probe
                                           really uses);
                                           "env" sets environment variables for the probe
        "text": "..." | null               an inline file content (a short sysfs attribute; null: unreadable)
        "stdout"/"stderr"/"rc"/"argv"      an inline command result: parser(stdout, stderr, rc)
      "rc": N                              with a file input: the exit status of the command
      "config": {...}                      with a node snapshot: the probe's configuration (ctx.config)
      "args": [...]                        optional extra positional arguments; "@NAME" is the check
                                           module's attribute NAME (a table such as ib_hca.STATES)
      and one outcome:
        "expected": {...}                  the parser's result, compared as JSON (tuples are lists)
        "error": "..."                     a regular expression searched in the ParseError's message
                                           (for a probe, in the message of whatever it raised)
    }

Inputs may sit in a folder below the json ("gpu_node/ip-addr.json") or beside another check's cases
("../gpu/h100_hgx_550.xml"): a recording is kept once. `preflight check --capture DIR` writes node
snapshots in this format. Also here: `tests/fixtures/gpu/nvml_*.json` hold recorded NVML sessions
("answers"), replayed by tests/checks/test_gpu.py; they are not parser cases.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Dict, Iterator, List, Tuple

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

#: Keys a case may hold; anything else is a typo the guard test reports.
KEYS = {"parser", "command", "source", "description", "note", "input", "text", "stdout", "stderr", "rc", "argv",
        "args", "env", "config", "expected", "error"}


def case_files() -> Iterator[str]:
    """Every case json: tests/fixtures/<check>/**/<case>.json that is a JSON object with a "parser"."""
    for check in sorted(os.listdir(ROOT)):
        base = os.path.join(ROOT, check)
        if not os.path.isdir(base):
            continue
        for dirpath, _dirs, files in sorted(os.walk(base)):
            for name in sorted(files):
                if name.endswith(".json"):
                    path = os.path.join(dirpath, name)
                    doc = load(path)
                    if isinstance(doc, dict) and "parser" in doc:
                        yield path


def load(path: str) -> Any:
    with open(path) as fh:
        return json.load(fh)


def check_of(path: str) -> str:
    return os.path.relpath(path, ROOT).split(os.sep)[0]


def case_id(path: str) -> str:
    return os.path.splitext(os.path.relpath(path, ROOT))[0]


def expected(check: str, case: str) -> Any:
    """The expected facts of tests/fixtures/<check>/<case>.json (for rule tests that start from them)."""
    return load(os.path.join(ROOT, check, case + ".json"))["expected"]


def fixture_dir(check: str) -> str:
    return os.path.join(ROOT, check)


def meta(path: str) -> Dict[str, Any]:
    """The case json beside a recorded input (<case>.<ext> -> <case>.json)."""
    return load(os.path.splitext(path)[0] + ".json")


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def input_path(path: str, doc: Dict[str, Any]) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(path), doc["input"]))


def resolve_args(module: Any, args: List[Any]) -> List[Any]:
    return [getattr(module, a[1:]) if isinstance(a, str) and a.startswith("@") else a for a in args]


REPLAY = """#!{python}
import json, os, sys
with open({commands!r}) as fh:
    recorded = json.load(fh)
for rec in recorded:
    if rec["argv"][1:] == sys.argv[1:] and os.path.basename(rec["argv"][0]) == {name!r}:
        if rec.get("stdout_file"):
            with open(os.path.join(os.path.dirname({commands!r}), rec["stdout_file"])) as fh:
                rec["stdout"] = fh.read()
        sys.stdout.write(rec.get("stdout") or "")
        sys.stderr.write(rec.get("stderr") or "")
        sys.exit(rec.get("rc", 0))
sys.stderr.write("%s: no recorded result for %r\\n" % ({name!r}, sys.argv[1:]))
sys.exit(127)
"""


def install_replay(snapshot: str, bindir: str) -> List[str]:
    """Executables in bindir that answer the snapshot's recorded commands; the program names."""
    commands = os.path.join(snapshot, "commands.json")
    if not os.path.exists(commands):
        return []
    names = sorted({os.path.basename(rec["argv"][0]) for rec in load(commands)})
    os.makedirs(bindir, exist_ok=True)
    for name in names:
        exe = os.path.join(bindir, name)
        with open(exe, "w") as fh:
            fh.write(REPLAY.format(python=sys.executable, commands=os.path.abspath(commands), name=name))
        os.chmod(exe, 0o755)
    return names


def check_modules(check: str) -> List[Any]:
    """The modules of check `check`'s folder that may hold a parser, node half first: probe.py, rule.py,
    stage.py (those that exist)."""
    from preflight import checks

    return [importlib.import_module("preflight.checks.%s.%s" % (check, part))
            for part in checks.PARTS if checks.has_part(check, part)]


def find_parser(check: str, name: str) -> Tuple[Any, Any]:
    """(module, function) for parser `name` of check `check`, looked up in its folder (check_modules); (None,
    None) when no module there defines it."""
    for module in check_modules(check):
        fn = getattr(module, name, None)
        if callable(fn):
            return module, fn
    return None, None


def prepare(path: str, doc: Dict[str, Any], bindir: str) -> Tuple[Any, List[Any], Dict[str, str]]:
    """(the parser function, its arguments, environment variables to set) for one case."""
    module, parser = find_parser(check_of(path), doc["parser"])
    if parser is None:
        raise LookupError("%s: no %s in preflight/checks/%s/" % (path, doc["parser"], check_of(path)))
    extra = resolve_args(module, doc.get("args") or [])
    env: Dict[str, str] = {}
    if "input" in doc:
        where = input_path(path, doc)
        if os.path.isdir(where):
            from preflight.probe.context import NodeContext

            sys_root = os.path.join(where, "sys")
            root = sys_root if os.path.isdir(sys_root) else where
            if install_replay(where, bindir):
                env["PATH"] = bindir
            env.update(doc.get("env") or {})
            return parser, [NodeContext(doc.get("config"), sysfs_root=root)] + extra, env
        with open(where, errors="replace") as fh:
            return parser, [fh.read()] + extra, env
    if "text" in doc:
        return parser, [doc["text"]] + extra, env
    if "stdout" in doc:
        return parser, [doc["stdout"], doc.get("stderr", ""), doc.get("rc")] + extra, env
    raise ValueError("%s: no input (input, text or stdout)" % path)


def as_json(value: Any) -> Any:
    """The value as it would travel: tuples become lists, keys strings."""
    return json.loads(json.dumps(value))

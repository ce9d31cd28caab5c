"""The user guide (docs/, mkdocs.yml) and README.md, its front page: nothing the code offers goes undocumented.

The generated tables match the declarations they come from; every command, option, inventory key and
Prometheus metric appears in the guide; every repository path it names exists; every page is in the nav (and
docs/incoming/, where other branches drop their notes, is not); `mkdocs build --strict` passes (links and
anchors included); README.md stays a front page whose two commands are the ones CI runs.

Run as a script, `python3 tests/docs/test_docs.py` rewrites the generated tables in place.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import importlib.util
import os
import re
import subprocess
import sys
from typing import Callable, Dict, Iterator, List, Tuple

if __name__ == "__main__":  # run as a script: the tree this file sits in, not an installed preflight
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pytest
import yaml

from preflight import checks, inventory
from preflight.output import markdown
from tests.paths import REPO

DOCS = os.path.join(REPO, "docs")

#: (page, the generated block's opening marker, its end marker, what generates it)
TABLES: List[Tuple[str, str, str, Callable[[], str]]] = [
    ("checks.md", "<!-- generated from the CHECK declarations", "<!-- end of the check table -->", markdown.checks_markdown),
    ("inventory.md", "<!-- generated from the Setting declarations", "<!-- end of the settings table -->",
     markdown.settings_markdown),
    ("history.md", "<!-- generated from inventory.HISTORY_SETTINGS", "<!-- end of the history settings table -->",
     markdown.history_markdown),
]


def read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def pages() -> List[str]:
    """The guide's pages (docs/incoming/ is not part of it), relative to docs/."""
    return sorted(os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
                  if not os.path.relpath(p, DOCS).startswith("incoming" + os.sep))


def guide() -> str:
    return "\n".join(read(os.path.join(DOCS, p)) for p in pages())


def mentioned(word: str, text: str) -> bool:
    """`word` occurs as a whole token (`--limit` is not found in `--limit-x`, `sizes` not in `busbw_sizes`)."""
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(word), text) is not None


def block(text: str, start: str, end: str) -> Tuple[int, int]:
    """Where the lines between the marker line starting `start` and the line `end` are in `text`."""
    begin = text.index("\n", text.index(start)) + 1
    return begin, text.index(end, begin)


# --- the generated tables --------------------------------------------------------------------------------


@pytest.mark.parametrize("page, start, end, generate", TABLES, ids=[t[0] for t in TABLES])
def test_generated_tables_match_their_declarations(page, start, end, generate):
    text = read(os.path.join(DOCS, page))
    begin, stop = block(text, start, end)
    have, want = text[begin:stop], generate()
    if have != want:
        rows = [line[2:].split("|")[1].strip().strip("`") for line in difflib.ndiff(have.splitlines(), want.splitlines())
                if line.startswith(("+ ", "- ")) and line.count("|") > 2]
        raise AssertionError("docs/%s's generated table drifted from its declarations (rows: %s); rewrite it with "
                             "`python3 tests/docs/test_docs.py`" % (page, ", ".join(sorted(set(rows))) or "order"))


def test_checks_markdown_escapes_pipes_and_keeps_one_row_per_check():
    rows = markdown.checks_markdown().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == list(checks.CHECK_NAMES)
    assert all(r.count(" | ") == 3 for r in rows)


def test_a_drifted_table_is_named_with_its_rows(tmp_path, monkeypatch):
    """The comparison itself can fail: a check table missing a row is caught and the row named."""
    page = tmp_path / "checks.md"
    text = read(os.path.join(DOCS, "checks.md"))
    page.write_text("\n".join(line for line in text.splitlines() if not line.startswith("| `nvls` |")) + "\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", str(tmp_path))
    with pytest.raises(AssertionError, match=r"docs/checks.md's generated table drifted .*rows: nvls\)"):
        test_generated_tables_match_their_declarations(*TABLES[0])


# --- nothing the code offers is left out -------------------------------------------------------------------


def options(parser: argparse.ArgumentParser, command: str = "preflight") -> Iterator[Tuple[str, str]]:
    """(command, option) for every option of every command; (command, '') for each command itself."""
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield command + " " + name, ""
                yield from options(sub, command + " " + name)
        else:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    yield command, option


def test_every_command_and_option_is_in_the_guide():
    from preflight.cli.parser import build_parser

    text = guide()
    missing = ["%s %s" % (command, option) if option else command
               for command, option in options(build_parser()) if not mentioned(option or command, text)]
    assert not missing, "not in docs/: %s (say what each does, on the page about its command)" % ", ".join(missing)


def test_every_check_and_inventory_key_is_in_the_guide():
    text = {page: read(os.path.join(DOCS, page)) for page in ("checks.md", "inventory.md", "history.md")}
    missing = ["check %s (docs/checks.md)" % n for n in checks.CHECK_NAMES if not mentioned("`%s`" % n, text["checks.md"])]
    keys = inventory.TOP_KEYS + inventory.NODE_KEYS + inventory.CLUSTER_KEYS + inventory.ALLREDUCE_KEYS
    missing += ["inventory key %s (docs/inventory.md)" % k for k in keys if not mentioned(k, text["inventory.md"])]
    missing += ["cluster.history.%s (docs/history.md)" % k for k in inventory.HISTORY_SETTINGS
                if not mentioned(k, text["history.md"])]
    assert not missing, "not in the guide: %s" % ", ".join(missing)


def test_every_prometheus_metric_is_in_the_guide():
    source = read(os.path.join(REPO, "preflight", "output", "prometheus.py"))
    metrics = sorted(set(re.findall(r"\"(preflight_[a-z0-9_]+)\"", source)))
    assert len(metrics) > 10, metrics  # the pattern still finds the metric names
    text = guide()
    missing = [m for m in metrics if not mentioned(m, text)]
    assert not missing, "metrics not in docs/outputs.md or docs/history.md: %s" % ", ".join(missing)


# --- what the guide names exists ---------------------------------------------------------------------------

#: a repository path in prose: a known top folder, then a file with an extension or a folder ending in /
PATH_RE = re.compile(r"(?<![\w/.-])((?:preflight|tests|benchmarks|inventory|\.ci)/[\w./<>{},*-]*)")


def named_paths(text: str) -> List[str]:
    out = []
    for path in PATH_RE.findall(text):
        path = path.rstrip(".,")
        if path.endswith("/") or "." in path.rsplit("/", 1)[-1]:  # not a label such as preflight/drained
            out.append(path)
    return sorted(set(out))


def exists(path: str) -> bool:
    """The path, or for a pattern (tests/fixtures/<check>/, allreduce/{tcpx,gib}_*) at least one match."""
    pattern = re.sub(r"<[^>]+>", "*", path)
    alternatives = re.match(r"(.*)\{([^}]*)\}(.*)", pattern)
    patterns = [alternatives.group(1) + a + alternatives.group(3) for a in alternatives.group(2).split(",")] \
        if alternatives else [pattern]
    return all(glob.glob(os.path.join(REPO, p)) for p in patterns)


def test_every_repository_path_the_guide_names_exists():
    text = guide() + read(os.path.join(REPO, "README.md"))
    paths = named_paths(text)
    assert "preflight/output/report.schema.json" in paths and "tests/fixtures/<check>/<case>.json" in paths
    assert named_paths("`preflight/drained` and preflight/nothing_here.py") == ["preflight/nothing_here.py"]
    missing = [p for p in paths if not exists(p)]
    assert not missing, "docs/ or README.md name paths that do not exist: %s (moved? say where now)" % ", ".join(missing)


def test_how_it_works_prints_the_layer_order_the_structure_test_enforces():
    from tests.structure import ORDER

    text = read(os.path.join(DOCS, "how-it-works.md"))
    printed = re.search(r"\n    (vocabulary <.*?)\n\n", text, re.S).group(1)
    layers = [re.sub(r"\(.*?\)", "", layer).strip() for layer in " ".join(printed.split()).split(" < ")]
    assert [sorted(layer.split(", ")) for layer in layers] == [sorted(layer.split(", ")) for layer in ORDER], (
        "docs/how-it-works.md's layer order is not tests/structure.py's ORDER: %s" % " < ".join(ORDER))


# --- the site ---------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's own tags (!relative) read as plain values."""


_Loader.add_multi_constructor("!", lambda loader, tag, node: None)


def nav_pages(nav) -> Iterator[str]:
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            if isinstance(value, list):
                yield from nav_pages(value)
            else:
                yield value


def test_every_page_is_in_the_nav_and_incoming_is_left_out():
    with open(os.path.join(REPO, "mkdocs.yml")) as fh:
        config = yaml.load(fh, Loader=_Loader)
    nav = list(nav_pages(config["nav"]))
    assert sorted(nav) == pages(), "mkdocs.yml's nav and docs/ differ: %s" % sorted(set(nav) ^ set(pages()))
    assert "incoming/" in config["exclude_docs"].split()
    assert config["validation"]["anchors"] == "warn"  # with --strict: a link to a missing heading fails


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="MkDocs and its Material theme are not installed: pip install -e '.[docs]'")
def test_the_guide_builds_with_mkdocs_strict(tmp_path):
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          os.path.join(REPO, "mkdocs.yml"), "--site-dir", str(site)],
                         cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert out.returncode == 0, out.stdout[-4000:]
    for page in pages():
        html = os.path.join(str(site), "" if page == "index.md" else page[:-3], "index.html")
        assert os.path.exists(html), "%s was not built" % page
    built = read(os.path.join(str(site), "inventory", "index.html"))
    assert "hgx-h100" in built and "--8&lt;--" not in built  # the example inventories were pulled in
    assert not os.path.exists(os.path.join(str(site), "incoming"))


# --- the front page -----------------------------------------------------------------------------------------


def test_the_readme_is_a_front_page_with_the_two_commands_ci_runs():
    readme = read(os.path.join(REPO, "README.md"))
    commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    assert commands[:2] == ["pip install . && preflight check",
                            "pip install torch==2.13.0 -e '.[test]' && python3 -m pytest -q"], commands[:2]
    ci = [line for line in read(os.path.join(REPO, ".ci", "run")).splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[1].split(" && ")[1], "the README's test command is not the one .ci/run runs"
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert sorted(set(l[5:] for l in links)) == pages(), "README.md's 'Read on' and docs/ differ"
    assert readme.count("\n") < 150, "README.md is the front page: what, quick start, one example, where to read on"


# --- python3 tests/docs/test_docs.py: rewrite the generated tables --------------------------------------------


def regenerate() -> Dict[str, bool]:
    """Rewrite every generated table in place; {page: whether it changed}."""
    changed = {}
    for page, start, end, generate in TABLES:
        path = os.path.join(DOCS, page)
        text = read(path)
        begin, stop = block(text, start, end)
        new = text[:begin] + generate() + text[stop:]
        changed[page] = new != text
        if changed[page]:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
    return changed


if __name__ == "__main__":
    for name, was in regenerate().items():
        print("docs/%s: %s" % (name, "rewritten" if was else "unchanged"))

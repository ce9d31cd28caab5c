"""The --html page (preflight.output.html): self-contained, every node-read value escaped, and rendered
by a real headless Chromium (Debian's `chromium`, tests/sim/browser.py) without a console error.

The load time of a 1,000-node page is measured by benchmarks/html_render.py, not asserted here.
"""

from __future__ import annotations

from html.parser import HTMLParser
import os
import re

import pytest

from preflight import cli
from preflight.history import queries
from preflight.history.db import History
from preflight.model import Finding, Status
from preflight.output import html
from tests import history_fleet
from tests.sim import fleet_report
from tests.sim.browser import Browser, chromium

needs_chromium = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (Debian package `chromium`; .ci/run installs it)")

HOSTILE_NAME = '<script>alert(1)</script>"x\'\x1b]52;c;AAAA\x07'
HOSTILE_MESSAGE = '<img src=x onerror="alert(2)"> \x1b[31mred\x1b[0m & </td></table><b>bold</b>'


class _Tags(HTMLParser):
    """Every start tag and its attributes, as a browser's tokenizer would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags(page: str):
    parser = _Tags()
    parser.feed(page)
    return parser.tags


def hostile_doc():
    names = ["gpu-01", HOSTILE_NAME, "gpu-03"]
    findings = fleet_report.findings_for(names, {
        HOSTILE_NAME: Finding("gpu", HOSTILE_NAME, Status.FAIL, HOSTILE_MESSAGE, expected="<b>", actual='"quoted"',
                              action="isolate", data={"note": "</pre><script>alert(3)</script>"})})
    section = fleet_report.allreduce_section(names, HOSTILE_NAME)
    return fleet_report.document(names, findings, section, inventory="<i>hosts</i>.yaml")


def test_page_loads_nothing_and_runs_nothing():
    page = html.render(fleet_report.fleet(16))
    found = tags(page)
    assert not [t for t, _a in found if t in ("script", "link", "img", "iframe", "object", "embed")]
    assert not [a for _t, a in found if "src" in a or any(k.startswith("on") for k in a)]
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page  # the CSP: even an escaping slip could neither run nor fetch


def test_hostile_node_text_is_escaped_everywhere():
    page = html.render(hostile_doc())
    found = tags(page)
    assert [t for t, _a in found if t in ("script", "img")] == []
    assert not [a for _t, a in found if any(k.startswith("on") for k in a)]
    assert "\x1b" not in page and "\x07" not in page  # terminal escapes shown as text, never sent raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;x&#x27;\\x1b]52;c;AAAA\\x07" in page
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt; \\x1b[31mred\\x1b[0m &amp; &lt;/td&gt;" in page
    assert "&lt;/pre&gt;&lt;script&gt;alert(3)" in page  # evidence data too
    assert "&lt;i&gt;hosts&lt;/i&gt;.yaml" in page  # the inventory path


def test_plain_names_are_shown_as_they_are():
    """The healthy twin: ordinary names and messages are not mangled by the escaping."""
    page = html.render(fleet_report.fleet(16))
    assert ">gpu-0004</a>" in page
    assert "GPU 3 (00000000:4E:00.0): Xid 79 (fallen off the bus)" in page
    assert "mlx5_2 port 1: symbol_error +1843 in 60 s" in page


def test_fleet_of_1000_is_folded_by_status():
    page = html.render(fleet_report.fleet(1000, failing=5))
    grid = page.split("<h2>failures</h2>")[0]
    assert re.search(r'<details open><summary><span class="badge fail">FAIL</span> 6 nodes', grid)
    assert re.search(r'<details><summary><span class="badge pass">PASS</span> 993 nodes: <span class="mono">gpu-\[', grid)
    assert grid.count('<li class="pass"') == 993  # every name is there, as text, behind the fold
    rounds = page.split("<h3>pair rounds</h3>")[1]
    assert "499 other groups of the screening (round 0) without a suspect" in rounds
    assert rounds.split("<details>")[0].count('class="hit"') == 2  # the suspect's screening pair and its round-1 pair


def _browse(tmp_path, doc, timelines=None, name="page.html"):
    path = tmp_path / name
    path.write_text(html.render(doc, timelines), encoding="utf-8")
    return str(path)


@needs_chromium
def test_chromium_renders_16_and_1000_nodes_without_errors(tmp_path):
    small = _browse(tmp_path, fleet_report.fleet(16), name="small.html")
    big = _browse(tmp_path, fleet_report.fleet(1000, failing=5), name="big.html")
    with Browser() as b:
        opened = b.open(small)
        assert opened["errors"] == []
        assert b.evaluate("document.querySelectorAll('.grid li.fail').length") == 3  # 2 + the slow node
        assert b.evaluate("document.querySelectorAll('.grid li').length") == 16
        assert b.evaluate("document.querySelectorAll('tr.hit').length") == 3  # per-node round + 2 pair groups
        shot = tmp_path / "small.png"
        b.screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        opened = b.open(big)
        assert opened["errors"] == []
        assert b.evaluate("document.querySelectorAll('.grid li').length") == 1000
        # the failing nodes open, the 993 passing ones folded behind their summary line
        assert b.evaluate("document.querySelector('.grid li.fail').closest('details').open") is True
        assert b.evaluate("document.querySelector('.grid li.pass').closest('details').open") is False


@needs_chromium
def test_chromium_sees_hostile_names_as_text(tmp_path):
    with Browser() as b:
        assert b.open(_browse(tmp_path, hostile_doc()))["errors"] == []
        assert b.evaluate("document.scripts.length + document.images.length") == 0
        text = b.evaluate("document.body.innerText")
        assert "<script>alert(1)</script>\"x'\\x1b]52;c;AAAA\\x07" in text
        assert '<img src=x onerror="alert(2)">' in text
        assert b.evaluate("document.title").startswith("preflight")


@needs_chromium
def test_harness_reports_a_blocked_script(tmp_path):
    """The error collection itself can fail: a script slipped into the page is blocked by the page's CSP
    and that refusal reaches the test as an error (so an empty error list means something)."""
    page = html.render(fleet_report.fleet(4)).replace("</body>", "<script>console.error('ran')</script></body>")
    path = tmp_path / "bad.html"
    path.write_text(page, encoding="utf-8")
    with Browser() as b:
        errors = b.open(str(path))["errors"]
    assert any("Content Security Policy" in e for e in errors), errors


def _history(tmp_path, nodes):
    """Five nightly runs: gpu-0002's Xid on nights 1 and 3, the rest clean."""
    with History(str(tmp_path / "h.sqlite")) as h:
        for day in range(5):
            faults = [history_fleet.xid("gpu-0002", 3)] if day in (1, 3) else []
            h.record(history_fleet.report(day, nodes, faults))
        return {n: queries.timeline(h, n, limit=html.HISTORY_RUNS) for n in nodes}


def test_recent_history_per_node(tmp_path):
    nodes = history_fleet.node_names(4)
    timelines = _history(tmp_path, nodes)
    doc = history_fleet.report(5, nodes, [history_fleet.xid("gpu-0002", 3)])
    page = html.render(doc, timelines)
    hist = page.split("<h2>recent history</h2>")[1]
    assert ">gpu-0002</a></td><td><span class=\"strip\">" in hist
    assert "2 of 5" in hist  # the two failing nights of the five recorded
    assert "3 nodes passed every recorded run: <span class=\"mono\">gpu-[0001,0003-0004]</span>" in hist
    card = page.split('id="node-1"')[1].split("</div>")[0]
    assert card.count("<tr><td class=\"nw\">2026-01-0") == 5 and "Xid 79" in card
    assert "recent history" not in html.render(doc)  # no database, no section


@needs_chromium
def test_history_page_renders(tmp_path):
    nodes = history_fleet.node_names(4)
    doc = history_fleet.report(5, nodes, [history_fleet.xid("gpu-0002", 3)])
    with Browser() as b:
        assert b.open(_browse(tmp_path, doc, _history(tmp_path, nodes)))["errors"] == []
        assert b.evaluate("document.querySelectorAll('.strip span.fail').length") == 4  # 2 nights, 2 strips


def test_html_option_writes_the_page_and_refuses_a_directory(tmp_path, capsys):
    out = tmp_path / "run.html"
    rc = cli.main(["check", "--only", "ssh", "--no-progress", "--html", str(out)])
    assert rc in (0, 1)
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<h2>nodes</h2>" in page
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"
    capsys.readouterr()
    assert cli.main(["check", "--only", "ssh", "--no-progress", "--html", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "preflight: error: cannot write %s: Is a directory; give --html a file path" % tmp_path


def test_history_command_writes_its_sections_as_a_page(tmp_path, capsys):
    nodes = history_fleet.node_names(3) + [HOSTILE_NAME]
    with History(str(tmp_path / "h.sqlite")) as h:
        for day in range(4):
            h.record(history_fleet.report(day, nodes, [history_fleet.xid(HOSTILE_NAME, 3)] if day % 2 else []))
    out = tmp_path / "history.html"
    assert cli.main(["history", str(tmp_path / "h.sqlite"), "--node", HOSTILE_NAME, "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert [t for t, _a in tags(page) if t in ("script", "img")] == []
    assert "<h2>timeline: &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<h2>flapping</h2><table>" in page and ".F.F" in page
    capsys.readouterr()
    assert cli.main(["history", str(tmp_path / "h.sqlite"), "--html", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("give --html a file path")
    if chromium() is not None:
        with Browser() as b:
            assert b.open(str(out))["errors"] == []
            assert "<script>alert(1)</script>" in b.evaluate("document.body.innerText")


def test_check_with_history_puts_each_nodes_runs_on_the_page(tmp_path):
    out, db = tmp_path / "run.html", str(tmp_path / "h.sqlite")
    for _ in range(2):
        assert cli.main(["check", "--only", "ssh", "--no-progress", "--history", db, "--html", str(out)]) in (0, 1)
    hist = out.read_text(encoding="utf-8").split("<h2>recent history</h2>")[1]
    with History(db) as h:
        node = h.conn.execute("SELECT name FROM nodes").fetchone()[0]
        runs = queries.timeline(h, node)
    assert len(runs) == 2
    troubled = sum(1 for r in runs if r["status"] != "pass")
    if troubled:  # this machine's ssh check may fail: then the node's strip says so
        assert "%d of 2</td>" % troubled in hist and html.esc(node) in hist
    else:
        assert '1 node passed every recorded run: <span class="mono">%s</span>' % html.esc(node) in hist


def test_the_screenings_recheck_is_labelled_and_never_folded_away():
    """A recheck group (the screening re-measuring a low node in-process, round 0) is said so, its control
    too, and stays in view when the quiet screening groups fold; a plain screening group carries no label."""
    quiet = [{"nodes": ["n%03d" % i, "n%03d" % (i + 1)], "round": 0, "busbw_gbps": 10.0} for i in range(10, 200, 2)]
    loc = {"rounds": 0, "why": "the screening measured n002 low", "groups": quiet + [
        {"nodes": ["n002", "n003"], "round": 0, "recheck": True, "busbw_gbps": 9.5},
        {"nodes": ["n004", "n005"], "round": 0, "recheck": True, "control": True, "busbw_gbps": 9.8}]}
    out = html._pair_rounds(loc, set())
    shown = out.split("<details>")[0]
    assert '<td class="num">0 (recheck)</td><td class="mono">n002 + n003</td>' in shown
    assert '<td class="num">0 (recheck, control)</td><td class="mono">n004 + n005</td>' in shown
    assert '<td class="num">0</td><td class="mono">n010 + n011</td>' in out.split("<details>")[1]

"""The --html page: one self-contained HTML file a person opens to see a run (no network, no script).

render(doc, timelines) turns the --json document (preflight.output.report.to_json) into the page:
the node grid coloured by status (grouped by status, a large group folded into a closed <details>,
node names as text, so 1,000 nodes stay readable), each failing finding with its evidence and action,
what to do, the all-reduce's curve, its per-node rounds and its pair rounds (where the slow node was
found), each troubled node's findings and, given the history database's timelines
(preflight.history.queries.timeline, newest first), each node's recent runs.

The page loads nothing: inline CSS, no script at all, and a Content-Security-Policy that forbids any
fetch or script, so even a hostile string that got past escaping could not run or call out. Every
value that came from a node or the inventory goes through `esc` (control characters made visible as
common.printable does for the terminal, then HTML-escaped, quotes included).
"""

from __future__ import annotations

import datetime
import functools
import html
import json
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from preflight import common

#: a status group with more nodes than this is folded (a closed <details> showing the folded names);
#: also the pair rounds' table, past which the screening's quiet groups fold
FOLD_OVER = 64
#: runs of history shown per node
HISTORY_RUNS = 10
#: all-reduce per-node rows shown before the rest fold away
NODE_ROWS = 24

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2127;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.6em 0 .5em;border-bottom:1px solid #d0d7de}
h3{font-size:1em;margin:1em 0 .3em}.meta{color:#57606a}code,pre,.mono{font-family:ui-monospace,monospace;font-size:12px}
pre{white-space:pre-wrap;word-break:break-all;background:#f2f4f7;padding:.4em;margin:.2em 0;max-height:20em;overflow:auto}
.chips span{display:inline-block;padding:.15em .6em;margin:.2em .3em .2em 0;border-radius:1em;font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(8.5em,1fr));gap:3px;list-style:none;padding:0;margin:.3em 0}
.grid li{padding:.15em .35em;border-radius:3px;font:12px ui-monospace,monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.grid a{color:inherit;text-decoration:none}
.pass{background:#d8f3dc;color:#14532d}.warn{background:#fff1c2;color:#6b4a00}.fail{background:#ffd6d6;color:#8b0000}
.error{background:#f5d0f5;color:#6b006b}.unavailable{background:#e4e4e4;color:#444}.skip{background:#eef0f2;color:#555}
.none{background:#fff;color:#999;border:1px dashed #ccc}
table{border-collapse:collapse;margin:.3em 0}th,td{text-align:left;vertical-align:top;padding:.25em .6em;border-bottom:1px solid #e1e4e8}
th{background:#f2f4f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:0 .4em;border-radius:3px;font-weight:700;font-size:12px}
.bar{display:inline-block;height:.8em;background:#4c8bf5;vertical-align:middle}.bar.low{background:#d1242f}
tr.hit td{background:#fff0f0}.card{border:1px solid #d0d7de;border-radius:6px;padding:.3em .8em;margin:.5em 0;background:#fff}
.strip span{display:inline-block;width:1.1em;height:1.1em;margin-right:2px;border-radius:2px;vertical-align:middle}
summary{cursor:pointer}.small{font-size:12px;color:#57606a}td a,.nw{white-space:nowrap}
"""

#: how each action is worded for the person reading (preflight.output.report.ACTION_WORDS, shorter)
ACTION_TEXT = {"isolate": "drain (isolate)", "reboot": "reboot", "reset_gpu": "reset the GPU",
               "fix_config": "fix the configuration", "check_app": "check the application", "retest": "retest"}

GROUP_ORDER = ("fail", "unavailable", "warn", "pass")


def esc(value: Any) -> str:
    """Node- or inventory-read text as HTML: control characters shown escaped, then <>&"' escaped."""
    return html.escape(common.printable("" if value is None else value), quote=True)


def render(doc: Mapping[str, Any], timelines: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None) -> str:
    """The whole page for a --json document; timelines: {node: its history, newest first} or None."""
    nodes = list(doc.get("nodes") or [])
    # the nodes with a card of their own (every node that did not pass): links go there
    anchors = {n["name"]: "node-%d" % i for i, n in enumerate(nodes) if n.get("status") != "pass"}
    results = list(doc.get("results") or [])
    parts = [_head(doc), _grid(nodes, anchors)]
    parts.append(_failures(results, anchors))
    parts.append(_todo(results, [n["name"] for n in nodes]))
    parts.append(_warnings(results, anchors))
    parts.append(_allreduce(doc.get("allreduce") or None))
    parts.append(_node_cards(nodes, results, anchors, timelines))
    if timelines is not None:
        parts.append(_history(nodes, anchors, timelines))
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"%s\">" % CSP,
        "<meta name=\"viewport\" content=\"width=device-width\">",
        "<title>preflight %s</title><style>%s</style></head><body>\n" % (esc(_when(doc.get("started_at"))), CSS),
        "\n".join(p for p in parts if p),
        "\n</body></html>\n",
    ])


@functools.lru_cache(maxsize=4096)  # a fleet's history repeats the same few run times thousands of times
def _when(value: Any) -> str:
    """A report's or history row's time as UTC text (reports carry ISO text, the database epoch seconds)."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
        except ValueError:
            return value
    if isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ""


def _head(doc: Mapping[str, Any]) -> str:
    counts = doc.get("node_summary") or {}
    chips = "".join('<span class="%s">%d %s</span>' % (s, counts.get(s, 0), s) for s in GROUP_ORDER
                    if counts.get(s) or s in ("fail", "pass"))
    checks = ", ".join(doc.get("checks") or [])
    kind = (doc.get("transport") or {}).get("kind") if isinstance(doc.get("transport"), dict) else doc.get("transport")
    return ("<h1>preflight %s · exit %s</h1><p class=\"meta\">%s · %s · %s · %s nodes · %.1f s · checks: %s</p>"
            "<p class=\"chips\">%s</p>" % (
                esc(doc.get("preflight_version")), esc(doc.get("exit_code")), esc(_when(doc.get("started_at"))),
                esc(doc.get("inventory")), esc(kind or "local"), len(doc.get("nodes") or []),
                float(doc.get("duration_s") or 0.0), esc(checks), chips))


def _grid(nodes: List[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    """Nodes grouped by status, worst first; a group over FOLD_OVER nodes is folded behind its folded names."""
    groups: "OrderedDict[str, List[Mapping[str, Any]]]" = OrderedDict((s, []) for s in GROUP_ORDER)
    for n in nodes:
        groups.setdefault(n.get("status") or "fail", []).append(n)
    out = ["<h2>nodes</h2>"]
    for status, members in groups.items():
        if not members:
            continue
        names = [m["name"] for m in members]
        cells = "".join(
            '<li class="%s" title="%s"><a href="#%s">%s</a></li>' % (status, esc("%s (%s)" % (m["name"], m.get("host"))), anchors[m["name"]], esc(m["name"]))
            if status != "pass" else '<li class="pass" title="%s">%s</li>' % (esc(m.get("host")), esc(m["name"]))
            for m in members)
        head = '<span class="badge %s">%s</span> %s: <span class="mono">%s</span>' % (
            status, status.upper(), common.plural(len(members), "node"), esc(common.fold(names)))
        opened = len(members) <= FOLD_OVER
        out.append('<details%s><summary>%s</summary><ul class="grid">%s</ul></details>' % (" open" if opened else "", head, cells))
    return "\n".join(out)


def _rows(results: Iterable[Mapping[str, Any]], statuses: Tuple[str, ...]) -> List[Tuple[Mapping[str, Any], List[Optional[str]]]]:
    """Findings of these statuses, identical ones (all but the node) on several nodes as one row."""
    rows: "OrderedDict[str, Tuple[Mapping[str, Any], List[Optional[str]]]]" = OrderedDict()
    for r in results:
        if r.get("status") not in statuses:
            continue
        key = json.dumps({k: v for k, v in r.items() if k != "node"}, sort_keys=True, default=str)
        rows.setdefault(key, (r, []))[1].append(r.get("node"))
    return list(rows.values())


def _where(nodes: Sequence[Optional[str]], anchors: Mapping[str, str], links: int = 8) -> str:
    """A row's nodes: each a link to its card when few, else folded; None (cluster-wide) as 'cluster'."""
    real = [n for n in nodes if n]
    text = ("cluster" + (", " if real else "")) if None in nodes else ""
    if len(real) <= links:
        return text + ", ".join('<a href="#%s">%s</a>' % (anchors[n], esc(n)) if n in anchors else esc(n) for n in real)
    return text + '%d: <span class="mono">%s</span>' % (len(real), esc(common.fold(real)))


def _evidence(r: Mapping[str, Any]) -> str:
    parts = []
    if r.get("expected") is not None:
        parts.append("expected <code>%s</code>" % esc(r["expected"]))
    if r.get("actual") is not None:
        parts.append("actual <code>%s</code>" % esc(r["actual"]))
    text = "; ".join(parts)
    if r.get("data"):
        data = json.dumps(r["data"], indent=1, sort_keys=True, default=str)
        text += "<details><summary class=\"small\">data</summary><pre>%s</pre></details>" % esc(data)
    return text or '<span class="small">in the message</span>'


def _consequence(r: Mapping[str, Any]) -> bool:
    """A finding that only repeats another's cause (report.is_consequence, on the JSON form)."""
    from preflight.model import Finding
    from preflight.output import report

    return report.is_consequence(Finding.from_json(r))


def _finding_table(rows: List[Tuple[Mapping[str, Any], List[Optional[str]]]], anchors: Mapping[str, str]) -> str:
    out = ["<table><tr><th>status</th><th>check</th><th>nodes</th><th>finding</th><th>evidence</th><th>action</th></tr>"]
    for r, nodes in rows:
        status = str(r.get("status"))
        action = r.get("action")
        out.append('<tr><td><span class="badge %s">%s</span></td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class="nw">%s</td></tr>' % (
            esc(status), esc(status.upper()), esc(r.get("check")), _where(nodes, anchors), esc(r.get("message")),
            _evidence(r), esc(ACTION_TEXT.get(action, action)) if action else ""))
    out.append("</table>")
    return "".join(out)


def _failures(results: List[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    rows = _rows(results, ("fail", "error"))
    if not rows:
        return "<h2>failures</h2><p>none: no check failed or errored.</p>"
    causes = [row for row in rows if not _consequence(row[0])]
    repeats = [row for row in rows if _consequence(row[0])]
    out = ["<h2>failures</h2>", _finding_table(causes, anchors) if causes else ""]
    if repeats:
        out.append("<details><summary>%s that only repeat a cause above (not run, not tested)</summary>%s</details>"
                   % (common.plural(sum(len(n) for _r, n in repeats), "finding"), _finding_table(repeats, anchors)))
    return "".join(out)


def _todo(results: List[Mapping[str, Any]], names: List[str]) -> str:
    from preflight.model import Finding
    from preflight.output import report

    findings = [Finding.from_json(r) for r in results if r.get("status") in ("fail", "error", "warn")]
    lines = report.actions([f for f in findings if not report.is_consequence(f)], names)
    if not lines:
        return ""
    return "<h2>what to do</h2><ul>%s</ul>" % "".join("<li>%s</li>" % esc(line) for line in lines)


def _warnings(results: List[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    rows = _rows(results, ("warn",))
    if not rows:
        return ""
    return "<h2>warnings</h2><details%s><summary>%s</summary>%s</details>" % (
        " open" if len(rows) <= 20 else "", common.plural(len(rows), "distinct warning"), _finding_table(rows, anchors))


def _gbps(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return ("%.2f" % value) if value >= 0.1 else ("%.2g" % value)


def _bar(value: Any, peak: float, low: bool = False) -> str:
    if not isinstance(value, (int, float)) or peak <= 0:
        return ""
    return '<span class="bar%s" style="width:%dpx"></span>' % (" low" if low else "", max(1, int(round(160 * value / peak))))


def _allreduce(ar: Optional[Mapping[str, Any]]) -> str:
    """The all-reduce: verdict and curve, then per-node rounds and the pair rounds (the report's summary)."""
    if not ar:
        return ""
    out = ["<h2>all-reduce</h2>"]
    verdict = str(ar.get("verdict") or "none")
    if verdict == "skip":
        return out[0] + "<p>not run: %s</p>" % esc(ar.get("reason"))
    out.append('<p><span class="badge %s">%s</span> %s</p>' % (esc(verdict), esc(verdict.upper()), esc(ar.get("summary"))))
    out.append("<p class=\"meta\">backend %s · %s ranks on %s nodes · busbw %s GB/s (threshold %s GB/s)</p>" % (
        esc(ar.get("backend")), esc(ar.get("world_size")), len(ar.get("nodes") or []),
        _gbps(ar.get("busbw_gbps")), _gbps(ar.get("threshold_gbps"))))
    curve = [p for p in ar.get("curve") or [] if isinstance(p, dict)]
    if curve:
        peak = max((p.get("busbw_gbps") or 0.0) for p in curve)
        out.append("<h3>curve</h3><table><tr><th>size</th><th>time</th><th>algbw GB/s</th><th>busbw GB/s</th><th></th></tr>")
        for p in curve:
            out.append('<tr><td class="num">%s</td><td class="num">%s</td><td class="num">%s</td><td class="num">%s</td><td>%s</td></tr>' % (
                esc(common.human_bytes(int(p.get("bytes") or 0))),
                "%.3f ms" % (1000 * p["time_s"]) if isinstance(p.get("time_s"), (int, float)) else "-",
                _gbps(p.get("algbw_gbps")), _gbps(p.get("busbw_gbps")), _bar(p.get("busbw_gbps"), peak)))
        out.append("</table>")
    exclude = set(((ar.get("localization") or {}).get("exclude")) or [])
    for rnd in ar.get("node_rounds") or []:
        out.append(_node_round(rnd, exclude))
    if ar.get("localization"):
        out.append(_pair_rounds(ar["localization"], exclude))
    return "".join(out)


def _node_round(rnd: Mapping[str, Any], exclude: set) -> str:
    """One partner-free round: every node's busbw, slowest first, the nodes it named marked."""
    values = rnd.get("nodes") or {}
    named = set(rnd.get("named") or []) | exclude
    order = sorted(values, key=lambda n: (values[n] is not None, values[n] if values[n] is not None else 0.0, n))
    peak = max([v for v in values.values() if isinstance(v, (int, float))] or [0.0])
    head = "<h3>per node: %s</h3><p class=\"meta\">%s · median %s GB/s · named: %s</p>" % (
        esc(rnd.get("name")), esc(rnd.get("what")), _gbps(rnd.get("median_gbps")),
        esc(common.fold(sorted(rnd.get("named") or []))) or "none")

    def row(n: str) -> str:
        hit = n in named
        return '<tr%s><td>%s</td><td class="num">%s</td><td>%s</td></tr>' % (
            ' class="hit"' if hit else "", esc(n), _gbps(values[n]), _bar(values[n], peak, hit))

    table = "<table><tr><th>node</th><th>busbw GB/s</th><th></th></tr>%s</table>"
    shown = "".join(row(n) for n in order[:NODE_ROWS])
    rest = order[NODE_ROWS:]
    more = ("<details><summary>the other %s (faster)</summary>%s</details>" % (
        common.plural(len(rest), "node"), table % "".join(row(n) for n in rest))) if rest else ""
    return head + table % shown + more


def _round_label(g: Mapping[str, Any]) -> str:
    """What a group was in its round: the screening's in-process recheck of a low node (round 0, a moment of
    its own: bench_worker._recheck) and a control timed beside a suspect are said so."""
    kinds = [k for k, on in (("recheck", g.get("recheck")), ("control", g.get("control"))) if on]
    return " (%s)" % ", ".join(kinds) if kinds else ""


def _pair_rounds(loc: Mapping[str, Any], exclude: set) -> str:
    """The pair rounds that localized a slow or failing run: each group per round, the excluded node's marked."""
    groups = [g for g in loc.get("groups") or [] if isinstance(g, dict)]
    found = {}
    for g in groups:
        for n in g.get("nodes") or []:
            if n in exclude:
                found[n] = max(found.get(n, 0), int(g.get("round") or 0))
    out = ["<h3>pair rounds</h3><p class=\"meta\">%s round%s · %s%s</p>" % (
        esc(loc.get("rounds")), "" if loc.get("rounds") == 1 else "s", esc(loc.get("why")),
        "" if loc.get("by_bandwidth") is not False else " · localizing a failure, not bandwidth")]
    if exclude:
        out.append("<p>found: %s</p>" % "; ".join("<b>%s</b> (last measured in round %d)" % (esc(n), r) for n, r in sorted(found.items())))
    peak = max([g["busbw_gbps"] for g in groups if isinstance(g.get("busbw_gbps"), (int, float))] or [0.0])

    def row(g: Mapping[str, Any]) -> str:
        hit = any(n in exclude for n in g.get("nodes") or [])
        return '<tr%s><td class="num">%s%s</td><td class="mono">%s</td><td class="num">%s</td><td>%s</td><td>%s</td></tr>' % (
            ' class="hit"' if hit else "", esc(g.get("round", 0)), _round_label(g),
            esc(" + ".join(g.get("nodes") or [])), _gbps(g.get("busbw_gbps")), _bar(g.get("busbw_gbps"), peak, hit),
            esc(g.get("failure") or ""))

    # the screening's groups that held no suspect fold away: on 1,000 nodes they are 500 rows of "fine"
    ordered = sorted(groups, key=lambda g: int(g.get("round") or 0))
    quiet = [g for g in ordered if not int(g.get("round") or 0) and not g.get("failure") and not g.get("recheck")
             and not any(n in exclude for n in g.get("nodes") or []) and len(ordered) > NODE_ROWS]
    table = "<table><tr><th>round</th><th>group</th><th>busbw GB/s</th><th></th><th>failure</th></tr>%s</table>"
    hidden = {id(g) for g in quiet}
    out.append(table % "".join(row(g) for g in ordered if id(g) not in hidden))
    if quiet:
        out.append("<details><summary>%s of the screening (round 0) without a suspect</summary>%s</details>" % (
            common.plural(len(quiet), "other group"), table % "".join(row(g) for g in quiet)))
    return "".join(out)


def _node_cards(nodes: List[Mapping[str, Any]], results: List[Mapping[str, Any]], anchors: Mapping[str, str],
                timelines: Optional[Mapping[str, Sequence[Mapping[str, Any]]]]) -> str:
    """A card for each node that did not pass: its problems and warnings, and its recent runs."""
    mine: Dict[str, List[Mapping[str, Any]]] = {}
    for r in results:
        if r.get("node") and r.get("status") in ("fail", "error", "warn"):
            mine.setdefault(r["node"], []).append(r)
    out = []
    for n in nodes:
        if n.get("status") == "pass":
            continue
        name = n["name"]
        lines = "".join('<li><span class="badge %s">%s</span> %s: %s%s</li>' % (
            esc(r.get("status")), esc(str(r.get("status")).upper()), esc(r.get("check")), esc(r.get("message")),
            " → %s" % esc(ACTION_TEXT.get(r.get("action"), r.get("action"))) if r.get("action") else "")
            for r in mine.get(name, []))
        history = ""
        if timelines is not None:
            history = _timeline(timelines.get(name) or [])
        out.append('<div class="card" id="%s"><h3><span class="badge %s">%s</span> %s <span class="small">%s · %s GPUs</span></h3>'
                   "<ul>%s</ul>%s</div>" % (anchors[name], esc(n.get("status")), esc(str(n.get("status")).upper()),
                                           esc(name), esc(n.get("host")), esc(n.get("gpus")), lines, history))
    if not out:
        return ""
    if len(out) > FOLD_OVER:  # a fleet-wide fault: the cards fold (the failures table above names them all)
        return "<h2>nodes that did not pass</h2><details><summary>%s, a card each</summary>%s</details>" % (
            common.plural(len(out), "node"), "".join(out))
    return "<h2>nodes that did not pass</h2>" + "".join(out)


def _strip(runs: Sequence[Mapping[str, Any]]) -> str:
    """Recent runs as coloured squares, oldest left; each square's title says when and what failed."""
    cells = []
    for run in reversed(list(runs)[:HISTORY_RUNS]):
        what = "; ".join("%s: %s" % (p.get("check"), p.get("message")) for p in run.get("problems") or [])
        status = str(run.get("status"))
        cells.append('<span class="%s" title="%s"></span>' % (
            esc(status if status in GROUP_ORDER else "none"), esc("%s %s%s" % (_when(run.get("started_at")), status, " · " + what if what else ""))))
    return '<span class="strip">%s</span>' % "".join(cells)


def _timeline(runs: Sequence[Mapping[str, Any]]) -> str:
    """A node's last HISTORY_RUNS runs, newest first: status, failing findings, actions taken."""
    if not runs:
        return '<p class="small">history: no earlier run of this node</p>'
    rows = []
    for run in list(runs)[:HISTORY_RUNS]:
        problems = "<br>".join("%s: %s" % (esc(p.get("check")), esc(p.get("message"))) for p in run.get("problems") or [])
        acts = "<br>".join("%s%s %s" % (esc(a.get("kind")), " (shadow)" if a.get("shadow") else "", esc(a.get("reason") or ""))
                           for a in run.get("actions") or [])
        status = str(run.get("status"))
        rows.append('<tr><td class="nw">%s</td><td><span class="badge %s">%s</span></td><td>%s</td><td>%s</td></tr>' % (
            esc(_when(run.get("started_at"))), esc(status), esc(status.upper()), problems, acts))
    return ("<p class=\"small\">history %s</p><table><tr><th>run</th><th>status</th><th>problems</th><th>actions</th></tr>%s</table>"
            % (_strip(runs), "".join(rows)))


def _history(nodes: List[Mapping[str, Any]], anchors: Mapping[str, str], timelines: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Every node's recent runs as a strip, troubled nodes first; nodes that passed all of theirs folded."""
    troubled, clean = [], []
    for n in nodes:
        runs = list(timelines.get(n["name"]) or [])[:HISTORY_RUNS]
        bad = sum(1 for r in runs if r.get("status") in ("fail", "warn", "unavailable"))
        (troubled if bad else clean).append((bad, n["name"], runs))
    out = ["<h2>recent history</h2><p class=\"meta\">each node's last %d runs, oldest left (hover a square for its findings)</p>" % HISTORY_RUNS]
    if troubled:
        out.append("<table><tr><th>node</th><th>runs</th><th>not passing</th></tr>")
        for bad, name, runs in sorted(troubled, key=lambda t: (-t[0], t[1])):
            link = '<a href="#%s">%s</a>' % (anchors[name], esc(name)) if name in anchors else esc(name)
            out.append('<tr><td>%s</td><td>%s</td><td class="num">%d of %d</td></tr>' % (link, _strip(runs), bad, len(runs)))
        out.append("</table>")
    if clean:
        names = [name for _b, name, _r in clean]
        out.append("<p>%s passed every recorded run: <span class=\"mono\">%s</span></p>" % (
            common.plural(len(names), "node"), esc(common.fold(names))))
    return "".join(out)


#: keys of `preflight history` rows that hold Unix times
TIME_KEYS = ("started_at", "last_seen", "at", "first_seen", "since")


def render_history(data: Mapping[str, Any], title: str = "preflight history") -> str:
    """`preflight history --html`: its JSON document's sections as tables on one self-contained page
    (a node's timeline with its strip; each other section a table of its rows; nested values as text)."""
    parts = ["<h1>%s</h1><p class=\"meta\">%s runs recorded</p>" % (esc(title), esc(data.get("runs")))]
    timeline = data.get("timeline")
    if isinstance(timeline, dict):
        parts.append("<h2>timeline: %s</h2>%s" % (esc(timeline.get("node")), _timeline(timeline.get("runs") or [])))
    for section, value in data.items():
        if section in ("runs", "timeline"):
            continue
        parts.append("<h2>%s</h2>%s" % (esc(section), _value_table(value)))
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"%s\">" % CSP,
        "<title>%s</title><style>%s</style></head><body>\n" % (esc(title), CSS), "\n".join(parts), "\n</body></html>\n"])


def _cell(key: str, value: Any) -> str:
    if key in TIME_KEYS and isinstance(value, (int, float)):
        return esc(_when(value))
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list)) for v in value):
        return esc(", ".join(str(v) for v in value))
    if isinstance(value, (dict, list)):
        return '<span class="mono">%s</span>' % esc(json.dumps(value, sort_keys=True, default=str))
    return esc(value)


def _value_table(value: Any) -> str:
    """A list of rows as a table (the union of their keys as columns), a mapping as key/value rows."""
    if isinstance(value, dict):
        value = [{"": k, "value": v} for k, v in value.items()]
    if not isinstance(value, list):
        return "<p>%s</p>" % esc(value)
    if not value:
        return "<p>none</p>"
    rows = [r if isinstance(r, dict) else {"value": r} for r in value]
    keys = list(OrderedDict((k, None) for r in rows for k in r))
    head = "".join("<th>%s</th>" % esc(k) for k in keys)
    body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % _cell(k, r.get(k, "")) for k in keys) for r in rows)
    return "<table><tr>%s</tr>%s</table>" % (head, body)

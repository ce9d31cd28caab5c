"""How long a 1,000-node --html page takes to build and to open in a real headless Chromium.

Builds the report from synthetic findings (tests/sim/fleet_report.py: failing nodes, a warning, a slow
node the all-reduce's pair rounds localized), records `--runs` nightly runs of the same fleet in a
history database (tests/history_fleet.py) and reads every node's timeline as `preflight check --html`
does, renders the page, then opens it `--repeat` times in one Chromium (tests/sim/browser.py, the
DevTools protocol on a pipe) and prints the median: from the navigation to the load event with the
page laid out, and the page's own navigation timing. Twice: a usual night (6 failing nodes) and a
fleet-wide fault (99% failing: every node a card and a timeline). Goal (issue 35 item 5): under 2 s.

    python3 benchmarks/html_render.py [--nodes 1000] [--runs 30] [--repeat 5] [--screenshot PNG]

--screenshot PNG: also a 16-node page with 2 failing nodes (an Xid, the slow node) and 5 nights of
history, full-page, for a note.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from preflight.history import queries  # noqa: E402
from preflight.history.db import History  # noqa: E402
from preflight.output import html  # noqa: E402
from tests import history_fleet  # noqa: E402
from tests.sim import fleet_report  # noqa: E402
from tests.sim.browser import Browser, chromium  # noqa: E402


def timelines(directory: str, doc: dict, runs: int) -> dict:
    """`runs` nightly runs of doc's nodes recorded (a node in ten with an Xid every third night), then
    every node's timeline as the CLI reads it; prints how long the reading took."""
    names = [n["name"] for n in doc["nodes"]]
    with History(os.path.join(directory, "h.sqlite")) as h:
        for day in range(runs):
            faults = [history_fleet.xid(n, 3) for n in names[::10]] if day % 3 == 1 else []
            h.record(history_fleet.report(day, names, faults))
        h.record(doc)
        begun = time.perf_counter()
        out = {n: queries.timeline(h, n, limit=html.HISTORY_RUNS) for n in names}
        print("history: %d runs recorded; %d nodes' timelines read in %.2f s" % (runs + 1, len(names), time.perf_counter() - begun))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=30, help="nightly runs in the history database (0: no history)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--screenshot", metavar="PNG")
    args = parser.parse_args()
    if chromium() is None:
        print("chromium is not installed (apt-get install chromium)")
        return 2
    with tempfile.TemporaryDirectory() as tmp, Browser() as b:
        # a usual night (5 failing nodes), then a fleet-wide fault (all but 1% failing)
        for failing in (5, args.nodes - args.nodes // 100 - 1):
            print("-- %d nodes, %d failing" % (args.nodes, failing + 1))
            doc = fleet_report.fleet(args.nodes, failing=failing, warn=0 if failing > 5 else 1)
            where = os.path.join(tmp, str(failing))
            os.mkdir(where)
            lines = timelines(where, doc, args.runs) if args.runs else None
            begun = time.perf_counter()
            page = html.render(doc, lines)
            render_s = time.perf_counter() - begun
            path = os.path.join(where, "page.html")
            with open(path, "w", encoding="utf-8") as out:
                out.write(page)
            print("render: %d KiB page in %.3f s" % (len(page.encode()) // 1024, render_s))
            loads, navs = [], []
            for _ in range(args.repeat):
                opened = b.open(path)
                if opened["errors"]:
                    print("errors: %s" % opened["errors"])
                    return 1
                loads.append(opened["load_s"])
                navs.append(opened["navigation"].get("loadEventEnd", 0.0) / 1000)
            print("chromium: open to laid out median %.3f s (min %.3f, max %.3f); load event %.3f s; goal < 2 s; "
                  "%d runs, no console error" % (statistics.median(loads), min(loads), max(loads), statistics.median(navs), len(loads)))
        if args.screenshot:
            small = fleet_report.fleet(16, failing=1)  # an Xid and the slow node: 2 failing nodes
            os.mkdir(os.path.join(tmp, "small"))
            page = html.render(small, timelines(os.path.join(tmp, "small"), small, 5))
            spath = os.path.join(tmp, "small", "page.html")
            with open(spath, "w", encoding="utf-8") as out:
                out.write(page)
            opened = b.open(spath)
            if opened["errors"]:
                print("errors: %s" % opened["errors"])
                return 1
            b.screenshot(args.screenshot)
            print("screenshot: %s" % args.screenshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

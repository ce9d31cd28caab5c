"""preflight history: what the history database says (a node's timeline, flapping nodes, lemons, repeat faults, failure
rates, time between incidents).
"""

from __future__ import annotations

import argparse
import os
import sys

from preflight.errors import EXIT_OK, UsageError


def run(args: argparse.Namespace) -> int:
    from preflight.history import render
    from preflight.history.db import History, location

    sections = args.show or list(render.SECTIONS)
    unknown = [s for s in sections if s not in render.SECTIONS]
    if unknown:
        raise UsageError("unknown section %s" % ", ".join(unknown), "choose from %s" % ", ".join(render.SECTIONS))
    if args.window_runs < 2 or args.limit < 1:
        raise UsageError("--window-runs must be at least 2 and --limit at least 1", "e.g. --window-runs 30 --limit 30")
    if args.html:
        from preflight.output import files

        files.check_output_paths(argparse.Namespace(html=args.html))  # before the database is read
    database, _ = location(args.path)
    if not os.path.isfile(database):
        raise UsageError("no history database at %s" % database, "give the --history PATH of `preflight check`")
    with History(database, lambda line: sys.stderr.write("preflight: %s\n" % line)) as h:
        data = render.gather(h, sections, args.node, args.window_runs, args.limit)
    if args.html:
        from preflight.output import html

        files.write(args.html, html.render_history(data, "preflight history %s" % args.path))
    sys.stdout.write(render.to_json(data) if args.json else "\n".join(render.lines(data)) + "\n")
    return EXIT_OK

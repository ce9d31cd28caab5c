"""preflight diff: compare two JSON reports (from --json or --history)."""

from __future__ import annotations

import argparse
import math
import sys

from preflight.errors import EXIT_OK, EXIT_PROBLEMS, UsageError


def run(args: argparse.Namespace) -> int:
    import json

    from preflight.output import diff as differ

    docs = []
    for path in (args.old, args.new):
        try:
            with open(path) as handle:
                docs.append(json.load(handle))
        except OSError as exc:
            raise UsageError("cannot read %s: %s" % (path, exc.strerror), "give the path of a JSON report") from None
        except ValueError as exc:
            raise UsageError("%s is not a JSON report: %s" % (path, exc), "give a file written by --json or --history") from None
        try:
            differ.validate(docs[-1])
        except ValueError as exc:
            raise UsageError("%s is not a preflight report (%s)" % (path, exc), "give a file written by --json or --history") from None
    if not (math.isfinite(args.bw_threshold) and args.bw_threshold >= 0):
        raise UsageError("--bw-threshold %s is not usable" % args.bw_threshold, "give a fraction such as 0.10")
    result = differ.diff(docs[0], docs[1], bw_threshold=args.bw_threshold)
    for line in differ.render_diff(result):
        sys.stdout.write(line + "\n")
    return EXIT_PROBLEMS if result.has_regressions else EXIT_OK

"""The history-backed drain policy's settings on the command line, over the inventory's `cluster.history`:

    --drain-after N/W    a retest-class, config or flapping fault takes a node out only once seen in N runs
                         within W (drain_after, drain_window_s)
    --drain-limit F[/W]  the circuit breaker: preflight takes out at most F of the fleet within W, across
                         runs (breaker_fraction, breaker_window_s)

W is a duration: a number with s, m, h or d (7d, 12h, 300s; a bare number is seconds). The inventory stays
the default source; a flag given wins for this run. Both need --history (the counts are the database's).
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Dict, Optional, Tuple

from preflight.errors import UsageError

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

#: flag -> (argparse dest, the count's setting, the window's setting, an example)
FLAGS = {
    "--drain-after": ("drain_after", "drain_after", "drain_window_s", "--drain-after 3/7d"),
    "--drain-limit": ("drain_limit", "breaker_fraction", "breaker_window_s", "--drain-limit 0.1/1h"),
}


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drain-after", metavar="N/W", help="with --history and --drain: take a node out for a "
                        "retest-class, config or flapping fault only once seen in N runs within W (e.g. 3/7d; "
                        "default: cluster.history drain_after / drain_window_s, else 2/7d)")
    parser.add_argument("--drain-limit", metavar="F[/W]", help="with --history and --drain: the circuit breaker, at "
                        "most this share F of the fleet taken out by preflight within W across runs (e.g. 0.1/1h; "
                        "default: cluster.history breaker_fraction / breaker_window_s, else 0.5/300s)")


def duration(text: str) -> Optional[float]:
    """Seconds from '7d', '12h', '30m', '300s' or '300'; None when it is not one."""
    match = _DURATION_RE.match(text)
    return float(match.group(1)) * _UNIT_S[match.group(2)] if match else None


def _bounded(flag: str, key: str, value: float, example: str) -> float:
    # imported here: the parser imports this module for its options, and `preflight --help` reads no YAML
    from preflight.inventory import HISTORY_SETTINGS

    _, low, high, what = HISTORY_SETTINGS[key]
    if not low <= value <= high:
        raise UsageError("%s: %s %g is out of range (%g to %g): %s" % (flag, key, value, low, high, what),
                         "e.g. %s" % example)
    return value


def parse(flag: str, text: str) -> Dict[str, Any]:
    """{setting: value} from one flag's N/W or F[/W]; a malformed or out-of-range value is a UsageError."""
    _, count_key, window_key, example = FLAGS[flag]
    count, slash, window = text.partition("/")
    out: Dict[str, Any] = {}
    try:
        value = float(count) if count_key == "breaker_fraction" else int(count)
    except ValueError:
        raise UsageError("%s %r: %r is not a %s" % (flag, text, count, "fraction" if count_key == "breaker_fraction"
                                                     else "whole number of runs"), "e.g. %s" % example) from None
    out[count_key] = _bounded(flag, count_key, value, example)
    if count_key == "drain_after":
        out[count_key] = int(out[count_key])
        if not slash:
            raise UsageError("%s %r: give the window too, N/W" % (flag, text), "e.g. %s" % example)
    if slash:
        seconds = duration(window)
        if seconds is None:
            raise UsageError("%s %r: %r is not a duration" % (flag, text, window), "write 300s, 30m, 12h or 7d")
        out[window_key] = _bounded(flag, window_key, seconds, example)
    return out


def _given(args: argparse.Namespace) -> Tuple[Tuple[str, str], ...]:
    return tuple((flag, getattr(args, dest)) for flag, (dest, *_rest) in FLAGS.items() if getattr(args, dest, None))


def check(args: argparse.Namespace) -> None:
    """Usage errors before any node is touched: a malformed value, or a flag without --history."""
    for flag, text in _given(args):
        parse(flag, text)
        if not getattr(args, "history", None):
            raise UsageError("%s counts runs in the history database" % flag, "add --history PATH")


def apply(args: argparse.Namespace, cluster: Dict[str, Any]) -> None:
    """The flags given, over the inventory's cluster.history settings (the escalation module reads them)."""
    given = _given(args)
    if not given:
        return
    history = dict(cluster.get("history") or {})
    for flag, text in given:
        history.update(parse(flag, text))
    cluster["history"] = history

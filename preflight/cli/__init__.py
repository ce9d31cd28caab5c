"""The `preflight` command line. The only place errors become messages and exit codes.

Exit codes: 0 nothing failed or errored, 1 a check failed or errored (or `diff` found regressions),
2 a usage or inventory error (one line, never a traceback), 128+N stopped by signal N: 130 Ctrl-C
(SIGINT), 143 SIGTERM, 129 SIGHUP. On any of these the remote runs are killed first; a second signal
exits at once.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from typing import Any, Iterator, List, Optional

from preflight.cli.parser import build_parser
from preflight.errors import EXIT_INTERRUPTED, EXIT_USAGE, PreflightError

#: each command's module (preflight.cli.<module>.run(args)), imported only when that command runs
COMMANDS = {"check": "check", "env": "check", "k8s": "k8s", "node": "node", "checks": "catalogue", "diff": "diff",
            "history": "history", "dashboard": "dashboard"}


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: unwinds like Ctrl-C (remote runs killed, cursor restored)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_stopping: List[int] = []


def _on_signal(signum: int, frame: Any) -> None:
    if _stopping:  # a second signal while the first one is being cleaned up: leave now, quietly
        os.write(2, b"preflight: interrupted again; exiting without waiting for cleanup\n")
        os._exit(128 + _stopping[0])
    _stopping.append(signum)
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP all raise Interrupted in the main thread (systemd stop, `timeout`, CI)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    del _stopping[:]
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        if not _stopping:  # after a signal ours stay: a second one exits at once, never a traceback
            for s, handler in old.items():
                signal.signal(s, handler)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "debug", False) else logging.WARNING, format="preflight: %(message)s")
    if getattr(args, "debug", False) is False:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    logging.getLogger("invoke").setLevel(logging.WARNING)  # fabric's config merging, every connection: noise
    try:
        with _signals():
            try:
                if args.command not in COMMANDS:
                    parser.print_help(sys.stderr)
                    return EXIT_USAGE
                return importlib.import_module("preflight.cli." + COMMANDS[args.command]).run(args)
            except PreflightError as exc:
                sys.stderr.write("preflight: error: %s\n" % exc)
                return exc.exit_code
            except KeyboardInterrupt as exc:
                signum = getattr(exc, "signum", signal.SIGINT)
                sys.stderr.write("preflight: %s (%s); remote runs were killed\n"
                                 % ("interrupted" if signum == signal.SIGINT else "terminated", signal.Signals(signum).name))
                sys.stderr.flush()
                return 128 + signum
    except KeyboardInterrupt:  # a signal between the handler's install and its removal
        return EXIT_INTERRUPTED



"""Where a run's outputs go: every path checked before any node is touched, each file written
atomically, a path that cannot be written one line (exit 2), never a traceback after a long run.

The files themselves are rendered by their modules (report, envfile, hostfile, junit, prometheus,
history, capture); this module decides where and how they are written for `preflight check`/`env`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
from typing import Any, Callable, Iterator, Optional

from preflight.errors import UsageError


def write_outputs(args: argparse.Namespace, result: Any, doc: dict, say: Callable[[str], None],
                  history: Optional[dict] = None, timelines: Optional[dict] = None) -> None:
    """Write every output the run asked for; `say` prints a line for the person at the terminal;
    `history`: the history database's metrics for the Prometheus file (preflight.history.queries.metrics);
    `timelines`: {node: its recent runs} for the --html page (preflight.history.queries.timeline)."""
    from preflight.output import report

    if getattr(args, "json", None):
        if args.json == "-":
            write_stdout(report.dumps(doc))
        else:
            write(args.json, report.dumps(doc))
    if getattr(args, "env_file", None):
        from preflight.output import envfile

        write(args.env_file, envfile.render(result), mode=0o644)
        say("env file: %s" % args.env_file)
    if getattr(args, "hostfile", None):
        from preflight.output import hostfile

        # the nodes that passed (worst finding pass/warn/skip); slots = GPUs per node, 1 on CPU-only nodes
        healthy = [(hostfile_name(n), max(1, n["gpus"])) for n in doc["nodes"] if n["status"] in ("pass", "warn", "skip")]
        try:
            text = hostfile.render_hostfile(healthy, args.hostfile_format)
        except ValueError as exc:
            raise UsageError("cannot write the hostfile: %s" % exc, "choose another --hostfile-format") from None
        write(args.hostfile, text)
    if getattr(args, "junit", None):
        from preflight.output import junit

        with writing(args.junit):
            junit.write_junit(doc, args.junit)
    if getattr(args, "prometheus", None):
        from preflight.output import prometheus

        with writing(args.prometheus):
            prometheus.write_prometheus(doc, args.prometheus, history)
    if getattr(args, "html", None):
        from preflight.output import html

        write(args.html, html.render(doc, timelines))
    if getattr(args, "capture", None):
        from preflight.output import capture

        written = capture.write(args.capture, result.captures, result.view.facts, result.started_at)
        say("captured %d probe runs to %s (review before sending: it holds command outputs and "
            "addresses)" % (len(written), args.capture))


def check_capture_dir(path: str) -> None:
    """--capture DIR must be a directory we can create or write, and empty: a capture never mixes runs."""
    from preflight.output import capture

    capture.check_dir(path)  # not a symlink, not another user's
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError("--capture %s is not a directory" % path, "give a new or empty directory")
        if os.listdir(path):
            raise UsageError("--capture directory %s is not empty" % path, "give a new or empty directory")
        if not os.access(path, os.W_OK):
            raise UsageError("--capture directory %s is not writable" % path, "give a writable directory")
    else:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise UsageError("cannot create --capture directory %s" % path, "give a path in a writable directory")


def check_output_paths(args: argparse.Namespace) -> None:
    """Every output path must be writable before any node is touched (not found after a long run)."""
    files = [(opt, getattr(args, dest, None)) for opt, dest in (
        ("--json", "json"), ("--env-file", "env_file"), ("--hostfile", "hostfile"),
        ("--junit", "junit"), ("--prometheus", "prometheus"), ("--html", "html"))]
    for opt, path in files:
        if not path or (opt == "--json" and path == "-"):
            continue
        if os.path.isdir(path):
            raise UsageError("cannot write %s: Is a directory" % path, "give %s a file path" % opt)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            unwritable(path, errno.EACCES)
        check_dir(path, os.path.dirname(os.path.abspath(path)))
    history = getattr(args, "history", None)
    if history:
        target = os.path.abspath(history)
        if os.path.exists(target) and not os.path.isdir(target) and not os.path.isfile(target):
            raise UsageError("--history %s is neither a directory nor a file" % history,
                             "give a directory or a .sqlite file for the run history")
        if os.path.isfile(target):
            target = os.path.dirname(target)  # the database's -wal and -shm files go beside it
        while not os.path.exists(target):  # the recorder creates the missing directories
            target = os.path.dirname(target)
        check_dir(history, target)


def unwritable(path: str, code: int) -> None:
    raise UsageError("cannot write %s: %s" % (path, os.strerror(code)), "check the directory exists and is writable")


def check_dir(path: str, directory: str) -> None:
    """`path` is to be written in `directory`: it must be an existing, writable directory."""
    if not os.path.exists(directory):
        unwritable(path, errno.ENOENT)
    if not os.path.isdir(directory):
        unwritable(path, errno.ENOTDIR)
    if not os.access(directory, os.W_OK | os.X_OK):
        unwritable(path, errno.EACCES)


def hostfile_name(node: dict) -> str:
    """The name a launcher reaches a node by: its inventory name, else its host."""
    return node.get("name") or node["host"]


def check_hostfile_names(inv: Any, fmt: str) -> None:
    """Every inventory node must be writable in the hostfile format: a usage error before any connection."""
    from preflight.output import hostfile

    for spec in inv.nodes:
        try:
            hostfile.validate_host(hostfile_name({"name": spec.name, "host": spec.host}), fmt)
        except ValueError as exc:
            raise UsageError("--hostfile-format %s: %s" % (fmt, exc), "rename the node in the inventory (name:) or choose another format") from None


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """An output file that cannot be written is a one-line usage error (exit 2), never a traceback."""
    try:
        yield
    except OSError as exc:
        raise UsageError("cannot write %s: %s" % (path, exc.strerror or exc), "check the directory exists and is writable") from None


def write_stdout(text: str) -> None:
    from preflight.output import report

    with writing("the standard output"):
        report.write_stdout(text)


def write(path: str, text: str, mode: int = 0o644) -> None:
    """Write a file atomically (temp file in the same directory, then rename)."""
    from preflight.output.history import atomic_write_text

    with writing(path):
        atomic_write_text(path, text, mode=mode)

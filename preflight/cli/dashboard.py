"""preflight dashboard: the Grafana dashboard for the --prometheus textfile, printed or written to a file."""

from __future__ import annotations

import argparse

from preflight.output import dashboard


def run(args: argparse.Namespace) -> int:
    """Print the dashboard JSON, or write it to --output (a file, or a Grafana provider's folder)."""
    return dashboard.command(args.output)

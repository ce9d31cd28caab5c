"""preflight checks: every check with its claim, what it reads and how long it takes, from the declarations alone (no
check's code imported); --markdown gives the user guide's two generated tables (docs/checks.md, docs/inventory.md).
"""

from __future__ import annotations

import argparse
import sys

from preflight.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    """The catalogue as a table, or the user guide's two tables with --markdown."""
    if args.markdown:
        from preflight.output.markdown import checks_markdown, settings_markdown

        sys.stdout.write(checks_markdown() + "\n" + settings_markdown())
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from preflight import checks as catalogue
    from preflight.model import ACTION_MEANINGS

    table = Table(box=None, header_style="bold")
    for column in ("check", "claim", "reads on each node", "takes", "on fail"):
        table.add_column(column)
    for name, check in catalogue.entries().items():  # the declarations: no check code imported
        table.add_row(*(Text(cell) for cell in (name, check.claim, check.reads or "(not declared)", check.takes or "?", check.action)))
    console = Console()
    console.print(table, markup=False)
    console.print("\nactions (a failing finding names one; `on fail` is the check's default):", markup=False)
    for action, meaning in ACTION_MEANINGS.items():
        console.print("  %-10s %s" % (action, meaning), markup=False)
    return EXIT_OK

"""The Grafana dashboard shipped with preflight, read from the package (grafana_dashboard.json).

Its panels query the metrics of the Prometheus textfile (preflight.output.prometheus): fleet status,
failing checks over time, bus bandwidth per node over time, lemons (GPU serials with repeat faults)
and preflight's drains. The Prometheus data source is the dashboard variable ``datasource``, so the
same file works imported by hand and provisioned from disk.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import sys
from typing import Any, Dict, Iterator, Optional, Tuple

from preflight.errors import UsageError
from preflight.output.history import atomic_write_text

FILE_NAME = "grafana_dashboard.json"
INSTALLED_NAME = "preflight.json"  # the file `preflight dashboard -o DIR` writes in DIR


def text() -> str:
    """The dashboard JSON, exactly as shipped."""
    return importlib.resources.files("preflight.output").joinpath(FILE_NAME).read_text("utf-8")


def load() -> Dict[str, Any]:
    """The dashboard as a document."""
    return json.loads(text())


def queries(dashboard: Dict[str, Any]) -> Iterator[Tuple[str, str, str]]:
    """(panel title, refId, PromQL expression) of every query of every panel, rows' panels included."""
    for panel in dashboard.get("panels") or []:
        for inner in [panel] + list(panel.get("panels") or []):
            for target in inner.get("targets") or []:
                yield inner.get("title", ""), target.get("refId", ""), target["expr"]


def command(output: Optional[str]) -> int:
    """`preflight dashboard`: the dashboard on stdout, or written atomically to `output` (an existing
    directory, such as a Grafana provider's folder, gets ``preflight.json``); a path that cannot be
    written is a UsageError naming it."""
    if output is None:
        sys.stdout.write(text())
        return 0
    if os.path.isdir(output):
        output = os.path.join(output, INSTALLED_NAME)
    try:
        atomic_write_text(output, text())
    except OSError as exc:
        raise UsageError("cannot write %s: %s" % (output, exc.strerror or exc), "give a writable file path") from None
    return 0

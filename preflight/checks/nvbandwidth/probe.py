"""nvbandwidth's node side: run the copy-bandwidth testcases (burn-in tier, GPU nodes) and parse its matrices.

Standard library only. The format is described in __init__.py (real captures cited there).
"""

from __future__ import annotations

import time

from preflight.node_model import ParseError
from preflight.probe.lazy_re import lazy  # compiled where nvbandwidth ran (the burn-in tier), not on every node run

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, List, Optional

TESTCASES = ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_to_device_memcpy_read_ce")
#: the longest the testcases may run on one node (8 GPUs: 56 peer pairs); the probe deadline caps it
BUDGET_S = 240.0
DEADLINE_SLACK_S = 3.0

_TITLE = lazy(r"^\s*(memcpy(?:Kernel)?\s+(?:CE|SM)\s+\S+\(row\)\s*(?:->|<-|<->)\s*\S+\(column\)\s+"
                    r"bandwidth\s*\(GB/s\))\s*$")
_SUM = lazy(r"^\s*SUM\s+(\S+)\s+([0-9.]+|N/A)\s*$")
_RUNNING = lazy(r"^\s*Running\s+(\S+?)\.?\s*$")
_HEADER = lazy(r"^\s*nvbandwidth Version:\s*(\S+)")
_DRIVER = lazy(r"^\s*Driver Version:\s*(\S+)")


def probe(ctx: Any) -> Dict[str, Any]:
    """Run nvbandwidth's copy testcases where it is installed on a GPU node and the tier asks for it."""
    path = ctx.which("nvbandwidth")
    facts: Dict[str, Any] = {"nvbandwidth": path, "ran": False}
    if not ctx.config.get("run"):
        facts["not_started"] = "not this tier (--tier burn-in runs it)"
        return facts
    if path is None:
        return facts
    if (ctx.config.get("node") or {}).get("gpus_per_node") == 0:
        facts["not_started"] = "CPU-only node"
        return facts
    timeout, why = ctx.budget(BUDGET_S, DEADLINE_SLACK_S, 10.0)
    if timeout is None:
        facts["not_started"] = why
        return facts
    argv = ["nvbandwidth", "-t"] + list(TESTCASES)
    t0 = time.monotonic()
    res = ctx.run(argv, timeout=timeout)
    facts.update(ran=True, argv=argv, rc=None if res.timed_out else res.rc, timed_out=res.timed_out,
                 elapsed_s=round(time.monotonic() - t0, 2), stderr_tail=res.stderr.strip()[-300:])
    facts["result"] = parse_nvbandwidth(res.stdout) if not res.timed_out and res.rc == 0 else None
    return facts


def _cell(text: str, where: str) -> Optional[float]:
    if text == "N/A":
        return None
    try:
        return float(text)
    except ValueError:
        raise ParseError("nvbandwidth: %s: %r is neither a figure nor N/A" % (where, text)) from None


def parse_nvbandwidth(text: str) -> Dict[str, Any]:
    """{"version", "driver", "tests": {name: {"title", "columns", "rows", "sum", "waived"}}} from nvbandwidth's
    output. A matrix is named by the "Running X." line before it or, where that is missing, by its SUM line."""
    out: Dict[str, Any] = {"version": None, "driver": None, "tests": {}}
    running: Optional[str] = None
    matrix: Optional[Dict[str, Any]] = None
    lines = text.splitlines()
    for no, line in enumerate(lines, 1):
        for key, pattern in (("version", _HEADER), ("driver", _DRIVER)):
            found = pattern.match(line)
            if found:
                out[key] = found.group(1)
        if _HEADER.match(line) or _DRIVER.match(line):
            continue
        if _RUNNING.match(line):
            running, matrix = _RUNNING.match(line).group(1), None
        elif line.strip().startswith("Waived"):
            if running and running not in out["tests"]:
                out["tests"][running] = {"title": None, "columns": [], "rows": {}, "sum": None, "waived": True}
        elif _TITLE.match(line):
            matrix = {"title": _TITLE.match(line).group(1), "columns": None, "rows": {}, "sum": None, "waived": False}
            if running:
                out["tests"][running] = matrix
        elif _SUM.match(line):
            name, value = _SUM.match(line).groups()
            if matrix is None:
                raise ParseError("nvbandwidth: line %d: SUM %s without a matrix before it" % (no, name))
            matrix["sum"] = None if value == "N/A" else float(value)
            out["tests"][name] = matrix
            matrix, running = None, None
        elif matrix is not None and line.strip():
            _matrix_line(matrix, line, no)
    for name, test in out["tests"].items():
        if not test["waived"] and not test["rows"]:
            raise ParseError("nvbandwidth: %s: a matrix title without rows" % name)
    return out


def _matrix_line(matrix: Dict[str, Any], line: str, no: int) -> None:
    words = line.split()
    if matrix["columns"] is None:
        if not all(w.isdigit() for w in words):
            raise ParseError("nvbandwidth: line %d: expected the column indices after %r" % (no, matrix["title"]))
        matrix["columns"] = [int(w) for w in words]
        return
    if not words[0].isdigit():
        raise ParseError("nvbandwidth: line %d: expected a row index, got %r" % (no, words[0]))
    cells: List[Optional[float]] = [_cell(w, "line %d" % no) for w in words[1:]]
    if len(cells) != len(matrix["columns"]):
        raise ParseError("nvbandwidth: line %d: %d figures for %d columns" % (no, len(cells), len(matrix["columns"])))
    matrix["rows"][words[0]] = cells

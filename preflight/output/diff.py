"""What changed between two runs: new failures, recoveries, nodes gone or down, driver drift, bandwidth.

`diff(old, new)` compares two report documents; `render_diff` turns the result into plain text lines.
A *regression* (``has_regressions``, the CLI exits 1) is any of:

- a new failure: a (check, node) whose worst status is now fail/error and was not before (including
  a (check, node) absent from the old run);
- a node that went down: its ``ssh`` check is now fail/error and was not in the old run. Its other
  new failures are folded into that one entry (they are what unreachable means), not listed again;
- an all-reduce bus bandwidth drop larger than ``bw_threshold`` (relative, default 10%).

Reported but not regressions: recoveries, nodes added or removed (an inventory edit is deliberate),
driver version changes (an upgrade is not a fault; a driver that now mismatches fails its own check
and so shows up as a new failure), bandwidth gains, GPUs replaced (same node and PCI slot, another
serial number) and "lemons": a GPU serial that failed the gpu check in the old run and is now in
another slot or on another node (a part pulled for repair and put back into the fleet). Both come from
the reports' `hardware` section (serials and UUIDs from the gpu facts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.common import fold, printable
from preflight.model import Status

SSH_CHECK = "ssh"
DRIVER_CHECK = "driver"

Key = Tuple[str, Optional[str]]


@dataclass(frozen=True)
class StatusChange:
    """A (check, node) whose worst status moved across the fail/error line."""

    check: str
    node: Optional[str]  # None: cluster-wide
    old: Optional[str]  # None: not in the old run
    new: str
    message: str  # the new run's message(s) at the worst status


@dataclass(frozen=True)
class VersionChange:
    """A node whose driver check reports a different `actual` than before."""

    node: str
    old: str
    new: str


@dataclass(frozen=True)
class BandwidthChange:
    """The all-reduce bus bandwidth of both runs, and whether the change passes the threshold."""

    old_gbps: float
    new_gbps: float
    threshold: float

    @property
    def relative(self) -> float:
        """(new - old) / old; 0 when old is 0."""
        return (self.new_gbps - self.old_gbps) / self.old_gbps if self.old_gbps else 0.0

    @property
    def dropped(self) -> bool:
        return self.relative < -self.threshold

    @property
    def improved(self) -> bool:
        return self.relative > self.threshold


@dataclass(frozen=True)
class GpuChange:
    """A GPU slot whose serial changed, or a serial that failed before and now sits elsewhere."""

    serial: str
    node: str
    slot: str  # PCI bus id, else "GPU <index>"
    old_node: Optional[str] = None
    old_slot: Optional[str] = None
    old_serial: Optional[str] = None


@dataclass
class DiffResult:
    """Everything `diff` found; `has_regressions` decides the exit code."""

    old_started_at: Optional[str] = None
    new_started_at: Optional[str] = None
    inventory_changed: bool = False
    new_failures: List[StatusChange] = field(default_factory=list)
    went_down: List[StatusChange] = field(default_factory=list)
    recovered: List[StatusChange] = field(default_factory=list)
    nodes_added: List[str] = field(default_factory=list)
    nodes_removed: List[str] = field(default_factory=list)
    version_drift: List[VersionChange] = field(default_factory=list)
    busbw: Optional[BandwidthChange] = None
    busbw_note: Optional[str] = None  # why bandwidth could not be compared, when one side has it
    gpus_replaced: List[GpuChange] = field(default_factory=list)
    lemons: List[GpuChange] = field(default_factory=list)

    @property
    def busbw_dropped(self) -> bool:
        return self.busbw is not None and self.busbw.dropped

    @property
    def has_regressions(self) -> bool:
        return bool(self.new_failures or self.went_down or self.busbw_dropped)

    @property
    def has_changes(self) -> bool:
        return bool(
            self.has_regressions
            or self.recovered
            or self.nodes_added
            or self.nodes_removed
            or self.version_drift
            or self.gpus_replaced
            or self.lemons
            or (self.busbw is not None and self.busbw.improved)
            or self.inventory_changed
        )


_STATUSES = {s.value for s in Status}


def validate(report: Any) -> None:
    """Raise ValueError naming what is wrong unless `report` has the shape `preflight check --json` writes.

    Checked: a mapping with preflight_version, a results list of {check: str, node: str|null, status,
    message: str}, an optional nodes list of {name: str}, an optional allreduce mapping with a numeric
    busbw_gbps. Anything else (another tool's JSON, `{"a": 1}`) is not a report.
    """
    if not isinstance(report, dict):
        raise ValueError("the top level is %s, not an object" % type(report).__name__)
    if "preflight_version" not in report or not isinstance(report.get("results"), list):
        raise ValueError("no preflight_version and results list")
    for i, result in enumerate(report["results"]):
        if not (
            isinstance(result, dict)
            and isinstance(result.get("check"), str)
            and (result.get("node") is None or isinstance(result.get("node"), str))
            and result.get("status") in _STATUSES
            and isinstance(result.get("message", ""), str)
        ):
            raise ValueError("results[%d] is not a finding (check, node, status, message)" % i)
    nodes = report.get("nodes") or []
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("name"), str) for n in nodes):
        raise ValueError("nodes is not a list of {name: ...}")
    allreduce = report.get("allreduce")
    if allreduce is not None:
        bw = allreduce.get("busbw_gbps") if isinstance(allreduce, dict) else "x"
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float))):
            raise ValueError("allreduce.busbw_gbps is not a number")


def _worst_by_key(report: Mapping[str, Any]) -> Dict[Key, Tuple[Status, str]]:
    """(check, node) -> (worst status, the messages at that status joined by '; ')."""
    grouped: Dict[Key, List[Mapping[str, Any]]] = {}
    for result in report.get("results") or []:
        grouped.setdefault((result["check"], result.get("node")), []).append(result)
    out = {}
    for key, findings in grouped.items():
        worst = max((Status(f["status"]) for f in findings), key=lambda s: s.rank)
        message = "; ".join(f.get("message", "") for f in findings if f["status"] == worst.value)
        out[key] = (worst, message)
    return out


def _node_names(report: Mapping[str, Any]) -> List[str]:
    names = [n["name"] for n in report.get("nodes") or []]
    seen = set(names)
    for result in report.get("results") or []:  # a report without a nodes list still has findings
        node = result.get("node")
        if node is not None and node not in seen:
            seen.add(node)
            names.append(node)
    return names


def _driver_actuals(report: Mapping[str, Any]) -> Dict[str, str]:
    actuals: Dict[str, List[str]] = {}
    for result in report.get("results") or []:
        if result["check"] == DRIVER_CHECK and result.get("node") is not None and result.get("actual") is not None:
            values = actuals.setdefault(result["node"], [])
            if str(result["actual"]) not in values:
                values.append(str(result["actual"]))
    return {node: ", ".join(values) for node, values in actuals.items()}


def _busbw(report: Mapping[str, Any]) -> Optional[float]:
    allreduce = report.get("allreduce") or {}
    value = allreduce.get("busbw_gbps")
    return None if value is None else float(value)


def _gpu_slots(report: Mapping[str, Any]) -> Dict[Tuple[str, str], Mapping[str, Any]]:
    """{(node, slot): gpu record} from a report's hardware section (absent in reports before it existed)."""
    out = {}
    for node, hw in (report.get("hardware") or {}).items():
        for g in (hw or {}).get("gpus") or []:
            slot = g.get("pci_bus_id") or "GPU %s" % g.get("index")
            out[(node, slot)] = g
    return out


def _gpu_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> Tuple[List[GpuChange], List[GpuChange]]:
    before, after = _gpu_slots(old), _gpu_slots(new)
    replaced, lemons = [], []
    for (node, slot), g in sorted(after.items()):
        was = before.get((node, slot))
        if was and was.get("serial") and g.get("serial") and was["serial"] != g["serial"]:
            replaced.append(GpuChange(g["serial"], node, slot, old_serial=was["serial"]))
    failed = {g["serial"]: key for key, g in before.items() if g.get("serial") and g.get("failed")}
    for key, g in sorted(after.items()):
        where = failed.get(g.get("serial"))
        if where is not None and where != key:
            lemons.append(GpuChange(g["serial"], key[0], key[1], old_node=where[0], old_slot=where[1]))
    return replaced, lemons


def _sort_key(change: StatusChange) -> Tuple[str, str]:
    return (change.check, change.node or "")


def diff(old: Mapping[str, Any], new: Mapping[str, Any], bw_threshold: float = 0.10) -> DiffResult:
    """Compare two report documents (old first). bw_threshold is relative: 0.10 means 10%."""
    if bw_threshold < 0:
        raise ValueError("bw_threshold must be >= 0, got %r" % bw_threshold)
    result = DiffResult(
        old_started_at=old.get("started_at"),
        new_started_at=new.get("started_at"),
        inventory_changed=(old.get("inventory_sha256") or None) != (new.get("inventory_sha256") or None),
    )

    old_nodes, new_nodes = _node_names(old), _node_names(new)
    result.nodes_added = [n for n in new_nodes if n not in set(old_nodes)]
    result.nodes_removed = [n for n in old_nodes if n not in set(new_nodes)]

    before, after = _worst_by_key(old), _worst_by_key(new)

    down = set()
    for node in new_nodes:
        now = after.get((SSH_CHECK, node))
        if node not in old_nodes or now is None or not now[0].is_problem:
            continue
        was = before.get((SSH_CHECK, node))
        if was is not None and was[0].is_problem:
            continue
        down.add(node)
        result.went_down.append(
            StatusChange(SSH_CHECK, node, was[0].value if was else None, now[0].value, now[1])
        )

    for key, (status, message) in after.items():
        was = before.get(key)
        if status.is_problem and (was is None or not was[0].is_problem):
            if key[1] in down:
                continue
            result.new_failures.append(
                StatusChange(key[0], key[1], was[0].value if was else None, status.value, message)
            )
        elif not status.is_problem and was is not None and was[0].is_problem:
            result.recovered.append(StatusChange(key[0], key[1], was[0].value, status.value, message))
    result.new_failures.sort(key=_sort_key)
    result.recovered.sort(key=_sort_key)

    old_drivers, new_drivers = _driver_actuals(old), _driver_actuals(new)
    for node in new_nodes:
        if node in old_drivers and node in new_drivers and old_drivers[node] != new_drivers[node]:
            result.version_drift.append(VersionChange(node, old_drivers[node], new_drivers[node]))

    result.gpus_replaced, result.lemons = _gpu_changes(old, new)

    old_bw, new_bw = _busbw(old), _busbw(new)
    if old_bw is not None and new_bw is not None:
        result.busbw = BandwidthChange(old_bw, new_bw, bw_threshold)
    elif old_bw is not None:
        result.busbw_note = "all-reduce busbw %.2f GB/s before, not measured now" % old_bw
    elif new_bw is not None:
        result.busbw_note = "all-reduce busbw %.2f GB/s now, not measured before" % new_bw
    return result


def _where(change: StatusChange) -> str:
    return change.check if change.node is None else "%s %s" % (change.check, change.node)


def render_diff(result: DiffResult) -> List[str]:
    """The diff as plain text lines, regressions first; the last line is the verdict."""
    lines: List[str] = []
    if result.old_started_at or result.new_started_at:
        lines.append("preflight diff: %s -> %s" % (result.old_started_at or "?", result.new_started_at or "?"))
    if result.inventory_changed:
        lines.append("inventory changed (different inventory_sha256)")

    if result.went_down:
        lines.append("went down (%d): %s" % (len(result.went_down), fold([c.node for c in result.went_down])))
        lines.extend("  %s: ssh %s: %s" % (c.node, c.new, c.message) for c in result.went_down)
    if result.new_failures:
        lines.append("new failures (%d):" % len(result.new_failures))
        lines.extend(
            "  %s: %s -> %s: %s" % (_where(c), c.old or "absent", c.new, c.message) for c in result.new_failures
        )
    if result.busbw is not None and (result.busbw.dropped or result.busbw.improved):
        bw = result.busbw
        lines.append(
            "all-reduce busbw %s: %.2f -> %.2f GB/s (%+.1f%%, threshold %.0f%%)"
            % ("dropped" if bw.dropped else "improved", bw.old_gbps, bw.new_gbps, 100 * bw.relative,
               100 * bw.threshold)
        )
    if result.recovered:
        lines.append("recovered (%d):" % len(result.recovered))
        lines.extend("  %s: %s -> %s" % (_where(c), c.old, c.new) for c in result.recovered)
    if result.nodes_removed:
        lines.append("nodes removed (%d): %s" % (len(result.nodes_removed), fold(result.nodes_removed)))
    if result.nodes_added:
        lines.append("nodes added (%d): %s" % (len(result.nodes_added), fold(result.nodes_added)))
    if result.version_drift:
        lines.append("driver changed (%d):" % len(result.version_drift))
        lines.extend("  %s: %s -> %s" % (v.node, v.old, v.new) for v in result.version_drift)
    if result.lemons:
        lines.append("GPUs that failed before, back in the fleet (%d):" % len(result.lemons))
        lines.extend(
            "  serial %s: now %s %s; failed on %s %s" % (c.serial, c.node, c.slot, c.old_node, c.old_slot) for c in result.lemons
        )
    if result.gpus_replaced:
        lines.append("GPUs replaced (%d):" % len(result.gpus_replaced))
        lines.extend("  %s %s: serial %s -> %s" % (c.node, c.slot, c.old_serial, c.serial) for c in result.gpus_replaced)
    if result.busbw_note:
        lines.append(result.busbw_note)

    if result.has_regressions:
        count = len(result.went_down) + len(result.new_failures) + (1 if result.busbw_dropped else 0)
        lines.append("verdict: %d regression%s" % (count, "" if count == 1 else "s"))
    elif result.has_changes:
        lines.append("verdict: no regressions")
    else:
        lines.append("verdict: no changes")
    return [printable(line, keep_newlines=False) for line in lines]  # messages, serials, versions came from nodes

"""The report as a Prometheus text-format file for node_exporter's textfile collector.

Run preflight from cron with ``--prometheus /var/lib/node_exporter/textfile/preflight.prom``; the file
is replaced atomically, so the collector never scrapes half a file. All metrics are gauges, one
sample per series, no client timestamps (the textfile collector rejects them).

Status numbering (the same order as `Status.rank`, best to worst)::

    0 pass   1 skip   2 warn   3 fail   4 error

Metrics::

    preflight_check_status{check,node}          worst status of that check on that node (numbering above);
                                                node="" for a cluster-wide finding
    preflight_check_ok{check,node}              1 unless that status is fail or error (what the exit code uses)
    preflight_node_status{node}                 the node's status (report.NODE_STATUSES) on the same scale:
                                                0 pass, 1 unavailable (not checked: Slurm had it out of
                                                service), 2 warn, 3 fail (a finding failed or errored)
    preflight_nodes{status}                     nodes per node status (pass, warn, fail, unavailable: all
                                                four always present; the terminal's and JSON's counts)
    preflight_check_action{check,node,action}   1 for each action a failing finding asks for (isolate,
                                                reboot, reset_gpu, fix_config, check_app, retest)
    preflight_findings{status}                  number of findings per status (all five always present), and
                                                not_run: checks that could not run on an unreachable node
    preflight_last_run_timestamp_seconds        start of the run, Unix time (alert on its age)
    preflight_run_duration_seconds              wall time of the run
    preflight_exit_code                         0 ok, 1 something failed or errored
    preflight_run_info{version,inventory,inventory_sha256}   always 1
    preflight_allreduce_status                  all-reduce verdict (numbering above)
    preflight_allreduce_world_size              ranks in the all-reduce test
    preflight_allreduce_busbw_gbps              headline bus bandwidth, GB/s
    preflight_allreduce_threshold_gbps          the pass threshold, when one was set
    preflight_allreduce_algbw_gbps{bytes}       algorithm bandwidth per message size
    preflight_allreduce_curve_busbw_gbps{bytes} bus bandwidth per message size
    preflight_allreduce_time_seconds{bytes}     time of one all-reduce per message size
    preflight_allreduce_node_busbw_gbps{node,test}  each node's partner-free bus bandwidth (the report's
                                                allreduce.node_rounds: test loopback, nvlink or nic)

With ``--history`` the same file carries what the history database says (preflight.history.queries.metrics)::

    preflight_history_runs                                  runs in the database
    preflight_history_incidents{node}                       incidents (a failing run after a passing one)
    preflight_history_consecutive_failures{node}            failing runs in a row up to the last one
    preflight_history_seconds_since_last_incident{node}     from the start of its last incident to the last run
    preflight_history_flips{node}                           failing/passing changes in the last 30 runs
    preflight_history_repeat_fault_runs{node,subject,fault} runs a fault was seen in on the same GPU serial
                                                            or port within the escalation window (2 or more)
    preflight_history_incidents_per_1000_node_days          the fleet's incident rate
    preflight_history_actions{node,kind,shadow}             actions the last run recorded per node (drain,
                                                            hold, breaker, escalate, resume); shadow="1": --shadow

The all-reduce metrics are absent when the report has no all-reduce result (or the value is null).
Alert examples: ``max(preflight_check_status) >= 3``, ``time() - preflight_last_run_timestamp_seconds > 7200``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from preflight.output.history import PathLike, atomic_write_text, parse_timestamp
from preflight.model import Status

STATUS_VALUE = {s: s.rank for s in Status}  # pass 0, skip 1, warn 2, fail 3, error 4
NODE_VALUE = {"pass": 0, "unavailable": 1, "warn": 2, "fail": 3}  # a node's status on the same scale
NODE_STATUSES = ("pass", "warn", "fail", "unavailable")  # = preflight.output.report.NODE_STATUSES
OLD_NODE_STATUS = {"skip": "pass", "error": "fail"}  # node statuses of reports without schema_version

Labels = Tuple[Tuple[str, str], ...]


def escape_label_value(value: Any) -> str:
    """A label value escaped per the exposition format: backslash, double quote, newline."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(number)


class _Family:
    """One metric family: its HELP/TYPE header and its samples, rendered together."""

    def __init__(self, name: str, help_text: str) -> None:
        self.name = name
        self.help = help_text
        self.samples: Dict[Labels, Any] = {}

    def add(self, value: Any, **labels: Any) -> None:
        if value is None:
            return
        self.samples[tuple((k, "" if v is None else str(v)) for k, v in labels.items())] = value

    def render(self) -> List[str]:
        if not self.samples:
            return []
        lines = ["# HELP %s %s" % (self.name, _escape_help(self.help)), "# TYPE %s gauge" % self.name]
        for labels, value in self.samples.items():
            label_text = ",".join('%s="%s"' % (k, escape_label_value(v)) for k, v in labels)
            series = "%s{%s}" % (self.name, label_text) if label_text else self.name
            lines.append("%s %s" % (series, _format_value(value)))
        return lines


def _worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: s.rank)


def _check_statuses(results: Iterable[Mapping[str, Any]]) -> Dict[Tuple[str, str], Status]:
    """Worst status per (check, node); node "" for cluster-wide findings."""
    worst: Dict[Tuple[str, str], Status] = {}
    for result in results:
        key = (result["check"], result.get("node") or "")
        status = Status(result["status"])
        if key not in worst or status.rank > worst[key].rank:
            worst[key] = status
    return worst


def _node_statuses(report: Mapping[str, Any], checks: Dict[Tuple[str, str], Status]) -> Dict[str, str]:
    """The node status the report states; for a node it does not list, fail when a finding failed or
    errored, warn on a warning, else pass (report.node_statuses's rule)."""
    out: Dict[str, str] = {}
    for node in report.get("nodes") or []:
        if node.get("status") is not None:  # a report before schema 1.0 said skip/error for pass/fail
            out[node["name"]] = OLD_NODE_STATUS.get(node["status"], node["status"])
    worst: Dict[str, Status] = {}
    for (_, node), status in checks.items():
        if node and node not in out:
            worst[node] = _worst([worst.get(node, status), status])
    for node, status in worst.items():
        out[node] = "fail" if status.is_problem else "warn" if status is Status.WARN else "pass"
    return out


def _number(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def to_prometheus(report: Mapping[str, Any]) -> str:
    """The report document as Prometheus text exposition format (version 0.0.4)."""
    numbering = ", ".join("%d %s" % (s.rank, s.value) for s in sorted(Status, key=lambda s: s.rank))
    fam = {
        name: _Family(name, help_text)
        for name, help_text in [
            ("preflight_check_status",
             "Worst status of a check on a node (%s); node=\"\" is cluster-wide." % numbering),
            ("preflight_check_ok", "1 unless the check's worst status on the node is fail or error."),
            ("preflight_node_status", "Status of the node: 0 pass, 1 unavailable (out of service in Slurm, not "
                                      "checked), 2 warn, 3 fail."),
            ("preflight_nodes", "Number of nodes of each node status (pass, warn, fail, unavailable)."),
            ("preflight_check_action", "1 for each action a failing finding of the check on the node asks for."),
            ("preflight_findings", "Number of findings of each status in the last run."),
            ("preflight_last_run_timestamp_seconds", "Start time of the last preflight run, Unix seconds."),
            ("preflight_run_duration_seconds", "Wall time of the last preflight run in seconds."),
            ("preflight_exit_code", "Exit code of the last run: 0 ok, 1 a check failed or errored."),
            ("preflight_run_info", "Version and inventory of the last run; always 1."),
            ("preflight_allreduce_status", "Verdict of the all-reduce bandwidth test (%s)." % numbering),
            ("preflight_allreduce_world_size", "Number of ranks in the all-reduce test."),
            ("preflight_allreduce_busbw_gbps", "All-reduce bus bandwidth, GB/s."),
            ("preflight_allreduce_threshold_gbps", "All-reduce bus bandwidth pass threshold, GB/s."),
            ("preflight_allreduce_algbw_gbps", "All-reduce algorithm bandwidth per message size, GB/s."),
            ("preflight_allreduce_curve_busbw_gbps", "All-reduce bus bandwidth per message size, GB/s."),
            ("preflight_allreduce_time_seconds", "Time of one all-reduce per message size, seconds."),
            ("preflight_allreduce_node_busbw_gbps", "Bus bandwidth of the node alone (test: loopback, nvlink, nic), GB/s."),
        ]
    }

    checks = _check_statuses(report.get("results") or [])
    for (check, node), status in checks.items():
        fam["preflight_check_status"].add(STATUS_VALUE[status], check=check, node=node)
        fam["preflight_check_ok"].add(0 if status.is_problem else 1, check=check, node=node)
    nodes = _node_statuses(report, checks)
    for node, status in nodes.items():
        fam["preflight_node_status"].add(NODE_VALUE[status], node=node)
    for status in NODE_STATUSES:
        fam["preflight_nodes"].add(sum(1 for v in nodes.values() if v == status), status=status)
    for result in report.get("results") or []:
        if result.get("action") and Status(result["status"]).is_problem:
            fam["preflight_check_action"].add(1, check=result["check"], node=result.get("node") or "", action=result["action"])

    summary = report.get("summary") or {}
    for status in sorted(Status, key=lambda s: s.rank):
        fam["preflight_findings"].add(int(summary.get(status.value, 0)), status=status.value)
    if "not_run" in summary:
        fam["preflight_findings"].add(int(summary["not_run"]), status="not_run")

    started = parse_timestamp(report.get("started_at"))
    if started is not None:
        fam["preflight_last_run_timestamp_seconds"].add(started.timestamp())
    fam["preflight_run_duration_seconds"].add(_number(report.get("duration_s")))
    if report.get("exit_code") is not None:
        fam["preflight_exit_code"].add(int(report["exit_code"]))
    fam["preflight_run_info"].add(
        1,
        version=report.get("preflight_version") or "",
        inventory=report.get("inventory") or "",
        inventory_sha256=report.get("inventory_sha256") or "",
    )

    _allreduce(fam, report.get("allreduce"))
    lines: List[str] = []
    for family in fam.values():
        lines.extend(family.render())
    return "\n".join(lines) + "\n"


def _allreduce(fam: Dict[str, "_Family"], allreduce: Optional[Mapping[str, Any]]) -> None:
    """The all-reduce's figures: verdict, world size, busbw and threshold, the curve, each node's own rounds."""
    if allreduce:
        if allreduce.get("verdict"):
            fam["preflight_allreduce_status"].add(STATUS_VALUE[Status(allreduce["verdict"])])
        if allreduce.get("world_size") is not None:
            fam["preflight_allreduce_world_size"].add(int(allreduce["world_size"]))
        fam["preflight_allreduce_busbw_gbps"].add(_number(allreduce.get("busbw_gbps")))
        fam["preflight_allreduce_threshold_gbps"].add(_number(allreduce.get("threshold_gbps")))
        for point in allreduce.get("curve") or []:
            size = int(point["bytes"])
            fam["preflight_allreduce_algbw_gbps"].add(_number(point.get("algbw_gbps")), bytes=size)
            fam["preflight_allreduce_curve_busbw_gbps"].add(_number(point.get("busbw_gbps")), bytes=size)
            fam["preflight_allreduce_time_seconds"].add(_number(point.get("time_s")), bytes=size)
        for rnd in allreduce.get("node_rounds") or []:
            for node, gbps in sorted((rnd.get("nodes") or {}).items()):
                fam["preflight_allreduce_node_busbw_gbps"].add(_number(gbps), node=node, test=rnd.get("name") or "")


def history_metrics(history: Mapping[str, Any]) -> str:
    """The history's figures (preflight.history.queries.metrics) in the exposition format."""
    fam = {name: _Family(name, text) for name, text in [
        ("preflight_history_runs", "Runs kept in the preflight history database."),
        ("preflight_history_incidents", "Incidents of the node: runs it failed after a run it did not."),
        ("preflight_history_consecutive_failures", "Runs in a row the node failed, up to the last run."),
        ("preflight_history_seconds_since_last_incident", "Seconds from the start of the node's last incident to the last run."),
        ("preflight_history_flips", "Changes between failing and not failing in the node's last 30 runs."),
        ("preflight_history_repeat_fault_runs", "Runs the fault was seen in on the same GPU serial, port or node within the escalation window."),
        ("preflight_history_incidents_per_1000_node_days", "The fleet's incidents per 1,000 node-days."),
        ("preflight_history_actions", "Actions the last run recorded on the node (drain, hold, breaker, escalate); shadow=1: only decided."),
    ]}
    fam["preflight_history_runs"].add(int(history.get("runs") or 0))
    for node, d in sorted((history.get("nodes") or {}).items()):
        fam["preflight_history_incidents"].add(int(d["incidents"]), node=node)
        fam["preflight_history_consecutive_failures"].add(int(d["consecutive_failures"]), node=node)
        fam["preflight_history_flips"].add(int(d["flips"]), node=node)
        fam["preflight_history_seconds_since_last_incident"].add(_number(d.get("seconds_since_last_incident")), node=node)
    for r in history.get("repeats") or []:
        fam["preflight_history_repeat_fault_runs"].add(int(r["runs"]), node=r["node"], subject=r["subject"], fault=r["fault"])
    fam["preflight_history_incidents_per_1000_node_days"].add(_number((history.get("fleet") or {}).get("incidents_per_1000_node_days")))
    for a in history.get("actions") or []:
        fam["preflight_history_actions"].add(int(a["count"]), node=a["node"], kind=a["kind"], shadow=int(bool(a["shadow"])))
    lines: List[str] = []
    for family in fam.values():
        lines.extend(family.render())
    return "\n".join(lines) + "\n" if lines else ""


def write_prometheus(report: Mapping[str, Any], path: PathLike, history: Optional[Mapping[str, Any]] = None) -> None:
    """Write `to_prometheus(report)` (and, given the history's metrics, `history_metrics`) to path
    atomically (temporary file in the same directory, rename).

    Give path a ``.prom`` suffix for the textfile collector; the temporary file never has one.
    """
    atomic_write_text(path, to_prometheus(report) + (history_metrics(history) if history else ""))

"""Output at scale (issue 22 item 5): a 1,000-node run with 5 failing nodes stays one screen, and the
machine-readable outputs (JSON, JUnit, Prometheus) grow linearly with the node count.

The run is synthetic (no simulator): every selected check passes on every node with the messages the
rules write, except five nodes, each with its own root cause, in the shapes the rules produce them:
an unreachable node (ssh FAIL, every other check "not run"), a GPU with uncorrectable ECC errors, an
HCA port down, a jumbo-frame black hole on one ring path (both ends named), and a held rendezvous port.
Sizes are compared, never timings.
"""

from __future__ import annotations

import io

from rich.console import Console

from preflight import checks
from preflight.engine import RunReport
from preflight.model import NOT_RUN, NOT_RUN_MESSAGE
from preflight.inventory import Inventory, NodeSpec
from preflight.model import Finding, NodeInfo, Status
from preflight.output import report
from preflight.output.junit import to_junit
from preflight.output.prometheus import to_prometheus
from tests import builders

#: a terminal screen: 24 lines is a VT100, 50 what a laptop's terminal shows; the report must fit the latter
SCREEN_LINES = 50
SELECTED = [n for n in checks.CHECK_NAMES if n != "allreduce"]


def name(i: int) -> str:
    return "gpu-%04d" % i


def failing(n: int) -> dict:
    """The five failing nodes, spread over the fleet (their positions scale with n)."""
    return {"unreachable": n // 7, "ecc": n // 3, "hca": n // 2, "mtu": (2 * n) // 3, "port": n - 1}


def run(n: int) -> RunReport:
    bad = failing(n)
    findings = []
    for i in range(1, n + 1):
        node = name(i)
        if i == bad["unreachable"]:
            findings.append(Finding("ssh", node, Status.FAIL, "unreachable: connect timed out after 10 s", action="isolate",
                                    data={"unreachable": True}))
            findings += [Finding(c, node, Status.ERROR, NOT_RUN_MESSAGE, data={NOT_RUN: True}) for c in SELECTED[1:]]
            continue
        for check in SELECTED:
            # passes carry per-node values (the report folds them away unless --verbose)
            findings.append(Finding(check, node, Status.PASS, "%s ok on %s (10.0.%d.%d)" % (check, node, i // 250, i % 250)))
    findings.append(Finding("gpu", name(bad["ecc"]), Status.FAIL,
                            "%s GPU 3 (00000000:4E:00.0): 2 uncorrectable ECC errors (expected 0)" % name(bad["ecc"]),
                            expected="0", actual="2", action="reset_gpu"))
    findings.append(Finding("ib_hca", name(bad["hca"]), Status.FAIL,
                            "%s mlx5_3 port 1: state DOWN (expected ACTIVE at 400 Gb/s)" % name(bad["hca"]), action="isolate"))
    src, dst = name(bad["mtu"]), name(bad["mtu"] + 1)
    findings.append(Finding("mtu", src, Status.FAIL, "%s → %s: 8972-byte DF ping lost (1000-byte ping ok): jumbo frames "
                            "black-holed (one failing path: the fault may be at either end)" % (src, dst), data={"path": [src, dst]}))
    findings.append(Finding("ports", name(bad["port"]), Status.FAIL,
                            "%s: port 29500 is held by another process (pid 4242 python3)" % name(bad["port"]), action="check_app"))
    # a failing node's PASS for the same check goes: one verdict per (check, node)
    failed = {(f.check, f.node) for f in findings if f.status.is_problem}
    findings = [f for f in findings if f.status.is_problem or (f.check, f.node) not in failed]
    nodes = [NodeSpec(name=name(i), host="10.0.%d.%d" % (i // 250, i % 250 + 1), line=i) for i in range(1, n + 1)]
    inv = Inventory(path="hosts.yaml", nodes=nodes, sha256="ab" * 32)
    infos = [NodeInfo(s.name, s.host, 8, i == 0) for i, s in enumerate(nodes)]
    view = builders.view({s.name: {} for s in nodes}, nodes=infos)
    return RunReport(inv, list(SELECTED), findings, view, "2026-11-25T13:00:00Z", 42.0)


def render(rep: RunReport, width: int = 120) -> str:
    buf = io.StringIO()
    report.render(rep, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


def test_a_thousand_nodes_with_five_failing_fit_one_screen():
    text = render(run(1000))
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES, "%d lines:\n%s" % (len(lines), text)
    bad = failing(1000)
    for what, i in bad.items():
        assert name(i) in text, "%s node %s is not named:\n%s" % (what, name(i), text)
    # one line per cause: each failing node's problem is one table row, the unreachable node's 17 "not run"
    # findings fold into its ssh line
    rows = [line for line in lines if line.startswith(("FAIL", "ERROR"))]
    assert len(rows) == 4 + 1, text  # ecc, hca, mtu, port, ssh
    assert "not run" in next(r for r in rows if name(bad["unreachable"]) in r)
    # passes fold into one row per set of nodes: the checks that passed on every reachable node (all but
    # the four that failed on one: gpu, ib_hca, mtu, ports) share
    # one, and each check with a failing node has its own (its range cut around that node)
    passes = [line for line in lines if line.startswith("PASS")]
    assert len(passes) == 1 + 4, text
    assert passes[0].split()[1:3] == [str(len(SELECTED) - 4), "checks"] and "all but gpu-0142 " in passes[0], text
    assert any("all but gpu-[0142,0333] " in line for line in passes), text  # shorter than gpu-[0001-0141,...]


def test_the_screen_does_not_grow_with_the_fleet():
    """100 and 1,000 nodes with the same five faults print the same number of lines (only ranges widen)."""
    assert len(render(run(100)).splitlines()) == len(render(run(1000)).splitlines())


def sizes(n: int) -> dict:
    doc = report.to_json(run(n))
    return {"json": len(report.dumps(doc)), "junit": len(to_junit(doc)), "prometheus": len(to_prometheus(doc))}


def test_machine_readable_outputs_grow_linearly():
    """Bytes per node stay flat from 250 to 1,000 nodes: no output repeats the node list per node.

    A quadratic term (say, every node's entry naming the majority's nodes) would make the per-node size
    at 1,000 nodes about 4x that at 250; linear output keeps it within a few percent (node names and
    addresses get one digit longer, the fixed header shrinks per node)."""
    small, mid, big = sizes(250), sizes(500), sizes(1000)
    for fmt in small:
        per_node = [small[fmt] / 250, mid[fmt] / 500, big[fmt] / 1000]
        assert max(per_node) <= 1.1 * min(per_node), "%s: bytes per node %s at 250/500/1000 nodes" % (fmt, per_node)

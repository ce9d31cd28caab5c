"""Issue 26 item 17: text read from nodes never reaches a terminal, a `preflight node` log line or a Slurm drain
reason as raw control characters. One helper (preflight.common.printable) at each output boundary; these
tests plant ESC/OSC/CSI sequences where nodes can (nccl.conf values, NCCL_* env, messages) and read the
outputs back."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from preflight.common import printable
from preflight.engine import RunReport
from preflight.inventory import Inventory, NodeSpec
from preflight.model import Finding, NodeInfo, Status
from preflight.output import report
from preflight.slurm import drain
from tests.paths import REPO
from tests import builders


#: what a hostile or corrupted node can put in a value: OSC 52 (set the clipboard, BEL- and ST-terminated),
#: CSI 2J (clear the screen), OSC 0 (retitle the window), a one-byte C1 CSI, a bidi override, CR over-printing
OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"
OSC52_ST = "\x1b]52;c;cm0gLXJmIH4=\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
TITLE = "\x1b]0;root@prod\x07"
C1_CSI = "\x9b2J"
BIDI = "\u202eFAIL\u202c"
HOSTILE = "eth0" + OSC52 + CLEAR + TITLE + C1_CSI + BIDI + "\rPASS"


def raw_controls(text):
    """The control characters in text other than newline and tab (what a terminal would act on)."""
    return sorted({c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f
                   or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"})


@pytest.mark.parametrize("raw,shown", [
    (OSC52, "\\x1b]52;c;cm0gLXJmIH4=\\x07"),
    (OSC52_ST, "\\x1b]52;c;cm0gLXJmIH4=\\x1b\\"),
    (CLEAR, "\\x1b[2J\\x1b[H"),
    (C1_CSI, "\\x9b2J"),
    (BIDI, "\\u202eFAIL\\u202c"),
    ("a\rb\x00c\x7fd\x0be", "a\\rb\\x00c\\x7fd\\x0be"),
])
def test_printable_shows_each_control_character_as_an_escape(raw, shown):
    assert printable(raw) == shown
    assert not raw_controls(printable(raw))


def test_printable_leaves_plain_text_alone():
    for text in ("n001 mlx5_0 port 1: state DOWN (expected ACTIVE at 400 Gb/s)", "gpu-[001-063] · ✓ ±5 °C",
                 "failed [/__w/pair.cc:537] [bold]x[/bold]", "a\tb\nc", "", "C:\\path\\x1b (text, not ESC)"):
        assert printable(text) == text
    assert printable("a\nb", keep_newlines=False) == "a\\nb"
    assert printable(42) == "42"


def _report(findings):
    nodes = [NodeSpec(name=n, host=n, line=i) for i, n in enumerate(("n001", "n002"))]
    view = builders.view({s.name: {} for s in nodes},
                         nodes=[NodeInfo(s.name, s.host, 8, i == 0) for i, s in enumerate(nodes)])
    return RunReport(Inventory(path="hosts.yaml", nodes=nodes), ["nccl_env"], findings, view, "2026-11-25T13:00:00Z", 1.0)


def test_console_report_escapes_node_text_in_findings_and_what_to_do():
    """A real terminal console (force_terminal: rich writes its own style escapes): none of the node's."""
    rep = _report([Finding("nccl_env", "n002", Status.FAIL, "n002: NCCL_SOCKET_IFNAME=%s (/etc/nccl.conf:3)" % HOSTILE,
                           action="fix_config")])
    buf = io.StringIO()
    report.render(rep, Console(file=buf, width=400, force_terminal=True, color_system="standard"))
    out = buf.getvalue()
    for sequence in (OSC52, "\x1b]52", CLEAR, "\x1b[2J", TITLE, "\x9b", "\u202e", "\r"):
        assert sequence not in out, repr(sequence)
    assert "NCCL_SOCKET_IFNAME=eth0\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J" in out
    plain = io.StringIO()
    report.render(rep, Console(file=plain, width=400, color_system=None, force_terminal=False))
    assert not raw_controls(plain.getvalue()), raw_controls(plain.getvalue())


def test_node_mode_line_and_drain_reason_escape_node_text():
    from preflight.cli import node as nodecheck

    finding = Finding("nccl_env", "n001", Status.FAIL, "NCCL_IB_HCA=%s set in the environment" % HOSTILE,
                      expected="mlx5" + TITLE)
    line = nodecheck.line(finding)
    assert line.startswith("preflight: FAIL nccl_env: NCCL_IB_HCA=eth0\\x1b]52;c;") and not raw_controls(line), line
    assert "(expected mlx5\\x1b]0;root@prod\\x07)" in line
    reason = drain.reason_for(finding)
    assert reason.startswith("preflight: nccl_env: NCCL_IB_HCA=eth0\\x1b]52") and not raw_controls(reason), reason
    assert len(reason) <= drain.REASON_MAX


def test_drain_plan_lines_escape_another_users_reason():
    plan = drain.Plan()
    plan.left_alone["n003"] = "drained by someone else: bad dimm" + CLEAR  # as plan() words it
    assert plan.lines() == ["left alone: n003 (drained by someone else: bad dimm\\x1b[2J\\x1b[H)"]


def test_diff_lines_escape_messages_from_reports(tmp_path):
    from preflight.output import diff

    def doc(status, message):
        return {"started_at": "t", "inventory_sha256": "x", "exit_code": 1, "checks": ["nccl_env"],
                "nodes": [{"name": "n001", "status": status}],
                "results": [{"check": "nccl_env", "node": "n001", "status": status, "message": message}]}

    result = diff.diff(doc("pass", "ok"), doc("fail", "NCCL_DEBUG=" + HOSTILE))
    lines = diff.render_diff(result)
    assert any("NCCL_DEBUG=eth0\\x1b]52" in l for l in lines), lines
    assert not [l for l in lines if raw_controls(l)]


def test_preflight_node_shows_an_nccl_variable_with_escapes_escaped(sim_cluster):
    """`preflight node` as slurmd runs it, with NCCL_SOCKET_IFNAME in its environment holding OSC/CSI sequences:
    the log line (and so the drain reason the wrapper cuts from it) shows them escaped."""
    from tests.builders import node_check

    cluster = sim_cluster(1)
    out = node_check(cluster, "n001", "--gpus-per-node", "0", "--only", "nccl_env", env={"NCCL_SOCKET_IFNAME": HOSTILE})
    lines = out.stdout.splitlines()
    assert out.returncode == 1 and lines[0].startswith("preflight: FAIL nccl_env: "), out.stdout + out.stderr
    assert "NCCL_SOCKET_IFNAME=eth0\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J" in lines[0], lines[0]
    assert not raw_controls(out.stdout + out.stderr), raw_controls(out.stdout + out.stderr)


def test_a_nodes_nccl_conf_escape_sequences_reach_the_console_escaped(sim_cluster):
    """The whole CLI over SSH, console output as a person reads it: a node's /etc/nccl.conf holds OSC 52 and CSI
    sequences in a value; the report names the line, with every control character shown as an escape."""
    cluster = sim_cluster(2)
    cluster.node("n002").write_host_file("/etc/nccl.conf", "NCCL_SOCKET_IFNAME=%s\n" % HOSTILE)
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", cluster.inventory(), "--only", "nccl_env",
                        "--no-progress"], cwd=REPO, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not raw_controls(proc.stdout + proc.stderr), raw_controls(proc.stdout + proc.stderr)
    assert "NCCL_SOCKET_IFNAME=eth0\\x1b]52;c;cm0gLXJmIH4=\\x07" in proc.stdout, proc.stdout

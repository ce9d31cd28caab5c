"""derived.rendezvous: the ranks of the rendezvous's burst, the head's short backlog, and the env file's note on
what it costs (rendered into a file that still sources cleanly)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from preflight.derived import ncclenv, rendezvous
from preflight.engine import RunReport
from preflight.output import envfile
from tests.builders import env_view


def _view(somaxconn, syn=4096):
    """3 nodes of 8 GPUs (24 ranks), the ports check verified, the head's somaxconn facts as given (None: not read)."""
    view = env_view(3)
    if somaxconn is not None:
        view.facts["n001"]["somaxconn"] = {"somaxconn": somaxconn, "tcp_max_syn_backlog": syn}
    return view


def test_a_short_head_backlog_is_noted_in_the_env_file_with_its_cost_and_fix(tmp_path):
    view = _view(16, syn=128)
    assert rendezvous.short_backlog(view) == {"head": "n001", "somaxconn": 16, "ranks": 24, "tcp_max_syn_backlog": 128}
    derived = ncclenv.derive(view)
    notes = [n for n in derived.notes if n.startswith("somaxconn check:")]
    assert notes == ["somaxconn check: n001's net.core.somaxconn is 16, below the 24 ranks that connect to MASTER_ADDR "
                     "at once: expect the rendezvous to take about 1 s longer, 3 s for a rank whose SYN is dropped twice "
                     "(%s); fix on n001: sysctl -w net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096 (persist it "
                     "in /etc/sysctl.d/)" % rendezvous.MEASURED]
    assert "MASTER_ADDR" in derived.as_dict()  # a slower rendezvous is still a verified one
    report = RunReport(inventory=SimpleNamespace(path="/etc/preflight/hosts.yaml", sha256="ab" * 32), selected=[],
                       findings=[], view=view, started_at="", duration_s=0.0, allreduce=None, env=derived)
    text = envfile.render(report)
    assert "# note: somaxconn check: n001's net.core.somaxconn is 16" in text
    path = tmp_path / "nccl.env"
    path.write_text(text)
    out = subprocess.run(["sh", "-ec", ". %s" % path], capture_output=True, text=True, env={})
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_enough_unknown_or_unread_backlogs_add_no_note():
    for view in (_view(24), _view(4096), _view(None)):
        assert rendezvous.short_backlog(view) is None
        assert not [n for n in ncclenv.derive(view).notes if n.startswith("somaxconn check:")]
    unknown = _view(16)
    unknown.facts["n001"]["somaxconn"] = {"somaxconn": None, "tcp_max_syn_backlog": None}
    assert rendezvous.short_backlog(unknown) is None
    failed = _view(16)
    failed.facts["n001"]["somaxconn"] = {"probe_error": "ParseError"}
    assert rendezvous.short_backlog(failed) is None

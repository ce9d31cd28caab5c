"""somaxconn: the probe in real network and mount namespaces, and the rule's warning with its healthy twins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from preflight.checks.somaxconn import probe as somax_probe
from preflight.checks.somaxconn import rule as somax_rule
from preflight.derived import rendezvous
from preflight.model import NodeInfo, Status
from preflight.probe.context import NodeContext
from tests.builders import names, view
from tests.paths import REPO

PROBE = "import json; from preflight.checks.somaxconn import probe as p; from preflight.probe.context import " \
        "NodeContext; print(json.dumps(p.probe(NodeContext())))"
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")


def _in_namespace(setup: str, flags: str = "-n"):
    """The probe's facts run under `unshare flags` after the shell commands `setup` (a namespace of its own:
    nothing outlives the call, and this host's sysctls are untouched)."""
    env = dict(os.environ, PYTHONPATH=REPO)
    out = subprocess.run(["unshare"] + flags.split() + ["sh", "-ec", setup + '\nexec "$0" -c "$1"', sys.executable,
                                                        PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _facts(somaxconn=4096, syn=2048):
    return {"somaxconn": {"somaxconn": somaxconn, "tcp_max_syn_backlog": syn}}


def _judge(nodes=1, gpus=8, head=None, others=None):
    """The rule over `nodes` nodes of `gpus` GPUs, the head (n001) with `head` facts, the others with `others`."""
    facts = {n: (head if i == 0 else others) or _facts() for i, n in enumerate(names(nodes))}
    return somax_rule.rule(view(facts, gpus=gpus))


def test_probe_reads_this_hosts_namespace():
    facts = somax_probe.probe(NodeContext())
    for key, path in somax_probe.SYSCTLS:
        with open(path) as fh:
            assert facts[key] == int(fh.read())


@needs_root
def test_probe_reads_the_namespace_the_store_listens_in():
    """Both sysctls are per network namespace (a simulated node has its own): the probe reads its own."""
    before = somax_probe.probe(NodeContext())
    facts = _in_namespace("sysctl -qw net.core.somaxconn=128 net.ipv4.tcp_max_syn_backlog=256")
    assert facts == {"somaxconn": 128, "tcp_max_syn_backlog": 256}
    assert somax_probe.probe(NodeContext()) == before  # this host's own values are untouched


@needs_root
def test_probe_says_none_when_the_proc_file_is_missing():
    """/proc/sys/net/core hidden (a tmpfs over it, in a mount namespace of its own): None, not a number."""
    facts = _in_namespace("mount -t tmpfs none /proc/sys/net/core", "-m -n")
    assert facts["somaxconn"] is None and isinstance(facts["tcp_max_syn_backlog"], int)


def test_old_kernel_default_on_a_1024_rank_head_warns_with_the_cost_and_the_fix():
    out = _judge(nodes=128, head=_facts(128, 512))
    head = [f for f in out if f.node == "n001"]
    assert [(f.status, f.action) for f in head] == [(Status.WARN, "fix_config")]
    msg = head[0].message
    assert msg.startswith("n001: net.core.somaxconn is 128, below the 1,024 ranks that connect to the rendezvous store "
                          "at once (one per GPU: 8 GPUs on each of 128 nodes)")
    assert "waits out TCP's SYN retransmission (1 s, then 3 s" in msg and "3.24 s instead of 2.2 s" in msg
    assert msg.endswith("fix on n001: sysctl -w net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096 "
                        "(persist it in /etc/sysctl.d/)")
    assert (head[0].expected, head[0].actual) == (">= 1024 (the ranks)", "128")
    assert head[0].data == {"somaxconn": 128, "tcp_max_syn_backlog": 512, "ranks": 1024}


def test_old_kernel_default_on_a_small_cluster_passes_and_says_the_value():
    out = _judge(nodes=8, head=_facts(128, 1024))
    head = [f for f in out if f.node == "n001"]
    assert [f.status for f in head] == [Status.PASS]
    assert head[0].message == ("n001: net.core.somaxconn 128 holds the 64 ranks that connect to the rendezvous store "
                               "at once (one per GPU: 8 GPUs on each of 8 nodes) (tcp_max_syn_backlog 1024)")
    assert [f.status for f in _judge(nodes=16, head=_facts(128))].count(Status.WARN) == 0  # 128 ranks: at, not below


def test_only_the_head_is_judged():
    out = _judge(nodes=128, others=_facts(128, 128))
    assert [(f.node, f.status) for f in out if f.status is not Status.SKIP] == [("n001", Status.PASS)]
    skipped = [f for f in out if f.status is Status.SKIP]
    assert len(skipped) == 127 and skipped[0].message.startswith("not the head: only the node hosting rank 0 (n001)")


def test_a_head_whose_proc_file_is_unreadable_is_unknown_not_passed():
    out = _judge(nodes=128, head=_facts(None, None))
    head = [f for f in out if f.node == "n001"]
    assert [(f.status, f.actual) for f in head] == [(Status.WARN, "unknown")]
    assert "net.core.somaxconn unknown (/proc/sys/net/core/somaxconn could not be read)" in head[0].message
    # a probe that failed (unparsable text) or never ran is an ERROR, never a PASS
    err = somax_rule.rule(view({"n001": {"somaxconn": {"probe_error": "ParseError: expected one integer"}}}))
    assert [f.status for f in err] == [Status.ERROR]
    assert [f.status for f in somax_rule.rule(view({"n001": {}}))] == [Status.ERROR]


def test_cpu_nodes_count_one_gloo_rank_each():
    assert rendezvous.ranks([NodeInfo(n, n, 0) for n in names(200)]) == (
        200, "one per node: the gloo all-reduce over nodes without GPUs")
    out = somax_rule.rule(view({n: _facts(128) for n in names(200)}, gpus=0))
    assert [f.status for f in out if f.node == "n001"] == [Status.WARN]
    assert [f.status for f in somax_rule.rule(view({n: _facts(128) for n in names(100)}, gpus=0))
            if f.node == "n001"] == [Status.PASS]
    mixed = [NodeInfo("a", "a", 8), NodeInfo("b", "b", 4)]
    assert rendezvous.ranks(mixed) == (12, "one per GPU: the GPUs of 2 nodes")


def test_the_fix_asks_for_the_ranks_past_the_default_and_leaves_a_large_syn_backlog_alone():
    assert rendezvous.fix_command(8192, 16384) == "sysctl -w net.core.somaxconn=8192 (persist it in /etc/sysctl.d/)"
    assert rendezvous.fix_command(256, None).endswith("net.ipv4.tcp_max_syn_backlog=4096 (persist it in /etc/sysctl.d/)")
    # the default 4096 is itself short for 8,192 ranks: warned, with the ranks as the value to set
    out = _judge(nodes=1024, head=_facts(4096, 8192))
    assert [f.status for f in out if f.node == "n001"] == [Status.WARN]


def test_an_unreached_head_is_left_to_the_ssh_check():
    nodes = names(4)
    out = somax_rule.rule(view({n: _facts() for n in nodes[1:]}, nodes=nodes))
    assert {f.status for f in out} == {Status.SKIP} and "n001" not in {f.node for f in out}

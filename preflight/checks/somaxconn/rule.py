"""The somaxconn check's controller half: the head's listen backlog against the ranks of the rendezvous (pure)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.checks.somaxconn import NAME
from preflight.checks.somaxconn.probe import SYSCTLS
from preflight.model import ClusterView, Finding, NodeInfo, Status, probe_error

#: The kernel's somaxconn default since Linux 5.4 (ip-sysctl.rst): what the fix asks for at the least.
DEFAULT = 4096
#: What a burst past the accept queue cost, measured with real torch TCPStore clients (docs/speed.md).
MEASURED = ("measured with somaxconn 128: 1,024 ranks connected in 3.24 s instead of 2.2 s, 256 in 1.12 s "
            "instead of 0.40 s")


def rendezvous_ranks(nodes: Sequence[NodeInfo]) -> Tuple[int, str]:
    """(ranks that connect to rank 0's store at once, how they were counted) for a run over `nodes`: one per GPU
    when every node has GPUs (the nccl all-reduce, and a torchrun job's workers), else one per node (gloo)."""
    gpus = [n.gpus_per_node for n in nodes]
    if gpus and all(g > 0 for g in gpus):
        each = "%d GPUs on each of %d nodes" % (gpus[0], len(gpus)) if len(set(gpus)) == 1 else \
            "the GPUs of %d nodes" % len(gpus)
        return sum(gpus), "one per GPU: %s" % each
    return len(gpus), "one per node: the gloo all-reduce over nodes without GPUs"


def rule(view: ClusterView) -> List[Finding]:
    """The head's somaxconn against the rendezvous's ranks: below WARNs (fix_config), at or above PASSes, unread
    WARNs unknown; every other node SKIPs (its backlog takes no rendezvous)."""
    head = view.head.name
    out = [Finding(NAME, name, Status.SKIP, "not the head: only the node hosting rank 0 (%s) takes the rendezvous "
                   "connections" % head) for name in view.of(NAME) if name != head]
    if head not in view.facts:  # unreachable: the ssh check names it
        return out
    facts = view.facts[head].get(NAME)
    err = probe_error(NAME, head, facts)
    return out + [err if err else judge(head, facts, *rendezvous_ranks(view.nodes))]


def judge(head: str, facts: Dict[str, Any], ranks: int, counted: str) -> Finding:
    """One finding on the head: its somaxconn against `ranks` (counted as `counted` says)."""
    somax, syn = facts.get("somaxconn"), facts.get("tcp_max_syn_backlog")
    who = "the %s ranks that connect to the rendezvous store at once (%s)" % (format(ranks, ","), counted)
    data = {"somaxconn": somax, "tcp_max_syn_backlog": syn, "ranks": ranks}
    expected = ">= %d (the ranks)" % ranks
    if somax is None:
        return Finding(NAME, head, Status.WARN, "%s: net.core.somaxconn unknown (%s could not be read): whether its "
                       "listen backlog holds %s is not known" % (head, dict(SYSCTLS)["somaxconn"], who),
                       expected=expected, actual="unknown", data=data)
    syn_text = "tcp_max_syn_backlog %s" % ("unknown" if syn is None else syn)
    if somax >= ranks:
        return Finding(NAME, head, Status.PASS, "%s: net.core.somaxconn %d holds %s (%s)" % (head, somax, who, syn_text),
                       expected=expected, actual=str(somax), data=data)
    return Finding(
        NAME, head, Status.WARN, "%s: net.core.somaxconn is %d, below %s: the kernel truncates the store's listen "
        "backlog to %d, so the SYNs of the rest of the burst are dropped and each of those ranks waits out TCP's SYN "
        "retransmission (1 s, then 3 s after its first try) before it connects (%s); fix on %s: %s" % (
            head, somax, who, somax, MEASURED, head, fix_command(ranks, syn)),
        expected=expected, actual=str(somax), action="fix_config", data=data)


def fix_command(ranks: int, syn: Optional[int]) -> str:
    """The sysctl that makes the head's queues hold `ranks`: somaxconn, and tcp_max_syn_backlog when it is lower
    too (or unknown): it bounds the SYN queue where syncookies are off."""
    want = max(DEFAULT, ranks)
    extra = "" if syn is not None and syn >= want else " net.ipv4.tcp_max_syn_backlog=%d" % want
    return "sysctl -w net.core.somaxconn=%d%s (persist it in /etc/sysctl.d/)" % (want, extra)

"""The somaxconn check's controller half: the head's listen backlog against the ranks of the rendezvous (pure)."""

from __future__ import annotations

from typing import Any, Dict, List

from preflight.checks.somaxconn import NAME
from preflight.checks.somaxconn.probe import SYSCTLS
from preflight.derived import rendezvous
from preflight.model import ClusterView, Finding, Status, probe_error


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
    return out + [err if err else judge(head, facts, *rendezvous.ranks(view.nodes))]


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
            head, somax, who, somax, rendezvous.MEASURED, head, rendezvous.fix_command(ranks, syn)),
        expected=expected, actual=str(somax), action="fix_config", data=data)


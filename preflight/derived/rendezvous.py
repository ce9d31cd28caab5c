"""The rendezvous's burst: how many ranks connect to rank 0's store on the head at once, and whether the head's
listen backlog (net.core.somaxconn, the somaxconn check's facts) holds them. Pure; read by the somaxconn rule
and by the env file's note on the expected extra rendezvous seconds."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from preflight.checks.somaxconn import NAME
from preflight.model import ClusterView, NodeInfo

#: The kernel's somaxconn default since Linux 5.4 (ip-sysctl.rst): what the fix asks for at the least.
DEFAULT = 4096
#: What the ranks past a short accept queue cost, measured with real torch TCPStore clients (docs/speed.md).
MEASURED = ("measured with somaxconn 128: 1,024 ranks connected in 3.24 s instead of 2.2 s, 256 in 1.12 s "
            "instead of 0.40 s")


def ranks(nodes: Sequence[NodeInfo]) -> Tuple[int, str]:
    """(ranks that connect to rank 0's store at once, how they were counted) for a run over `nodes`: one per GPU
    when every node has GPUs (the nccl all-reduce, and a torchrun job's workers), else one per node (gloo)."""
    gpus = [n.gpus_per_node for n in nodes]
    if gpus and all(g > 0 for g in gpus):
        each = "%d GPUs on each of %d nodes" % (gpus[0], len(gpus)) if len(set(gpus)) == 1 else \
            "the GPUs of %d nodes" % len(gpus)
        return sum(gpus), "one per GPU: %s" % each
    return len(gpus), "one per node: the gloo all-reduce over nodes without GPUs"


def short_backlog(view: ClusterView) -> Optional[Dict[str, Any]]:
    """{"head", "somaxconn", "ranks", "tcp_max_syn_backlog"} when the head's somaxconn is known and below the ranks of a run over the
    inventory; else None (enough, unknown, or not read)."""
    somax, syn = head_sysctls(view)
    count = ranks(view.nodes)[0]
    if somax is None or somax >= count:
        return None
    return {"head": view.head.name, "somaxconn": somax, "ranks": count, "tcp_max_syn_backlog": syn}


def head_sysctls(view: ClusterView) -> Tuple[Optional[int], Optional[int]]:
    """(somaxconn, tcp_max_syn_backlog) the somaxconn check read on the head; None for each not known."""
    facts = (view.facts.get(view.head.name) or {}).get(NAME)
    values = [facts.get(k) if isinstance(facts, dict) else None for k in ("somaxconn", "tcp_max_syn_backlog")]
    return values[0] if isinstance(values[0], int) else None, values[1] if isinstance(values[1], int) else None


def fix_command(count: int, syn: Optional[int]) -> str:
    """The sysctl that makes the head's queues hold `count` ranks: somaxconn, and tcp_max_syn_backlog when it is
    lower too (or unknown): it bounds the SYN queue where syncookies are off."""
    want = max(DEFAULT, count)
    extra = "" if syn is not None and syn >= want else " net.ipv4.tcp_max_syn_backlog=%d" % want
    return "sysctl -w net.core.somaxconn=%d%s (persist it in /etc/sysctl.d/)" % (want, extra)

"""The RDMA rails NCCL uses on each node (NCCL_IB_HCA), derived once per cluster view: what topology reads
to judge GPU↔NIC affinity on the compute NICs only, not on storage or management ports.

Controller side. The choice itself is the ib_hca check's usable_hcas (ACTIVE ports at the expected rate, of
the link layer most usable ports have: an H100 node's 8 InfiniBand rails, not its BlueField-3 Ethernet
port), the same the env file writes as NCCL_IB_HCA; here it is carried on the view (ClusterView.derive),
so readers neither recompute it nor dig in ib_hca's facts.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Set

DERIVED = "rails"


def _choose(view: Any) -> Dict[str, Any]:
    from preflight.checks.ib_hca import rule as ib_hca_rule

    return ib_hca_rule.usable_hcas(view)


def of(view: Any) -> Dict[str, Any]:
    """The ib_hca rule's usable_hcas(view), computed once per view."""
    return view.derive(DERIVED, _choose)


def compute_hcas(view: Any, node: str) -> Optional[Set[str]]:
    """The HCA devices (mlx5_0) carrying the node's NCCL rails; None when the node has no ib_hca facts
    (its rails unknown)."""
    ports = of(view)["nodes"].get(node)
    if ports is None:
        return None
    return {label.rsplit(":", 1)[0] for label in ports}

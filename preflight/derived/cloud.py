"""Each node's cloud GPU fabric, from the cloud_fabric check's facts: what its rule and the env file read.

    fabric_of(facts) -> "efa" | "tcpx" | "tcpxo" | "gib" | "ib" | "mixed" | "none"    pure, per node
    of(view)         -> {node: NodeFabric}  computed once per view (view.derive)

Recognition (preflight.checks.cloud_fabric's docstring says where each fact comes from): EFA devices make a
node "efa"; a TCPXO or TCPX plugin directory or receive-datapath manager makes it "tcpxo" / "tcpx"; the gIB
plugin "gib" (its RoCE HCAs belong to it); other RDMA devices "ib"; two of those at once "mixed". GKE's shared
plugin directory (/usr/local/nvidia/lib64) tells nothing by itself: it counts for the fabric whose RxDM runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from preflight.model import ClusterView

CLOUD = ("efa", "tcpx", "tcpxo", "gib")


@dataclass
class NodeFabric:
    """One node's fabric and the facts it was recognised from (None: no facts, the probe failed)."""

    fabric: Optional[str]
    parts: List[str] = field(default_factory=list)
    facts: Dict[str, Any] = field(default_factory=dict)


def parts_of(facts: Mapping[str, Any]) -> List[str]:
    """Every fabric the node shows a sign of, in CLOUD order, then "ib" for RDMA devices no plugin claims."""
    plugins = facts.get("plugins") or {}
    rxdm = {p.get("fabric") for p in facts.get("rxdm") or [] if isinstance(p, dict)}
    found = []
    if facts.get("efa"):
        found.append("efa")
    for fabric in ("tcpx", "tcpxo"):
        if plugins.get(fabric) or fabric in rxdm:
            found.append(fabric)
    if plugins.get("gib"):
        found.append("gib")
    if facts.get("hcas") and "gib" not in found:
        found.append("ib")
    return found


def plugins_of(facts: Mapping[str, Any], fabric: str) -> List[str]:
    """The fabric's plugin libraries on the node: its own directory's, for TCPX/TCPXO also GKE's shared one."""
    plugins = facts.get("plugins") or {}
    return list(plugins.get(fabric) or (plugins.get("gke") if fabric in ("tcpx", "tcpxo") else None) or [])


def profile_of(facts: Mapping[str, Any], fabric: str) -> Optional[str]:
    profiles = facts.get("profiles") or {}
    return profiles.get(fabric) or (profiles.get("gke") if fabric in ("tcpx", "tcpxo") else None)


#: DMI marks of each cloud (cloud-init's datasources read the same: canonical/cloud-init
#: cloudinit/sources/DataSourceAzure.py's chassis asset tag, DataSourceOracle.py's "OracleCloud.com";
#: EC2 Nitro's sys_vendor "Amazon EC2"; Compute Engine's product_name "Google Compute Engine").
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
OCI_ASSET_TAG = "OracleCloud.com"


def provider_of(facts: Mapping[str, Any]) -> Optional[str]:
    """"aws" | "gcp" | "azure" | "oci" from the node's DMI, else None."""
    tag = facts.get("chassis_asset_tag")
    if tag == AZURE_ASSET_TAG:
        return "azure"
    if tag == OCI_ASSET_TAG:
        return "oci"
    if facts.get("sys_vendor") == "Amazon EC2":
        return "aws"
    if facts.get("product_name") == "Google Compute Engine":
        return "gcp"
    return None


def fabric_of(facts: Mapping[str, Any]) -> str:
    found = parts_of(facts)
    return found[0] if len(found) == 1 else ("none" if not found else "mixed")


def of(view: ClusterView) -> Dict[str, NodeFabric]:
    def compute(v: ClusterView) -> Dict[str, NodeFabric]:
        out = {}
        for name, facts in v.of("cloud_fabric").items():
            if not isinstance(facts, dict) or "probe_error" in facts or "plugins" not in facts:
                out[name] = NodeFabric(None)
            else:
                out[name] = NodeFabric(fabric_of(facts), parts_of(facts), facts)
        return out
    return view.derive("cloud_fabric", compute)

"""The env file's lines for clouds whose GPU network is InfiniBand/RoCE tuned by the vendor: Azure ND and OCI.

    tuning(view, nodes, derived)   only variables the vendor documents for that machine, recognised from node facts

Recognition is from each node's own facts (cloud_fabric's DMI chassis asset tag, preflight.derived.cloud.provider_of;
never the clouds' metadata services, which the vendors' own scripts ask for the VM size or shape):
- Azure ND v4 / ND v5 (A100 / H100, H200): the Azure HPC image links /opt/microsoft/<ndv4|ndv5>/topo.xml and writes
  /etc/nccl.conf only on those sizes (Azure/azhpc-images components/customizations/ndv5.sh and ndv4.sh):
  NCCL_IB_PCI_RELAXED_ORDERING=1, NCCL_TOPO_FILE=/opt/microsoft/<family>/topo.xml, NCCL_IGNORE_CPU_AFFINITY=1.
  Written here because a container does not see the host's /etc/nccl.conf (the topology file must be mounted).
- OCI GPU shapes on RoCE: every one of Oracle's NCCL templates (oracle-quickstart/oci-hpc
  playbooks/roles/nccl-conf/templates: h100, h200, b200, b300, bm.gpu4.8, a100_b4.8) sets NCCL_IB_TC=41 and
  NCCL_IB_SL=0; NCCL_IB_QPS_PER_CONNECTION is 1 on the H100/H200/B200/B300 templates and 4 on the A100 ones,
  so it is written from the GPU model the gpu check found. NCCL_IB_GID_INDEX=3 of the templates is left to
  envfabric.gid, which reads the RoCE v2 entry from the nodes' own GID tables.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from preflight.derived import cloud
from preflight.derived.envvars import Derived, EnvVar, fold_names
from preflight.derived.gpus import node_gpus
from preflight.derived.rails import of as rails_of

AZURE_SOURCE = "Azure/azhpc-images components/customizations/%s.sh (the Azure HPC image's /etc/nccl.conf for this VM size)"
OCI_SOURCE = "oracle-quickstart/oci-hpc playbooks/roles/nccl-conf/templates (Oracle's nccl.conf for its GPU shapes)"
#: OCI's NCCL_IB_QPS_PER_CONNECTION by GPU model (the template each shape gets in nccl-conf/tasks/main.yml).
OCI_QPS = (("A100", "4"), ("H100", "1"), ("H200", "1"), ("B200", "1"), ("B300", "1"))


def tuning(view: Any, nodes: Sequence[str], derived: Derived) -> None:
    """The Azure ND or OCI lines when every node is on that cloud's InfiniBand/RoCE network; otherwise nothing."""
    fabrics = cloud.of(view)
    if not nodes or any(n not in fabrics or fabrics[n].fabric != "ib" for n in nodes):
        return
    providers = {cloud.provider_of(fabrics[n].facts) for n in nodes}
    if providers == {"azure"}:
        _azure(nodes, [fabrics[n].facts.get("azure_family") for n in nodes], derived)
    elif providers == {"oci"} and (rails_of(view).get("link_layer") == "roce"):
        _oci(view, nodes, derived)


def _azure(nodes: Sequence[str], families: List[Optional[str]], derived: Derived) -> None:
    where = fold_names(list(nodes))
    if None in families or len(set(families)) != 1:
        derived.notes.append("Azure: NCCL_IB_PCI_RELAXED_ORDERING/NCCL_TOPO_FILE not written: the Azure HPC image's ND v4/v5 "
                             "customization (/opt/microsoft/ndv5/topo.xml or ndv4) is not on every node of %s" % where)
        return
    family = families[0]
    why = "cloud_fabric check: Azure VMs (DMI) customised as %s on %s; %s" % (family, where, AZURE_SOURCE % family)
    derived.variables.append(EnvVar("NCCL_IB_PCI_RELAXED_ORDERING", "1", [
        why, "the VM's HCAs reach the GPUs through the hypervisor's PCI: relaxed ordering keeps GPUDirect RDMA at full rate"]))
    derived.variables.append(EnvVar("NCCL_TOPO_FILE", "/opt/microsoft/%s/topo.xml" % family, [
        why, "the VM's PCI tree hides the real GPU-HCA affinity; mount this file into a container that runs NCCL"]))
    derived.variables.append(EnvVar("NCCL_IGNORE_CPU_AFFINITY", "1", [why]))


def _oci(view: Any, nodes: Sequence[str], derived: Derived) -> None:
    why = "cloud_fabric check: OCI bare metal (DMI) on RoCE rails on %s; %s" % (fold_names(list(nodes)), OCI_SOURCE)
    derived.variables.append(EnvVar("NCCL_IB_TC", "41", [why, "the traffic class Oracle's RoCE network gives GPU traffic"]))
    derived.variables.append(EnvVar("NCCL_IB_SL", "0", [why]))
    models = {m for n in nodes for m in ((node_gpus(view, n).models() if node_gpus(view, n) else []) or [None])}
    qps = {next((q for key, q in OCI_QPS if m and key in m), None) for m in models}
    if len(qps) == 1 and None not in qps:
        derived.variables.append(EnvVar("NCCL_IB_QPS_PER_CONNECTION", qps.pop(), [
            why, "the value of Oracle's template for %s" % ", ".join(sorted(models))]))
    else:
        derived.notes.append("OCI: NCCL_IB_QPS_PER_CONNECTION not written: Oracle's templates set it per GPU model "
                             "(1 on H100/H200/B200/B300, 4 on A100) and the GPU models here are %s"
                             % (", ".join(sorted(str(m) for m in models)) or "unknown"))

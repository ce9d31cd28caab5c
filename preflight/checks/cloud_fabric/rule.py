"""The cloud_fabric check's controller half: each node's fabric judged against its documented needs (pure).

Expectations and their sources:
- EFA devices per instance type: the network cards with EFA each type has, AWS EC2 User Guide "Elastic Fabric
  Adapter: supported instance types" and the P4/P5/P6 instance pages (p4d.24xlarge and p4de.24xlarge 4 x 100
  Gbps, p5.48xlarge and p5e.48xlarge 32 x 100 Gbps = 3200 Gbps EFAv2, p5en.48xlarge 16 x 200 Gbps EFAv3,
  p6-b200.48xlarge 8 x 400 Gbps EFAv4).
- "falls back to sockets": NCCL without a net plugin and without InfiniBand HCAs uses its socket transport
  (NCCL's net.cc; the aws-ofi-nccl README: the plugin is what lets NCCL use libfabric/EFA); AWS's EFA/NCCL guide
  shows "NET/OFI Selected Provider is efa" as the sign it is in use.
- GPU NICs: Google Cloud "GPU machine types": a3-highgpu-8g 4 GPU NICs (GPUDirect-TCPX), a3-megagpu-8g 8 GPU
  NICs (GPUDirect-TCPXO), each a gVNIC beside the host NIC; "Maximize GPU network bandwidth with
  GPUDirect-TCPX(O)": the GPU VPCs are created with MTU 8244, and the RxDM (receive-datapath manager) must run
  on the node before NCCL starts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from preflight.checks.cloud_fabric import NAME, compat, efa_counters
from preflight.checks.cloud_fabric.probe import PLUGIN_DIRS
from preflight.common import plural
from preflight.derived import cloud, versions
from preflight.derived.envvars import fold_names
from preflight.model import ClusterView, Finding, Status, probe_error

EFA_DEVICES = {"p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32,
               "p5en.48xlarge": 16, "p6-b200.48xlarge": 8}
GPU_NICS = {"tcpx": 4, "tcpxo": 8}
GPU_NIC_MTU = 8244
NAMES = {"efa": "AWS EFA", "tcpx": "GPUDirect-TCPX", "tcpxo": "GPUDirect-TCPXO", "gib": "gIB (RDMA over RoCE)",
         "ib": "InfiniBand/RoCE", "none": "no GPU fabric", "mixed": "mixed"}
PLUGIN = {"efa": "aws-ofi-nccl", "tcpx": "the GPUDirect-TCPX plugin", "tcpxo": "the GPUDirect-TCPXO (FasTrak) plugin",
          "gib": "the gIB plugin"}
FALLBACK = "NCCL falls back to its socket transport at about a tenth of the fabric's bandwidth"


Problem = Tuple[Status, str, str]  # (status, what, action)


def _efa(facts: Mapping[str, Any], multi: bool, before: Tuple[Any, ...] = (None, None),
         nccl: Optional[str] = None) -> Tuple[List[Problem], str]:
    """(problems, what was seen) for an EFA node; before: (the previous run's kept hw_counters, its start);
    nccl: the NCCL version the node's jobs load (the driver check's), None when unknown."""
    count, itype = len(facts.get("efa") or []), facts.get("product_name")
    problems: List[Problem] = []
    want = EFA_DEVICES.get(itype or "")
    seen = "%s on %s" % (plural(count, "EFA device"), itype or "an unknown instance type (no DMI product_name)")
    if want is not None and count < want:
        problems.append((Status.FAIL, "%s, expected %d on %s (AWS EFA instance types): launch it with every EFA "
                         "interface" % (plural(count, "EFA device"), want, itype), "fix_config"))
    elif want is None:
        seen += " (not in the documented table: the count is compared with the other EFA nodes by ib_hca)"
    plugins = cloud.plugins_of(facts, "efa")
    if not plugins:
        problems.append(_plugin_missing("efa", multi))
    else:
        bad, said = compat.ofi((facts.get("plugin_versions") or {}).get("efa"), nccl)
        seen += "; aws-ofi-nccl %s (%s)" % (", ".join(plugins), said if multi or not bad else bad + "; a single-node run does not use it")
        if bad and multi:
            problems.append((Status.FAIL, bad, "fix_config"))
    fi = facts.get("fi_info")
    if fi is None:
        seen += "; fi_info not found, libfabric's efa provider not confirmed"
    elif not any(p.get("provider", "").split(";")[0] == "efa" for p in fi.get("providers") or []):
        problems.append((Status.FAIL, "fi_info -p efa lists no efa provider (%s): libfabric cannot open the EFA "
                         "devices, so aws-ofi-nccl cannot either; %s" % (fi.get("error") or "no provider listed", FALLBACK),
                         "fix_config"))
    else:
        seen += "; fi_info: efa provider on %s" % plural(len({p.get("domain") for p in fi["providers"]}), "domain")
    found, counted = efa_counters.judge(efa_counters.kept(facts.get("efa_counters") or {}), *before)
    problems.extend((Status.FAIL, what, "reboot") if word == "fail" else (Status.WARN, what, "") for word, what in found)
    return [p for p in problems if p is not None], seen + "; " + counted


def _plugin_missing(fabric: str, multi: bool) -> Optional[Problem]:
    if not multi:
        return None
    dirs = ", ".join(_dirs(fabric))
    return (Status.FAIL, "%s not found (no libnccl-net*.so in %s): %s" % (PLUGIN[fabric], dirs, FALLBACK), "fix_config")


def _dirs(fabric: str) -> Tuple[str, ...]:
    return PLUGIN_DIRS[fabric] + (PLUGIN_DIRS["gke"] if fabric in ("tcpx", "tcpxo") else ())


def _shipped(facts: Mapping[str, Any], fabric: str) -> List[str]:
    found = facts.get("bundled_nccl") or {}
    return list(found.get(fabric) or (found.get("gke") if fabric in ("tcpx", "tcpxo") else None) or [])


def _google(fabric: str, facts: Mapping[str, Any], multi: bool, nccl: Optional[str] = None) -> Tuple[List[Problem], str]:
    """(problems, what was seen) for a TCPX/TCPXO node: GPU NICs, their MTU, the RxDM, the plugin."""
    gve = facts.get("gve") or []
    nics = gve[1:]  # the first gVNIC is the host NIC (eth0), the others carry GPU traffic
    want = GPU_NICS[fabric]
    problems: List[Problem] = []
    if len(nics) < want:
        problems.append((Status.FAIL, "%s beside the host NIC, expected %d for %s: attach every GPU NIC"
                         % (plural(len(nics), "GPU NIC"), want, NAMES[fabric]), "fix_config"))
    wrong = ["%s MTU %s" % (n.get("name"), n.get("mtu")) for n in nics if n.get("mtu") != GPU_NIC_MTU]
    if wrong:
        problems.append((Status.FAIL, "%s (expected MTU %d on every GPU NIC: set the GPU VPC's MTU to %d)"
                         % (", ".join(wrong), GPU_NIC_MTU, GPU_NIC_MTU), "fix_config"))
    rxdm = [p for p in facts.get("rxdm") or [] if p.get("fabric") == fabric]
    if not rxdm and multi:
        problems.append((Status.FAIL, "the receive-datapath manager (RxDM) is not running: %s cannot receive; "
                         "start the RxDM before NCCL" % PLUGIN[fabric], "fix_config"))
    plugged = bool(cloud.plugins_of(facts, fabric))
    if not plugged:
        problems.append(_plugin_missing(fabric, multi))
    seen = "%s at MTU %s, RxDM %s" % (plural(len(nics), "GPU NIC"), "/".join(sorted({str(n.get("mtu")) for n in nics})) or "-",
                                      "pid %d" % rxdm[0]["pid"] if rxdm else "not running" + ("" if multi else " (single-node run)"))
    if plugged:
        seen += "; " + compat.bundled(NAMES[fabric], _shipped(facts, fabric), nccl)
    return [p for p in problems if p is not None], seen


def _node(name: str, nf: cloud.NodeFabric, multi: bool, before: Tuple[Any, ...] = (None, None),
          nccl: Optional[str] = None) -> Finding:
    fabric, facts = nf.fabric, nf.facts
    if fabric == "none":
        return Finding(NAME, name, Status.SKIP, "no cloud GPU fabric and no RDMA device (sockets only)")
    if fabric == "ib":
        return Finding(NAME, name, Status.SKIP, "InfiniBand/RoCE HCAs without a cloud plugin: judged by ib_hca")
    if fabric == "mixed":
        return Finding(NAME, name, Status.WARN, "signs of several fabrics: %s; NCCL uses one net plugin, say which "
                       "one by NCCL_NET" % ", ".join(NAMES[p] for p in nf.parts), data={"fabric": fabric, "parts": nf.parts})
    if fabric == "efa":
        problems, seen = _efa(facts, multi, before, nccl)
    elif fabric in GPU_NICS:
        problems, seen = _google(fabric, facts, multi, nccl)
    else:  # gib: its RoCE rails are ib_hca's
        problems, seen = [], "gIB plugin %s (%s); the RoCE rails are judged by ib_hca" % (
            ", ".join(facts["plugins"]["gib"]), compat.bundled(NAMES[fabric], _shipped(facts, fabric), nccl))
    data: Dict[str, Any] = {"fabric": fabric, "instance_type": facts.get("product_name")}
    if fabric == "efa":
        data.update(efa_counters=efa_counters.kept(facts.get("efa_counters") or {}), at=facts.get("at"))
    if not multi and not cloud.plugins_of(facts, fabric):
        seen += "; no %s: not needed on a single-node run (install it before running across nodes)" % PLUGIN[fabric]
    if not problems:
        return Finding(NAME, name, Status.PASS, "%s: %s" % (NAMES[fabric], seen), data=data)
    failed = [p for p in problems if p[0] is Status.FAIL]
    return Finding(NAME, name, Status.FAIL if failed else Status.WARN,
                   "%s: %s" % (NAMES[fabric], "; ".join(m for _, m, _ in failed + [p for p in problems if p not in failed])),
                   expected="the %s devices, NICs, plugin and RxDM this node type is documented with" % NAMES[fabric],
                   actual=seen, data=data, action=failed[0][2] if failed else None)


def rule(view: ClusterView) -> List[Finding]:
    """Per node: its fabric's needs; across nodes: one fabric for the whole run."""
    out: List[Finding] = []
    fabrics = cloud.of(view)
    raw = view.of(NAME)
    multi = len(view.live) > 1
    for name, nf in fabrics.items():
        if nf.fabric is None:
            out.append(probe_error(NAME, name, raw.get(name), listed=None) or Finding(
                NAME, name, Status.ERROR, "no cloud_fabric facts from this node", action="retest"))
            continue
        kept, _at, since = efa_counters.previous(view, NAME, name)
        out.append(_node(name, nf, multi, (kept, since), compat.nccl_of(view, name, versions.nccl_version)))
    groups: Dict[str, List[str]] = {}
    for name, nf in fabrics.items():
        if nf.fabric in cloud.CLOUD or (nf.fabric == "ib" and any(f.fabric in cloud.CLOUD for f in fabrics.values())):
            groups.setdefault(nf.fabric, []).append(name)
    if len(groups) > 1:
        out.append(Finding(NAME, None, Status.FAIL, "the nodes are on different fabrics: %s; NCCL cannot join them over "
                           "one net plugin: run them as separate jobs" % "; ".join(
                               "%s: %s" % (NAMES[f], fold_names(n)) for f, n in sorted(groups.items())),
                           action="fix_config"))
    return out

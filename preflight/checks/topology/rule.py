"""The topology check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.checks.topology import NAME
from preflight.common import majority, plural
from preflight.derived import rails as nccl_rails
from preflight.model import ClusterView, Finding, Status, per_gpu_node


def _label(dev: Dict[str, Any], index: Optional[int] = None) -> str:
    if dev["kind"] == "hca":
        return "%s (%s)" % (dev.get("name"), dev["bdf"])
    return "GPU %s (%s)" % ("?" if index is None else index, dev["bdf"])


def _link_text(width: Any, speed: Any) -> str:
    return "x%s at %s" % ("?" if width is None else width, "?" if speed is None else "%g GT/s" % speed)


def _expected_max(dev: Dict[str, Any], field: str) -> Optional[float]:
    """The device's maximum, capped by its slot's (the bridge above) when that is narrower."""
    own = dev["link"].get("max_" + field)
    slot = (dev.get("slot") or {}).get("max_" + field)
    if own is None:
        return None
    return min(own, slot) if slot is not None else own


def _fleet(view_facts: Dict[str, Dict[str, Any]]) -> Dict[Tuple[str, str], List[Tuple[Any, Any]]]:
    """{(kind, bdf): [(cur_width, cur_speed) per node]} over every node's devices."""
    out: Dict[Tuple[str, str], List[Tuple[Any, Any]]] = {}
    for facts in view_facts.values():
        for dev in facts.get("devices") or []:
            out.setdefault((dev["kind"], dev["bdf"]), []).append((dev["link"]["cur_width"], dev["link"]["cur_speed"]))
    return out


def signature(devices: Sequence[Dict[str, Any]]) -> Tuple[Tuple[str, str], ...]:
    """(item, placement) pairs: each GPU (bus order) with its NUMA node and the HCAs under its PCIe switch,
    then each HCA with its NUMA node. Two nodes with the same signature give NCCL the same paths."""
    gpus = sorted((d for d in devices if d["kind"] == "gpu"), key=lambda d: d["bdf"])
    hcas = sorted((d for d in devices if d["kind"] == "hca"), key=lambda d: str(d.get("name")))
    out = []
    for index, gpu in enumerate(gpus):
        # Below the root port: sharing a bridge there means sharing a PCIe switch.
        shared = sorted(str(h["name"]) for h in hcas if set(gpu["bridges"][1:]) & set(h["bridges"][1:]))
        out.append(("GPU %d" % index, "NUMA %s, %s" % (_numa(gpu), "switch with " + ",".join(shared) if shared else "no HCA on its switch")))
    for hca in hcas:
        out.append((str(hca["name"]), "NUMA %s" % _numa(hca)))
    return tuple(out)


def _numa(dev: Dict[str, Any]) -> str:
    return "?" if dev.get("numa_node") is None else str(dev["numa_node"])


def _drift_text(mine: Tuple[Tuple[str, str], ...], usual: Tuple[Tuple[str, str], ...]) -> Tuple[str, str]:
    theirs = dict(usual)
    ours = dict(mine)
    keys = [k for k, _ in usual] + [k for k, _ in mine if k not in theirs]
    diffs = [k for k in keys if ours.get(k) != theirs.get(k)]
    actual = "; ".join("%s: %s" % (k, ours.get(k, "absent")) for k in diffs)
    expected = "; ".join("%s: %s" % (k, theirs.get(k, "absent")) for k in diffs)
    return actual, expected


def _link_findings(name: str, dev: Dict[str, Any], label: str, fleet: Dict[Tuple[str, str], List[Tuple[Any, Any]]], nodes: int) -> List[Finding]:
    out = []
    fields = [("width", 0)] + ([("speed", 1)] if dev["kind"] == "hca" else [])
    for field, pos in fields:
        cur = dev["link"].get("cur_" + field)
        top = _expected_max(dev, field)
        if cur is None or top is None or cur >= top:
            continue
        usual, _count, strict = majority([v[pos] for v in fleet.get((dev["kind"], dev["bdf"]), [])])
        if strict and usual is not None and usual <= cur and nodes > 1:
            continue  # the fleet links this device this way: the platform, not this node
        actual = _link_text(dev["link"]["cur_width"], dev["link"]["cur_speed"])
        expected = _link_text(_expected_max(dev, "width"), _expected_max(dev, "speed"))
        alone = nodes <= 1
        msg = "%s %s: PCIe link %s (expected %s%s)" % (
            name, label, actual, expected, "; one node: no fleet to compare" if alone else ", like the other nodes")
        out.append(Finding(NAME, name, Status.WARN if alone else Status.FAIL, msg, expected=expected, actual=actual,
                           data={"device": dev["bdf"]}, action="isolate"))
        break
    return out


def _judge(node: Any, facts: Dict[str, Any], fleet: Dict[Tuple[str, str], List[Tuple[Any, Any]]],
           sigs: Dict[str, Tuple[Any, ...]], nodes: int, rails: Optional[Any] = None) -> List[Finding]:
    name = node.name
    devices = facts.get("devices") or []
    gpus = sorted((d for d in devices if d["kind"] == "gpu"), key=lambda d: d["bdf"])
    every_hca = sorted((d for d in devices if d["kind"] == "hca"), key=lambda d: d["bdf"])
    hcas = [d for d in compute_devices(every_hca, rails)]  # the compute NICs: affinity is theirs
    if not gpus:
        return [Finding(NAME, name, Status.ERROR, "%s: no NVIDIA GPU found in sysfs (expected %d; see the gpu check)" % (name, node.gpus_per_node))]
    out: List[Finding] = []
    for index, gpu in enumerate(gpus):
        out.extend(_link_findings(name, gpu, _label(gpu, index), fleet, nodes))
    for hca in every_hca:
        out.extend(_link_findings(name, hca, _label(hca), fleet, nodes))
    numa_known = all(d["numa_node"] is not None for d in gpus + hcas)
    if hcas:
        mine = sigs[name]
        usual, count, strict = majority(list(sigs.values()))
        if usual is not None and strict and mine != usual:
            actual, expected = _drift_text(mine, usual)
            out.append(Finding(NAME, name, Status.FAIL,
                               "%s: GPU↔NIC affinity differs from %d of %d nodes: %s (expected %s)" % (name, count, len(sigs), actual, expected),
                               expected=expected, actual=actual, action="fix_config"))
        elif usual is None and len(set(sigs.values())) > 1:
            out.append(Finding(NAME, name, Status.WARN, "%s: GPU↔NIC affinity differs between nodes and no layout is held by most: %s" % (
                name, "; ".join("%s: %s" % kv for kv in mine)), actual="; ".join("%s: %s" % kv for kv in mine)))
        if len(hcas) >= len(gpus) and numa_known:
            for index, gpu in enumerate(gpus):
                if not any(h["numa_node"] == gpu["numa_node"] for h in hcas):
                    where = ", ".join("%s NUMA %s" % (h["name"], h["numa_node"]) for h in hcas)
                    out.append(Finding(NAME, name, Status.FAIL,
                                       "%s GPU %d (%s) on NUMA %d has no HCA on its NUMA node (%s): its RDMA traffic crosses the CPU interconnect" % (
                                           name, index, gpu["bdf"], gpu["numa_node"], where),
                                       expected="an HCA on NUMA %d" % gpu["numa_node"], actual="none", action="fix_config"))
    which = ("" if rails is None or len(hcas) == len(every_hca) else
             " (the %s carrying NCCL's rails; %s not counted)" % (plural(len(hcas), "HCA"),
                                                                  ", ".join(str(h["name"]) for h in every_hca if h not in hcas)))
    unknown = [d for d in gpus + hcas if d["numa_node"] is None]
    if hcas and unknown:
        out.append(Finding(NAME, name, Status.SKIP, "GPU↔NIC NUMA affinity not judged: numa_node -1 on %s (a VM or "
                           "firmware without NUMA information)%s" % (plural(len(unknown), "device"), which)))
    if not [f for f in out if f.status is not Status.SKIP]:
        affinity = "no RDMA HCA for NCCL: affinity not judged" if every_hca else "no RDMA HCA: affinity not judged"
        if hcas:
            affinity = ("NUMA affinity not judged" if unknown else "each GPU has an HCA on its NUMA node%s" % which
                        if len(hcas) >= len(gpus) else "affinity alike on every node%s" % which)
        out.append(Finding(NAME, name, Status.PASS, "%s and %s at full PCIe width; %s" % (
            plural(len(gpus), "GPU"), plural(len(every_hca), "HCA"), affinity)))
    return out


def compute_devices(devices: Sequence[Dict[str, Any]], rails: Optional[Any]) -> List[Dict[str, Any]]:
    """The GPUs and the HCAs carrying NCCL's rails (rails: their names; None: unknown, every HCA)."""
    return [d for d in devices if d["kind"] == "gpu" or rails is None or d.get("name") in rails]


def rule(view: ClusterView) -> List[Finding]:

    valid = {n: f for n, f in view.of(NAME).items() if isinstance(f, dict) and isinstance(f.get("devices"), list)
             and view.node(n).gpus_per_node > 0}
    fleet = _fleet(valid)
    rails = {n: nccl_rails.compute_hcas(view, n) for n in valid}
    sigs = {n: signature(compute_devices(f["devices"], rails[n])) for n, f in valid.items()
            if any(d["kind"] == "hca" for d in compute_devices(f["devices"], rails[n]))}
    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, fleet, sigs, len(valid), rails.get(node.name)))

"""topology: every GPU and RDMA NIC links at its full PCIe width and speed, and GPU↔NIC affinity is alike on every node.

The probe walks the sysfs root: NVIDIA GPUs are the PCI functions of vendor 0x10de and class 0x0300/0x0302
under ``bus/pci/devices``; NICs are the RDMA HCAs under ``class/infiniband/<hca>/device``. For each it reads the
kernel's PCIe link attributes (``current_link_width``, ``max_link_width``, ``current_link_speed``,
``max_link_speed``; speeds as "16.0 GT/s PCIe", or "8 GT/s" on kernels before 4.19, "Unknown" without link),
the same attributes of the bridge above it (the slot), ``numa_node``, and its chain of PCI bridges (the path
of the device's real sysfs directory, ``devices/pci0000:00/0000:00:01.0/0000:01:00.0/...``).

Facts schema::

    devices [{kind "gpu"|"hca", bdf "0000:1b:00.0", name "mlx5_0"|None, numa_node int|None,
              bridges ["0000:00:01.0", "0000:01:00.0", ...] (root port first),
              link {cur_width, max_width: int|None, cur_speed, max_speed: float GT/s|None},
              slot {max_width, max_speed}|None    (the parent bridge's own maximum)}]

Rule (per GPU node; CPU-only nodes SKIP):

- no GPU found: ERROR (facts missing; the gpu check says why).
- link width below the device's maximum: FAIL, unless the slot itself is narrower (an x16 card in an x8
  slot is the platform's design, not a fault) or the same device links as narrow on most nodes (the
  fleet is built that way): then not reported. With no fleet to compare (one node) it is a WARN.
  Speed below maximum is judged the same way for NICs; not for GPUs, which lower their link speed when
  idle (the gpu check's rule).
- affinity is judged over the compute NICs only: the HCAs carrying the node's NCCL rails (preflight.rails:
  the ports ib_hca picks for NCCL_IB_HCA), not storage or management ports; all HCAs where the rails are
  unknown (no ib_hca facts), said in the message.
- affinity: for each GPU (in bus order), the HCAs on its NUMA node and the HCAs under the same PCIe switch
  form the node's signature; a node whose signature differs from the strict majority of nodes FAILs (drift:
  NCCL builds different paths there). A tie has no reference: WARN on every differing node.
- where the node has at least as many HCAs as GPUs and NUMA is known: a GPU without an HCA on its own
  NUMA node FAILs (its traffic crosses the CPU interconnect).
- NUMA unknown (numa_node -1: a VM, or firmware without NUMA information): the NUMA affinity is not judged,
  a SKIP finding says so beside the link verdict (never a PASS for what was not judged).
- otherwise PASS: "8 GPUs and 8 HCAs at full PCIe width; each GPU has an HCA on its NUMA node".
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.common import majority, plural
from preflight.model import Check, ClusterView, Finding, ParseError, Status, per_gpu_node
from preflight.probe.pci import bridges, nvidia_gpus, rdma_hcas

NAME = "topology"
LINK_FILES = ("current_link_width", "max_link_width", "current_link_speed", "max_link_speed")
_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s(?: PCIe)?$")


# --------------------------------------------------------------------------------------------- probe


def _link_attrs(ctx: Any, bdf: str) -> Dict[str, Optional[str]]:
    base = ctx.sys_path("bus", "pci", "devices", bdf)
    return {name: ctx.read(os.path.join(base, name)) for name in LINK_FILES}


def read_device(ctx: Any, kind: str, bdf: str, name: Optional[str]) -> Dict[str, Any]:
    chain = bridges(ctx, bdf)
    slot = None
    if chain:
        attrs = _link_attrs(ctx, chain[-1])
        if attrs["max_link_width"] is not None:
            link = link_facts(attrs, "%s slot" % chain[-1])
            slot = {"max_width": link["max_width"], "max_speed": link["max_speed"]}
    numa = ctx.read(ctx.sys_path("bus", "pci", "devices", bdf, "numa_node"))
    return {
        "kind": kind,
        "bdf": bdf,
        "name": name,
        "numa_node": parse_numa_node(numa),
        "bridges": chain,
        "link": link_facts(_link_attrs(ctx, bdf), "%s %s" % (kind, bdf)),
        "slot": slot,
    }


def probe(ctx: Any) -> Dict[str, Any]:
    """Link state, NUMA node and bridge chain of every NVIDIA GPU and RDMA HCA."""
    devices = [read_device(ctx, "gpu", bdf, None) for bdf in nvidia_gpus(ctx)]
    for hca, bdf in rdma_hcas(ctx):
        if bdf is not None:
            devices.append(read_device(ctx, "hca", bdf, hca))
    return {"devices": devices}


# --------------------------------------------------------------------------------------------- parse


def parse_numa_node(text: Optional[str]) -> Optional[int]:
    """'1' -> 1; '-1' (no NUMA information) or unreadable -> None."""
    if text is None or text.strip() == "-1":
        return None
    if not re.match(r"^\d+$", text.strip()):
        raise ParseError("numa_node: expected an integer or -1, got %.40r" % text)
    return int(text.strip())


def parse_link_speed(text: Optional[str], what: str = "link speed") -> Optional[float]:
    """'32.0 GT/s PCIe' (kernel 4.19+), '8 GT/s' (older) -> GT/s; 'Unknown' (no link) or unreadable -> None."""
    if text is None or text.strip() in ("Unknown", "Unknown speed", ""):
        return None
    m = _SPEED.match(text.strip())
    if not m:
        raise ParseError("%s: expected a speed like '16.0 GT/s PCIe', got %.40r" % (what, text))
    return float(m.group(1))


def parse_link_width(text: Optional[str], what: str = "link width") -> Optional[int]:
    """'16' -> 16; '0' (no link trained) or unreadable -> None."""
    if text is None or text.strip() == "0":
        return None
    if not text.strip().isdigit():
        raise ParseError("%s: expected a lane count like 16, got %.40r" % (what, text))
    return int(text.strip())


def link_facts(attrs: Dict[str, Optional[str]], where: str = "device") -> Dict[str, Any]:
    """{current,max}_link_{width,speed} sysfs texts -> {cur_width, max_width, cur_speed, max_speed}."""
    return {
        "cur_width": parse_link_width(attrs.get("current_link_width"), where + " current_link_width"),
        "max_width": parse_link_width(attrs.get("max_link_width"), where + " max_link_width"),
        "cur_speed": parse_link_speed(attrs.get("current_link_speed"), where + " current_link_speed"),
        "max_speed": parse_link_speed(attrs.get("max_link_speed"), where + " max_link_speed"),
    }


# ---------------------------------------------------------------------------------------------- rule


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
    from preflight import rails as nccl_rails

    valid = {n: f for n, f in view.of(NAME).items() if isinstance(f, dict) and isinstance(f.get("devices"), list)
             and view.node(n).gpus_per_node > 0}
    fleet = _fleet(valid)
    rails = {n: nccl_rails.compute_hcas(view, n) for n in valid}
    sigs = {n: signature(compute_devices(f["devices"], rails[n])) for n, f in valid.items()
            if any(d["kind"] == "hca" for d in compute_devices(f["devices"], rails[n]))}
    return per_gpu_node(NAME, view, lambda node, facts: _judge(node, facts, fleet, sigs, len(valid), rails.get(node.name)))


CHECK = Check(
    name=NAME,
    claim="Every GPU and RDMA NIC links at its full PCIe width (NICs also speed), and GPU↔NIC NUMA/PCIe "
    "affinity is the same on every node, with an HCA on each GPU's NUMA node",
    why="A NIC or GPU trained at x8 or a lower generation halves its bandwidth and paces every collective; a node "
    "whose NICs sit on another NUMA node or switch routes RDMA across the CPU interconnect and becomes the straggler.",
    fix="Reseat the card or riser and check the slot's BIOS bifurcation setting (lspci -vv: LnkSta vs LnkCap); "
    "put NICs back in the slots the platform guide pairs with each GPU; keep BIOS NUMA settings (NPS, SNC) alike.",
    probe=probe,
    rule=rule,
    needs=("ib_hca",),
    reads="sysfs bus/pci/devices/* of GPUs and RDMA HCAs: current/max link speed and width, numa_node, bridge chain",
    takes="< 0.1 s",
    order=68,
)

"""The ib_errors check's node half: what probe(ctx) runs on a node, and its parsers (standard library only)."""

from __future__ import annotations

import os
import time

from preflight.node_model import ParseError
from preflight.probe import kernlog, pci
from preflight.probe.lazy_re import lazy
from preflight.probe.rdma import is_efa

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

INTERVAL_S = 1.0
#: Width in bits of each IBTA PortCounters field (IBA spec vol. 1, PortCounters attribute): the value
#: a saturated counter stops at is 2**bits - 1.
WIDTH_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}
COUNTERS = tuple(WIDTH_BITS)
_INT = lazy(r"^\d+$")
NO_PMA = "N/A (no PMA)"
_BDF = r"([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
#: ib_core (drivers/infiniband/core/cache.c): "<driver> <pci> <ibdev>: Port: <n> Link <state>"
_IB_PORT = lazy(r"^(\S+) %s (\S+): Port: (\d+) Link ([A-Z_]+)\s*$" % _BDF)
#: mlx5e_update_carrier: "mlx5_core <pci> <netdev>: Link up|down"
_NETDEV = lazy(r"^mlx5_core %s (\S+): Link (up|down)\s*$" % _BDF)
#: mlx5 events.c port_module: "mlx5_core <pci>: Port module event[error]: module <n>, <status>[, <error>]"
_MODULE = lazy(r"^mlx5_core %s: Port module event(\[error\])?: module (\d+), ([^,]+?)(?:, (.+?))?\s*$" % _BDF)
_UP = ("ACTIVE", "up", "Cable plugged")
DOWN = ("DOWN", "down", "Cable unplugged")
#: The lines the parser reads (kernlog.lines_with): every other line is only counted.
_LITERALS = ("Link", "Port module event")
#: Link events are folded on the node per these fields (kernlog.fold).
FOLD_KEY = ("kind", "pci", "hca", "netdev", "port", "state", "error", "after_up")


def parse_counter(text: Optional[str], name: str) -> Optional[int]:
    """One counters/<name> file's text → its value, or None when unavailable.

    "N/A (no PMA)" (what the kernel's show_pma_counter in drivers/infiniband/core/sysfs.c prints for a
    device without a performance-management agent) and an absent file read as None: unavailable, never a
    fabricated 0. Any other value that is not a non-negative integer raises ParseError naming the counter.
    """
    value = None if text is None else text.strip()
    if value is None or value == NO_PMA:
        return None
    if not _INT.match(value):
        raise ParseError("counters/%s: expected a non-negative integer or %r, got %.40r" % (name, NO_PMA, text))
    return int(value)


def counters_from(files: Mapping[str, Optional[str]]) -> Dict[str, Optional[int]]:
    """{counter file name: its text (None = absent)} → {error counter: value or None}, for COUNTERS."""
    return {name: parse_counter(files.get(name), name) for name in COUNTERS}


def parse_link_events(text: str, source: str = "journalctl", hca_pci: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, Any]:
    """The HCA link changes in `journalctl -k -b 0 -o short-monotonic` or `dmesg` output (formats: module doc).

    {"lines": message lines read, "first_ts": the oldest stamp, "events": [folded event]} with events in
    order of first appearance; a journalctl line without its stamp or "HOST IDENT:" raises ParseError
    naming the line. hca_pci ({hca: its PCI function}) names the port of a line that gives only the PCI
    address (netdev and module lines), so that its after_up follows the same port as its ib_core lines.
    """
    lines, first_ts = kernlog.survey(text, source)
    by_pci = {pci: hca for hca, pci in (hca_pci or {}).items() if pci}
    up: Dict[Tuple[str, int], bool] = {}

    def events() -> Iterator[Dict[str, Any]]:
        for ts, body in kernlog.lines_with(text, source, _LITERALS):
            event = _link_event(body.strip())
            if event is None:
                continue
            key = (port_name(event, by_pci), int(event.get("port") or 1))
            event.update(ts=ts, line=body.strip()[:200], after_up=False)
            if event["kind"] == "module" and event["error"]:
                pass
            elif event["state"] in _UP:
                up[key] = True
            elif event["state"] in DOWN:
                event["after_up"] = up.get(key, False)
                up[key] = False
            yield event

    return {"lines": lines, "first_ts": first_ts, "events": kernlog.fold(events(), FOLD_KEY)}


def port_name(event: Mapping[str, Any], by_pci: Mapping[str, str]) -> str:
    """The HCA a link event is about: its ib device, else the one on its PCI function, else the address."""
    return event.get("hca") or by_pci.get(event.get("pci")) or "HCA at %s" % event.get("pci")


def _link_event(body: str) -> Optional[Dict[str, Any]]:
    if "Link" not in body and "Port module event" not in body:
        return None
    m = _IB_PORT.match(body)
    if m:
        return {"kind": "ib_port", "pci": m.group(2).lower(), "hca": m.group(3), "netdev": None,
                "port": int(m.group(4)), "state": m.group(5), "error": None}
    m = _NETDEV.match(body)
    if m:
        return {"kind": "netdev", "pci": m.group(1).lower(), "hca": None, "netdev": m.group(2), "port": None,
                "state": m.group(3), "error": None}
    m = _MODULE.match(body)
    if m:
        return {"kind": "module", "pci": m.group(1).lower(), "hca": None, "netdev": None, "port": None,
                "state": m.group(4), "error": (m.group(5) or m.group(4)) if m.group(2) else None}
    return None


def _read_counters(ctx: Any, port_dir: str) -> Dict[str, Optional[int]]:
    cdir = os.path.join(port_dir, "counters")
    return counters_from({name: ctx.read(os.path.join(cdir, name)) for name in COUNTERS})


def probe(ctx: Any) -> Dict[str, Any]:
    """Every port's error counters, read twice interval_s apart (no sleep on a node without HCAs)."""
    root = ctx.sys_path("class", "infiniband")
    interval = float(ctx.config.get("interval_s", INTERVAL_S))
    ports: List[Dict[str, Any]] = []
    efa: List[str] = []
    for hca in ctx.listdir(root):
        if is_efa(ctx, os.path.join(root, hca)):  # no IB PortCounters (counters/): EFA publishes hw_counters/
            efa.append(hca)
            continue
        for entry in ctx.listdir(os.path.join(root, hca, "ports")):
            if not entry.isdigit():
                raise ParseError("%s: unexpected port entry %r" % (hca, entry))
            port_dir = os.path.join(root, hca, "ports", entry)
            layer = (ctx.read(os.path.join(port_dir, "link_layer")) or "").strip()
            state = (ctx.read(os.path.join(port_dir, "state")) or "").strip()
            ports.append(
                {
                    "hca": hca,
                    "port": int(entry),
                    "link_layer": {"InfiniBand": "ib", "Ethernet": "roce"}.get(layer, layer or None),
                    "state": state.split(": ", 1)[-1] or None,
                    "dir": port_dir,
                }
            )
    if not ports:
        return {"interval_s": 0.0, "at": time.time(), "ports": [], "efa": efa}
    started = time.monotonic()
    for p in ports:
        p["before"] = _read_counters(ctx, p["dir"])
    time.sleep(interval)
    for p in ports:
        p["after"] = _read_counters(ctx, p.pop("dir"))
    facts = {"interval_s": round(time.monotonic() - started, 3), "at": time.time(), "ports": ports, "efa": efa}
    bus = dict(pci.rdma_hcas(ctx))  # each HCA's PCI function, resolved once per probe run for every probe
    facts["hca_pci"] = {hca: bus.get(hca) for hca in sorted({p["hca"] for p in ports})}
    facts["uptime_s"] = kernlog.uptime(ctx)
    klog = kernlog.read(ctx)
    log: Dict[str, Any] = {"source": klog["source"], "error": klog["error"], "lines": 0, "first_ts": None, "events": []}
    if klog["text"] is not None:
        log.update(parse_link_events(klog["text"], klog["source"], facts["hca_pci"]))
    facts["kernel_log"] = log
    return facts

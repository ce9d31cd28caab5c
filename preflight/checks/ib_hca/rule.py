"""The ib_hca check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from preflight.checks.ib_hca import NAME
from preflight.common import fold, human_bytes, majority, plural
from preflight.derived import rails
from preflight.derived.rails import (
    PORT_LIST,
    active_rates,
    is_active,
    port_label,
    rate_text,
)
from preflight.model import ClusterView, Finding, Status, probe_error

#: Below this locked-memory limit RDMA registration of NCCL's buffers fails: FAIL.
MEMLOCK_MIN_BYTES = 1 << 30


def rate_split(valid: Dict[str, Dict[str, Any]], layer: str) -> str:
    """'400 Gb/s on 4 ports · 200 Gb/s on 4 ports': the ACTIVE ports' rates of one link layer."""
    return _split(active_rates(valid).get(layer) or [], "port")


def _split(rates: List[Any], what: str) -> str:
    return " · ".join("%s on %s" % (rate_text(r), plural(rates.count(r), what)) for r in sorted(set(rates), reverse=True))


def _left_out_text(left_out: Optional[List[Tuple[str, str]]]) -> str:
    """'; not for NCCL: mlx5_bond_0:1 (RoCE at 200 Gb/s; the rails are ...)', or ''."""
    if not left_out:
        return ""
    return "; not for NCCL: " + ", ".join("%s (%s)" % pair for pair in left_out)


def _memlock_finding(view: ClusterView, name: str) -> Optional[Finding]:
    ssh = view.facts.get(name, {}).get("ssh")
    if not isinstance(ssh, dict) or "probe_error" in ssh or "memlock_soft" not in ssh:
        return Finding(NAME, name, Status.ERROR, "%s: locked-memory limit unknown (no ssh facts)" % name)
    soft = ssh["memlock_soft"]
    if soft is None:
        return None
    shown = human_bytes(soft)
    if soft < MEMLOCK_MIN_BYTES:
        status, consequence = Status.FAIL, ": RDMA memory registration will fail"
    else:
        status, consequence = Status.WARN, "; set it unlimited for RDMA"
    return Finding(NAME, name, status, "%s: locked-memory limit (ulimit -l) is %s%s" % (name, shown, consequence),
                   expected="unlimited", actual=shown)


def _no_hca(name: str, with_hcas: List[str], want_count: Any, want_rate: Any) -> Finding:
    """FAIL for a node without InfiniBand/RoCE ports where some were expected or other nodes have them."""
    if want_count is not None or want_rate is not None:
        exp = "%s HCA ports" % want_count if want_count is not None else "HCAs at %s" % rate_text(want_rate)
        return Finding(NAME, name, Status.FAIL, "no InfiniBand/RoCE HCA (expected %s)" % exp, expected=exp,
                       actual="none")
    others = sorted(set(with_hcas) - {name})
    return Finding(NAME, name, Status.FAIL, "no InfiniBand/RoCE HCA (%s have them)" % fold(others),
                   expected="HCAs like the other nodes", actual="none")


def _port_findings(name: str, judged: List[Dict[str, Any]], enough: bool, valid: Dict[str, Any]) -> List[Finding]:
    """A node's port verdicts: a port not ACTIVE (a Disabled non-rail only noted), a rate off its reference."""
    out = []
    usable = sum(1 for j in judged if j["usable"])
    for j in judged:
        p, exp_rate = j["port"], j["expected"]
        expected = "ACTIVE at %s" % rate_text(exp_rate) if exp_rate is not None else "ACTIVE"
        where = "%s %s port %d" % (name, p["hca"], p["port"])
        data = {"port": port_label(p), "role": "rail" if j["rail"] else "other"}
        if not is_active(p):
            if p["phys_state"] == "Disabled" and not j["rail"]:
                continue  # administratively off and no rail: a spare, named in the PASS
            out.append(Finding(NAME, name, Status.WARN if enough else Status.FAIL, "%s: state %s, %s (expected %s)%s" % (
                where, p["state"], p["phys_state"], expected,
                "; not needed: %d usable ports as expected" % usable if enough else ""),
                expected=expected, actual="%s/%s" % (p["state"], p["phys_state"]), data=data))
        elif exp_rate is not None and float(p["rate_gbps"]) != float(exp_rate):
            out.append(Finding(NAME, name, Status.FAIL, "%s: rate %s%s (expected %s%s)" % (
                where, rate_text(p["rate_gbps"]), ", %s" % p["width"] if p.get("width") else "",
                rate_text(exp_rate), j["basis"]), expected=rate_text(exp_rate),
                actual=rate_text(p["rate_gbps"]), data=data))
        elif exp_rate is None and (j["rail"] or j["tie"]):
            split = "no majority: %s; set expect.ib_rate_gbps" % rate_split(valid, p["link_layer"]) if j["rail"] else (
                "this port differs across nodes, no majority: %s" % _split(j["tie"], "node"))
            out.append(Finding(NAME, name, Status.FAIL, "%s: rate %s (%s)" % (where, rate_text(p["rate_gbps"]), split),
                expected="one rate on every port", actual=rate_text(p["rate_gbps"]), data=data))
    return out


def _pass(name: str, judged: List[Dict[str, Any]], left_out: Optional[List[Tuple[str, str]]]) -> Finding:
    aside = {label for label, _ in left_out or []}
    shown = [j["port"] for j in judged if j["usable"] and port_label(j["port"]) not in aside]
    spares = [port_label(j["port"]) for j in judged if not is_active(j["port"])]
    return Finding(NAME, name, Status.PASS, "%s ACTIVE at %s (%s): %s%s%s" % (
        plural(len(shown), "port"), "/".join(rate_text(r) for r in sorted({p["rate_gbps"] for p in shown})),
        "/".join(sorted({p["link_layer"] for p in shown})), ", ".join(port_label(p) for p in shown),
        _left_out_text(left_out), "; spare, Disabled: %s" % ", ".join(spares) if spares else ""),
        actual=str(sum(1 for j in judged if j["usable"])))


def _count_findings(name: str, usable: int, counts: Dict[str, int], want_count: Any) -> List[Finding]:
    """Usable ports per node against expect.ib_hcas, else the majority; a tie has no reference value."""
    target = want_count if want_count is not None else majority(list(counts.values()))[0]
    if want_count is None and target is None and len(set(counts.values())) > 1:
        split = " · ".join("%d on %s" % (c, fold(n for n, v in counts.items() if v == c))
                           for c in sorted(set(counts.values()), reverse=True))
        return [Finding(NAME, name, Status.FAIL, "%s: %d usable HCA ports (no majority: %s; set expect.ib_hcas)" % (
            name, usable, split), expected="the same count on every node", actual=str(usable))]
    if target is None or usable >= target:
        return []
    basis = "expected %d" % target if want_count is not None else "%s have %d" % (
        fold(sorted(n for n, c in counts.items() if c == target)), target)
    return [Finding(NAME, name, Status.FAIL, "%s: %d usable HCA ports (%s)" % (name, usable, basis),
                    expected=str(target), actual=str(usable))]


def rule(view: ClusterView) -> List[Finding]:
    out: List[Finding] = []
    ports = rails.ports_of(view)  # valid ports, fleet reference, each port's role: read once, as the rails are
    valid = ports["valid"]
    for name, facts in view.of(NAME).items():
        if name not in valid:
            out.append(probe_error(NAME, name, facts, listed=PORT_LIST))
    want_count, want_rate = view.expect.get("ib_hcas"), view.expect.get("ib_rate_gbps")
    expected_some = want_count is not None or want_rate is not None
    with_hcas = [n for n, f in valid.items() if f["ports"]]
    efa = efa_findings(view, valid)
    if not with_hcas and not (expected_some and (want_count is None or want_count > 0)):
        with_efa = {f.node for f in efa}
        return out + efa + [Finding(NAME, n, Status.SKIP, "no InfiniBand/RoCE HCA") for n in valid if n not in with_efa]
    judged = ports["judged"]
    counts = {n: sum(1 for j in js if j["usable"]) for n, js in judged.items()}
    not_for_nccl = rails.of(view)["left_out"]
    for name in (node.name for node in view.live if node.name in valid):
        if not valid[name]["ports"]:
            out.append(_no_hca(name, with_hcas, want_count, want_rate))
            continue
        enough = want_count is not None and counts[name] >= want_count
        node_out = _port_findings(name, judged[name], enough, valid)
        node_out += _count_findings(name, counts[name], counts, want_count)
        if any(is_active(p) for p in valid[name]["ports"]):
            mem = _memlock_finding(view, name)
            node_out += [mem] if mem is not None else []
        out.extend(node_out or [_pass(name, judged[name], not_for_nccl.get(name))])
    return out + efa


def efa_findings(view: ClusterView, valid: Dict[str, Dict[str, Any]]) -> List[Finding]:
    """One finding per node with EFA devices: PASS naming them, WARN for fewer than most EFA nodes have or
    a device whose port is not ACTIVE (the efa driver reports ACTIVE/LinkUp while the device works)."""
    devices = {n: f["efa"] for n, f in valid.items() if f.get("efa")}
    common = majority([len(d) for d in devices.values()])[0] if len(devices) > 1 else None
    out = []
    for name, ports in devices.items():
        down = ["%s (%s/%s)" % (p["device"], p["state"], p["phys_state"]) for p in ports if not is_active(p)]
        rates = "/".join(rate_text(r) for r in sorted({p["rate_gbps"] for p in ports}))
        problems = []
        if common is not None and len(ports) < common:
            problems.append("%d EFA devices where most EFA nodes have %d: launch the instance with every EFA "
                            "interface its type has" % (len(ports), common))
        if down:
            problems.append("not ACTIVE: %s" % ", ".join(down))
        if problems:
            out.append(Finding(NAME, name, Status.WARN, "%s: %s" % (name, "; ".join(problems)), action="fix_config",
                               expected="%s EFA devices ACTIVE" % (common or len(ports)), actual=str(len(ports) - len(down))))
        else:
            shown = ", ".join(p["device"] for p in ports[:4]) + (", ... (%d)" % len(ports) if len(ports) > 4 else "")
            out.append(Finding(NAME, name, Status.PASS, "%s ACTIVE at %s: %s (AWS EFA: used by NCCL through the aws-ofi-nccl "
                               "plugin, not its InfiniBand transport)" % (plural(len(ports), "EFA device"), rates, shown),
                               actual=str(len(ports))))
        if not valid[name]["ports"]:
            mem = _memlock_finding(view, name)
            out += [mem] if mem is not None else []
    return out

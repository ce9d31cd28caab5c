"""The gpu_state check's controller half: the rule over every node's facts (pure: no I/O)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from preflight.checks.gpu_state import NAME
from preflight.common import majority, plural
from preflight.derived.gpus import node_gpus, per_health_node
from preflight.model import ClusterView, Finding, Status

#: A power limit this far below the default is a cap (rounding in the driver's milliwatts is not).
POWER_SLACK = 0.02
RESET_ACTIONS = ("Reset", "Drain and Reset", "Drain P2P", "Bus Reset")
REBOOT_ACTIONS = ("Reboot", "System Reboot")


class ModelReference:
    """Per model, what the run's GPUs of that model share: a setting every one of them has is the site's
    choice (a power policy, an exclusive-mode cluster), not a node's fault."""

    def __init__(self, records: List[Any]) -> None:
        self.values: Dict[Tuple[str, Any], List[Any]] = {}
        for record in records:
            for g in record.gpus:
                h = g.health or {}
                for key in ("compute_mode", "power_limit_w", "apps_clock_mhz"):
                    self.values.setdefault((key, g.name), []).append(h.get(key))

    def site_choice(self, key: str, gpu: Any) -> bool:
        """True when this GPU's value is what its model's GPUs in the run hold (a strict majority of more
        than one GPU), or when it is the run's only GPU of its model (nothing says otherwise)."""
        values = self.values.get((key, gpu.name)) or []
        if len(values) <= 1:
            return True
        top, _, strict = majority(values)
        return strict and top == (gpu.health or {}).get(key)


def _gpu(gpu: Any, fleet: ModelReference) -> List[Any]:
    h = gpu.health or {}
    out: List[Any] = []
    mode = h.get("compute_mode")
    if mode == "Prohibited":
        out.append((Status.FAIL, "%s: compute mode Prohibited (expected Default: no process can use it; "
                    "nvidia-smi -c DEFAULT)" % gpu.label, "Default", mode, "fix_config"))
    elif mode in ("Exclusive_Process", "Exclusive_Thread"):
        if fleet.site_choice("compute_mode", gpu):
            out.append((None, "compute mode %s on the %s GPUs" % (mode, gpu.name)))
        else:
            out.append((Status.WARN, "%s: compute mode %s (expected Default: a second process on this GPU fails; "
                        "nvidia-smi -c DEFAULT)" % (gpu.label, mode), "Default", mode, "fix_config"))
    procs = h.get("processes") or []
    holding = [p for p in procs if p.get("used_mib")]
    if holding:
        named = ", ".join("pid %s %s (%s MiB)" % (p["pid"], p.get("name") or "(not visible here)", p["used_mib"])
                          for p in holding[:4]) + (", ..." if len(holding) > 4 else "")
        total = sum(p["used_mib"] for p in holding)
        out.append((Status.FAIL, "%s: %s holding %d MiB of GPU memory: %s (expected none before a job: end them, "
                    "or find which job left them)" % (gpu.label, plural(len(holding), "process", "processes"),
                                                       total, named), "no processes", str(len(holding)), "check_app"))
    elif procs:
        out.append((None, "%s: %s without reported memory" % (gpu.label, plural(len(procs), "process", "processes"))))
    action = h.get("recovery_action")
    if action and action != "None":
        kind = "reset_gpu" if action in RESET_ACTIONS else "reboot" if action in REBOOT_ACTIONS else "fix_config"
        out.append((Status.FAIL, "%s: the driver asks for recovery action %r (expected None)" % (gpu.label, action),
                    "None", action, kind))
    elif action is None and (h.get("reset_required") or h.get("drain_and_reset")):
        what = "drain and reset recommended" if h.get("drain_and_reset") else "reset required"
        out.append((Status.FAIL, "%s: the driver says %s (expected neither)" % (gpu.label, what), "no", what,
                    "reset_gpu"))
    limit, default = h.get("power_limit_w"), h.get("default_power_limit_w")
    if limit is not None and default and limit < default * (1 - POWER_SLACK):
        if fleet.site_choice("power_limit_w", gpu):
            out.append((None, "power limit %g W on the %s GPUs (default %g W)" % (limit, gpu.name, default)))
        else:
            out.append((Status.WARN, "%s: power limit %g W (expected the default %g W: nvidia-smi -pl %g)"
                        % (gpu.label, limit, default, default), "%g W" % default, "%g W" % limit, "fix_config"))
    clock, default_clock = h.get("apps_clock_mhz"), h.get("default_apps_clock_mhz")
    if clock is not None and default_clock and clock < default_clock:
        if fleet.site_choice("apps_clock_mhz", gpu):
            out.append((None, "applications clock %d MHz on the %s GPUs (default %d MHz)" % (clock, gpu.name, default_clock)))
        else:
            out.append((Status.WARN, "%s: applications clock %d MHz (expected the default %d MHz: nvidia-smi -rac)"
                        % (gpu.label, clock, default_clock), "%d MHz" % default_clock, "%d MHz" % clock, "fix_config"))
    for problem in h.get("query_errors") or []:
        out.append((Status.WARN, "%s: %s: state unknown" % (gpu.label, problem), "an answer", problem, None))
    return out


def rule(view: ClusterView) -> List[Finding]:

    records = [r for r in (node_gpus(view, n.name) for n in view.live if n.gpus_per_node) if r and r.health_source]
    fleet = ModelReference(records)
    return per_health_node(
        NAME, view, lambda gpu, record: _gpu(gpu, fleet),
        lambda record, read: "%s: compute mode, processes, power limit, clocks and recovery action as expected"
        % plural(len(read), "GPU"), report_stopped=False)

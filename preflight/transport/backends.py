"""The transport backends, registered once: each brings its command-line options, its inventory source, its
fleet (the transport contract, preflight.transport.contract) and its node actions (an Applier of
preflight.actions.policy). The engine, the inventory and the CLI read this registry; none of them compares
a backend's name.

A declaration is data (cheap to import: the parser and the inventory read it); its behaviour lives in its
hooks module, imported when a run uses it, which defines:

    inventory_of(args) -> Inventory the nodes, from the command line (the ssh backend: an inventory file,
                                    or this machine); a usage mistake raises UsageError
    prepare(args, inv, acting)      before the run: what must hold or be made first (Slurm: the allocation
                                    --drain/--resume act on; ssh: the ssh_config files readable)
    open_fleet(inv, opts) -> Fleet  the transport for one run (a contract.Fleet)
    set_aside(findings, inv, args)  the findings with nodes the scheduler had out of service set aside
    outputs(args, inv, result)      [(path, text, what to say)]: files the backend adds beside the outputs
                                    (Kubernetes: the env file's ConfigMap), written before any node is acted on
    applier(inv) -> Applier | None  who carries out drain / cordon / resume (None: this backend cannot)

Backends are tried in REGISTRY order; the first that one of its `chosen_by` options names carries the run
(ssh, the default, last).
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, NamedTuple, Optional, Tuple


# NamedTuples, not dataclasses: the parser reads these for `preflight --help`, which imports no dataclasses
class Option(NamedTuple):
    """One command-line option a backend brings: argparse's flags and keywords; commands: where it applies."""

    flags: Tuple[str, ...]
    kwargs: Dict[str, Any]
    commands: Tuple[str, ...] = ("check", "env")


class Backend(NamedTuple):
    """A transport backend's declaration."""

    name: str  # cluster.transport's value and the Inventory's transport
    title: str  # how messages name it ("Slurm")
    hooks: str  # the module that implements it (see the module docstring)
    switch: Optional[str] = None  # the command-line switch that chooses it (--slurm); None: the default
    chosen_by: Tuple[str, ...] = ()  # the options (argparse dests) any one of which chooses it
    in_inventory: bool = False  # `cluster: transport: NAME` may name it
    kinds: Tuple[str, ...] = ()  # what its fleet.describe()["kind"] says (default: the name)
    unreachable_fix: Optional[str] = None  # the ssh check's fix when this backend carried the run
    acts: bool = False  # it can drain / cordon / resume nodes
    options: Tuple[Option, ...] = ()

    def module(self) -> Any:
        """The hooks module (imported on first use)."""
        return importlib.import_module(self.hooks)


SLURM = Backend(
    name="slurm", title="Slurm", hooks="preflight.slurm.backend", switch="--slurm", chosen_by=("slurm",), in_inventory=True,
    acts=True,
    unreachable_fix=("check the node's slurmd (systemctl status slurmd; its log), what Slurm says of it "
                     "(scontrol show node NODE: State, Reason) and munge (munge -n | ssh NODE unmunge, clocks in "
                     "sync); python3 must be on the nodes' PATH under srun (or give --python)"),
    options=(
        Option(("--slurm",), dict(action="store_true", help="nodes and transport from Slurm: this allocation (SLURM_JOB_ID), or --nodelist / --partition --nodes")),
        Option(("--nodelist",), dict(metavar="NODES", help="with --slurm: allocate these Slurm nodes for the run (e.g. gpu-[001-064]); with --k8s: check these Kubernetes nodes")),
        Option(("--partition",), dict(metavar="P", help="with --slurm: allocate --nodes N (or --nodelist) nodes in partition P")),
        Option(("--qos",), dict(metavar="Q", help="with --slurm, when preflight allocates: the job's QOS (salloc --qos)")),
        Option(("--preemptible",), dict(action="store_true", help="with --slurm --partition/--qos that user jobs preempt: "
                                        "a burn-in that yields; its nodes are reported preempted, neither failed nor resumed")),
        Option(("--nodes",), dict(type=int, metavar="N", help="with --slurm --partition: how many nodes")),
        Option(("--python",), dict(metavar="PATH", help="with --slurm: the interpreter the nodes run the probe with "
                                   "(default python3 on the nodes' PATH under srun)")),
        Option(("--alloc-wait",), dict(type=float, metavar="SECONDS", help="when preflight allocates Slurm nodes: how long to wait for them (default 120; whole nodes: one running a job is waited for)")),
        Option(("--count-unavailable",), dict(action="store_true", help="with Slurm: count nodes Slurm has out of service (drained, down) as failures (exit 1), "
                                              "not as unavailable"), commands=("check",)),
    ),
)

K8S = Backend(
    name="k8s", title="Kubernetes", hooks="preflight.k8s.backend", switch="--k8s", acts=True,
    chosen_by=("k8s", "selector", "k8s_deploy"),  # its options without --k8s: its inventory() names the missing --k8s
    unreachable_fix=("check the node's preflight agent pod (kubectl -n preflight describe pod POD: events, image), the "
                     "node's kubelet (kubectl describe node NODE: Ready) and your rights (kubectl auth can-i create "
                     "pods --subresource=exec -n preflight); python3 must be in the agent's image"),
    options=(
        Option(("--k8s",), dict(action="store_true", help="nodes from Kubernetes (--selector or --nodelist), reached with kubectl exec into preflight's agent pods")),
        Option(("--selector",), dict(metavar="LABEL", help="with --k8s: the nodes matching this label selector (e.g. nvidia.com/gpu.present=true)")),
        Option(("--context",), dict(metavar="NAME", help="with --k8s: the kubeconfig context (default: kubectl's current one)")),
        Option(("--k8s-namespace",), dict(default="preflight", metavar="NS", help="with --k8s: namespace of the agent DaemonSet (default preflight)")),
        Option(("--k8s-deploy",), dict(action="store_true", help="with --k8s: apply the agent DaemonSet first and wait for its pods")),
        Option(("--k8s-wait",), dict(type=float, default=180.0, metavar="SECONDS", help="with --k8s: how long to wait for agent and all-reduce pods still starting (image pulls); a pod stuck on a reason that cannot resolve (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, Unschedulable) is named at once (default 180)")),
        Option(("--k8s-image",), dict(metavar="IMAGE", help="with --k8s: the image of the agent (--k8s-deploy) and of the all-reduce Job (needs torch)")),
    ),
)

SSH = Backend(
    name="ssh", title="SSH", hooks="preflight.transport.ssh_backend", in_inventory=True, kinds=("ssh", "local"),
    options=(
        Option(("--accept-new-host-keys",), dict(action="store_true", help="record unknown host keys (changed keys still fail)")),
    ),
)

#: in the order the command line tries them (Kubernetes before Slurm: `--slurm --k8s` is named a mistake by
#: Kubernetes' inventory); the default (ssh, or this machine) last
REGISTRY: Dict[str, Backend] = {b.name: b for b in (K8S, SLURM, SSH)}


def get(name: str) -> Backend:
    """The backend registered under `name` (KeyError: a name no inventory can hold, a bug)."""
    return REGISTRY[name]


def inventory_names() -> Tuple[str, ...]:
    """What `cluster: transport:` may say, the default first."""
    return tuple(b.name for b in sorted(REGISTRY.values(), key=lambda b: b.switch is not None) if b.in_inventory)


def by_kind(kind: Optional[str]) -> Optional[Backend]:
    """The backend whose fleet described a run with this kind (report.transport["kind"])."""
    for b in REGISTRY.values():
        if kind in (b.kinds or (b.name,)):
            return b
    return None


def chosen(args: Any) -> Backend:
    """The backend the command line chose: the first in REGISTRY order one of whose chosen_by options is set."""
    for b in REGISTRY.values():
        if b.switch is None or any(getattr(args, dest, None) for dest in b.chosen_by):
            return b
    raise AssertionError("the registry ends with a default backend")  # pragma: no cover


def acting() -> Tuple[Backend, ...]:
    """The backends that can drain / cordon / resume, in registry order."""
    return tuple(b for b in sorted(REGISTRY.values(), key=lambda b: not b.in_inventory) if b.acts)


def add_options(parser: Any, command: str) -> None:
    """Every backend's options that apply to `command`, on its parser."""
    for b in REGISTRY.values():
        for o in b.options:
            if command in o.commands:
                parser.add_argument(*o.flags, **o.kwargs)

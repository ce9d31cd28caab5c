"""The command line's Kubernetes parts: options, `preflight k8s manifest`, the nodes as an inventory,
--drain/--resume, the env ConfigMap. The CLI calls these and prints what they return; errors are
UsageError/KubeError (one line, exit 2), turned into messages by the CLI only."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, List, Optional, Tuple

from preflight.errors import UsageError


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of `check` and `env` that select Kubernetes nodes (--nodelist is shared with --slurm)."""
    p.add_argument("--k8s", action="store_true", help="nodes from Kubernetes (--selector or --nodelist), reached with kubectl exec into preflight's agent pods")
    p.add_argument("--selector", metavar="LABEL", help="with --k8s: the nodes matching this label selector (e.g. nvidia.com/gpu.present=true)")
    p.add_argument("--context", metavar="NAME", help="with --k8s: the kubeconfig context (default: kubectl's current one)")
    p.add_argument("--k8s-namespace", default="preflight", metavar="NS", help="with --k8s: namespace of the agent DaemonSet (default preflight)")
    p.add_argument("--k8s-deploy", action="store_true", help="with --k8s: apply the agent DaemonSet first and wait for its pods")
    p.add_argument("--k8s-image", metavar="IMAGE", help="with --k8s: the image of the agent (--k8s-deploy) and of the all-reduce Job (needs torch)")


def add_commands(sub: Any, parser_class: Any) -> None:
    """`preflight k8s manifest`."""
    k8s = sub.add_parser("k8s", help="Kubernetes helpers: `preflight k8s manifest` prints the agent and its RBAC")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", metavar="WHAT", parser_class=parser_class)
    manifest = k8s_sub.add_parser("manifest", help="print the Namespace, ServiceAccount, RBAC and agent DaemonSet (YAML)")
    manifest.add_argument("--k8s-namespace", default="preflight", metavar="NS", help="namespace of the agent (default preflight)")
    manifest.add_argument("--k8s-image", metavar="IMAGE", help="the agent's image (python3, iproute2, ping, util-linux)")
    manifest.add_argument("--no-rbac", action="store_true", help="leave out the operator ClusterRole and its binding")


def manifest_text(args: argparse.Namespace) -> str:
    from preflight.k8s import manifest

    objects = manifest.agent_objects(args.k8s_namespace, args.k8s_image or manifest.IMAGE)
    if not args.no_rbac:
        objects = manifest.operator_rbac(args.k8s_namespace) + objects
    return manifest.dump(objects)


def misused(args: argparse.Namespace) -> None:
    """Kubernetes-only options without --k8s are a usage error."""
    if not getattr(args, "k8s", False) and (getattr(args, "selector", None) or getattr(args, "k8s_deploy", False)):
        raise UsageError("--selector/--k8s-deploy apply only with --k8s", "add --k8s")


def inventory(args: argparse.Namespace, note: Callable[[str], None]) -> Any:
    """The Kubernetes nodes (by --selector / --nodelist) as the inventory; --k8s-deploy applies the agent first."""
    from preflight.k8s import fleet as k8s
    from preflight.k8s.kubectl import Kubectl

    if getattr(args, "slurm", False) or args.inventory:
        raise UsageError("--k8s takes its nodes from Kubernetes, not from %s" % ("--slurm" if args.slurm else "an inventory file"),
                         "drop %s" % ("--slurm" if args.slurm else "the inventory"))
    if args.partition or args.nodes:
        raise UsageError("--partition/--nodes are Slurm's", "with --k8s give --selector LABEL or --nodelist NODES")
    kubectl = Kubectl(context=args.context, namespace=args.k8s_namespace)
    nodes = k8s.select_nodes(kubectl, args.selector, args.nodelist)
    if args.k8s_deploy:
        from preflight.k8s import deploy, manifest

        missing = deploy.deploy(kubectl, nodes, args.k8s_image or manifest.IMAGE)
        if missing:
            note(deploy.describe(missing))
    from preflight.k8s import manifest as k8s_manifest

    target = k8s.Target(kubectl, nodes, image=args.k8s_image or k8s_manifest.IMAGE)
    return k8s.inventory(target, command_timeout=60.0, gpus_per_node=args.gpus_per_node)


def act(args: argparse.Namespace, inv: Any, result: Any) -> List[str]:
    """--drain / --resume on Kubernetes (preflight.k8s.nodes); the lines to print."""
    if not (getattr(args, "drain", False) or getattr(args, "resume", False)):
        return []
    from preflight.k8s import nodes

    target = inv.allocation
    actions = nodes.plan(result.findings, target.nodes, drain=args.drain, resume=args.resume,
                         max_fraction=args.max_drain_fraction)
    shown = nodes.apply(actions, target.kubectl, target.nodes, result.findings, dry_run=args.dry_run)
    return actions.lines() + ["would run: " + line for line in shown]


def env_configmap(env_file: str, result: Any) -> Optional[Tuple[str, str]]:
    """(path, YAML) of the env ConfigMap written beside the env file on a Kubernetes run, else None."""
    if result.inventory.transport != "k8s" or result.env is None:
        return None
    from preflight.k8s import manifest

    return os.path.splitext(env_file)[0] + ".configmap.yaml", manifest.dump([manifest.env_configmap(result.env.as_dict())])

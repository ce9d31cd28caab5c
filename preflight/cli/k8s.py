"""The command line's Kubernetes parts: the --k8s options, `preflight k8s manifest`, the nodes as an
inventory, and after a run the env file's ConfigMap and --drain/--resume (cordon/taint).

preflight/cli/ calls these at four points and stays the one place where errors become exit codes:
everything here raises UsageError/KubeError (one line, exit 2). Printing goes to the console the CLI
hands over (plain text, markup off) or, for notes before the run, to stderr as the CLI's own notes do.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List

from preflight.errors import UsageError


def extend(sub: Any, parser_class: Any, *commands: argparse.ArgumentParser) -> None:
    """The --k8s options on `check` and `env` (--nodelist is shared with --slurm); `preflight k8s manifest`."""
    for p in commands:
        p.add_argument("--k8s", action="store_true", help="nodes from Kubernetes (--selector or --nodelist), reached with kubectl exec into preflight's agent pods")
        p.add_argument("--selector", metavar="LABEL", help="with --k8s: the nodes matching this label selector (e.g. nvidia.com/gpu.present=true)")
        p.add_argument("--context", metavar="NAME", help="with --k8s: the kubeconfig context (default: kubectl's current one)")
        p.add_argument("--k8s-namespace", default="preflight", metavar="NS", help="with --k8s: namespace of the agent DaemonSet (default preflight)")
        p.add_argument("--k8s-deploy", action="store_true", help="with --k8s: apply the agent DaemonSet first and wait for its pods")
        p.add_argument("--k8s-wait", type=float, default=180.0, metavar="SECONDS", help="with --k8s: how long to wait for agent and all-reduce pods still starting (image pulls); a pod stuck on a reason that cannot resolve (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, Unschedulable) is named at once (default 180)")
        p.add_argument("--k8s-image", metavar="IMAGE", help="with --k8s: the image of the agent (--k8s-deploy) and of the all-reduce Job (needs torch)")
    k8s = sub.add_parser("k8s", help="Kubernetes helpers: `preflight k8s manifest` prints the agent and its RBAC")
    k8s_sub = k8s.add_subparsers(dest="k8s_command", metavar="WHAT", parser_class=parser_class)
    manifest = k8s_sub.add_parser("manifest", help="print the Namespace, ServiceAccount, RBAC and agent DaemonSet (YAML)")
    manifest.add_argument("--k8s-namespace", default="preflight", metavar="NS", help="namespace of the agent (default preflight)")
    manifest.add_argument("--k8s-image", metavar="IMAGE", help="the agent's image (python3, iproute2, ping, util-linux)")
    manifest.add_argument("--no-rbac", action="store_true", help="leave out the operator ClusterRole and its binding")


def run(args: argparse.Namespace) -> int:
    """`preflight k8s WHAT`."""
    from preflight.k8s import manifest

    if getattr(args, "k8s_command", None) != "manifest":
        raise UsageError("`preflight k8s` needs what to do", "e.g. preflight k8s manifest > preflight-k8s.yaml")
    image = args.k8s_image or manifest.IMAGE
    if args.no_rbac:
        objects = manifest.agent_objects(args.k8s_namespace, image)
    else:
        objects = manifest.everything(args.k8s_namespace, image)
    if not manifest.pinned(image):
        sys.stderr.write("preflight: note: image %s is not pinned by digest: pin it (NAME@sha256:DIGEST) so every "
                         "node runs the bytes you reviewed\n" % image)
    sys.stdout.write(manifest.dump(objects))
    return 0


def wanted(args: argparse.Namespace) -> bool:
    """--k8s, or one of its options (then inventory() names the missing --k8s)."""
    return bool(getattr(args, "k8s", False) or getattr(args, "selector", None) or getattr(args, "k8s_deploy", False))


def inventory(args: argparse.Namespace) -> Any:
    """The Kubernetes nodes (by --selector / --nodelist) as the inventory; --k8s-deploy applies the agent first."""
    from preflight.k8s import fleet as k8s
    from preflight.k8s import manifest
    from preflight.k8s.kubectl import Kubectl

    if not getattr(args, "k8s", False):
        raise UsageError("--selector/--k8s-deploy apply only with --k8s", "add --k8s")
    if getattr(args, "slurm", False) or args.inventory:
        raise UsageError("--k8s takes its nodes from Kubernetes, not from %s" % ("--slurm" if args.slurm else "an inventory file"),
                         "drop %s" % ("--slurm" if args.slurm else "the inventory"))
    if args.partition or args.nodes:
        raise UsageError("--partition/--nodes are Slurm's", "with --k8s give --selector LABEL or --nodelist NODES")
    kubectl = Kubectl(context=args.context, namespace=args.k8s_namespace)
    nodes = k8s.select_nodes(kubectl, args.selector, args.nodelist)
    image = args.k8s_image or manifest.IMAGE
    from preflight.k8s.benchjob import stale_jobs

    for line in stale_jobs(kubectl):
        sys.stderr.write("preflight: note: %s\n" % line)
    wait_s = args.k8s_wait
    if not wait_s > 0:
        raise UsageError("--k8s-wait %g: must be more than 0 seconds" % wait_s, "e.g. --k8s-wait 600 for a slow registry")
    if args.k8s_deploy:
        from preflight.k8s import deploy

        for line in deploy.describe(deploy.deploy(kubectl, nodes, image, wait_s=wait_s)):
            sys.stderr.write("preflight: note: %s\n" % line)
    return k8s.inventory(k8s.Target(kubectl, nodes, image=image, launch_wait_s=wait_s), command_timeout=60.0,
                         gpus_per_node=args.gpus_per_node)


def after_run(args: argparse.Namespace, inv: Any, result: Any, console: Any) -> None:
    """After a Kubernetes run: the env file's ConfigMap beside it, then --drain/--resume (preflight.k8s.nodes)."""
    lines: List[str] = []
    if getattr(args, "env_file", None) and result.env is not None:
        from preflight.k8s import manifest
        from preflight.output.history import atomic_write_text

        path = os.path.splitext(args.env_file)[0] + ".configmap.yaml"
        try:
            atomic_write_text(path, manifest.dump([manifest.env_configmap(result.env.as_dict())]), mode=0o644)
        except OSError as exc:
            raise UsageError("cannot write %s: %s" % (path, exc.strerror or exc), "check the directory is writable") from None
        lines.append("env ConfigMap: %s (kubectl apply -f it; mount with envFrom: configMapRef preflight-nccl-env)" % path)
    if getattr(args, "drain", False) or getattr(args, "resume", False):
        from preflight.k8s import nodes

        target = inv.allocation
        actions = nodes.plan(result.findings, target.nodes, drain=args.drain, resume=args.resume,
                             max_fraction=args.max_drain_fraction)
        shown = nodes.apply(actions, target.kubectl, target.nodes, result.findings, dry_run=args.dry_run)
        lines += actions.lines() + ["would run: " + line for line in shown]
    for line in lines:
        console.print(line, markup=False, highlight=False)

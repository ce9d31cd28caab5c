"""The Kubernetes backend's hooks (preflight.transport.backends): the nodes a label selector (or --nodelist)
names, reached with kubectl exec into preflight's agent pods; the env file's ConfigMap after the run;
cordon, taint and resume by merge patch (preflight.k8s.nodes.KubeApplier).

Everything here raises UsageError/KubeError (one line, exit 2); notes before the run go to stderr as the
CLI's own notes do.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional, Tuple

from preflight.actions import tier_gate
from preflight.errors import UsageError
from preflight.inventory import Inventory
from preflight.k8s import deploy, manifest
from preflight.k8s import fleet as k8s
from preflight.k8s.benchjob import stale_jobs
from preflight.k8s.kubectl import Kubectl
from preflight.k8s.nodes import KubeApplier


def inventory_of(args: argparse.Namespace) -> Inventory:
    """The Kubernetes nodes (by --selector / --nodelist) as the inventory; --k8s-deploy applies the agent first."""
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
    for line in stale_jobs(kubectl):
        sys.stderr.write("preflight: note: %s\n" % line)
    wait_s = args.k8s_wait
    if not wait_s > 0:
        raise UsageError("--k8s-wait %g: must be more than 0 seconds" % wait_s, "e.g. --k8s-wait 600 for a slow registry")
    if args.k8s_deploy:
        for line in deploy.describe(deploy.deploy(kubectl, nodes, image, wait_s=wait_s)):
            sys.stderr.write("preflight: note: %s\n" % line)
    return k8s.inventory(k8s.Target(kubectl, nodes, image=image, launch_wait_s=wait_s), command_timeout=60.0,
                         gpus_per_node=args.gpus_per_node)


def prepare(args: argparse.Namespace, inv: Inventory, acting: bool) -> None:
    return None


def open_fleet(inv: Inventory, opts: Any) -> Any:
    """kubectl exec into each node's agent pod; the all-reduce as an indexed Job."""
    return k8s.fleet_for(inv, opts.progress, opts.parallel)


def set_aside(findings: List[Any], inv: Inventory, args: argparse.Namespace) -> List[Any]:
    """With --resume --tier standard|burn-in, the nodes preflight cordoned (those --resume may return) held
    back unless the tier passed on them in this run (preflight.actions.tier_gate); cordoned nodes are checked
    like the others, so nothing else is set aside."""
    tier = tier_gate.demanded(args)
    if inv.allocation is None or tier is None:
        return findings
    ours = [name for name, mark in applier(inv).marks().items() if mark.out and mark.back is None]
    return tier_gate.hold(findings, tier, ours)


def outputs(args: argparse.Namespace, inv: Inventory, result: Any) -> List[Tuple[str, str, str]]:
    """The env file's ConfigMap beside it (path, YAML, what to say), written before any node is acted on."""
    if not getattr(args, "env_file", None) or result.env is None:
        return []
    path = os.path.splitext(args.env_file)[0] + ".configmap.yaml"
    return [(path, manifest.dump([manifest.env_configmap(result.env.as_dict())]),
             "env ConfigMap: %s (kubectl apply -f it; mount with envFrom: configMapRef preflight-nccl-env)" % path)]


def applier(inv: Inventory) -> Optional[KubeApplier]:
    return KubeApplier(inv.allocation)

"""`preflight k8s manifest`: the agent DaemonSet and its RBAC as YAML. The --k8s options, the nodes as an
inventory, the env file's ConfigMap and cordon/resume are the Kubernetes backend's (preflight.k8s.backend,
registered in preflight.transport.backends).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from preflight.errors import UsageError


def extend(sub: Any, parser_class: Any) -> None:
    """`preflight k8s manifest` (the --k8s options are the backend's: preflight.transport.backends)."""
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

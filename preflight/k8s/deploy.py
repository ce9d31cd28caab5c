"""--k8s-deploy: apply the agent's objects and wait until the selected nodes have a Ready agent pod.

The wait is bounded (--k8s-wait, default WAIT_S: image pulls dominate on a first deploy) and gives up
early on what cannot come: a pod on a node whose kubelet is not Ready never becomes Ready, and a pod
stuck on a reason that does not resolve by itself (ErrImagePull / ImagePullBackOff, CreateContainerConfigError,
Unschedulable: kubectl.STUCK_REASONS) is named at once with that reason; only pods making progress (an
image pull under way) are waited for. The check run then names each node without a Ready agent.
"""

from __future__ import annotations

import time
from typing import Dict, List

from preflight.common import fold
from preflight.k8s import manifest
from preflight.k8s.fleet import agent_pods, not_ready_summary
from preflight.k8s.kubectl import Kubectl, KubeError, NodeState, said

#: how long --k8s-deploy waits for the agent pods (image pulls dominate on a first deploy)
WAIT_S = 180.0


def deploy(kubectl: Kubectl, nodes: Dict[str, NodeState], image: str = manifest.IMAGE, wait_s: float = WAIT_S,
           poll_s: float = 0.5) -> Dict[str, str]:
    """Apply Namespace, ServiceAccount and DaemonSet; wait for Ready agent pods on `nodes`.

    Returns {node: why} for the nodes still without one when the wait ended (empty: all Ready)."""
    text = manifest.dump(manifest.agent_objects(kubectl.namespace, image))
    out = kubectl.run("apply", "-f", "-", stdin=text, timeout=120)
    if out.returncode != 0:
        raise KubeError("kubectl apply of the preflight agent failed: %s" % said(out.stderr),
                        "check your rights (preflight k8s manifest prints the RBAC preflight needs)")
    until = time.monotonic() + wait_s
    while True:
        pods = agent_pods(kubectl)
        progressing = [n for n in not_ready_summary(pods, list(nodes)) if nodes[n].ready and not (n in pods and pods[n].stuck)]
        if not progressing or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    return {n: ("cannot start: %s" % pods[n].not_ready if pods[n].stuck else
                "not Ready after --k8s-wait %g s (%s)" % (wait_s, pods[n].not_ready)) if n in pods else
            "has no pod after --k8s-wait %g s" % wait_s for n in not_ready_summary(pods, list(nodes))}


def describe(missing: Dict[str, str]) -> List[str]:
    """One note per reason, its nodes folded."""
    by: Dict[str, List[str]] = {}
    for node, why in missing.items():
        by.setdefault(why, []).append(node)
    return ["agent pod on %s %s (the check names it)" % (fold(nodes), why) for why, nodes in sorted(by.items())]

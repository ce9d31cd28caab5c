"""--k8s-deploy: apply the agent's objects and wait until the selected nodes have a Ready agent pod.

The wait is bounded and gives up early on what cannot come: a pod on a node whose kubelet is not Ready
never becomes Ready, so such nodes are not waited for; the check run then names them ("agent pod ... is
not Ready"), it does not hang on them.
"""

from __future__ import annotations

import time
from typing import Dict, List, Sequence

from preflight.common import fold
from preflight.k8s import manifest
from preflight.k8s.fleet import agent_pods, not_ready_summary
from preflight.k8s.kubectl import Kubectl, KubeError, NodeState, said

#: how long --k8s-deploy waits for the agent pods (image pulls dominate on a first deploy)
WAIT_S = 180.0


def deploy(kubectl: Kubectl, nodes: Dict[str, NodeState], image: str = manifest.IMAGE, wait_s: float = WAIT_S,
           poll_s: float = 0.5) -> List[str]:
    """Apply Namespace, ServiceAccount and DaemonSet; wait for Ready agent pods on `nodes`.

    Returns the nodes still without one when the wait ended (empty: all Ready)."""
    text = manifest.dump(manifest.agent_objects(kubectl.namespace, image))
    out = kubectl.run("apply", "-f", "-", stdin=text, timeout=120)
    if out.returncode != 0:
        raise KubeError("kubectl apply of the preflight agent failed: %s" % said(out.stderr),
                        "check your rights (preflight k8s manifest prints the RBAC preflight needs)")
    until = time.monotonic() + wait_s
    waiting: Sequence[str] = list(nodes)
    while True:
        pods = agent_pods(kubectl)
        waiting = [n for n in not_ready_summary(pods, list(nodes)) if nodes[n].ready]
        if not waiting or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    return not_ready_summary(pods, list(nodes)) if not waiting else list(waiting)


def describe(missing: Sequence[str]) -> str:
    return "agent pods not Ready on %s (their checks will name them)" % fold(missing)

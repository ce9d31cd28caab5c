"""A simulated GPU-less cluster for tests and benchmarks: network namespaces, real OpenSSH sshd per node."""

from .base import SimError
from .cluster import DOCKER0_CIDR, SimCluster, SimNode
from .teardown import cleanup_stale
from .netns import in_netns, netns_available

__all__ = ["DOCKER0_CIDR", "SimCluster", "SimError", "SimNode", "cleanup_stale", "in_netns", "netns_available"]

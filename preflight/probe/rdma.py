"""What node-side probes share about RDMA devices under class/infiniband: which are AWS EFA, and their order.

Checks that read class/infiniband (ib_hca, ib_errors, cloud_fabric) tell EFA devices apart the same way: the
efa driver named in the PCI function's device/uevent, else (no uevent) Amazon's PCI vendor id 0x1d0f (real
layouts cited in preflight.checks.ib_hca's docstring). Standard library only.
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Optional, Tuple

#: The PCI vendor id of Amazon's EFA functions (device/vendor), where device/uevent names no driver.
EFA_VENDOR = "0x1d0f"


def natural_key(name: str) -> Tuple[Any, ...]:
    """mlx5_2 sorts before mlx5_10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def driver(ctx: Any, hca_dir: str) -> Optional[str]:
    """The kernel driver bound to the HCA's PCI function ('efa', 'mlx5_core'), from device/uevent's DRIVER=
    line; None when unreadable."""
    for line in (ctx.read(os.path.join(hca_dir, "device", "uevent")) or "").splitlines():
        if line.startswith("DRIVER="):
            return line[len("DRIVER="):].strip() or None
    return None


def is_efa(ctx: Any, hca_dir: str) -> bool:
    """An AWS Elastic Fabric Adapter: bound to the efa driver, or (no uevent) on a PCI function of Amazon's
    vendor id 0x1d0f."""
    bound = driver(ctx, hca_dir)
    if bound is not None:
        return bound == "efa"
    return (ctx.read(os.path.join(hca_dir, "device", "vendor")) or "").strip().lower() == EFA_VENDOR

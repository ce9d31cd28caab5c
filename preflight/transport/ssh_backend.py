"""The ssh backend's hooks (preflight.transport.backends): the nodes of an inventory file reached over SSH, or
this machine alone in a local process; no node actions (drain and resume need a scheduler)."""

from __future__ import annotations

import argparse
from typing import Any, List, Optional, Tuple

from preflight import inventory
from preflight.errors import UsageError
from preflight.inventory import Inventory
from preflight.transport.pool import SessionPool


def inventory_of(args: argparse.Namespace) -> Inventory:
    """The inventory file's nodes, or this machine when none is given."""
    if getattr(args, "nodelist", None) or getattr(args, "partition", None) or getattr(args, "nodes", None):
        raise UsageError("--nodelist/--partition/--nodes apply only with --slurm", "add --slurm")
    if not args.inventory:
        return inventory.local_inventory(args.gpus_per_node)
    if args.gpus_per_node is not None:
        raise UsageError("--gpus-per-node applies only without an inventory", "set gpus_per_node in the inventory")
    if args.max_nodes is not None and args.max_nodes < 1:
        raise UsageError("--max-nodes must be at least 1", "e.g. --max-nodes 20000")
    return inventory.load(args.inventory, max_nodes=args.max_nodes)


def prepare(args: argparse.Namespace, inv: Inventory, acting: bool) -> None:
    """The nodes' ssh_config files must be readable before any connection (OpenSSH's reading, Include included)."""
    if not any(not s.local for s in inv.nodes):
        return
    from preflight.transport import ssh_config

    try:
        ssh_config.load_ssh_configs(s.ssh_config for s in inv.nodes if not s.local)
    except ssh_config.SSHConfigError as exc:
        raise UsageError(str(exc), "fix the ssh_config (preflight reads it as OpenSSH does, Include included)") from None


def open_fleet(inv: Inventory, opts: Any) -> SessionPool:
    """One SSH (or local) session per node, driven by a bounded pool."""
    return SessionPool(inv.nodes, opts.parallel, opts.accept_new_host_keys, opts.progress)


def set_aside(findings: List[Any], inv: Inventory, args: argparse.Namespace) -> List[Any]:
    return findings


def outputs(args: argparse.Namespace, inv: Inventory, result: Any) -> List[Tuple[str, str, str]]:
    return []


def applier(inv: Inventory) -> Optional[Any]:
    return None

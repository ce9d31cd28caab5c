"""Hostfiles of the healthy nodes, in the syntax each launcher reads.

Formats (`render_hostfile(nodes, fmt)`, nodes = [(host, slots), ...] in launch order)::

    plain      one host per line                     (pdsh -w ^file, torchrun wrappers, clush)
    deepspeed  host slots=N                          (deepspeed --hostfile)
    mpi        host slots=N                          (Open MPI mpirun --hostfile; `slots` = processes
                                                      per host, our GPUs per node)
    mpich      host:N                                (MPICH / Intel MPI Hydra -f machinefile)
    slurm      gpu-[001-003,005]  on one line        (sbatch/srun --nodelist, folded by ClusterShell)

`mpi` means Open MPI because that is what NCCL/PyTorch clusters mostly ship; MPICH's Hydra does not
read ``slots=`` and wants ``host:N``, hence its own format. The slurm list is a set: Slurm orders nodes
itself, so the folded list is sorted and the input order is not kept.

These files are read by launchers that split on whitespace and sometimes pass names through a shell,
so every host is validated first: letters, digits, ``.``, ``-``, ``_`` (and ``:`` for IPv6, except in
the mpich and slurm formats where ``:`` and node-range syntax mean something else); anything else —
whitespace, quotes, ``$;&|<>`*?[]{}()!#@,=\\`` — raises ValueError naming the host. So does a duplicate
host, a name starting with ``-`` (it would read as an option), and a slot count below 1 in a format
that has slots.
"""

from __future__ import annotations

import re
from typing import List, Sequence, Tuple

from preflight.common import expand, fold
from preflight.output.history import PathLike, atomic_write_text

FORMATS = ("plain", "deepspeed", "mpi", "mpich", "slurm")
_SLOT_FORMATS = ("deepspeed", "mpi", "mpich")
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]*")
_MAX_HOST_LEN = 253


def validate_host(host: str, fmt: str = "plain") -> str:
    """The host unchanged if a launcher can read it safely in format fmt; ValueError naming it if not."""
    if not isinstance(host, str) or not host:
        raise ValueError("invalid host name %r: empty" % (host,))
    if len(host) > _MAX_HOST_LEN:
        raise ValueError("invalid host name %r: longer than %d characters" % (host, _MAX_HOST_LEN))
    if not _HOST_RE.fullmatch(host):
        bad = sorted({c for c in host if not re.fullmatch(r"[A-Za-z0-9._:-]", c)})
        why = "starts with %r" % host[0] if not bad else "contains %s" % ", ".join(repr(c) for c in bad)
        raise ValueError("invalid host name %r: %s (only letters, digits, '.', '-', '_', ':' allowed)"
                         % (host, why))
    if ":" in host and fmt in ("mpich", "slurm"):
        raise ValueError("invalid host name %r: ':' cannot appear in a %s hostfile" % (host, fmt))
    return host


def _validate(nodes: Sequence[Tuple[str, int]], fmt: str) -> List[Tuple[str, int]]:
    if fmt not in FORMATS:
        raise ValueError("unknown hostfile format %r (choose from %s)" % (fmt, ", ".join(FORMATS)))
    seen = set()
    out = []
    for host, slots in nodes:
        validate_host(host, fmt)
        if host in seen:
            raise ValueError("duplicate host %r in hostfile" % host)
        seen.add(host)
        if fmt in _SLOT_FORMATS:
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
                raise ValueError("host %r: slots must be a whole number >= 1, got %r" % (host, slots))
        out.append((host, slots))
    return out


def _slurm_nodelist(hosts: List[str]) -> str:
    folded = fold(hosts)  # group resolution off: a name never reaches a groups.conf upcall
    try:
        back = set(expand(folded))
    except ValueError:
        back = set()
    if back != set(hosts):  # the fold must expand back to exactly these hosts
        raise ValueError("hosts %r do not fold into a Slurm nodelist (got %r)" % (hosts, folded))
    return folded


def render_hostfile(nodes: Sequence[Tuple[str, int]], fmt: str) -> str:
    """The hostfile text for nodes [(host, slots), ...] in format fmt (see FORMATS); '' for no nodes."""
    checked = _validate(nodes, fmt)
    if not checked:
        return ""
    if fmt == "plain":
        lines = [host for host, _ in checked]
    elif fmt in ("deepspeed", "mpi"):
        lines = ["%s slots=%d" % (host, slots) for host, slots in checked]
    elif fmt == "mpich":
        lines = ["%s:%d" % (host, slots) for host, slots in checked]
    else:
        lines = [_slurm_nodelist([host for host, _ in checked])]
    return "\n".join(lines) + "\n"


def write_hostfile(nodes: Sequence[Tuple[str, int]], fmt: str, path: PathLike) -> None:
    """Write `render_hostfile(nodes, fmt)` to path atomically (validation happens before any write)."""
    atomic_write_text(path, render_hostfile(nodes, fmt))

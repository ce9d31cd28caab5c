"""What the simulator's modules share: its error, iproute2 batches, file writes, host keys, log tails.

tests/sim/cluster.py (the topology and sshd lifecycle), tests/sim/faults.py (the fault injectors) and
tests/sim/slurm.py all build on these; nothing here knows a cluster.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Optional, Sequence, Tuple, Union

BASE_DIR = os.environ.get("PFSIM_BASE", os.path.join(tempfile.gettempdir(), "pfsim"))
PREFIX_BASE = "pfsim"
DATA_MTU = 9000
MGMT_MTU = 1500


class SimError(RuntimeError):
    """The simulated cluster could not be built or changed."""


def ip_batch(lines: Sequence[str], ns: Optional[str] = None, force: bool = False) -> None:
    """Run iproute2 commands through one `ip [-n NS] -batch -` process."""
    argv = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)
    if proc.returncode != 0 and not force:
        raise SimError("%s failed: %s" % (" ".join(argv), proc.stdout.strip()))


def ed25519_keypair(comment: str) -> Tuple[bytes, bytes]:
    """(OpenSSH private key PEM, 'ssh-ed25519 AAAA... comment' line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + b" " + comment.encode()


def tail(path: str, n: int) -> str:
    """The last n bytes of a (log) file as text; "" when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read()[-n:].decode(errors="replace").strip()
    except OSError:
        return ""


def write_file(path: str, data: Union[str, bytes], mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)

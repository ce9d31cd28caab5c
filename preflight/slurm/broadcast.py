"""The probe bundle on Slurm: broadcast once per run with sbcast, so srun's stdin carries only its name.

Without it, `srun --input=all` copies the whole zipped bundle (about 600 KB) to every task: 600 MB
leaving the controller at 1,000 nodes, each byte handed from srun to each node's slurmstepd in 1 KB I/O
messages. With it, one `sbcast` sends the file along slurmd's own tree (each slurmd forwards the block to
others: the controller sends it a few times, not once per node), and the step's stdin carries one line,
`@SHA256 PATH` (preflight.transport.bundle).

Where: `/dev/shm/preflight-UID-bundle-SHA256.zip`. /dev/shm is a tmpfs on every Linux node, so the
file is node-local by construction (a /tmp may be a shared or slow filesystem on some sites), it is world
writable with the sticky bit (only its owner can replace or remove a file there), and where the site
runs job_container/tmpfs it is private to the job. sbcast writes as the job's user.

Why `sbcast` and not `srun --bcast`: --bcast copies the step's *executable* to the nodes and runs that
copy; the bundle is data read by `python3 -c BOOTSTRAP`, and the executable (sh) is on every node already.
sbcast copies any file, once per job, independent of the step, and says per node what went wrong.

Reuse and what stays on the nodes: sbcast runs without --force, so slurmd creates the file with
O_EXCL. Where a previous run left the same version (same name: same user, same digest), the node answers
"File exists" and keeps it: the next run sends nothing to that node (its cost is one small RPC) and the
bootstrap verifies the file before it uses it. The file is kept after the run for that reuse; what
bounds it: one file per user and preflight version per node (the bootstrap removes the user's other
versions once it has verified the current one), about 600 KB of RAM, gone at reboot, and with the job
where /dev/shm is per job. An interrupted sbcast can leave a short file at the name: the bootstrap finds
its digest wrong, removes it (only its owner could have written it) and the node gets its bundle over
stdin in this run; the next run's sbcast writes it whole.

Falls back to stdin (the bundle on srun's stdin, as before) when sbcast is missing, fails for the whole
job (an old Slurm, a site that forbids it) or when a node refuses the file (missing, planted by another
user, a symlink, group-writable, wrong digest): those nodes are re-run with the bundle on stdin. Each
fallback is logged with --debug; a refused file is a warning (someone or something put it there).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import tempfile
from typing import Dict, List, Optional, Tuple

from preflight.transport import bundle

log = logging.getLogger(__name__)

SBCAST = "sbcast"
#: node-local on every Linux node (tmpfs), sticky and world-writable; see the module docstring
BUNDLE_DIR = "/dev/shm"
#: how long sbcast may take before the bundle goes on srun's stdin instead: SBCAST_TIMEOUT_S, plus
#: SBCAST_PER_NODE_S for every node. sbcast's time grows with the nodes where slurmctld and the slurmds
#: are busy (58.8 s for 1,000 simulated nodes sharing 2 cores, where 60 s flat was then missed in the
#: next run), and the fallback is dearer than waiting: 600 KB per node through srun (600 MB and ~30 ms
#: of controller CPU per node at 1,000; on the simulator the nodes' slurmstepds ran it out of memory).
SBCAST_TIMEOUT_S = 60.0
SBCAST_PER_NODE_S = 0.15

# sbcast's per-node errors: "sbcast: error: REQUEST_FILE_BCAST(n003): File exists"
_NODE_ERROR_RE = re.compile(r"REQUEST_FILE_BCAST\(([^)]+)\):\s*(.*)$")
EXISTS = "File exists"


class Delivery:
    """The outcome of one broadcast: `file` = (path, sha256) to name on stdin, or None (send on stdin)."""

    def __init__(self, file: Optional[Tuple[str, str]], why: str = "", node_errors: Optional[Dict[str, str]] = None,
                 kept: int = 0) -> None:
        self.file = file
        self.why = why  # why the bundle goes on stdin to every node ('' when the file is used)
        self.node_errors = node_errors or {}  # {node: sbcast's error} other than "File exists"
        self.kept = kept  # nodes that had this version already (reused)


def parse_sbcast_errors(text: str) -> Dict[str, str]:
    """{node: error} from sbcast's stderr ("REQUEST_FILE_BCAST(n003): File exists")."""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        match = _NODE_ERROR_RE.search(line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def deliver(job_id: str, nodes: List[str], blob: bytes, env: Optional[Dict[str, str]] = None,
            timeout: Optional[float] = None) -> Delivery:
    """sbcast `blob` to every node of job `job_id` as BUNDLE_DIR/preflight-UID-bundle-SHA256.zip, within
    `timeout` (default SBCAST_TIMEOUT_S + SBCAST_PER_NODE_S per node).

    Never raises for a failed broadcast: the Delivery says to use stdin and why.
    """
    if timeout is None:
        timeout = SBCAST_TIMEOUT_S + SBCAST_PER_NODE_S * len(nodes)
    digest = hashlib.sha256(blob).hexdigest()
    path = os.path.join(BUNDLE_DIR, bundle.file_name(os.getuid(), digest))
    fd, src = tempfile.mkstemp(prefix="preflight-bundle-", suffix=".zip")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        try:
            # restore_signals=False: sbcast inherits Python's SIGPIPE ignored, so a slurmd that drops its
            # connection is an error sbcast reports for that node ("REQUEST_FILE_BCAST(n1): ..."); with SIGPIPE's
            # default, sbcast died of it (rc -13, seen at 1,000 simulated nodes) and every node fell back to stdin
            out = subprocess.run([SBCAST, "--jobid=%s" % job_id, src, path], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env,
                                 restore_signals=False)
        except FileNotFoundError:
            return Delivery(None, "sbcast not found on PATH")
        except subprocess.TimeoutExpired:
            return Delivery(None, "sbcast did not finish within %g s" % timeout)
    finally:
        os.unlink(src)
    said = out.stderr.decode("utf-8", "replace")
    errors = parse_sbcast_errors(said)
    kept = sum(1 for why in errors.values() if why == EXISTS)
    others = {n: why for n, why in errors.items() if why != EXISTS}
    if out.returncode != 0 and not errors:
        last = [line for line in said.splitlines() if line.strip()][-1:] or ["no message"]
        return Delivery(None, "sbcast failed (rc %d): %s" % (out.returncode, last[0][:300]))
    if others and len(others) >= len(nodes):
        return Delivery(None, "sbcast failed on every node: %s" % next(iter(others.values())))
    return Delivery((path, digest), node_errors=others, kept=kept)

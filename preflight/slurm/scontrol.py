"""Slurm's commands and what they print: names, node states, the pure parsers, one runner.

Output formats (scontrol(1), srun(1), salloc(1) of Slurm 22.05, recorded from tests/sim/slurm.py into
tests/fixtures/slurm/): `scontrol -o show node` prints one `Key=Value ...` line per node with `Reason=`
last before the optional `Comment=`/`Extra=`; `scontrol -d -o show job` carries `JOB_GRES=` and `TRES=`;
srun names a failed launch "Task launch for J.S failed on node X: ..." and a task's exit
"srun: error: X: task N: ..."; salloc prints `salloc: Granted job allocation N`.

Slurm commands are run with argv lists, never through a shell.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preflight.common import expand, fold
from preflight.actions.policy import REASON_PREFIX, ours  # noqa: F401  (whose a reason is: the policy's words)
from preflight.errors import PreflightError

SRUN = "srun"
SALLOC = "salloc"
SCONTROL = "scontrol"
SCANCEL = "scancel"
SQUEUE = "squeue"

#: Slurm node states (base or flag) in which a node cannot run the probe.
BAD_STATES = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
              "POWER_DOWN", "POWERING_DOWN", "FUTURE", "UNKNOWN", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED")

#: Slurm node states of a node that runs a job: an allocation of whole nodes (--exclusive) waits for it.
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")

LAUNCH_FAIL_RE = re.compile(r"Task launch for \S+ failed on node (\S+?):\s*(.+)$")
#: launch failures that are about the node itself: its slurmd refused or could not be reached at all (Slurm's
#: SLURM_COMMUNICATIONS_CONNECTION_ERROR, "Communication connection failure", marks only that node in
#: forward.c; a timeout marks a forwarder's whole subtree: see preflight.slurm.fleet)
LAUNCH_REFUSED_RE = re.compile(r"Communication connection failure|Connection refused|No route to host|"
                               r"Network is unreachable|Unable to resolve|Invalid node name", re.I)
EXIT_RE = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
#: srun ending the whole step because its I/O connection to one node's slurmstepd broke (Slurm 22.05
#: src/api/step_launch.c, step_launch_notify_io_failure: "aborting, io error with slurmstepd on node %d", or
#: "Aborting, io error and missing step on node %d"; the number is the node's index in the step). Every task
#: not yet finished is then reported "Killed" (reproduced in tests/actions/test_slurm_ops.py by resetting one
#: slurmstepd's TCP connection): nothing is known against those nodes.
STEP_ABORT_RE = re.compile(r"(?:aborting, io error with slurmstepd|Aborting, io error and missing step) on node (\d+)")
GRANTED_RE = re.compile(r"Granted job allocation (\d+)")
#: srun failing for a reason of the controller's, not of any node (Slurm src/srun/libsrun/allocate.c: "Unable
#: to confirm allocation for job %u: %m"; launch.c / step_ctx.c: "Unable to create step for job %u: %m";
#: "Unable to contact slurm controller" from the API): seen at 512 and 1,000 simulated nodes with slurmctld
#: starved of CPU ("Unable to confirm allocation for job 1: Socket timed out on send/recv operation").
#: Also the job itself ending under the step ("srun: error: Slurm job 1 has expired", seen at 1,000 simulated
#: nodes when Slurm ended the job for one failed node, before --no-kill; also its time limit or a scancel by
#: someone): nothing is known of the nodes whose results had not arrived. And the job holding fewer nodes than
#: the step names ("srun: error: Only allocated 998 nodes asked for 999", seen at 1,000 simulated nodes when
#: slurmctld set a node whose slurmd it could not reach DOWN during the run; --no-kill kept the job).
CONTROLLER_FAIL_RE = re.compile(r"(Unable to confirm allocation for job \S+|Unable to create step for job \S+|"
                                r"Unable to contact slurm controller|Slurm job \S+ has expired|"
                                r"Only allocated \d+ nodes asked for \d+)(?::\s*(.*))?$", re.M)


def drained(state: Sequence[str]) -> bool:
    """A node in this state (base state and flags) is drained or draining."""
    return any(s.rstrip("*") in ("DRAIN", "DRAINED", "DRAINING") for s in state)


def down(state: Sequence[str]) -> bool:
    """A node in this state is DOWN."""
    return any(s.rstrip("*") == "DOWN" for s in state)


def left_alone_why(kind: str, info: Dict[str, Any]) -> Optional[str]:
    """Why a node in this Slurm state ({"state", "reason"}) must not get preflight's update (kind "drain"
    or "resume"), None when it may: a node someone else drained, or Slurm set DOWN, is theirs; a resume
    also needs preflight's own drain still in place."""
    state, reason = list(info.get("state") or []), info.get("reason")
    if down(state) and not ours(reason):
        return "Slurm marked it %s%s" % ("+".join(state), ": %s" % reason if reason else "")
    if drained(state) and not ours(reason):
        return "drained by someone else: %s" % (reason or "+".join(state))
    if kind == "resume" and not drained(state):
        return "not drained any more: Slurm reports it %s" % "+".join(state)
    return None


class SlurmError(PreflightError):
    """Slurm could not be used (no allocation, a command failed, bad node list)."""


# --- parsers (pure) ------------------------------------------------------------------------------


def parse_show_node(text: str) -> Dict[str, Dict[str, Any]]:
    """`scontrol -o show node [LIST]` -> {node: {"state": [..], "reason": str|None, "gpus": int|None}}.

    One line per node; values hold no spaces except Reason= (free text, possibly followed by a
    `[user@time]` stamp), which runs until a following ` Comment=`/` Extra=` field or the end.
    """
    nodes: Dict[str, Dict[str, Any]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("NodeName="):
            raise ValueError("line %d is not a `scontrol -o show node` line: %r" % (lineno, line[:80]))
        reason = None
        m = re.search(r"(?:^| )Reason=(.*?)(?= (?:Comment|Extra)=|$)", line)
        if m:
            reason = re.sub(r"\s*\[[^\]@]*@[^\]]*\]$", "", m.group(1)).strip()  # drop the [user@time] stamp
            line = line[: m.start()] + line[m.end():]
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        state = fields.get("State")
        if state is None:
            raise ValueError("line %d has no State=: %r" % (lineno, line[:80]))
        gres = fields.get("Gres", "(null)")
        nodes[fields["NodeName"]] = {"state": state.split("+"), "reason": reason or None, "gpus": gres_gpus(gres)}
    return nodes


def gres_gpus(gres: str) -> int:
    """GPUs in a Gres= value: gpu:8, gpu:h100:8(S:0-1), gpu:a100:4,gpu:v100:2 -> 8, 8, 6; (null) -> 0."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def job_gpus(text: str) -> int:
    """GPUs a job holds, from `scontrol -d -o show job J`: JOB_GRES=gpu:4 (gpu:h100:4, comma-separated
    items), else gres/gpu in TRES=/AllocTRES= (only where AccountingStorageTRES tracks gres/gpu:
    `gres/gpu=16`, typed `gres/gpu:h100=16` counted once: the untyped total when present)."""
    m = re.search(r"(?:^| )JOB_GRES=(\S+)", text)
    held = gres_gpus(m.group(1)) if m else 0  # the same item syntax as a node's Gres= ("(null)": 0)
    if held:
        return held
    m = re.search(r"(?:^| )(?:Alloc)?TRES=(\S+)", text)
    if not m:
        return 0
    total, typed = None, 0
    for item in m.group(1).split(","):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            total = int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
    return total if total is not None else typed


def bad_state(state: Sequence[str]) -> bool:
    """True when a node in this state (list of base state and flags) must not be launched on."""
    return any(s.rstrip("*") in BAD_STATES for s in state) or any(s.endswith("*") for s in state)


_WIDENING_RE = re.compile(r"(?<![0-9])(0[0-9]*)-([0-9]+)(?![0-9])")


def hostnames(text: str) -> List[str]:
    """A Slurm host list (squeue's %N, SLURM_JOB_NODELIST) as node names, the way Slurm expands it.

    Slurm pads a range to its first bound's width and lets later numbers grow past it: nodes n001 ...
    n1000 are `n[001-1000]` (squeue -o %N, recorded on the 1,000-node simulator: Slurm 22.05's
    hostlist.c prints each number with `%0*d` of the range's width). ClusterShell refuses a range whose
    bounds differ in width ("padding length mismatch"), so such a range is cut where the width grows
    (001-999,1000) before it is expanded. Raises ValueError for what is no host list.
    """
    def split(match: "re.Match[str]") -> str:
        lo, hi = match.group(1), match.group(2)
        if len(lo) < 2 or len(hi) <= len(lo):
            return match.group(0)
        parts, start, width = [], int(lo), len(lo)
        while width < len(hi):
            top = 10 ** width - 1
            if start <= top:
                parts.append("%0*d-%d" % (width, start, top) if start < top else "%0*d" % (width, start))
            start, width = max(start, top + 1), width + 1
        parts.append("%d-%s" % (start, hi) if start < int(hi) else hi)
        return ",".join(parts)

    return expand(re.sub(r"\[[^\]]*\]", lambda m: _WIDENING_RE.sub(split, m.group(0)), text))


def parse_srun_stderr(text: str) -> Tuple[Dict[str, str], Dict[str, str]]:
    """srun's own error lines -> ({node: launch failure}, {node: task exit message})."""
    launch: Dict[str, str] = {}
    exits: Dict[str, str] = {}
    for line in text.splitlines():
        m = LAUNCH_FAIL_RE.search(line)
        if m:
            launch[m.group(1)] = m.group(2).strip()
            continue
        m = EXIT_RE.match(line.strip())
        if m:
            exits[m.group(1)] = m.group(3).strip()
    return launch, exits

def controller_failure(text: str) -> Optional[str]:
    """The first srun error line that blames Slurm's controller (not a node), shortened; else None."""
    m = CONTROLLER_FAIL_RE.search(text)
    if not m:
        return None
    return (m.group(1) + (": " + m.group(2).strip() if m.group(2) else ""))[:200]


# --- running Slurm commands ----------------------------------------------------------------------


#: How a Slurm client says it cannot read its configuration (Slurm 22.05 src/common/parse_config.c,
#: read_config.c): a missing file is retried for 60 s before the client gives up, so it is recognised
#: from the first line, not waited for.
CONF_MISSING_RE = re.compile(r"cannot stat file (\S+): (.+?)(?:, retrying.*)?$", re.M)
CONF_PARSE_RE = re.compile(r'Parse error in file (\S+) line (\d+): (.*)$', re.M)
CONF_FATAL = "Unable to process configuration file"


def config_error(said: str) -> Optional[SlurmError]:
    """The one-line error for a Slurm client that could not load its configuration, else None."""
    m = CONF_MISSING_RE.search(said)
    if m:
        named = os.environ.get("SLURM_CONF") == m.group(1)
        return SlurmError("Slurm's configuration %s cannot be read: %s" % (m.group(1), m.group(2).strip()),
                          "SLURM_CONF names it: point SLURM_CONF at the cluster's slurm.conf" if named else
                          "install the cluster's slurm.conf there or point SLURM_CONF at it (a configless client "
                          "needs the _slurmctld._tcp DNS SRV record)")
    m = CONF_PARSE_RE.search(said)
    if m:
        return SlurmError("Slurm's configuration %s line %s cannot be parsed: %s" % (m.group(1), m.group(2), m.group(3)[:120]),
                          "fix that line (see slurm.conf(5)), or point SLURM_CONF at the cluster's slurm.conf")
    if CONF_FATAL in said:
        last = [line for line in said.splitlines() if "error:" in line][-1:] or [CONF_FATAL]
        return SlurmError("Slurm's configuration cannot be loaded: %s" % last[0].split("error:", 1)[-1].strip()[:200],
                          "check SLURM_CONF and the slurm.conf it names (scontrol show config works when it loads)")
    return None


def run(argv: List[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a Slurm command (argv, no shell); a configuration it cannot load is a SlurmError at once."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError("%s not found" % argv[0], "install the Slurm client (slurm-client) or put it on PATH") from None
    out, err = bytearray(), bytearray()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    until = time.monotonic() + timeout
    try:
        while streams:
            left = until - time.monotonic()
            if left <= 0:
                raise SlurmError("%s did not answer within %g s" % (" ".join(argv[:3]), timeout),
                                 "check that slurmctld is up (scontrol ping)")
            for fd in select.select(list(streams), [], [], min(left, 0.5))[0]:
                data = os.read(fd, 65536)
                if data:
                    streams[fd] += data
                else:
                    del streams[fd]
            if CONF_MISSING_RE.search(err.decode("utf-8", "replace")):
                raise config_error(err.decode("utf-8", "replace"))  # type: ignore[misc]
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    said = err.decode("utf-8", "replace")
    if rc != 0:
        problem = config_error(said)
        if problem is not None:
            raise problem
    return subprocess.CompletedProcess(argv, rc, out.decode("utf-8", "replace"), said)


def node_info(names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Slurm's view of the named nodes (state, reason, GPUs), from one `scontrol -o show node`."""
    out = run([SCONTROL, "-o", "show", "node", fold(names)])
    if out.returncode != 0:
        raise SlurmError("scontrol show node %s failed: %s" % (fold(names), out.stderr.strip()[:300]),
                         "check the node names (sinfo -N)")
    try:
        info = parse_show_node(out.stdout)
    except ValueError as exc:
        raise SlurmError("cannot read scontrol's output: %s" % exc) from None
    missing = [n for n in names if n not in info]
    if missing:
        raise SlurmError("Slurm does not know %s" % fold(missing), "check the node names (sinfo -N)")
    return info


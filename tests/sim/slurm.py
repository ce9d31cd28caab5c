"""A real Slurm on the simulated cluster: slurmctld in the controller namespace, one slurmd per node.

Debian's packages (slurmctld, slurmd, slurm-client, munge), configured entirely under the cluster's
root directory, never /etc/slurm or /etc/munge:

    root/slurm/slurm.conf     read by every daemon and client through SLURM_CONF (see env())
    root/slurm/cgroup.conf    cgroup/v1 at /sys/fs/cgroup (unused: proctrack/linuxproc, task/none)
    root/slurm/munge/         private key, pid, seed, log (mode 0700)
    root/slurm/sock/          the controller's munged socket; slurm.conf's AuthInfo=socket= points every
                              party at it (on the nodes, the node's own munged: below)
    root/nNNN/munge/          a node's munged: pid, seed, log; sock/ its socket
    root/slurm/spool/NODE/    SlurmdSpoolDir (%n), state/ is StateSaveLocation, log/ the daemon logs
    root/slurm/task_prolog    TaskProlog: puts the node's bin/ first on PATH and sets PREFLIGHT_SYSFS_ROOT,
                              like the SetEnv line of the node's sshd (a site's TaskProlog is the real
                              mechanism for per-node task environment)

Each daemon runs inside its node's network namespace (`ip netns exec`, which also mounts that
namespace's own sysfs) and its own UTS namespace whose hostname is the node name (ctl for the
controller). Each slurmd also has its own mount namespace in which the node's directory shm/ is
mounted on /dev/shm (root/nNNN/shm, mode 1777): a real node's /dev/shm is its own tmpfs, so what
sbcast writes there, and what a test plants there, is per node (see SimSlurm.shm). NodeAddr is the node's management address (198.18.x.y), so Slurm's RPCs travel on the
management bridge; the data network (MTU 9000) and docker0 are the SSH simulator's. The ports are the
Slurm defaults (6817/6818): every namespace is private, so nothing else can hold them.

munged runs per node, as on a real cluster: the controller's in the controller namespace (for
slurmctld, srun, scontrol), each node's in its node namespace with its own socket (root/nNNN/munge/),
bind-mounted over root/slurm/sock/ in that node's slurmd mount namespace, so slurm.conf's one
AuthInfo=socket= path reaches the node's own munged. All share one key. Past MAX_NODE_MUNGED nodes,
consecutive nodes share one (the first node's of the group): at 1,000 nodes a munged each is 4 GB of this
machine's memory. With a single munged for every node, 1,000 slurmstepds asking it at once overflow its
socket's backlog and srun fails with "Munge encode failed ... Resource temporarily unavailable" (seen at
1,000 nodes): a simulator artifact, not Slurm's.
All daemons are children of the SimCluster and live in its namespaces, so its stop() (atexit,
signals, cleanup_stale()) kills them and removes everything, also when a test fails.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from tests.paths import PREFLIGHT
from .base import SimError, tail, write_file
from .cluster import SimNode, as_node

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
#: node munged daemons at most (4 MB each); past this many nodes, consecutive nodes share one
MAX_NODE_MUNGED = 64
CTLD_PORT = 6817
SLURMD_PORT = 6818
PARTITION = "sim"
CTL_HOSTNAME = "ctl"


def available() -> Optional[str]:
    """None when Slurm and munge are installed here, else why not."""
    missing = [p for p in (SLURMCTLD, SLURMD, MUNGED, "/usr/bin/srun", "/usr/bin/salloc", "/usr/bin/scontrol")
               if not os.access(p, os.X_OK)]
    if missing:
        return "Slurm/munge not installed (missing %s): apt-get install slurmctld slurmd slurm-client munge" % ", ".join(missing)
    return None


def _in_uts(hostname: str, argv: Sequence[str]) -> List[str]:
    """argv run in a new UTS namespace whose hostname is `hostname` (no shell interpolation of either)."""
    return ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]


class SimSlurm:
    """The Slurm daemons of one SimCluster. Built by SimCluster(slurm=True); see the module docstring."""

    def __init__(self, cluster, message_timeout: int = 5, gpus: int = 0, tree_width: Optional[int] = None,
                 proctrack: str = "linuxproc", extra_conf: str = "", kill_wait: int = 2,
                 cred_expire: Optional[int] = None) -> None:
        self.cluster = cluster
        # KillWait: SIGTERM to SIGKILL when a job ends (Slurm's default is 30 s); cred_expire (AuthInfo): a step
        # credential's lifetime, also how long a requeued batch job waits before it may start again (120 s)
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.extra_conf = extra_conf  # slurm.conf lines after the default partition (e.g. a preemptible one)
        self.gpus = gpus  # Gres=gpu:N per node, the devices being char-device stand-ins (see _gres)
        self.dir = os.path.join(cluster.root, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_dir = os.path.join(self.dir, "munge")
        self.socket = os.path.join(self.dir, "sock", "munge.sock")
        self.log_dir = os.path.join(self.dir, "log")
        self.message_timeout = message_timeout
        self.tree_width = tree_width  # slurm.conf TreeWidth (None: Slurm's default, 50 in 22.05); benchmarks at scale
        # ProctrackType: linuxproc finds a step's processes by walking /proc, which here holds every node's
        # processes (one pid namespace): 1,000 slurmstepds each reading ~3,000 entries' stat (the mm lock of
        # each) at step ends put hundreds of tasks in D state (do_task_stat, dup_mmap). pgid (the step's
        # process groups) walks nothing; benchmarks past 256 nodes use it, the suite keeps linuxproc.
        self.proctrack = proctrack
        self.munged: Optional[subprocess.Popen] = None
        self.node_munged: Dict[str, subprocess.Popen] = {}
        self.ctld: Optional[subprocess.Popen] = None
        self.slurmd: Dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ files

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """An environment for Slurm clients (srun, salloc, scontrol, sinfo) talking to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]  # an outer allocation's variables must not leak into this cluster's clients
        return env

    def preflight(self, argv: Sequence[str], *, prefix: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                  timeout: float = 180, popen: bool = False, **kw):
        """`[PREFIX] preflight ARGV --no-progress` on the controller, a client of this cluster (env() unless
        env is given): the CompletedProcess, or with popen=True the running Popen (killed at stop())."""
        argv = [*prefix, PREFLIGHT, *argv, "--no-progress"]
        if popen:
            return self.cluster.ctl_popen(argv, env=env or self.env(), **kw)
        return self.cluster.ctl(argv, env=env or self.env(), timeout=timeout, **kw)

    def _write_files(self) -> None:
        for d in ("sock", "state", "log", "spool"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        os.chmod(os.path.join(self.dir, "sock"), 0o755)  # munged wants its socket directory searchable by all
        os.chmod(self.dir, 0o755)
        os.makedirs(self.munge_dir, mode=0o700, exist_ok=True)
        write_file(os.path.join(self.munge_dir, "munge.key"), os.urandom(1024), 0o400)
        for node in self.cluster.nodes:
            os.makedirs(os.path.join(self.dir, "spool", node.name), exist_ok=True)
        prolog = os.path.join(self.dir, "task_prolog")
        # TaskProlog's stdout lines `export NAME=value` set the task's environment (slurm.conf(5)).
        write_file(prolog, "#!/bin/sh\n"
                       'echo "export PATH=%s/$SLURMD_NODENAME/bin:%s"\n'
                       'echo "export PREFLIGHT_SYSFS_ROOT=%s/$SLURMD_NODENAME/sys"\n'
                       % (self.cluster.root, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          self.cluster.root), 0o755)
        write_file(os.path.join(self.dir, "cgroup.conf"), "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
        gres = " Gres=gpu:%d" % self.gpus if self.gpus else ""
        nodes = "".join("NodeName=%s NodeAddr=%s CPUs=1 RealMemory=64%s State=UNKNOWN\n" % (n.name, n.mgmt_ip, gres)
                        for n in self.cluster.nodes)
        if self.gpus:
            self._gres()
        write_file(self.conf, ("GresTypes=gpu\n" if self.gpus else "") + (
            "ClusterName=pfsim\n"
            "SlurmctldHost=%(ctl)s(%(ctl_ip)s)\n"
            "SlurmUser=root\n"
            "SlurmdUser=root\n"
            "SlurmctldPort=%(ctld_port)d\n"
            "SlurmdPort=%(slurmd_port)d\n"
            "AuthType=auth/munge\n"
            "CredType=cred/munge\n"
            "AuthInfo=socket=%(sock)s%(cred_expire)s\n"
            "StateSaveLocation=%(dir)s/state\n"
            "SlurmdSpoolDir=%(dir)s/spool/%%n\n"
            "SlurmctldPidFile=%(dir)s/slurmctld.pid\n"
            "SlurmdPidFile=%(dir)s/spool/%%n/slurmd.pid\n"
            "SlurmctldLogFile=%(dir)s/log/slurmctld.log\n"
            "SlurmdLogFile=%(dir)s/log/slurmd-%%n.log\n"
            "ProctrackType=proctrack/%(proctrack)s\n"
            "TaskPlugin=task/none\n"
            "TaskProlog=%(dir)s/task_prolog\n"
            "SelectType=select/cons_tres\n"
            "SchedulerType=sched/builtin\n"
            "ReturnToService=2\n"
            "MpiDefault=none\n"
            "MessageTimeout=%(msg_timeout)d\n"
            "%(tree_width)s"
            "SlurmdTimeout=120\n"
            "KillWait=%(kill_wait)d\n"
            "SlurmctldDebug=info\n"
            "SlurmdDebug=info\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "%(nodes)s"
            "PartitionName=%(part)s Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        ) % {"ctl": CTL_HOSTNAME, "ctl_ip": self.cluster.ctl_mgmt_ip, "ctld_port": CTLD_PORT,
             "slurmd_port": SLURMD_PORT, "sock": self.socket, "dir": self.dir, "nodes": nodes,
             "part": PARTITION, "msg_timeout": self.message_timeout, "proctrack": self.proctrack,
             "tree_width": "TreeWidth=%d\n" % self.tree_width if self.tree_width else "", "kill_wait": self.kill_wait,
             "cred_expire": ",cred_expire=%d" % self.cred_expire if self.cred_expire else ""} + self.extra_conf)

    def _gres(self) -> None:
        """gres.conf (read from SLURM_CONF's folder) giving every node `gpus` GPU devices: character
        devices made like /dev/null (1:3) under the Slurm dir. With task/none nothing is constrained;
        Slurm allocates them and sets CUDA_VISIBLE_DEVICES per task from their index, as for real GPUs."""
        lines = ["AutoDetect=off\n"]
        for node in self.cluster.nodes:
            dev = os.path.join(self.dir, "dev", node.name)
            os.makedirs(dev, exist_ok=True)
            for i in range(self.gpus):
                path = os.path.join(dev, "nvidia%d" % i)
                if not os.path.exists(path):
                    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            lines.append("NodeName=%s Name=gpu File=%s/nvidia[0-%d]\n" % (node.name, dev, self.gpus - 1))
        write_file(os.path.join(os.path.dirname(self.conf), "gres.conf"), "".join(lines))

    # ------------------------------------------------------------------ daemons

    def start(self, timeout: float = 60.0) -> "SimSlurm":
        why = available()
        if why:
            raise SimError(why)
        self._write_files()
        c = self.cluster
        env = self.env()
        self.munged = self._spawn_munged(c.ctl_ns, self.munge_dir, self.socket, "munged.out")
        for node in c.nodes:
            if self._munge_host(node) is not node:
                continue  # its group's first node runs the munged it uses
            os.makedirs(os.path.join(self.node_munge_dir(node), "sock"), mode=0o755, exist_ok=True)
            os.chmod(self.node_munge_dir(node), 0o755)  # munged: every folder above its socket searchable by all
            self.node_munged[node.name] = self._spawn_munged(
                node.ns, self.node_munge_dir(node), os.path.join(self.node_munge_dir(node), "sock", "munge.sock"),
                "munged-%s.out" % node.name)
        sockets = [self.socket] + [os.path.join(self.node_munge_dir(n), "sock", "munge.sock") for n in c.nodes]
        self._wait(lambda: all(os.path.exists(p) for p in sockets), timeout, "munged sockets",
                   lambda: self._tail(os.path.join(self.munge_dir, "munged.log")))
        self.ctld = c._spawn(["ip", "netns", "exec", c.ctl_ns] + _in_uts(CTL_HOSTNAME, [SLURMCTLD, "-D", "-i"]),
                             env=env, stdin=subprocess.DEVNULL, stdout=self._log("slurmctld.out"),
                             stderr=subprocess.STDOUT)
        for node in c.nodes:
            self._spawn_slurmd(node)
        self.wait_idle([n.name for n in c.nodes], timeout)
        return self

    def _spawn_munged(self, ns: str, folder: str, socket: str, out: str) -> subprocess.Popen:
        err = self._log(out)
        try:
            return self.cluster._spawn(["ip", "netns", "exec", ns, MUNGED, "-F", "--socket=" + socket,
                                        "--key-file=" + os.path.join(self.munge_dir, "munge.key"),
                                        "--pid-file=" + os.path.join(folder, "munged.pid"),
                                        "--seed-file=" + os.path.join(folder, "munged.seed"),
                                        "--log-file=" + os.path.join(folder, "munged.log")],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        finally:
            err.close()

    def node_munge_dir(self, node) -> str:
        """The folder of the munged a node uses: its pid, seed and log, and sock/ (bind-mounted over
        root/slurm/sock/ for the node's slurmd and everything it starts). Its own, up to MAX_NODE_MUNGED
        nodes; past that, its group's first node's."""
        return os.path.join(self._munge_host(node).dir, "munge")

    def _munge_host(self, node) -> SimNode:
        """The node whose munged `node` uses: itself, or past MAX_NODE_MUNGED nodes its group's first."""
        nodes = self.cluster.nodes
        per = -(-len(nodes) // MAX_NODE_MUNGED)  # nodes a munged serves
        index = nodes.index(self.cluster.node(node))
        return nodes[index - index % per]

    def shm(self, node) -> str:
        """The directory mounted on the node's /dev/shm for its slurmd and every task it starts."""
        return self.cluster.node(node).shm_dir

    def _log(self, name: str):
        return open(os.path.join(self.log_dir, name), "ab")

    def _spawn_slurmd(self, node: SimNode) -> None:
        out = self._log("slurmd-%s.out" % node.name)
        try:
            self.slurmd[node.name] = self.cluster._spawn(
                ["ip", "netns", "exec", node.ns] + as_node(self.shm(node), [SLURMD, "-D", "-N", node.name], hostname=node.name,
                                                        binds=[(os.path.join(self.node_munge_dir(node), "sock"),
                                                                os.path.dirname(self.socket))]),
                env=self.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()

    def _wait(self, ok, timeout: float, what: str, detail=lambda: "") -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            for proc, name in [(self.munged, "munged"), (self.ctld, "slurmctld")]:
                if proc is not None and proc.poll() is not None:
                    raise SimError("%s exited (rc %s): %s" % (name, proc.returncode, self.logs(name)))
            if time.monotonic() > deadline:
                raise SimError("no %s after %.0f s: %s" % (what, timeout, detail()))
            time.sleep(0.1)

    def run(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """A Slurm client command (scontrol, sinfo, ...) from the controller namespace."""
        kw.setdefault("timeout", 30)
        return self.cluster.ctl(list(argv), env=self.env(), **kw)

    def states(self) -> Dict[str, str]:
        """{node: Slurm state as sinfo's %T writes it (idle, down*, drained, allocated ...)}."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        if out.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())

    def wait_idle(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until every named node is idle (registered with slurmctld and free)."""
        want = set(names)
        self._wait(lambda: want <= {n for n, s in self.states().items() if s == "idle"}, timeout,
                   "idle nodes", lambda: "states %s; slurmctld log: %s" % (self.states(), self.logs("slurmctld")))

    def settle(self, timeout: float = 90.0) -> None:
        """Put the shared cluster back as a test found it: every job cancelled, every reservation deleted,
        every drained or down node resumed, then wait until all nodes are idle."""
        for job in self.jobs():
            self.run(["scancel", job.split()[0]])
        for resv in self.reservations():
            self.run(["scontrol", "delete", "reservation=%s" % resv])
        for node in self.reasons():
            self.run(["scontrol", "update", "nodename=%s" % node, "state=resume"])
        self.wait_idle([n.name for n in self.cluster.nodes], timeout)

    def logs(self, daemon: str) -> str:
        """The tail of a daemon's log: 'slurmctld', 'munged' or a node name (its slurmd)."""
        if daemon == "munged":
            return self._tail(os.path.join(self.munge_dir, "munged.log"))
        if daemon == "slurmctld":
            return self._tail(os.path.join(self.log_dir, "slurmctld.log")) or self._tail(os.path.join(self.log_dir, "slurmctld.out"))
        return self._tail(os.path.join(self.log_dir, "slurmd-%s.log" % daemon)) or self._tail(os.path.join(self.log_dir, "slurmd-%s.out" % daemon))

    @staticmethod
    def _tail(path: str, n: int = 1500) -> str:
        return tail(path, n)

    # ------------------------------------------------------------------ faults

    def stop_slurmd(self, node) -> None:
        """Kill the node's slurmd (slurmctld does not notice for SlurmdTimeout); undone by heal()."""
        node = self.cluster.node(node)
        proc = self.slurmd.get(node.name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.cluster._push_undo(node, lambda: self.start_slurmd(node))

    def freeze_slurmd(self, node) -> None:
        """Stop the node's slurmd with SIGSTOP: its kernel still accepts connections, nothing answers them (srun:
        'Task launch ... failed on node N: Socket timed out on send/recv operation'); undone by heal()."""
        node = self.cluster.node(node)
        pid = self.slurmd[node.name].pid
        os.kill(pid, signal.SIGSTOP)
        self.cluster._push_undo(node, lambda: os.kill(pid, signal.SIGCONT))

    def break_step_io(self, node) -> int:
        """Reset the TCP connections between the node's slurmstepds and srun (their I/O streams), as a flapping
        link or a middlebox's reset would: the kernel destroys the sockets (`ss -K`, CONFIG_INET_DIAG_DESTROY).
        Slurm 22.05's srun then aborts the whole step ("step_launch_notify_io_failure: aborting, io error with
        slurmstepd on node K"). Returns how many connections were reset (0: none open, or ss -K unsupported)."""
        node = self.cluster.node(node)
        listing = self.cluster.node_exec(node, ["ss", "-Htnp", "state", "established"]).stdout
        ports = [line.split()[2].rsplit(":", 1)[1] for line in listing.splitlines()
                 if '"slurmstepd"' in line and len(line.split()) > 3]
        for port in ports:
            self.cluster.node_exec(node, ["ss", "-K", "-tn", "state", "established", "sport", "=", ":" + port])
        after = self.cluster.node_exec(node, ["ss", "-Htn", "state", "established"]).stdout
        return sum(1 for port in ports if not any(line.split()[2].endswith(":" + port) for line in after.splitlines()
                                                  if len(line.split()) > 2))

    def start_slurmd(self, node, timeout: float = 30.0) -> None:
        """(Re)start the node's slurmd and wait until it wrote its pid file (it then serves RPCs)."""
        node = self.cluster.node(node)
        proc = self.slurmd.get(node.name)
        if proc is not None and proc.poll() is None:
            return
        pid_file = os.path.join(self.dir, "spool", node.name, "slurmd.pid")
        if os.path.exists(pid_file):
            os.unlink(pid_file)
        self._spawn_slurmd(node)
        self._wait(lambda: self._alive(node) and os.path.exists(pid_file), timeout, "slurmd on %s" % node.name,
                   lambda: self.logs(node.name))

    def _alive(self, node: SimNode) -> bool:
        proc = self.slurmd[node.name]
        if proc.poll() is not None:
            raise SimError("slurmd on %s exited (rc %s): %s" % (node.name, proc.returncode, self.logs(node.name)))
        return True

    def drain(self, node, reason: str) -> None:
        """Drain a node by hand, as an admin would."""
        out = self.run(["scontrol", "update", "nodename=%s" % self.cluster.node(node).name, "state=drain",
                        "reason=%s" % reason])
        if out.returncode != 0:
            raise SimError("scontrol drain failed: %s" % out.stderr.strip())

    def reasons(self) -> Dict[str, str]:
        """{node: reason} as `sinfo -R` shows them (drained/down nodes only)."""
        out = self.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%E"])
        found = {}
        for line in out.stdout.splitlines():
            if "|" in line:
                name, reason = line.split("|", 1)
                found[name.strip()] = reason.strip()
        return found

    def set_prolog(self, path: Optional[str]) -> None:
        """Prolog=path in slurm.conf (None: no Prolog), then `scontrol reconfigure`: slurmd runs it as
        root before a job's first step on each node (slurm.conf(5)), with the job's SLURM_* variables
        and no PATH of the daemon's."""
        with open(self.conf) as fh:
            lines = [line for line in fh.read().splitlines() if not line.startswith("Prolog=")]
        if path:
            lines.insert(0, "Prolog=%s" % path)
        write_file(self.conf, "\n".join(lines) + "\n")
        out = self.run(["scontrol", "reconfigure"])
        if out.returncode != 0:
            raise SimError("scontrol reconfigure failed: %s" % out.stderr.strip())

    def reservations(self) -> List[str]:
        """Names of the reservations slurmctld holds."""
        out = self.run(["scontrol", "-o", "show", "reservation"])
        return re.findall(r"ReservationName=(\S+)", out.stdout)

    def jobs(self) -> List[str]:
        """'JOBID NAME STATE REASON' of every job slurmctld knows that has not ended."""
        out = self.run(["squeue", "-h", "-o", "%i %j %T %r"])
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]

    def leftover_steps(self) -> List[str]:
        """Job steps still known to slurmctld (squeue -s), e.g. '5.0 preflight'."""
        out = self.run(["squeue", "-h", "-s", "-o", "%i %j"])
        return [line.strip() for line in out.stdout.splitlines() if line.strip() and not re.search(r"\.(extern|batch)\b", line)]


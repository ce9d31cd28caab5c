"""A simulated cluster: each node a Linux network namespace running a real OpenSSH sshd.

Topology (all addresses in 198.18.0.0/15, all inside namespaces this module creates; nothing is
added to the root namespace):

    {prefix}-sw    switch: bridges br-mgmt (MTU 1500) and br-data (MTU 9000); ports m<i>/d<i>, mctl/dctl
    {prefix}-ctl   controller: eth0 198.18.0.1/16 on br-mgmt, eth1 198.19.0.1/16 (MTU 9000) on br-data
    {prefix}-nNNN  node i: eth0 198.18.(i//250).(i%250+2)/16, eth1 198.19.(i//250).(i%250+2)/16 MTU 9000,
                   optional docker0 bridge 198.19.255.1/24 (the same on every node, like Docker's default),
                   operationally UP through one port vethdocker0 (a veth whose peer c<i> idles in the switch
                   namespace, standing in for a container's end)

Each node has a directory root/nNNN/ with sshd_config, its ed25519 host key, bin/ (first on the PATH
of SSH sessions), sys/ (the sysfs root the probe sees through PREFLIGHT_SYSFS_ROOT) and sshd.log.

    with SimCluster(4, docker0=True) as c:
        hosts = c.inventory()
        c.ctl(["preflight", "check", hosts])
        c.mtu_blackhole("n003")

Everything is removed by stop() (also via atexit, SIGTERM/SIGHUP, and cleanup_stale() after a crash).
The fault injectors (mtu_blackhole, data_link_down, freeze_sshd, hold_port, ...) live in tests/sim/faults.py,
mixed into SimCluster; teardown and cleanup_stale in tests/sim/teardown.py; shared primitives in tests/sim/base.py.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .base import BASE_DIR, DATA_MTU, MGMT_MTU, PREFIX_BASE, SimError, ed25519_keypair, ip_batch, tail, write_file
from .faults import FaultInjection
from .netns import cmdline, in_netns, list_netns, netns_id, pids_by_netns
from .teardown import cleanup_stale, proc_starttime, teardown

__all__ = ["DOCKER0_CIDR", "SimCluster", "SimError", "SimNode", "cleanup_stale"]  # cleanup_stale: tests/sim/teardown.py

SSHD = "/usr/sbin/sshd"
MGMT_NET = "198.18"
DATA_NET = "198.19"
CTL_MGMT_IP = "198.18.0.1"
CTL_DATA_IP = "198.19.0.1"
DOCKER0_CIDR = "198.19.255.1/24"
MAX_NODES = 250 * 250  # third octet stays below 250, clear of docker0's 198.19.255.0/24
SESSION_PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

NodeRef = Union["SimNode", str, int]


def _sshd_version() -> Tuple[int, int]:
    out = subprocess.run([SSHD, "-V"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True).stdout
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _hex_addr(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (little-endian hex)."""
    return "".join("%02X" % int(o) for o in reversed(ip.split(".")))


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def _child_setup() -> None:
    """In the forked child: die with the parent (crash safety), and leave the terminal's process group."""
    os.setsid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def as_node(shm: str, argv: Sequence[str], hostname: Optional[str] = None,
            binds: Sequence[Tuple[str, str]] = ()) -> List[str]:
    """argv run as a node's daemon: in its own mount namespace in which `shm` (the node's directory, mode
    1777) is mounted on /dev/shm, each (source, target) of `binds` is bind-mounted too, and, given a
    hostname, in its own UTS namespace with that hostname (no shell interpolation of any of them). Real
    nodes each have their own node-local tmpfs on /dev/shm; the simulated ones would otherwise share the
    host's, so a file one node's daemon or task writes there (sbcast, the probe bundle kept over SSH, a
    test's planted file) would appear on all of them. Everything the daemon starts inherits the namespace."""
    script = ['hostname "$0"'] if hostname else []
    script.append('mount --bind "$1" /dev/shm')
    paths = [shm]
    for source, target in binds:
        script.append('mount --bind "$%d" "$%d"' % (len(paths) + 1, len(paths) + 2))
        paths += [source, target]
    script.append("shift %d" % len(paths))
    script.append('exec "$@"')
    return ["unshare", *(["--uts"] if hostname else []), "--mount", "--propagation", "private", "--", "sh", "-c",
            " && ".join(script), hostname or "node", *paths, *argv]


class SimNode:
    """One simulated node: its namespace, addresses, directory and the hooks for fake hardware."""

    def __init__(self, cluster: "SimCluster", index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = "n%03d" % index
        self.ns = "%s-%s" % (cluster.prefix, self.name)
        host = "%d.%d" % (index // 250, index % 250 + 2)
        self.mgmt_ip = "%s.%s" % (MGMT_NET, host)
        self.data_ip = "%s.%s" % (DATA_NET, host)
        self.mgmt_veth = "m%d" % index  # switch side, in {prefix}-sw
        self.data_veth = "d%d" % index
        self.container_veth = "c%d" % index  # peer of the node's vethdocker0 (docker0's port)
        self.dir = os.path.join(cluster.root, self.name)
        self.bin_dir = os.path.join(self.dir, "bin")
        self.sys_dir = os.path.join(self.dir, "sys")
        self.root_dir = os.path.join(self.dir, "root")  # the node's "/" for configuration files (PREFLIGHT_HOST_ROOT)
        self.host_key = os.path.join(self.dir, "ssh_host_ed25519_key")
        self.sshd_config = os.path.join(self.dir, "sshd_config")
        self.sshd_log = os.path.join(self.dir, "sshd.log")
        # the node's shell start-up file: bash sources $BASH_ENV before every command sshd runs, as it
        # sources ~/.bashrc on a real node; empty unless a fault writes into it
        self.shell_rc = os.path.join(self.dir, "shellrc")
        # mounted on /dev/shm for the node's daemons (as_node): a real node's /dev/shm is its own tmpfs
        self.shm_dir = os.path.join(self.dir, "shm")
        self.docker0 = False
        self.sshd: Optional[subprocess.Popen] = None
        self.host_pubkey = b""

    def __repr__(self) -> str:
        return "SimNode(%s %s)" % (self.name, self.mgmt_ip)

    def install_executable(self, name: str, text: str) -> str:
        """Write an executable script into bin/ (first on the PATH of SSH sessions); returns its path."""
        path = os.path.join(self.bin_dir, name)
        if os.path.lexists(path):
            os.unlink(path)
        write_file(path, text, 0o755)
        return path

    def write_host_file(self, path: str, text: Union[str, bytes]) -> str:
        """Write a file the node's jobs read at absolute `path` (e.g. /etc/nccl.conf) under its root_dir."""
        real = os.path.join(self.root_dir, path.lstrip("/"))
        os.makedirs(os.path.dirname(real), exist_ok=True)
        write_file(real, text)
        return real

    def write_sys(self, relpath: str, text: Union[str, bytes]) -> str:
        """Write a file under the node's sysfs root (sys/), creating directories; returns its path."""
        path = os.path.join(self.sys_dir, relpath.lstrip("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_file(path, text)
        return path


_live: List["SimCluster"] = []
_signals_installed = False


def _stop_all() -> None:
    for cluster in list(_live):
        cluster.stop()


def _install_exit_hooks() -> None:
    """atexit, and SIGTERM/SIGHUP turned into KeyboardInterrupt so finally-blocks and teardowns run."""
    global _signals_installed
    if _signals_installed:
        return
    _signals_installed = True
    atexit.register(_stop_all)
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, interrupt)


class SimCluster(FaultInjection):
    """N simulated nodes, a switch and a controller namespace; start() builds it, stop() removes it all.

    docker0: True for every node, or an iterable of node names/indices that get one.
    root: directory for keys/configs/node dirs (default BASE_DIR/prefix, removed at stop unless keep_root).
    """

    def __init__(self, n: int, *, prefix: Optional[str] = None, docker0: Union[bool, Iterable] = False,
                 root: Optional[str] = None, keep_root: bool = False, start_timeout: float = 60.0,
                 slurm: bool = False, slurm_gpus: int = 0, sshd: bool = True, link_local: bool = True,
                 slurm_conf: str = "", slurm_options: Optional[Dict[str, Any]] = None) -> None:
        if not 1 <= n < MAX_NODES:
            raise ValueError("n must be between 1 and %d" % (MAX_NODES - 1))
        self.want_sshd = sshd
        # link_local=False: the nodes' eth0/eth1 get no IPv6 link-local address (addrgenmode none), so they send
        # none of IPv6's start-up multicast (DAD, router solicitation, MLD reports). One Linux bridge copies each
        # such frame to every port in software: at 1,000 nodes that is ~100,000 frames a second dropped by the
        # kernel's input backlog (/proc/net/softnet_stat), and real pings with them. A real switch does not drop
        # like that; the benchmarks past 256 nodes turn it off (benchmarks/README.md, the knobs table).
        self.link_local = link_local
        self.prefix = prefix or "%s%s" % (PREFIX_BASE, secrets.token_hex(3))
        if not re.match(r"^[A-Za-z0-9_]{1,20}$", self.prefix):
            raise ValueError("prefix must be 1-20 characters of [A-Za-z0-9_]")
        self.root = os.path.abspath(root or os.path.join(BASE_DIR, self.prefix))
        self.keep_root = keep_root
        self.start_timeout = start_timeout
        self.switch_ns = "%s-sw" % self.prefix
        self.ctl_ns = "%s-ctl" % self.prefix
        self.ctl_mgmt_ip = CTL_MGMT_IP
        self.ctl_data_ip = CTL_DATA_IP
        self.identity_file = os.path.join(self.root, "id_ed25519")
        self.known_hosts = os.path.join(self.root, "known_hosts")
        self.authorized_keys = os.path.join(self.root, "authorized_keys")
        self._owner_file = os.path.join(BASE_DIR, "%s.owner.json" % self.prefix)
        self.nodes: List[SimNode] = [SimNode(self, i) for i in range(1, n + 1)]
        self._by_name = {node.name: node for node in self.nodes}
        if docker0 is True:
            for node in self.nodes:
                node.docker0 = True
        elif docker0:
            for ref in docker0:
                self.node(ref).docker0 = True
        self._popens: List[subprocess.Popen] = []
        self._undo: Dict[str, List[Callable[[], None]]] = {}
        self._held: Dict[int, subprocess.Popen] = {}
        self._created_ns: List[str] = []
        self.started = False
        self.stopped = False
        self.timings: Dict[str, float] = {}
        # slurm=True: every node also runs slurmd (tests/sim/slurm.py) and, like slurmd, its sshd gets a
        # UTS namespace whose hostname is the node name, so both transports see the same node.
        self.want_slurm = slurm
        self.slurm_gpus = slurm_gpus  # Gres=gpu:N on every Slurm node (tests/sim/slurm.py)
        self.slurm_conf = slurm_conf  # lines added to slurm.conf (partitions, preemption: tests/sim/slurm.py)
        self.slurm_options = dict(slurm_options or {})  # SimSlurm's keywords (kill_wait, cred_expire)
        self.slurm = None

    # ---------------------------------------------------------------- lookup

    def node(self, ref: NodeRef) -> SimNode:
        """A node by SimNode, name ('n003') or 1-based index (3)."""
        if isinstance(ref, SimNode):
            return ref
        if isinstance(ref, int):
            if not 1 <= ref <= len(self.nodes):
                raise KeyError("no node %d in this cluster (1..%d)" % (ref, len(self.nodes)))
            return self.nodes[ref - 1]
        try:
            return self._by_name[ref]
        except KeyError:
            raise KeyError("no node %r in this cluster" % (ref,)) from None

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __enter__(self) -> "SimCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- build

    def start(self) -> "SimCluster":
        """Create namespaces, links and addresses, start every sshd, and wait until all listen."""
        if self.started:
            return self
        _install_exit_hooks()
        _live.append(self)
        self.started = True
        t0 = time.monotonic()
        try:
            self._register_owner()
            self._write_files()
            t1 = time.monotonic()
            self._build_network()
            t2 = time.monotonic()
            if self.want_sshd:  # sshd=False: a Slurm-only benchmark's nodes (1,000 sshd are ~2 GB)
                for node in self.nodes:
                    self._spawn_sshd(node)
                self._wait_listening(self.nodes)
                self._wait_links_up(self.nodes)  # read through sshd's mount namespace (Slurm waits its own way)
            t3 = time.monotonic()
            if self.want_slurm:
                from .slurm import SimSlurm

                self.slurm = SimSlurm(self, gpus=self.slurm_gpus, extra_conf=self.slurm_conf,
                                      **self.slurm_options).start()
            t4 = time.monotonic()
        except BaseException:
            self.stop()
            raise
        self.timings.update(files=t1 - t0, network=t2 - t1, sshd=t3 - t2, slurm=t4 - t3, start=t4 - t0)
        return self

    def _register_owner(self) -> None:
        os.makedirs(BASE_DIR, exist_ok=True)
        # written whole under another name, then renamed: another test process's cleanup_stale() (pytest-xdist
        # workers run side by side) must never read a half-written owner record and take a live cluster for stale
        partial = self._owner_file + ".%d.tmp" % os.getpid()
        write_file(partial, json.dumps({"pid": os.getpid(), "start": proc_starttime(os.getpid()), "root": self.root}))
        os.rename(partial, self._owner_file)

    def _write_files(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        os.makedirs(self.root, exist_ok=True)
        private, public = ed25519_keypair("preflight-sim-client")
        write_file(self.identity_file, private, 0o600)
        write_file(self.identity_file + ".pub", public + b"\n")
        write_file(self.authorized_keys, public + b"\n", 0o600)
        extra = "PerSourcePenalties no\n" if _sshd_version() >= (9, 8) else ""
        known = []
        for node in self.nodes:
            for d in (node.bin_dir, os.path.join(node.sys_dir, "class"), os.path.join(node.sys_dir, "bus/pci/devices"),
                      os.path.join(node.root_dir, "etc"), node.shm_dir):
                os.makedirs(d, exist_ok=True)
            os.chmod(node.shm_dir, 0o1777)  # world-writable and sticky, like a real /dev/shm
            net = os.path.join(node.sys_dir, "class", "net")
            if not os.path.lexists(net):
                os.symlink("/sys/class/net", net)  # inside `ip netns exec`, /sys is the namespace's sysfs
            self._install_python(node)
            private, public = ed25519_keypair("root@" + node.name)
            write_file(node.host_key, private, 0o600)
            node.host_pubkey = public
            known.append(b"%s %s\n" % (node.mgmt_ip.encode(), b" ".join(public.split()[:2])))
            write_file(node.sshd_config, self._sshd_config_text(node, extra))
            write_file(node.shell_rc, "")
        write_file(self.known_hosts, b"".join(known))

    @staticmethod
    def _install_python(node: SimNode) -> None:
        path = os.path.join(node.bin_dir, "python3")
        if os.path.lexists(path):
            os.unlink(path)
        if sys.prefix == sys.base_prefix:
            os.symlink(sys.executable, path)
        else:  # a venv is found next to the path python was started by, so keep that path
            write_file(path, '#!/bin/sh\nexec %s "$@"\n' % sys.executable, 0o755)

    def _sshd_config_text(self, node: SimNode, extra: str) -> str:
        return (
            "Port 22\n"
            "ListenAddress %(ip)s\n"
            "HostKey %(key)s\n"
            "AuthorizedKeysFile %(auth)s\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PidFile none\n"
            "MaxStartups 1000:30:2000\n"
            "MaxSessions 100\n"
            "LoginGraceTime 30\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "X11Forwarding no\n"
            "AllowTcpForwarding yes\n"
            "Subsystem sftp internal-sftp\n"
            "LogLevel INFO\n"
            # SHLVL=1: bash started by sshd sources ~/.bashrc only at shell level 1; the host's root
            # .bashrc (shared by every node) would otherwise rewrite PATH (pyenv shims) and cost time.
            # PREFLIGHT_HOST_ROOT: the node's own "/" for the files jobs read (/etc/nccl.conf, ~/.nccl.conf).
            "SetEnv PATH=%(bin)s:%(tail)s PREFLIGHT_SYSFS_ROOT=%(sys)s PREFLIGHT_HOST_ROOT=%(root)s SHLVL=1 BASH_ENV=%(rc)s\n"
            "%(extra)s"
        ) % {"ip": node.mgmt_ip, "key": node.host_key, "auth": self.authorized_keys, "bin": node.bin_dir,
             "tail": SESSION_PATH_TAIL, "sys": node.sys_dir, "root": node.root_dir, "extra": extra,
             "rc": node.shell_rc}

    def _build_network(self) -> None:
        names = [self.switch_ns, self.ctl_ns] + [node.ns for node in self.nodes]
        existing = set(list_netns())
        clash = [n for n in names if n in existing]
        if clash:
            raise SimError("namespaces already exist: %s" % ", ".join(clash[:5]))
        self._created_ns = names
        ip_batch(["netns add %s" % n for n in names])

        # the switch is layer 2 only: no IPv6 of its own (its bridges and ports would send multicast too)
        subprocess.run(["ip", "netns", "exec", self.switch_ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
        sw = [
            "link set lo up",
            # MTU set after creation, so the bridge keeps it when a port's MTU changes (mtu_blackhole)
            "link add br-mgmt type bridge",
            "link set br-mgmt mtu %d up" % MGMT_MTU,
            "link add br-data type bridge",
            "link set br-data mtu %d up" % DATA_MTU,
            "link add mctl mtu %d master br-mgmt up type veth peer name eth0 netns %s" % (MGMT_MTU, self.ctl_ns),
            "link add dctl mtu %d master br-data up type veth peer name eth1 mtu %d netns %s"
            % (DATA_MTU, DATA_MTU, self.ctl_ns),
        ]
        for node in self.nodes:
            sw.append("link add %s mtu %d master br-mgmt up type veth peer name eth0 netns %s"
                      % (node.mgmt_veth, MGMT_MTU, node.ns))
            sw.append("link add %s mtu %d master br-data up type veth peer name eth1 mtu %d netns %s"
                      % (node.data_veth, DATA_MTU, DATA_MTU, node.ns))
            if node.docker0:
                sw.append(self._docker0_port_line(node))
        ip_batch(sw, ns=self.switch_ns)

        jobs = [(self.ctl_ns, self._host_lines(self.ctl_mgmt_ip, self.ctl_data_ip, False, self.link_local))]
        jobs += [(node.ns, self._host_lines(node.mgmt_ip, node.data_ip, node.docker0, self.link_local))
                 for node in self.nodes]
        self._parallel_batches(jobs)

    @staticmethod
    def _host_lines(mgmt_ip: str, data_ip: str, docker0: bool, link_local: bool = True) -> List[str]:
        lines = [] if link_local else ["link set eth0 addrgenmode none", "link set eth1 addrgenmode none"]
        lines += [
            "link set lo up",
            "addr add %s/16 dev eth0" % mgmt_ip,
            "link set eth0 up",
            "addr add %s/16 dev eth1" % data_ip,
            "link set eth1 mtu %d up" % DATA_MTU,
        ]
        if docker0:
            lines += SimCluster._docker0_lines()
        return lines

    @staticmethod
    def _docker0_port_line(node: SimNode) -> str:
        """(switch namespace) a veth whose node end becomes docker0's port; its other end stays unattached."""
        return "link add %s up type veth peer name vethdocker0 netns %s" % (node.container_veth, node.ns)

    @staticmethod
    def _docker0_lines() -> List[str]:
        # the port with carrier makes docker0 operationally UP, as on a host running containers:
        # an interface with an address that a NIC check could wrongly pick
        return ["link add docker0 type bridge", "addr add %s dev docker0" % DOCKER0_CIDR, "link set docker0 up",
                "link set vethdocker0 master docker0 up"]

    @staticmethod
    def _parallel_batches(jobs: List[Tuple[str, List[str]]], width: int = 16) -> None:
        """One `ip -n NS -batch -` per namespace, `width` at a time."""
        pending = list(jobs)
        running: List[Tuple[str, subprocess.Popen]] = []
        errors = []
        while pending or running:
            while pending and len(running) < width:
                ns, lines = pending.pop(0)
                proc = subprocess.Popen(["ip", "-n", ns, "-batch", "-"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
                proc.stdin.write("\n".join(lines) + "\n")
                proc.stdin.close()
                running.append((ns, proc))
            ns, proc = running.pop(0)
            out = proc.stdout.read()
            proc.stdout.close()
            if proc.wait() != 0:
                errors.append("%s: %s" % (ns, out.strip()))
        if errors:
            raise SimError("ip -batch failed in %d namespace(s): %s" % (len(errors), "; ".join(errors[:3])))

    def _spawn_sshd(self, node: SimNode) -> None:
        log = open(node.sshd_log, "ab")
        try:
            argv = as_node(node.shm_dir, [SSHD, "-D", "-e", "-f", node.sshd_config],
                           hostname=node.name if self.want_slurm else None)
            node.sshd = self._spawn(["ip", "netns", "exec", node.ns] + argv,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        finally:
            log.close()

    def _spawn(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            kw.setdefault("preexec_fn", _child_setup)  # parent-death signal is per thread: main only
        else:
            kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(list(argv), **kw)
        self._popens.append(proc)
        return proc

    def _wait_listening(self, nodes: Sequence[SimNode], timeout: Optional[float] = None) -> None:
        """Wait until each node's sshd has its socket in LISTEN (read from /proc/PID/net/tcp: no connections)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        waiting = {node.name: node for node in nodes}
        while waiting:
            for name, node in list(waiting.items()):
                proc = node.sshd
                if proc is None or proc.poll() is not None:
                    raise SimError("sshd on %s exited (rc %s): %s"
                                   % (name, proc and proc.returncode, self._tail(node.sshd_log)))
                want = "%s:0016" % _hex_addr(node.mgmt_ip)
                try:
                    with open("/proc/%d/net/tcp" % proc.pid) as fh:
                        table = fh.read()
                except OSError:
                    continue
                for line in table.splitlines()[1:]:
                    fields = line.split()
                    if fields[1] == want and fields[3] == "0A":
                        del waiting[name]
                        break
            if waiting:
                if time.monotonic() > deadline:
                    raise SimError("sshd not listening after %.0fs on: %s" % (timeout or self.start_timeout,
                                                                               ", ".join(sorted(waiting)[:10])))
                time.sleep(0.01)

    def _wait_links_up(self, nodes: Sequence[SimNode], timeout: float = 10.0) -> None:
        """Wait until eth0, eth1 (and docker0) report operstate up, so probes never see a link mid-start.

        Read through /proc/<sshd>/root/sys: sshd runs in the mount namespace where `ip netns exec`
        mounted the node's own sysfs.
        """
        deadline = time.monotonic() + timeout
        waiting = [(node, iface) for node in nodes
                   for iface in ("eth0", "eth1") + (("docker0",) if node.docker0 else ())]
        while waiting:
            still = []
            for node, iface in waiting:
                try:
                    with open("/proc/%d/root/sys/class/net/%s/operstate" % (node.sshd.pid, iface)) as fh:
                        if fh.read().strip() == "up":
                            continue
                except OSError:
                    pass
                still.append((node, iface))
            waiting = still
            if waiting:
                if time.monotonic() > deadline:
                    raise SimError("links not up after %.0fs: %s" % (timeout, ", ".join(
                        "%s %s" % (n.name, i) for n, i in waiting[:10])))
                time.sleep(0.01)

    @staticmethod
    def _tail(path: str, n: int = 2000) -> str:
        return tail(path, n)

    # ---------------------------------------------------------------- teardown

    def stop(self) -> None:
        """Kill every process in the cluster's namespaces, delete the namespaces and the root dir. Idempotent."""
        if self.stopped or not self.started:
            return
        self.stopped = True
        t0 = time.monotonic()
        try:
            teardown(self._created_ns, self._popens)
        finally:
            if self in _live:
                _live.remove(self)
            if not self.keep_root:
                shutil.rmtree(self.root, ignore_errors=True)
            try:
                os.unlink(self._owner_file)
            except OSError:
                pass
        self.timings["stop"] = time.monotonic() - t0

    # ---------------------------------------------------------------- running things

    @staticmethod
    def _run_defaults(kw: dict) -> dict:
        if not {"stdout", "stderr", "capture_output"} & set(kw):
            kw["capture_output"] = True
        if "text" not in kw and "universal_newlines" not in kw and "encoding" not in kw:
            kw["text"] = True
        return kw

    def ctl(self, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv) in the controller namespace (captures text output unless told otherwise)."""
        return subprocess.run(["ip", "netns", "exec", self.ctl_ns, *map(str, argv)], **self._run_defaults(kw))

    def ctl_popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """subprocess.Popen(argv) in the controller namespace; killed at stop() if still running."""
        return self._spawn(["ip", "netns", "exec", self.ctl_ns, *map(str, argv)], **kw)

    def node_exec(self, node: NodeRef, argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside a node's namespace, not through ssh (captures text output by default)."""
        return subprocess.run(["ip", "netns", "exec", self.node(node).ns, *map(str, argv)], **self._run_defaults(kw))

    def ssh_argv(self, node: NodeRef, *options: str) -> List[str]:
        """A real `ssh` command line to a node (strict host-key checking, batch mode, cluster key).

        `options` come first, so they win over these defaults (ssh keeps the first value it reads).
        ConnectTimeout is generous: it also covers the key exchange, slow on a loaded 2-core box.
        """
        node = self.node(node)
        return ["ssh", *options, "-F", "/dev/null", "-i", self.identity_file,
                "-o", "UserKnownHostsFile=%s" % self.known_hosts, "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20",
                "root@%s" % node.mgmt_ip]

    def ssh(self, node: NodeRef, command: str, *options: str, **kw) -> subprocess.CompletedProcess:
        """Run `command` on a node through the real ssh client, from the controller namespace."""
        kw.setdefault("timeout", 30)
        return self.ctl(self.ssh_argv(node, *options) + ["--", command], **kw)

    def in_ctl(self):
        """Context manager: the current thread in the controller namespace (for paramiko/sockets in-process)."""
        return in_netns(self.ctl_ns)

    def inventory(self, path: Optional[str] = None, nodes: Optional[Iterable[NodeRef]] = None,
                  node_overrides: Optional[Dict[str, dict]] = None, **extra) -> str:
        """Write a hosts.yaml for this cluster and return its path.

        extra: master_port/head/expect/shared_paths go to `cluster:`, anything else to `defaults:`.
        node_overrides: {"n003": {"port": 2222}} merged into that node's entry.
        nodes: a subset (default all).
        """
        import yaml

        defaults = {"user": "root", "identity_file": self.identity_file, "known_hosts": self.known_hosts,
                    "python": "python3", "gpus_per_node": 0, "connect_timeout": 5, "command_timeout": 30}
        cluster = {"master_port": 29500}
        for key, value in extra.items():
            (cluster if key in ("master_port", "head", "expect", "shared_paths", "xid_window_s") else defaults)[key] = value
        overrides = dict(node_overrides or {})
        entries = []
        for node in (self.node(r) for r in (nodes if nodes is not None else self.nodes)):
            entry = {"host": node.mgmt_ip, "name": node.name}
            entry.update(overrides.pop(node.name, {}))
            entries.append(entry)
        if overrides:
            raise KeyError("node_overrides for unknown nodes: %s" % ", ".join(sorted(overrides)))
        path = path or os.path.join(self.root, "hosts.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump({"defaults": defaults, "cluster": cluster, "nodes": entries}, fh,
                           sort_keys=False, default_flow_style=False)
        return path

    # ---------------------------------------------------------------- process inventory

    def processes(self, node: NodeRef) -> List[Tuple[int, str]]:
        """(pid, cmdline) of every process in the node's network namespace except its sshd listener.

        Listeners started by hold_port() and the node's slurmd and munged are left out too; sshd session processes
        of a connection that just closed may still show for a few milliseconds (see leftover_processes).
        """
        node = self.node(node)
        key = netns_id(node.ns)
        listener = node.sshd.pid if node.sshd is not None and node.sshd.poll() is None else None
        held = {pid for pid, p in self._held.items() if p.poll() is None}
        if self.slurm is not None:  # the node's slurmd and munged are infrastructure, like its sshd listener
            for daemons in (self.slurm.slurmd, self.slurm.node_munged):
                held |= {p.pid for name, p in daemons.items() if name == node.name and p.poll() is None}
        return [(pid, cmdline(pid)) for pid in sorted(pids_by_netns([key])[key])
                if pid != listener and pid not in held]

    def leftover_processes(self, nodes: Optional[Iterable[NodeRef]] = None,
                           timeout: float = 5.0) -> Dict[str, List[Tuple[int, str]]]:
        """Wait up to `timeout` for nodes to go quiet; return {node: processes} for those that did not.

        sshd session processes need a moment to exit after the client disconnects, hence the wait.
        Ports held by hold_port() are not counted.
        """
        targets = [self.node(r) for r in (nodes if nodes is not None else self.nodes)]
        deadline = time.monotonic() + timeout
        while True:
            left = {node.name: procs for node in targets for procs in [self.processes(node)] if procs}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    # ---------------------------------------------------------------- sshd and docker0 on a running node

    def start_sshd(self, node: NodeRef, timeout: float = 10.0) -> None:
        """(Re)start a node's sshd if it is not running, and wait until it listens."""
        node = self.node(node)
        if node.sshd is not None and node.sshd.poll() is None:
            return
        self._spawn_sshd(node)
        self._wait_listening([node], timeout)

    def _kill_sshd(self, node: SimNode) -> None:
        if node.sshd is not None and node.sshd.poll() is None:
            node.sshd.kill()
            node.sshd.wait()

    def add_docker0(self, node: NodeRef) -> None:
        """Give a running node a docker0 bridge with the shared address (see DOCKER0_CIDR)."""
        node = self.node(node)
        if not node.docker0:
            ip_batch([self._docker0_port_line(node)], ns=self.switch_ns)
            ip_batch(self._docker0_lines(), ns=node.ns)
            node.docker0 = True

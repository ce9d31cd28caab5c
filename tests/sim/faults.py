"""The simulator's fault injectors: what can go wrong on a node, made real in its namespace.

Each injector breaks one thing the way it breaks on real hosts (a pulled cable, a switch port at MTU 1500,
a frozen sshd, a process holding a port, a local directory over a shared mount, a changed host key ...)
and pushes its undo; heal() undoes them newest first, stop() heals everything. SimCluster
(tests/sim/cluster.py) mixes this in; the injectors use its lookup (`node`), its namespaces (`switch_ns`,
`ctl_ns`), its process spawner (`_spawn`, `_held`) and its sshd lifecycle (`start_sshd`, `_kill_sshd`,
`_install_python`), and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Union

from .base import DATA_MTU, SimError, ed25519_keypair, ip_batch, write_file

if TYPE_CHECKING:
    from .cluster import SimNode

NodeRef = Union["SimNode", str, int]


class FaultInjection:
    """Fault injectors and their undo stack, mixed into SimCluster."""

    _undo: Dict[str, List[Callable[[], None]]]

    def _push_undo(self, node: SimNode, fn: Callable[[], None]) -> None:
        self._undo.setdefault(node.name, []).append(fn)

    def heal(self, node: Optional[NodeRef] = None) -> None:
        """Undo injected faults (newest first) on one node or on all."""
        names = [self.node(node).name] if node is not None else list(self._undo)
        for name in names:
            stack = self._undo.pop(name, [])
            while stack:
                stack.pop()()

    def stop_sshd(self, node: NodeRef) -> None:
        """Kill the node's sshd listener: connections are refused. Existing sessions live on."""
        node = self.node(node)
        self._kill_sshd(node)
        self._push_undo(node, lambda: self.start_sshd(node))

    def freeze_sshd(self, node: NodeRef) -> None:
        """SIGSTOP the node's sshd: TCP connects (kernel backlog) but no SSH banner ever comes."""
        node = self.node(node)
        proc = node.sshd
        if proc is None or proc.poll() is not None:
            raise SimError("sshd on %s is not running" % node.name)
        proc.send_signal(signal.SIGSTOP)
        self._push_undo(node, lambda: proc.poll() is None and proc.send_signal(signal.SIGCONT))

    def hang_commands(self, node: NodeRef) -> None:
        """Every `python3` on the node hangs (bin/python3 becomes `exec sleep 100000`)."""
        node = self.node(node)
        node.install_executable("python3", "#!/bin/sh\nexec sleep 100000\n")
        self._push_undo(node, lambda: self._install_python(node))

    def crash_commands(self, node: NodeRef) -> None:
        """Every `python3` on the node is killed at once (SIGKILL, as the kernel's OOM killer ends a process)."""
        node = self.node(node)
        node.install_executable("python3", "#!/bin/sh\nkill -KILL $$\n")
        self._push_undo(node, lambda: self._install_python(node))

    def _shell_rc(self, node: SimNode, text: str) -> None:
        write_file(node.shell_rc, text)
        self._push_undo(node, lambda: write_file(node.shell_rc, ""))

    def shell_rc_prints(self, node: NodeRef, text: str) -> None:
        """The node's shell start-up prints `text` (printf: no newline unless text has one) before every command."""
        node = self.node(node)
        self._shell_rc(node, "printf '%%s' %s\n" % shlex.quote(text))

    def shell_rc_background_job(self, node: NodeRef, seconds: int = 100000) -> None:
        """The node's shell start-up leaves a background job holding the session's stdout open."""
        node = self.node(node)
        self._shell_rc(node, "sleep %d &\n" % seconds)

    def hang_login_mid_run(self, node: NodeRef) -> None:
        """Like a home directory on NFS that goes away mid-run: the first python3 hangs (until its stdin
        closes, as the probe bundle's watchdog does) and from then on every new login shell hangs in its
        start-up file until the connection closes, so a kill sent over a second channel never answers."""
        node = self.node(node)
        flag = os.path.join(node.dir, "nfs-lost")
        self._shell_rc(node, "[ -e %s ] && exec cat >/dev/null\n" % shlex.quote(flag))
        node.install_executable("python3", "#!/bin/sh\ntouch %s\nexec cat >/dev/null\n" % shlex.quote(flag))

        def undo() -> None:
            self._install_python(node)
            if os.path.exists(flag):
                os.unlink(flag)
        self._push_undo(node, undo)

    def mtu_blackhole(self, node: NodeRef, mtu: int = 1500) -> None:
        """Switch-side data port of the node drops to `mtu` while its eth1 says 9000: jumbo frames vanish."""
        node = self.node(node)
        ip_batch(["link set %s mtu %d" % (node.data_veth, mtu)], ns=self.switch_ns)
        self._push_undo(node, lambda: ip_batch(["link set %s mtu %d" % (node.data_veth, DATA_MTU)],
                                                ns=self.switch_ns))

    def throttle(self, node: NodeRef, rate: str = "8mbit", burst: str = "32kb", latency: str = "400ms") -> None:
        """The node's data link slows to `rate` (a token-bucket filter on its eth1, egress): the link
        stays up and every packet arrives, only late, like a NIC that trained down or a congested port."""
        node = self.node(node)
        subprocess.run(["ip", "netns", "exec", node.ns, "tc", "qdisc", "replace", "dev", "eth1", "root", "tbf",
                        "rate", rate, "burst", burst, "latency", latency], check=True, capture_output=True)
        self._push_undo(node, lambda: subprocess.run(
            ["ip", "netns", "exec", node.ns, "tc", "qdisc", "del", "dev", "eth1", "root"], capture_output=True))

    def hold_port(self, node: NodeRef, port: int, addr: str = "0.0.0.0") -> int:
        """A real TCP listener on addr:port inside the node (until stop/heal); returns its pid."""
        node = self.node(node)
        code = ("import socket,sys,time\n"
                "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)\n"
                "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
                "while True: time.sleep(3600)\n")
        return self._hold(node, "hold_port %s:%d" % (addr, port), [sys.executable, "-c", code, addr, str(port)])

    def _hold(self, node: "SimNode", what: str, argv: List[str]) -> int:
        """Start argv inside the node, wait for its 'ready' line, and keep it until heal/stop; its pid."""
        proc = self._spawn(["ip", "netns", "exec", node.ns] + argv,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.stdout.readline().strip() != b"ready":
            proc.kill()
            err = proc.stderr.read().decode(errors="replace").strip()
            proc.wait()
            raise SimError("%s on %s failed: %s" % (what, node.name, err))
        self._held[proc.pid] = proc

        def release() -> None:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self._held.pop(proc.pid, None)

        self._push_undo(node, release)
        return proc.pid

    def count_up(self, node: NodeRef, relpaths: Sequence[str], step: int = 7, every: float = 0.05) -> int:
        """A process in the node that adds `step` to each sysfs counter file every `every` seconds (an HCA
        port counting errors while the probe watches it), until heal/stop; returns its pid."""
        node = self.node(node)
        paths = [os.path.join(node.sys_dir, r.lstrip("/")) for r in relpaths]
        # each new value replaces the file whole (a reader never sees it half-written, as with sysfs)
        code = ("import os,sys,time\n"
                "paths, step, every = sys.argv[3:], int(sys.argv[1]), float(sys.argv[2])\n"
                "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
                "while True:\n"
                "    for p in paths:\n"
                "        v = int(open(p).read().strip()) + step\n"
                "        open(p + '.new', 'w').write('%d\\n' % v)\n"
                "        os.replace(p + '.new', p)\n"
                "    time.sleep(every)\n")
        return self._hold(node, "count_up", [sys.executable, "-c", code, str(step), str(every)] + paths)

    def mount_local(self, node: NodeRef, path: str) -> None:
        """Mount an empty tmpfs over `path` in the node's mount namespace (its sshd's): the node sees a
        local directory where the others see the shared one, as when a network mount failed at boot."""
        node = self.node(node)
        if node.sshd is None or node.sshd.poll() is not None:
            raise SimError("sshd on %s is not running" % node.name)
        pid = self._sshd_pid(node)
        argv = ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", "size=16m", "pfsim-local", path]
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if proc.returncode != 0:
            raise SimError("mount_local %s %s failed: %s" % (node.name, path, proc.stdout.strip()))

        def undo() -> None:
            subprocess.run(["nsenter", "-t", str(pid), "-m", "umount", path],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        self._push_undo(node, undo)

    def _sshd_pid(self, node: SimNode) -> int:
        """The pid of the node's sshd itself (`ip netns exec` execs it, so the Popen pid is sshd's)."""
        return node.sshd.pid

    def link_down(self, node: NodeRef, unreachable: bool = False) -> None:
        """Take the node's management link down.

        Default: the controller keeps a permanent ARP entry for the node, so a connect from ctl times
        out (SYNs vanish), like a hung or partitioned host. unreachable=True: ARP fails too, so
        connects end with EHOSTUNREACH after about 3 s (or time out first if shorter).
        """
        node = self.node(node)
        mac = None
        if not unreachable:
            out = subprocess.run(["ip", "-n", node.ns, "-j", "link", "show", "eth0"], stdout=subprocess.PIPE,
                                 universal_newlines=True, check=True).stdout
            mac = json.loads(out)[0]["address"]
            ip_batch(["neigh replace %s lladdr %s dev eth0 nud permanent" % (node.mgmt_ip, mac)], ns=self.ctl_ns)
        ip_batch(["link set %s down" % node.mgmt_veth], ns=self.switch_ns)

        def undo() -> None:
            ip_batch(["link set %s up" % node.mgmt_veth], ns=self.switch_ns)
            if mac:
                ip_batch(["neigh del %s dev eth0" % node.mgmt_ip], ns=self.ctl_ns, force=True)

        self._push_undo(node, undo)

    def data_link_down(self, node: NodeRef) -> None:
        """Pull the node's data cable: its switch-side data port goes down, so eth1 keeps its address
        and MTU but loses carrier (NO-CARRIER, operstate DOWN), as a dead cable or switch port does."""
        node = self.node(node)
        ip_batch(["link set %s down" % node.data_veth], ns=self.switch_ns)
        self._push_undo(node, lambda: ip_batch(["link set %s up" % node.data_veth], ns=self.switch_ns))

    def nic_speeds(self, node: NodeRef, speeds: Dict[str, int]) -> None:
        """The node's NICs report these sysfs speeds (Mb/s; -1: no link, as a real NIC without carrier reads),
        e.g. {"eth0": 1000}: a 1 GbE management port. The node's class/net (a link to its namespace's live
        sysfs) becomes a directory of what the nic probe reads: each interface's type and speed."""
        node = self.node(node)
        net = os.path.join(node.sys_dir, "class", "net")
        live = os.readlink(net)
        out = subprocess.run(["ip", "netns", "exec", node.ns, "sh", "-c",
                              'for i in /sys/class/net/*; do echo "${i##*/} $(cat $i/type)"; done'],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        os.unlink(net)
        for line in out.splitlines():
            name, arp_type = line.split()
            node.write_sys("class/net/%s/type" % name, arp_type + "\n")
            if name in speeds:
                node.write_sys("class/net/%s/speed" % name, "%d\n" % speeds[name])

        def undo() -> None:
            shutil.rmtree(net)
            os.symlink(live, net)
        self._push_undo(node, undo)

    def remove_data_nic(self, node: NodeRef) -> None:
        """The node has no data NIC at all, only its management eth0 (a CPU-only login node): eth1 and its
        switch port are deleted; heal() cables it back with its address and MTU."""
        node = self.node(node)
        ip_batch(["link del %s" % node.data_veth], ns=self.switch_ns)  # a veth pair: eth1 goes with it

        def undo() -> None:
            ip_batch(["link add %s mtu %d master br-data up type veth peer name eth1 mtu %d netns %s"
                      % (node.data_veth, DATA_MTU, DATA_MTU, node.ns)], ns=self.switch_ns)
            ip_batch(["addr add %s/16 dev eth1" % node.data_ip, "link set eth1 mtu %d up" % DATA_MTU], ns=node.ns)
        self._push_undo(node, undo)

    def set_data_address(self, node: NodeRef, ip: str) -> None:
        """Give the node's eth1 another address in the data subnet (e.g. another node's: a conflict).
        Duplicate-address detection is IPv6-only, so the kernel accepts it, as on a real mis-set host."""
        node = self.node(node)
        old = node.data_ip
        ip_batch(["addr del %s/16 dev eth1" % old, "addr add %s/16 dev eth1" % ip], ns=node.ns)
        self._push_undo(node, lambda: ip_batch(["addr del %s/16 dev eth1" % ip, "addr add %s/16 dev eth1" % old],
                                                ns=node.ns))

    def change_host_key(self, node: NodeRef) -> None:
        """New host key and sshd restart, known_hosts left alone: clients must see a key mismatch."""
        node = self.node(node)
        with open(node.host_key, "rb") as fh:
            old_private = fh.read()
        old_public = node.host_pubkey
        private, node.host_pubkey = ed25519_keypair("root@" + node.name)
        write_file(node.host_key, private, 0o600)
        self._kill_sshd(node)
        self.start_sshd(node)

        def undo() -> None:
            write_file(node.host_key, old_private, 0o600)
            node.host_pubkey = old_public
            self._kill_sshd(node)
            self.start_sshd(node)

        self._push_undo(node, undo)

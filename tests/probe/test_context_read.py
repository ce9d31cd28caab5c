"""NodeContext.read reads with os.read, not a text file object (half the CPU, times hundreds of sysfs reads on a GPU
node: benchmarks/node_bundle_cpu.py --pci-functions 100), and must give what open()'s text mode gave: the locale's
encoding with errors replaced, universal newlines, the trailing newline stripped, None where nothing can be read.
"""

from __future__ import annotations

import glob
import os

import pytest

from preflight.probe.context import NodeContext


def text_mode(path):
    """What NodeContext.read returned before: open()'s text mode."""
    try:
        with open(path, "r", errors="replace") as handle:
            return handle.read().rstrip("\n")
    except OSError:
        return None


CASES = {
    "sysfs-like": b"0x10de\n",
    "no-newline": b"8",
    "empty": b"",
    "only-newlines": b"\n\n",
    "crlf": b"line one\r\nline two\r\n",
    "lone-cr": b"progress 10%\rprogress 100%\n",
    "invalid-utf8": b"NVRM: Xid \xff\xfe (PCI:0000:41:00)\n",
    "multibyte-at-64k": ("x" * 65535 + "\u00e9\n").encode("utf-8"),  # a character split across two reads
    "large": b"".join(b"%06d a kernel log line\n" % i for i in range(20000)),  # 480 KB: many reads
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_file_reads_as_text_mode_read_it(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(CASES[name])
    assert NodeContext.read(str(path)) == text_mode(str(path))


def test_what_cannot_be_read_is_none_as_before(tmp_path):
    unreadable = tmp_path / "unreadable"
    unreadable.write_text("secret\n")
    unreadable.chmod(0)
    cases = [str(tmp_path / "absent"), str(tmp_path)]  # missing; a directory (EISDIR on read, not on open)
    if os.geteuid() != 0:  # root reads mode 000 files
        cases.append(str(unreadable))
    for path in cases:
        assert NodeContext.read(path) is None, path
        assert text_mode(path) is None, path


def test_this_machines_sysfs_and_proc_read_the_same():
    """Real kernel files, each read both ways: the attributes the probes read (a virtual NIC's speed answers
    EINVAL), never a device's config space or BARs (reading an I/O BAR touches the hardware)."""
    net = ("mtu", "operstate", "speed", "duplex", "address", "carrier", "type", "ifindex", "flags", "tx_queue_len")
    pci = ("vendor", "device", "class", "numa_node", "max_link_speed", "max_link_width", "current_link_speed",
           "current_link_width", "local_cpulist", "subsystem_vendor")
    paths = [p for a in net for p in sorted(glob.glob("/sys/class/net/*/" + a))[:20]]
    paths += [p for a in pci for p in sorted(glob.glob("/sys/bus/pci/devices/*/" + a))[:20]]
    paths += ["/proc/cpuinfo", "/proc/meminfo", "/proc/net/dev", "/proc/sys/net/core/somaxconn", "/proc/self/status"]
    files = [p for p in paths if os.path.isfile(p) and os.access(p, os.R_OK)]
    assert len(files) >= 10, files  # the comparison saw real files (lo's attributes and /proc at least)
    volatile = ("/proc/self/status", "/proc/net/dev", "/proc/meminfo", "/proc/cpuinfo")
    for path in files:
        ours, theirs = NodeContext.read(path), text_mode(path)
        if any(v in path for v in volatile):  # counters move between two reads: same shape, not same text
            assert (ours is None) == (theirs is None) and (ours or "").count("\n") == (theirs or "").count("\n"), path
        else:
            assert ours == theirs, path

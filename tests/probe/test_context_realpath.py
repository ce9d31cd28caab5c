"""NodeContext.realpath: the kernel's resolution (O_PATH, then the descriptor's /proc link) where the path exists,
os.path.realpath otherwise; the PCI probes find the bridges above a GPU or HCA from it (preflight.probe.pci).

Each case is compared with os.path.realpath, which it replaces: this machine's own sysfs device links (as the
probes read them) and a tree of links built here, with the shapes realpath must get right.
"""

from __future__ import annotations

import glob
import os

import pytest

from preflight.probe.context import NodeContext


def test_this_machines_sysfs_device_links_resolve_as_realpath_does():
    paths = sorted(glob.glob("/sys/bus/pci/devices/*") + glob.glob("/sys/class/net/*/device")
                   + glob.glob("/sys/class/infiniband/*/device") + glob.glob("/sys/class/net/*"))
    if not paths:
        pytest.skip("no sysfs device links on this machine")
    for path in paths:
        assert NodeContext.realpath(path) == os.path.realpath(path), path
    assert any(NodeContext.realpath(p) != p for p in paths)  # links were among them


def test_links_of_every_shape_resolve_as_realpath_does(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    target = root / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:01:00.0"
    target.mkdir(parents=True)
    (target / "vendor").write_text("0x10de\n")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    (bus / "0000:01:00.0").symlink_to("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0")  # as sysfs has it
    (bus / "hop").symlink_to("0000:01:00.0")  # a link to a link
    (bus / "absolute").symlink_to(str(target))
    (bus / "dangling").symlink_to("../../../devices/gone")
    (bus / "loop").symlink_to("loop")
    (tmp_path / "alias").symlink_to(root)  # a linked ancestor
    cases = [
        bus / "0000:01:00.0", bus / "hop", bus / "absolute", bus / "dangling", bus / "loop", bus / "missing",
        tmp_path / "alias" / "bus" / "pci" / "devices" / "0000:01:00.0", bus / "0000:01:00.0" / "vendor",
        str(bus / "0000:01:00.0") + "/", str(bus / "0000:01:00.0" / "vendor") + "/",
        str(bus / "0000:01:00.0") + "/../..", root / "devices",
    ]
    for case in cases:
        assert NodeContext.realpath(str(case)) == os.path.realpath(str(case)), case
    assert NodeContext.realpath(str(bus / "hop")) == str(target)
    monkeypatch.chdir(bus)
    assert NodeContext.realpath("0000:01:00.0") == str(target)  # relative to the working directory, as realpath


def test_a_directory_removed_under_it_falls_back_to_realpath(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    real_readlink = os.readlink

    def deleted(path, *args, **kwargs):  # what the kernel's link says of a directory removed while open
        text = real_readlink(path, *args, **kwargs)
        return text + " (deleted)" if str(path).startswith("/proc/self/fd/") else text

    monkeypatch.setattr(os, "readlink", deleted)
    assert NodeContext.realpath(str(gone)) == str(gone)

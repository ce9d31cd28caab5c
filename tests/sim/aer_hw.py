"""Simulated PCIe AER statistics: the kernel's aer_dev_{correctable,nonfatal,fatal} files of a PCI function.

Written in the format of drivers/pci/pcie/aer.c (kernel 6.x short names, one '<name> <count>' line per
error bit, then TOTAL_ERR_*), under the node's sysfs root, into the device directory bus/pci/devices/<bdf>
resolves to (call after tests.sim.pci_hw.install_pcie, which lays that tree out):

    install_aer(node, "0000:18:00.0")                        # a clean link: every counter 0
    install_aer(node, "0000:18:00.0", fatal={"SDES": 1})     # one surprise-down since boot
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                 "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                 "PoisonTLPBlocked")


def aer_text(names: Any, total_name: str, counts: Optional[Dict[str, int]]) -> str:
    counts = dict(counts or {})
    unknown = set(counts) - set(names)
    if unknown:
        raise ValueError("AER bits %s: expected some of %s" % (sorted(unknown), ", ".join(names)))
    lines = ["%s %d" % (n, counts.get(n, 0)) for n in names]
    return "\n".join(lines + ["%s %d" % (total_name, sum(counts.values()))]) + "\n"


def install_aer(node: Any, bdf: str, correctable: Optional[Dict[str, int]] = None, nonfatal: Optional[Dict[str, int]] = None,
                fatal: Optional[Dict[str, int]] = None) -> str:
    """Write the three AER files of bdf; returns its (real) device directory."""
    real = os.path.realpath(os.path.join(node.sys_dir, "bus", "pci", "devices", bdf))
    if not os.path.isdir(real):
        raise ValueError("%s: no such PCI function in the node's sysfs" % bdf)
    for fname, names, total, counts in (("aer_dev_correctable", CORRECTABLE, "TOTAL_ERR_COR", correctable),
                                        ("aer_dev_nonfatal", UNCORRECTABLE, "TOTAL_ERR_NONFATAL", nonfatal),
                                        ("aer_dev_fatal", UNCORRECTABLE, "TOTAL_ERR_FATAL", fatal)):
        with open(os.path.join(real, fname), "w") as fh:
            fh.write(aer_text(names, total, counts))
    return real

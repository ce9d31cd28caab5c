"""pcie: no GPU or NIC PCIe link reports uncorrectable AER errors, or correctable ones above the link's error budget.

The probe reads the kernel's AER statistics (``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``
under ``bus/pci/devices/<bdf>``, kernel 4.19+; Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats,
Documentation/PCI/pcieaer-howto.rst) of every NVIDIA GPU (class 0x0300/0x0302) and network controller
(class 0x02xxxx), and of the port directly above each (the other end of the same link: errors the port
receives are counted there; a port above several functions, a dual-port NIC's, counts toward the first). It reads them twice, ``window_s`` apart (default 1 s, shortened to fit the
probe deadline), so errors happening now are told from old ones, and reads /proc/uptime for the rate
since boot. Each file is one ``<name> <count>`` line per error bit then ``TOTAL_ERR_COR|NONFATAL|FATAL <n>``;
kernels before 5.x print long names with spaces ("Receiver Error 2", "RELAY_NUM Rollover 0"), later
ones short names ("RxErr 2"); only the TOTAL line is summed (the kernel's own total).

Facts schema::

    uptime_s float | None     window_s float
    devices [{kind "gpu"|"nic", bdf, port bdf|None, rate [GT/s, lanes] | None,
              total {"correctable", "nonfatal", "fatal": int} | None     (device + port, after the window;
                                                                          None: the kernel keeps no AER stats)
              delta {same keys} | None                                    (during the window)
              counts {"<name>": n}                                        (non-zero bits, for evidence)}]

Rule (every node; CPU-only nodes are judged for their NICs):

- fatal or non-fatal errors during the window: FAIL, isolate (the link is failing now).
- fatal errors since boot: FAIL, reboot (a fatal error resets the link; the device is usually lost until
  a reboot; if it recurs, isolate).
- non-fatal errors since boot only: WARN (recovered, but a healthy link has none).
- correctable errors are judged against DCGM's PCIe replay budget (modules/health/DcgmHealthWatch.cpp
  GetExpectedPcieReplayRate: a 1e-12 bit error rate, ceil(GT/s x 0.06 x lanes) per minute: 31/min at
  Gen5 x16): FAIL isolate when at least 3 arrive during the window at a rate above it (DCGM's
  DCGM_FR_PCI_REPLAY_RATE is ISOLATE severity), or when the average since boot is above it over at least
  100 errors (a link failing for its whole uptime). A handful of old correctable errors is not a fault:
  the PASS names them with their rate.
- no device with AER statistics (a VM, a kernel without AER stats, pci=noaer): SKIP with that reason.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "pcie"

CHECK = Check(
    name=NAME,
    claim="No GPU or NIC PCIe link logs uncorrectable AER errors, or correctable ones above its 1e-12 bit-error "
    "budget (now, or on average since boot)",
    why="A PCIe link that counts errors retransmits (replays) traffic and slows every transfer through it; "
    "uncorrectable errors drop the GPU or NIC off the bus (Xid 79) mid-job. The kernel counts them silently.",
    fix="Reseat the GPU/NIC and its riser, check the slot and cable (lspci -vvv: LnkSta, CESta/UESta), update "
    "the platform firmware; after fatal errors reboot; drain the node if the count keeps rising.",
    action="isolate",
    reads="sysfs bus/pci/devices/*/{vendor,class,max_link_*,aer_dev_*} of GPUs, NICs and their ports, twice; /proc/uptime",
    takes="1 s window (none without AER statistics)",
    order=69,
)

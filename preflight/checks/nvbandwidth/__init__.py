"""nvbandwidth: with --tier burn-in, where NVIDIA's nvbandwidth is installed, every GPU's host<->device and
peer copy bandwidth is at the fleet's pace for the same position.

Runs ``nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce device_to_device_memcpy_read_ce``
on GPU nodes (burn-in tier only: it takes a minute or more on 8 GPUs), under a deadline. Nodes without
``nvbandwidth`` on PATH, CPU nodes and runs of another tier SKIP with that reason.

Real format (nvbandwidth v0.6-v0.8), from public captures: NVIDIA/nvbandwidth#50 (v0.8,
device_to_device_memcpy_read_ce on 6 RTX A6000: a GPU x GPU matrix with ``N/A`` on the diagonal, then
``SUM device_to_device_memcpy_read_ce 715.53``), NVIDIA/nvbandwidth#24 (H100, one ``CPU(row) -> GPU(column)``
row of 8 GPUs) and microsoft/superbenchmark#675 / #669 (v0.6: the ``nvbandwidth Version``/``Driver
Version`` header, ``Running <testcase>.`` before each matrix, ``Waived:`` for a testcase that does not apply,
``N/A`` cells). Each matrix: a title ``memcpy CE|SM <SRC>(row) ->|<-|<-> <DST>(column) bandwidth (GB/s)``, a
line of column indices, one line per row index with a figure or N/A per column.

Facts schema::

    nvbandwidth "/usr/bin/nvbandwidth" | None     ran bool     not_started str (why not run)
    argv, rc int|None, timed_out bool, elapsed_s, stderr_tail str
    result {version, driver, tests {name: {"title", "columns" [int], "rows" {row: [float|None]},
            "sum" float|None, "waived" bool}}} | None
"""

from __future__ import annotations

from preflight.model import Check

NAME = "nvbandwidth"

CHECK = Check(
    name=NAME,
    claim="With --tier burn-in, where nvbandwidth is installed, every GPU's host and peer copy bandwidth matches "
    "the fleet's for the same position",
    why="A GPU whose PCIe link trained narrow or slow (x8, Gen4 on a Gen5 slot), or whose NVLink peer path "
    "is degraded, passes every idle check and then stalls data loading, checkpoints and the all-reduce's "
    "intra-node step; nvbandwidth measures the copy paths a job uses.",
    fix="A slow host<->device figure: read the GPU's PCIe link (gpu_pcie check, `nvidia-smi -q -d PCI`: "
    "current vs max width and generation), reseat the GPU or riser; a slow peer figure: `nvidia-smi nvlink "
    "--status`, the fabric manager; then rerun `nvbandwidth -t device_to_device_memcpy_read_ce`.",
    action="isolate",
    reads="nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce device_to_device_memcpy_read_ce",
    takes="~30-120 s per GPU node with --tier burn-in where installed; 0 otherwise",
    order=48,
)

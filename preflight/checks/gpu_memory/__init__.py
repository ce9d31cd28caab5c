"""gpu_memory: no GPU's memory is running out of spare rows, out of retirable pages, or correcting errors now.

Rule only: the gpu probe reads the facts in its one NVML session (preflight.probe.gpu_health: the row-remap
counts and the bank remap-availability histogram on Ampere and later, retired pages on earlier parts, the
corrected ECC counter twice WINDOW_S apart) or from the nvidia-smi XML it already ran. The gpu check keeps
the verdicts it had (uncorrectable ECC, remap failure: isolate; remap pending: reset when idle; page
retirement pending: reset): one verdict per fault.

Which condition isolates and which resets follows NVIDIA's "GPU Memory Error Management" (docs.nvidia.com/
deploy/a100-gpu-mem-error-mgmt: "Row Remapping", "RMA Policy"): a pending remap takes effect at the next
reset and does not affect running work (reset when idle, the gpu check); the RMA criterion is the
row-remap failure flag, set when an uncorrectable error hits a bank that already has eight rows remapped
for uncorrectable errors, a row already remapped, or after 512 such remaps; legacy page retirement allows
at most 64 retired pages, after which no page can be retired. The histogram (nvmlRowRemapperHistogramValues_t:
banks with max / high / partial / low / none of their reserved rows available) says how close a GPU is
to that flag. Correctable HBM errors are outside NVIDIA's note: the thresholds below are ours and named.

Per GPU:

- banks with no spare row left (histogram "none" > 0): WARN, plan the replacement: the next uncorrectable
  error in such a bank sets the row-remap failure flag (RMA). Banks at "low": named in the PASS message.
- pre-Ampere: retired pages (single-bit + double-bit causes) at or above RETIRED_PAGES_MAX: FAIL isolate
  (no page can be retired any more: the next bad page stays in use). Fewer: named in the PASS message.
- corrected ECC errors arriving during the window (NVML, two reads): at CE_STORM_PER_S or more per second,
  FAIL isolate (a memory part failing now: error handling costs bandwidth and the uncorrectable error
  follows); fewer but some: WARN (retest; isolate if it keeps rising). A large count since the last reset
  with none arriving now is an old burst: named in the PASS message, never a verdict. On the nvidia-smi
  path (one sample) the rate is not judged: said in the PASS message.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "gpu_memory"

CHECK = Check(
    name=NAME,
    claim="No GPU has a memory bank without spare rows, its retired-page limit reached, or corrected ECC errors "
    "arriving during the run",
    why="An uncorrectable error in a bank with no spare row is a row-remap failure (NVIDIA's RMA criterion); a GPU "
    "whose memory corrects errors by the thousand each second is failing now and slows every collective; past "
    "64 retired pages a pre-Ampere GPU keeps using bad pages. A count of old corrected errors with none arriving "
    "now is not failed.",
    fix="Banks without spare rows: plan the GPU's replacement (nvidia-smi -q -d ROW_REMAPPER). Corrected errors "
    "arriving: drain the node, run dcgmi diag -r 3, replace the GPU if they continue. Retired-page limit: "
    "replace the GPU (nvidia-smi -q -d PAGE_RETIREMENT).",
    needs=("gpu",),
    action="isolate",
    order=21,
    reads="the gpu probe's NVML session (row remapper histogram, retired pages, corrected ECC twice) or its "
    "nvidia-smi -q -x",
    takes="a 1 s window inside the gpu probe (NVML only), concurrent with pcie and ib_errors",
)

"""dcgm: where DCGM is installed, its diagnostic (`dcgmi diag`) passes on every GPU of the node.

Runs ``dcgmi diag -r <level> -j --timeout <s>`` (level 1 by default: DCGM's quick deployment/software
validation; ``--dcgm-level 2|3`` opts in to the medium and long hardware runs) under two deadlines, because
level 2 is known to hang on B200/GB200 and a hung diagnostic must cost its deadline, not the run: dcgmi's
own ``--timeout`` (DCGM 3.3.8+; it stops the diagnostic inside nv-hostengine and answers a runtime_error
"Timeout", exit 245), 10 s before an outer deadline at which the probe kills dcgmi. A dcgmi before 3.3.8
refuses ``--timeout`` (TCLAP's "PARSE ERROR"): it is run again without it, the kill then the only deadline. Nodes without ``dcgmi`` on PATH SKIP with that reason; CPU-only nodes SKIP
without running it.

Real formats, from NVIDIA/DCGM's sources (dcgmi/Diag.cpp, nvvs/include/NvvsJsonStrings.h,
testing/python3/dcgm_diag_schema.json; tags 3.3.1 and 4.x), and the table outputs of DCGM 2.4.6/3.3.1/
4.2.3 pasted in NVIDIA/DCGM#49, #253 and NVIDIA/go-dcgm#52 (../shared/realworld/dcgmi_diag):

- DCGM 3.x: root ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [...]}]}]}, "version", "Driver Version Detected", "GPU Device IDs", "GPU Device Serials"}``.
  Deployment (level-one) results carry one status for the node and their errors on the result itself
  (``"warnings": "<text>", "error_id", "error_category", "error_severity"``); plugin results carry
  ``"gpu_id": "3"`` and ``"warnings": [{"warning", "error_id", "error_category", "error_severity"}]``.
- DCGM 4.x: root ``{"DCGM Diagnostic": {"test_categories": [...]}, "entity_groups": [{"entity_group":
  "GPU", "entities": [{"entity_id", "device_id", "serial_num"}]}], "metadata": {"version", "Driver Version
  Detected"}}``; each test has ``results`` per entity (``entity_group``, ``entity_id``, ``status``,
  ``warnings`` as above, ``info``) and a ``test_summary`` (``status`` and every error of the test).
- DCGM 4.x lists a test it did not run as ``{"name": "pcie"}`` alone: dcgmi/Diag.cpp (HelperJsonAddResult,
  HelperJsonAddTestSummary) writes no result for DCGM_DIAG_RESULT_NOT_RUN and no test_summary for a test
  whose own result is NOT_RUN. Such a test is "not run"; the rest of the document is still judged. A real
  4.x test as dcgmi wrote it on an 8-GPU node (per-GPU results with info arrays, test_summary): NVIDIA/DCGM#215.
- Either shape may say ``"runtime_error"`` under its root key (the diagnostic could not run), and output
  may start with a banner line before the JSON document.
- Exit status: 0 all passed; 226 (DCGM_ST_NVVS_ERROR = -30) a test failed; 205 (DCGM_ST_NVVS_ISOLATE_ERROR
  = -51) a failure of ISOLATE severity; 235 (DCGM_ST_CONNECTION_NOT_VALID = -21) no nv-hostengine.

Facts schema::

    dcgmi  "/usr/bin/dcgmi" | None          level 1|2|3
    ran    bool (False: CPU-only node, or too little time left: "not_started" says why)
    argv, rc int|None, timed_out bool, timeout_s float, elapsed_s float
    result {format "3.x"|"4.x"|"text", version, driver, rc, runtime_error str|None, hostengine bool,
            gpus [int], tests [{category, name, status "pass"|"fail"|"warn"|"skip"|"not run", failed ["GPU 3", ...]}],
            errors [{test, entity "GPU 3"|None, gpu int|None, code, category, severity, message}]} | None

Rule (per GPU node). Error severities (dcgmlib/dcgm_errors.h dcgmErrorSeverity_t, each error code's
severity in dcgmlib/src/dcgm_errors.c) become preflight actions:

- ISOLATE ("cannot perform workload, GPU should be isolated"): FAIL, isolate.
- RESET ("drain and reset GPU": pending/failed row remap, graphics processes): FAIL, reset_gpu.
- TRIAGE, UNKNOWN, NONE on a failing test ("should be triaged": NVLink down, Xid, CUDA errors): FAIL, retest
  (rerun and read the error; the diagnostic did not say the hardware is bad).
- CONFIG: FAIL, fix_config (ECC disabled, a denylisted driver, fabric-manager training). Persistence mode
  off (error 29) is a WARN, fix_config: jobs run, the driver re-initialises on every start; not bad hardware.
- MONITOR ("can perform workload, but needs to be monitored"): WARN.
- A failing test with no error listed: FAIL (isolate when dcgmi exited 205, else retest); exit 205 with no
  ISOLATE error parsed still FAILs isolate; exit 226 with nothing failing in the JSON is an ERROR.
- dcgmi overran its deadline, or stopped the diagnostic at its --timeout (runtime_error "Return: (-11)"):
  ERROR (retest; the level and, at level 2, the B200 hang named). Any other runtime error: ERROR. No nv-hostengine: SKIP (DCGM installed but not running is a deployment choice), but WARN when
  other GPU nodes of the run did run the diagnostic (the service died here).
- all tests passed, skipped or not run: PASS naming the DCGM version, level, tests and GPUs; every listed test
  not run: ERROR (retest).
- A document neither format allows (a field of the wrong type, non-finite numbers, nesting past the JSON
  decoder's depth) is a ParseError naming the field, so the probe reports it as such.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "dcgm"

CHECK = Check(
    name=NAME,
    claim="Where DCGM is installed, `dcgmi diag` (level 1; --dcgm-level 2|3 for the hardware runs) passes on every GPU",
    why="DCGM's diagnostic is NVIDIA's own verdict on a GPU: deployment problems (driver, libraries, persistence, "
    "pending row remaps, InfoROM) at level 1, memory, PCIe, NVLink and stress faults at levels 2-3; a GPU it asks "
    "to isolate or reset fails the job that lands on it.",
    fix="Follow the error's severity: ISOLATE: drain the node and RMA the GPU; RESET: drain, `nvidia-smi -r -i N` "
    "or reboot; CONFIG: fix the setting named (nvidia-smi -pm 1, ECC, fabric manager); TRIAGE: rerun "
    "`dcgmi diag -r 2` and read the error; no nv-hostengine: `systemctl start nvidia-dcgm`.",
    action="retest",
    reads="dcgmi diag -r LEVEL -j, where dcgmi is installed",
    takes="level 1 ~10-90 s, 2 ~2-7 min, 3 ~30 min; 0 without dcgmi",
    order=47,
)

#!/usr/bin/env bash
# Record, on a real NVIDIA GPU machine, the outputs preflight's GPU-side parsers and rules have only seen
# written by us (issue 12, issue 15), and check the NVML path against nvidia-smi there.
#
#   benchmarks/record_gpu_fixtures.sh [OUTDIR]        (default: ./gpu-capture-<hostname>-<date>)
#
# Run from the repository root with the project's interpreter (PYTHON=.venv/bin/python by default) on
# an H100/H200/B200 (or any NVIDIA) node. It writes, and prints a summary of:
#   nvidia_smi_q_x.xml           nvidia-smi -q -x (the gpu parser's input), with its wall time
#   nvidia_smi_q_i0.txt          nvidia-smi -q -i 0 (its "Fabric" section is compared with our struct)
#   fabric_struct_gpu0.txt       GPU 0's nvmlGpuFabricInfo_t read through preflight/probe/nvml.py's own structure
#   nvidia_smi_nvlink_status.txt nvidia-smi nvlink --status; nvlink_counts.txt: per-GPU counts through
#                                NVML and through the nvidia-smi parser, against the model's count
#   probe_nvml.json, probe_smi.json, probe.diff   gpu probe facts through NVML and with PREFLIGHT_NVML=off
#   driver_probe.json            driver probe facts (driver, CUDA, NCCL, torch versions)
#   systemctl_show_nvidia-fabricmanager.{stdout,stderr,rc}, systemctl_show_nvidia-imex.{...}
#   nv_fabricmanager_version.txt, proc_driver_version.txt, ldconfig_p.txt, lspci_nn.txt
#   timing.txt                   nvidia-smi -q -x and each probe against the probe budget
#   dcgmi_diag_r1.{json,rc}      dcgmi diag -r 1 -j where DCGM is installed (the dcgm parser's input), its exit status
#   aer/<bdf>.<file>             every GPU's and NIC's aer_dev_{correctable,nonfatal,fatal} (the pcie parser's input)
#   proc_self_limits.txt, dev_shm_df.txt, imex_channels.txt   what the limits probe reads
#   nvidia_smi_q_d_<SECTION>.txt  nvidia-smi -q -d ROW_REMAPPER / PAGE_RETIREMENT / ECC / COMPUTE / POWER /
#                                CLOCK / PIDS / PERFORMANCE (the health facts' -q -d layouts, issue 21)
#   nvidia_smi_nvlink_e.txt      nvidia-smi nvlink -e (NVLink error counters, beside the NVML field values)
#   health_verdicts.txt          gpu_memory, gpu_state, nvlink_errors, gpu_pcie judged on probe_nvml.json and
#                                probe_smi.json (the health facts in both probes' "health"; their window_s)
#   nvidia_smi_q_fabric.txt      every GPU's "Fabric" block of nvidia-smi -q (state, status, clique, cluster, health)
#   multicast.txt                per CUDA device, through libcuda (ctypes): CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (132,
#                                what NCCL asks before NVLS), HANDLE_TYPE_FABRIC_SUPPORTED (128, MNNVL), compute
#                                capability, and cuInit's wall/CPU time (is it cheap enough for the probe?)
#   nvls_verdict.txt             the nvls check on this node's gpu, fabric_manager, driver and nccl_env probe facts
#   nccl_nvls_info.txt           where nccl-tests' all_reduce_perf is on PATH: its NCCL_DEBUG=INFO NVLS lines
#   compute.json, compute_verdicts.txt   issue 36: the standard tier's compute phase on every local GPU (GEMM,
#                                copy, SDC digest, NVML samples under load) and gpu_compute's verdicts
#                                ("NVLS multicast support is (not) available", "Failed to bind ... NVLS")
#   compute_figures.txt          issue 36 item 3: per GPU the GEMM TFLOPS per dtype (both passes, the cold first
#                                chunk), copy GB/s, SDC digest and repeat agreement, from compute.json
#   compute_burnin.json, compute_burnin_verdicts.txt   a shortened burn-in (BURNIN_SECONDS per GEMM dtype,
#                                default 20; the all-reduce soak: 10 rounds of 1 s), its trend and soak verdicts
#   nvml_samples_rank<N>.csv     the NVML samples taken under that load (t, SM/memory MHz, W, C, clock-event
#                                reasons); the header: the GPU's slowdown/shutdown thresholds, the dtype windows
#   nvbandwidth.{txt,rc,stderr}, nvbandwidth_parsed.json   where nvbandwidth is on PATH: the nvbandwidth check's
#                                three testcases and what its parser makes of them (or its parse error)
#   dcgmi_diag_r3.{json,rc}      only with RECORD_DCGM_L3=1 (about 30 minutes): the burn-in's DCGM level 3
# The files are ours to commit as fixtures (tests/fixtures/<check>/, with a .json beside each naming the
# command, the machine and the expected facts); see tests/fixtures/README.md.
set -u
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${1:-gpu-capture-$(hostname -s)-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
PROPS=LoadState,ActiveState,SubState,Result,ExecMainCode,ExecMainStatus,UnitFileState,NRestarts

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

echo "# recording into $OUT" >&2
uname -a > "$OUT/uname.txt"

t0=$(now); nvidia-smi -q -x > "$OUT/nvidia_smi_q_x.xml" 2> "$OUT/nvidia_smi_q_x.stderr"; rc=$?; t1=$(now)
echo "nvidia-smi -q -x rc=$rc wall_s=$(took "$t0" "$t1")" | tee "$OUT/timing.txt"
nvidia-smi -q -i 0 > "$OUT/nvidia_smi_q_i0.txt" 2>&1
nvidia-smi nvlink --status > "$OUT/nvidia_smi_nvlink_status.txt" 2>&1; echo $? > "$OUT/nvidia_smi_nvlink_status.rc"
nvidia-smi topo -m > "$OUT/nvidia_smi_topo_m.txt" 2>&1
for section in ROW_REMAPPER PAGE_RETIREMENT ECC COMPUTE POWER CLOCK PIDS PERFORMANCE; do
  nvidia-smi -q -d "$section" > "$OUT/nvidia_smi_q_d_$section.txt" 2>&1
done
nvidia-smi nvlink -e > "$OUT/nvidia_smi_nvlink_e.txt" 2>&1; echo $? > "$OUT/nvidia_smi_nvlink_e.rc"
for unit in nvidia-fabricmanager nvidia-imex; do
  systemctl show "$unit" --property=$PROPS > "$OUT/systemctl_show_$unit.stdout" 2> "$OUT/systemctl_show_$unit.stderr"
  echo $? > "$OUT/systemctl_show_$unit.rc"
done
nv-fabricmanager --version > "$OUT/nv_fabricmanager_version.txt" 2>&1
cat /proc/driver/nvidia/version > "$OUT/proc_driver_version.txt" 2>&1
ldconfig -p > "$OUT/ldconfig_p.txt" 2>&1
lspci -nn > "$OUT/lspci_nn.txt" 2>&1
if command -v dcgmi > /dev/null; then
  t0=$(now); timeout 300 dcgmi diag -r 1 -j > "$OUT/dcgmi_diag_r1.json" 2>&1; echo $? > "$OUT/dcgmi_diag_r1.rc"; t1=$(now)
  echo "dcgmi diag -r 1 -j rc=$(cat "$OUT/dcgmi_diag_r1.rc") wall_s=$(took "$t0" "$t1")" | tee -a "$OUT/timing.txt"
fi
mkdir -p "$OUT/aer"
for dev in /sys/bus/pci/devices/*; do
  case "$(cat "$dev/class" 2>/dev/null)" in 0x0302*|0x0300*|0x02*) ;; *) continue ;; esac
  for f in aer_dev_correctable aer_dev_nonfatal aer_dev_fatal max_link_speed max_link_width; do
    [ -r "$dev/$f" ] && cat "$dev/$f" > "$OUT/aer/$(basename "$dev").$f"
  done
done
cat /proc/self/limits > "$OUT/proc_self_limits.txt"; df -B1 /dev/shm > "$OUT/dev_shm_df.txt" 2>&1
ls -l /dev/nvidia-caps-imex-channels > "$OUT/imex_channels.txt" 2>&1

# The Fabric section nvidia-smi prints for GPU 0, then the same structure read through our ctypes layout.
sed -n '/^ *Fabric$/,/^ *[A-Z][A-Za-z ]*$/p' "$OUT/nvidia_smi_q_i0.txt" > "$OUT/nvidia_smi_fabric_gpu0.txt"
"$PYTHON" - "$OUT" <<'EOF'
import ctypes, json, os, sys, time
out = sys.argv[1]
from preflight.checks import gpu
from preflight.probe import gpu_facts, gpu_nvml, nvidia_smi, nvml as bounded
nvml, why = bounded.load_nvml()
lines = []
if nvml is None:
    lines.append("NVML unavailable: %s" % why)
else:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    info = bounded.NvmlGpuFabricInfo()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.pointer(info))
        raw = bytes(bytearray(info.clusterUuid)).hex()
        lines += ["state %d (%s)" % (info.state, gpu_nvml.FABRIC_STATES.get(info.state, "not supported")),
                  "status %d (%s)" % (info.status, nvml.nvmlErrorString(info.status) if info.status else "Success"),
                  "cliqueId %d" % info.cliqueId, "clusterUuid %s" % raw, "sizeof %d" % ctypes.sizeof(info)]
    except nvml.NVMLError as exc:
        lines.append("nvmlDeviceGetGpuFabricInfo: %s" % exc)
    # NVLink counts: NVML per GPU against the model's count
    counts = []
    for i in range(nvml.nvmlDeviceGetCount()):
        d = nvml.nvmlDeviceGetHandleByIndex(i)
        g = gpu_facts.empty_gpu(i)
        name = bounded.text(nvml.nvmlDeviceGetName(d))
        links = gpu_nvml.nvml_links(nvml, g, d)
        counts.append("GPU %d %s: NVML %s, model %s, errors %s" % (i, name, links, gpu.model_nvlinks(name), g["query_errors"]))
    with open(os.path.join(out, "nvlink_counts.txt"), "w") as fh:
        fh.write("\n".join(counts) + "\n")
        text = open(os.path.join(out, "nvidia_smi_nvlink_status.txt")).read()
        fh.write("nvidia-smi parser: %r\n" % (nvidia_smi.read_nvlink_status(text),))
with open(os.path.join(out, "fabric_struct_gpu0.txt"), "w") as fh:
    fh.write("\n".join(lines) + "\n")
EOF

# The gpu probe through NVML and through nvidia-smi (PREFLIGHT_NVML=off), each timed, then diffed.
probe() {  # $1: output file; environment decides the source
  "$PYTHON" - "$1" <<'EOF'
import json, sys, time
from preflight.checks import gpu, driver
from preflight.probe.context import NodeContext
t = time.time(); facts = gpu.probe(NodeContext()); took = time.time() - t
json.dump(facts, open(sys.argv[1], "w"), indent=1, sort_keys=True)
print("gpu probe source=%s gpus=%d wall_s=%.3f" % (facts.get("source"), len(facts.get("gpus") or []), took))
EOF
}
probe "$OUT/probe_nvml.json" | tee -a "$OUT/timing.txt"
PREFLIGHT_NVML=off probe "$OUT/probe_smi.json" | tee -a "$OUT/timing.txt"
"$PYTHON" - "$OUT" <<'EOF' > "$OUT/probe.diff"
import json, os, sys
out = sys.argv[1]
a = json.load(open(os.path.join(out, "probe_nvml.json")))
b = json.load(open(os.path.join(out, "probe_smi.json")))
def walk(x, y, path):
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            walk(x.get(k, "<absent>"), y.get(k, "<absent>"), path + "." + k)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (p, q) in enumerate(zip(x, y)):
            walk(p, q, "%s[%d]" % (path, i))
    elif x != y:
        print("%s: nvml=%r smi=%r" % (path, x, y))
walk(a, b, "facts")
EOF
echo "probe facts differing between NVML and nvidia-smi: $(wc -l < "$OUT/probe.diff") (see probe.diff)"
"$PYTHON" - "$OUT/driver_probe.json" <<'EOF' | tee -a "$OUT/timing.txt"
import json, sys, time
from preflight.checks import driver
from preflight.probe.context import NodeContext
t = time.time(); facts = driver.probe(NodeContext()); took = time.time() - t
json.dump(facts, open(sys.argv[1], "w"), indent=1, sort_keys=True)
print("driver probe source=%s wall_s=%.3f" % (facts.get("driver_source"), took))
EOF
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/health_verdicts.txt"
import json, os, sys
from preflight.checks import gpu_memory, gpu_pcie, gpu_state, nvlink_errors
from preflight.model import ClusterView, NodeInfo
for name in ("probe_nvml.json", "probe_smi.json"):
    facts = json.load(open(os.path.join(sys.argv[1], name)))
    health = facts.get("health") or {}
    print("%s: health source=%s window_s=%s error=%s" % (name, health.get("source"), health.get("window_s"), health.get("error")))
    view = ClusterView([NodeInfo("this", "127.0.0.1", len(facts.get("gpus") or []) or 1)], {"this": {"gpu": facts}})
    for check in (gpu_memory, gpu_state, nvlink_errors, gpu_pcie):
        for f in check.rule(view):
            print("  %s %s: %s" % (f.status.value.upper(), f.check, f.message))
EOF
# NVLS (issue 21.5): the Fabric blocks, the multicast attribute NCCL reads, the nvls verdict, NCCL's own word.
nvidia-smi -q > "$OUT/nvidia_smi_q.txt" 2>&1
awk '/^GPU /{print} /^    Fabric$/{p=1; print; next} p && /^    [^ ]/{p=0} p' "$OUT/nvidia_smi_q.txt" > "$OUT/nvidia_smi_q_fabric.txt"
"$PYTHON" - <<'EOF' | tee "$OUT/multicast.txt"
import ctypes, resource, time
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    raise SystemExit("libcuda.so.1 not loadable: %s" % exc)
t, c = time.time(), resource.getrusage(resource.RUSAGE_SELF)
rc = cuda.cuInit(0)
c2 = resource.getrusage(resource.RUSAGE_SELF)
print("cuInit rc=%d wall_s=%.3f cpu_s=%.3f" % (rc, time.time() - t, c2.ru_utime - c.ru_utime + c2.ru_stime - c.ru_stime))
count = ctypes.c_int(0)
print("cuDeviceGetCount rc=%d count=%d" % (cuda.cuDeviceGetCount(ctypes.byref(count)), count.value))
ver = ctypes.c_int(0)
cuda.cuDriverGetVersion(ctypes.byref(ver))
print("cuDriverGetVersion %d" % ver.value)
for i in range(count.value):
    dev = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    values = []
    for name, attr in (("multicast", 132), ("fabric_handle", 128), ("cc_major", 75), ("cc_minor", 76)):
        v = ctypes.c_int(-1)
        r = cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
        values.append("%s=%d%s" % (name, v.value, "" if r == 0 else " (rc %d)" % r))
    print("device %d: %s" % (i, " ".join(values)))
EOF
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/nvls_verdict.txt"
import json, os, sys
from preflight.checks import fabric_manager, nccl_env, nvls
from preflight.model import ClusterView, NodeInfo
from preflight.probe.context import NodeContext
out = sys.argv[1]
facts = {"gpu": json.load(open(os.path.join(out, "probe_nvml.json"))),
         "driver": json.load(open(os.path.join(out, "driver_probe.json"))),
         "fabric_manager": fabric_manager.probe(NodeContext()), "nccl_env": nccl_env.probe(NodeContext())}
json.dump(facts["fabric_manager"], open(os.path.join(out, "fabric_manager_probe.json"), "w"), indent=1, sort_keys=True)
view = ClusterView([NodeInfo("this", "127.0.0.1", len(facts["gpu"].get("gpus") or []) or 1)], {"this": facts})
for f in nvls.rule(view):
    print("%s nvls: %s" % (f.status.value.upper(), f.message))
EOF
if command -v all_reduce_perf > /dev/null; then
  NCCL_DEBUG=INFO timeout 120 all_reduce_perf -b 8M -e 64M -g "$(nvidia-smi -L | wc -l)" 2>&1 \
    | grep -E "NCCL version|NVLS|nvls|Multicast" > "$OUT/nccl_nvls_info.txt"
  echo "all_reduce_perf NVLS lines: $(wc -l < "$OUT/nccl_nvls_info.txt") (nccl_nvls_info.txt)"
fi
# issue 36: the standard tier's compute phase on every local GPU (nccl, one node, the all-reduce's own ranks):
# compute.json (per rank: GEMM bf16/fp8 TFLOPS, copy GB/s, SDC digest, NVML samples under load) and
# compute_verdicts.txt (gpu_compute on it, with the datasheet-peak line)
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/compute_verdicts.txt"
import json, os, subprocess, sys
from preflight.checks.allreduce import tiers
from preflight.checks.gpu_compute import rule as gc
from preflight.model import ClusterView, NodeInfo
from preflight.probe import bench_agent
out = sys.argv[1]
gpus = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines())
spec = tiers.compute_spec("standard", "nccl")
cfg = {"backend": "nccl", "master_addr": "127.0.0.1", "master_port": 29533, "world_size": gpus, "node_rank": 0,
       "local_world_size": gpus, "sizes": [1 << 20], "warmup": 1, "iters": 2, "compute": spec,
       "deadlines": {"init_s": 120, "op_s": 60, "total_s": 300}}
doc = bench_agent.run(cfg)
json.dump(doc, open(os.path.join(out, "compute.json"), "w"), indent=1, sort_keys=True)
for r in doc["ranks"]:
    c = r.get("compute") or {}
    shown = {k: c.get(k) for k in ("device", "gemm", "copy", "sdc", "wall_s", "nvml_error")}
    print("rank %s %s: %s" % (r["rank"], r["status"], json.dumps(shown) if c else r.get("compute_error") or r.get("error")))
view = ClusterView([NodeInfo("this", "127.0.0.1", gpus, True, {})], {"this": {"allreduce": doc}}, {},
                   {"allreduce": {"backend": "nccl", "nodes": ["this"], "compute": spec}}, {})
for f in gc.rule(view):
    print("%s gpu_compute: %s" % (f.status.value.upper(), f.message))
EOF
# issue 36 item 3: the standard run's figures in one table, then a shortened burn-in with its NVML samples
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/compute_figures.txt"
import json, os, sys
doc = json.load(open(os.path.join(sys.argv[1], "compute.json")))
for r in doc["ranks"]:
    c = r.get("compute") or {}
    gemm = " ".join("%s %s TFLOPS (passes %s, first %s)" % (d, g.get("tflops"), g.get("passes"), g.get("first_tflops"))
                    if "tflops" in g else "%s error %s" % (d, g.get("error")) for d, g in sorted((c.get("gemm") or {}).items()))
    sdc = c.get("sdc") or {}
    print("GPU %s (%s): %s; copy %s GB/s; SDC %s repeat_agree=%s; wall %s s; %d NVML samples" % (
        r.get("local_rank"), c.get("device"), gemm or "no GEMM", (c.get("copy") or {}).get("gbps"), sdc.get("digest"),
        sdc.get("repeat_agree"), c.get("wall_s"), len(c.get("nvml") or [])))
EOF
"$PYTHON" - "$OUT" "${BURNIN_SECONDS:-20}" <<'EOF' | tee "$OUT/compute_burnin_verdicts.txt"
import csv, json, os, subprocess, sys
from preflight.checks.allreduce import soak, tiers
from preflight.checks.gpu_compute import rule as gc
from preflight.model import ClusterView, NodeInfo
from preflight.probe import bench_agent
out, seconds = sys.argv[1], float(sys.argv[2])
gpus = len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines())
spec = dict(tiers.compute_spec("burn-in", "nccl"), seconds=seconds, soak_rounds=10, soak_round_s=1.0)
cfg = {"backend": "nccl", "master_addr": "127.0.0.1", "master_port": 29534, "world_size": gpus, "node_rank": 0,
       "local_world_size": gpus, "sizes": [1 << 20], "warmup": 1, "iters": 2, "compute": spec,
       "deadlines": {"init_s": 120, "op_s": 4 * seconds + 60, "total_s": 6 * seconds + 300}}
doc = bench_agent.run(cfg)
json.dump(doc, open(os.path.join(out, "compute_burnin.json"), "w"), indent=1, sort_keys=True)
for r in doc["ranks"]:
    c = r.get("compute") or {}
    with open(os.path.join(out, "nvml_samples_rank%s.csv" % r["rank"]), "w") as fh:
        fh.write("# %s limits %s windows %s nvml_error %s\n" % (c.get("device"), json.dumps(c.get("nvml_limits")),
                                                              json.dumps(c.get("windows")), c.get("nvml_error")))
        w = csv.writer(fh)
        w.writerow(["t", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons"])
        for s in c.get("nvml") or []:
            w.writerow([s.get(k) for k in ("t", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons")])
    print("rank %s %s: soak %s" % (r["rank"], r["status"], json.dumps(c.get("soak")) if c else r.get("compute_error")))
view = ClusterView([NodeInfo("this", "127.0.0.1", gpus, True, {})], {"this": {"allreduce": doc}}, {},
                   {"allreduce": {"backend": "nccl", "nodes": ["this"], "compute": spec}}, {})
for f in gc.rule(view) + soak.soak_findings(view):
    print("%s %s: %s" % (f.status.value.upper(), f.check, f.message))
EOF
if command -v nvbandwidth > /dev/null; then
  t0=$(now)
  timeout 600 nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce device_to_device_memcpy_read_ce \
    > "$OUT/nvbandwidth.txt" 2> "$OUT/nvbandwidth.stderr"; echo $? > "$OUT/nvbandwidth.rc"; t1=$(now)
  echo "nvbandwidth rc=$(cat "$OUT/nvbandwidth.rc") wall_s=$(took "$t0" "$t1")" | tee -a "$OUT/timing.txt"
  "$PYTHON" - "$OUT" <<'EOF'
import json, os, sys
from preflight.checks.nvbandwidth.probe import parse_nvbandwidth
from preflight.model import ParseError
out = sys.argv[1]
try:
    parsed = parse_nvbandwidth(open(os.path.join(out, "nvbandwidth.txt")).read())
except ParseError as exc:
    parsed = {"parse_error": str(exc)}
json.dump(parsed, open(os.path.join(out, "nvbandwidth_parsed.json"), "w"), indent=1, sort_keys=True)
print("nvbandwidth parsed: %s" % (parsed.get("parse_error") or ", ".join(sorted(parsed["tests"]))))
EOF
fi
if [ "${RECORD_DCGM_L3:-0}" = 1 ] && command -v dcgmi > /dev/null; then
  t0=$(now); timeout 3000 dcgmi diag -r 3 -j > "$OUT/dcgmi_diag_r3.json" 2>&1; echo $? > "$OUT/dcgmi_diag_r3.rc"; t1=$(now)
  echo "dcgmi diag -r 3 -j rc=$(cat "$OUT/dcgmi_diag_r3.rc") wall_s=$(took "$t0" "$t1")" | tee -a "$OUT/timing.txt"
fi
"$PYTHON" -c "from preflight.checks import gpu; print('probe budget: probe_timeout_s 30 (runner default), NVML_BUDGET_S %g, nvidia-smi -q -x timeout 60' % gpu.NVML_BUDGET_S)" | tee -a "$OUT/timing.txt"
echo "--- fabric: nvidia-smi -q -i 0 vs our struct"; cat "$OUT/nvidia_smi_fabric_gpu0.txt" "$OUT/fabric_struct_gpu0.txt"
echo "--- NVLink"; cat "$OUT/nvlink_counts.txt" 2>/dev/null
echo "--- NVLS"; cat "$OUT/multicast.txt" "$OUT/nvls_verdict.txt" 2>/dev/null
echo "# done: $OUT" >&2

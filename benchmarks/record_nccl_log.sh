#!/usr/bin/env bash
# Record a real NCCL_DEBUG=INFO log on a GPU machine and keep it as a parser fixture.
#
# Run on a machine with NVIDIA GPUs, the driver loaded, and torch built with CUDA (the interpreter the
# inventory's `python:` names). No network access is needed. It runs preflight's own bench worker as
# the bench agent does (one rank per GPU, NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV), then:
#   1. one rank alone (the issue's "one rank under NCCL_DEBUG=INFO"): init, network selection, GDR lines;
#   2. every local GPU (NVLink/NVSwitch or PCIe P2P: the intra-node transports);
#   3. every local GPU with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (traffic through the NICs, GDR lines);
# and writes each rank-0 log to tests/fixtures/allreduce/recorded_<gpu>_<case>.log with a fixture
# JSON whose "expected" is what parse_nccl_log made of it (review it by eye before committing), plus
# nvidia-smi -q -x to tests/fixtures/gpu/recorded_<gpu>.xml for the gpu parsers.
#
#   PYTHON=/opt/venv/bin/python benchmarks/record_nccl_log.sh            # from the repository root
set -euo pipefail
PYTHON=${PYTHON:-python3}
OUT=${OUT:-tests/fixtures/allreduce}
NGPU=$(nvidia-smi -L | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cs 'A-Za-z0-9' '_' | sed 's/_$//')
mkdir -p "$OUT" tests/fixtures/gpu
nvidia-smi -q -x > "tests/fixtures/gpu/recorded_${GPU}.xml"

run_case() {  # name local_ranks extra-env...
  local name=$1 ranks=$2; shift 2
  local port=$((29500 + RANDOM % 1000))
  env "$@" "$PYTHON" - "$ranks" "$port" "$OUT/recorded_${GPU}_${name}" "$@" <<'PY'
import json, sys
from preflight.probe import bench_agent
from preflight.checks import allreduce
ranks, port, stem = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = {"backend": "nccl", "master_addr": "127.0.0.1", "master_port": port, "world_size": ranks,
       "node_rank": 0, "local_world_size": ranks, "env": {}, "sizes": [1 << 20, 1 << 30],
       "warmup": 2, "iters": 5, "deadlines": {"init_s": 120, "op_s": 60, "total_s": 300}}
doc = bench_agent.run(cfg)
rank0 = doc["ranks"][0]
print(json.dumps({k: rank0.get(k) for k in ("status", "error", "init_s")}))
log = rank0.get("nccl_log") or ""
open(stem + ".log", "w").write(log + "\n")
fixture = {"parser": "parse_nccl_log", "command": "bench_agent nccl, %d local rank(s), env %s" % (
               ranks, " ".join(a for a in sys.argv[4:])), "source": "recorded by benchmarks/record_nccl_log.sh",
           "input": stem.rsplit("/", 1)[1] + ".log"}
try:
    fixture["expected"] = allreduce.parse_nccl_log(log)
except Exception as exc:
    fixture["error"] = str(exc)[:60]
open(stem + ".json", "w").write(json.dumps(fixture, indent=1) + "\n")
print(json.dumps(fixture.get("expected") or fixture.get("error"), indent=1))
print("busbw per size:", [(s["bytes"], s["time_s"]) for s in rank0.get("sizes") or []])
PY
}

run_case one_rank 1
run_case all_gpus "$NGPU"
run_case via_nic "$NGPU" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
echo "fixtures written under $OUT (recorded_${GPU}_*); review, then commit with their source filled in"

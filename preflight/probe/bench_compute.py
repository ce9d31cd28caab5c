"""The compute tier in the all-reduce's rank processes: dense GEMMs, a device-memory copy, the SDC digest, NVML under load.

bench_worker runs compute_phase() after its sweep when its config carries "compute" (preflight
--tier standard or burn-in), with the torch it already imported: no second launch, no second import.
The agent sends this module's source ahead of the worker's program (bench_agent.worker_source); the
controller's rule is preflight.checks.gpu_compute.

Standard library only at import (torch is passed in), Python 3.8 compatible.

What a GPU run does and what is only proven on a CPU: the fp32 GEMM, the copy and the SDC digest run in
the CPU tests (gloo); the bf16/fp8 GEMMs, CUDA-event timing, the TF32 switch and the NVML sampler's
handle lookup run only on a GPU (sample_nvml itself is tested with an NVML double in pynvml's layout).
"""

import hashlib
import os
import re
import statistics
import threading
import time

#: The SDC computation's seed: the same on every rank, every node, every run (a digest is comparable
#: across runs of the same model, driver and torch).
SDC_SEED = 20240917


def compute_phase(torch, dist, device, gpu, spec, emit):
    """The compute tier (config "compute"), in the sweep's own processes after it: a dense GEMM per fast
    dtype, a device-memory copy and the SDC computation, with NVML sampled on a GPU while they run.

    spec: {"seconds": s per GEMM dtype, "gemm_n": n, "copy_bytes": b, "sdc_n": n, "sdc_steps": k}.
    Every rank starts at once (a barrier): the GPUs of a node load the power and cooling together, as a
    job does. Returns the "compute" event's fields: {"device", "versions", "gemm": {dtype: {"tflops",
    "first_tflops", "n", "iters", "s"}}, "copy": {"gbps", "bytes"}, "sdc": {"digest", "repeat_agree",
    "what"}, "nvml": [samples] | null, "nvml_error", "wall_s"}.
    """
    dist.barrier()
    t0 = time.monotonic()
    sampler = _NvmlSampler(torch, device, float(spec.get("sample_s", 0.2))) if gpu else None
    out = {"device": _device_name(torch, device, gpu), "versions": _versions(torch, gpu), "gemm": {}, "windows": {}}
    if sampler is not None:
        sampler.start()
    try:
        for dtype in _fast_dtypes(torch, device, gpu):
            began = round(time.time(), 3)  # the NVML samples' clock: the soak's trend is judged per dtype
            try:
                out["gemm"][dtype] = _gemm(torch, device, gpu, dtype, int(spec.get("gemm_n", 4096)),
                                           float(spec.get("seconds", 2.0)))
            except (RuntimeError, TypeError) as exc:
                if dtype != "fp8":  # bf16/fp32 failing is the GPU's (or the node's) fault: the phase fails
                    raise
                # torch._scaled_mm is private and its signature moved between releases: recorded, not judged
                out["gemm"][dtype] = {"error": "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:300])}
            out["windows"][dtype] = [began, round(time.time(), 3)]
            emit("compute_step", what="gemm " + dtype)
        out["copy"] = _copy(torch, device, gpu, int(spec.get("copy_bytes", 1 << 30)))
        emit("compute_step", what="copy")
        out["sdc"] = _sdc(torch, device, gpu, int(spec.get("sdc_n", 512)), int(spec.get("sdc_steps", 8)))
        if spec.get("soak_rounds"):  # burn-in: the all-reduce again, round after round (allreduce/soak.py)
            out["soak"] = allreduce_soak(torch, dist, device, spec, emit)
    finally:
        if sampler is not None:
            sampler.stop.set()
            sampler.join(5.0)
    if sampler is not None:
        out["nvml"], out["nvml_error"], out["nvml_limits"] = sampler.samples, sampler.error, sampler.limits
    dist.barrier()
    out["wall_s"] = round(time.monotonic() - t0, 3)  # what the phase added to the run, on this rank
    return out


def _device_name(torch, device, gpu):
    if gpu:
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (os.uname().machine or "unknown")


def _versions(torch, gpu):
    """What a digest depends on besides the part: torch, and on a GPU CUDA and the driver (cuBLAS picks
    kernels by all of them)."""
    out = {"torch": str(torch.__version__).split("+")[0]}
    if not gpu:  # BLAS blocks a CPU GEMM by its thread count: another count, another (right) digest
        out["threads"] = torch.get_num_threads()
    if gpu:
        out["cuda"] = torch.version.cuda
        out["driver"] = _driver_version()
    return out


def _driver_version():
    try:
        with open("/proc/driver/nvidia/version") as fh:
            found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", fh.read())
        return found.group(1) if found else None
    except OSError:
        return None


def _fast_dtypes(torch, device, gpu):
    """The dtypes the part runs dense GEMMs fast in: fp32 on a CPU; bf16 on a GPU (Ampere and later),
    fp16 before it, plus fp8 where the tensor cores have it (compute capability 8.9 and later)."""
    if not gpu:
        return ["fp32"]
    major, minor = torch.cuda.get_device_capability(device)
    out = ["bf16"] if major >= 8 else ["fp16"]
    if (major, minor) >= (8, 9) and hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm"):
        out.append("fp8")
    return out


def _matmul_fn(torch, device, dtype, n):
    """A closure that runs one n x n x n GEMM in dtype (fp8: e4m3 inputs, bf16 out, unit scales)."""
    a = torch.randn(n, n, device=device)  # made where it runs: the values do not matter here, the SDC's do
    b = torch.randn(n, n, device=device)
    if dtype == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), dtype=torch.float32, device=device)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    kind = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    a, b = a.to(kind), b.to(kind)
    return lambda: torch.matmul(a, b)


def _timed(torch, gpu, fn, iters):
    """Seconds for iters calls of fn (CUDA events on a GPU, perf_counter on a CPU)."""
    if gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return time.perf_counter() - t0


def _gemm(torch, device, gpu, dtype, n, seconds):
    """Dense GEMM throughput for about `seconds`, in chunks: the first chunk (cold clocks), then two
    passes (the medians of the first and second half of the rest: steady clocks, where a power or thermal
    cap shows; the second pass confirms the first, so one noisy moment names no GPU)."""
    fn = _matmul_fn(torch, device, dtype, n)
    one = max(_timed(torch, gpu, fn, 1), 1e-6)
    per_chunk = max(1, int(seconds / 8 / one))
    chunks, spent = [], 0.0
    while spent < seconds or len(chunks) < 5:
        took = _timed(torch, gpu, fn, per_chunk)
        chunks.append(2.0 * n ** 3 * per_chunk / max(took, 1e-9) / 1e12)
        spent += took
    half = 1 + (len(chunks) - 1) // 2
    passes = [round(statistics.median(chunks[1:half]), 4), round(statistics.median(chunks[half:]), 4)]
    return {"tflops": round(statistics.median(chunks[1:]), 4), "passes": passes, "first_tflops": round(chunks[0], 4),
            "n": n, "iters": per_chunk * len(chunks), "s": round(spent, 3)}


def _copy(torch, device, gpu, nbytes):
    """Device-memory copy bandwidth: GB/s of bytes read plus written, median of 10 copies."""
    count = max(1, nbytes // 4)
    src = torch.ones(count, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):  # untimed: first touches of both buffers (page faults on a CPU, allocation on a GPU)
        dst.copy_(src)
    times = [_timed(torch, gpu, lambda: dst.copy_(src), 1) for _ in range(10)]
    ok = bool(dst.eq(1.0).all().item())
    return {"gbps": round(2.0 * count * 4 / statistics.median(times) / 1e9, 3), "bytes": count * 4, "ok": ok}


def _sdc(torch, device, gpu, n, steps):
    """The silent-data-corruption computation: from fixed seeded inputs (made on the CPU, so identical on
    every rank), `steps` chained fp32 GEMMs with tanh between them (on a GPU: TF32 off, deterministic
    algorithms on); its sha256 digest must equal every other rank's of the same part, driver and torch. Run twice: a
    part that disagrees with itself is named even when it is alone of its kind."""
    gen = torch.Generator(device="cpu").manual_seed(SDC_SEED)
    x0 = torch.randn(n, n, generator=gen)
    ws = [torch.randn(n, n, generator=gen) / (n ** 0.5) for _ in range(steps)]
    tf32 = torch.backends.cuda.matmul.allow_tf32 if gpu else None
    deterministic = torch.are_deterministic_algorithms_enabled() if gpu else None
    digests = []
    try:
        if gpu:  # on a CPU matmul is deterministic for a fixed shape and thread count (in the digest's
            # kind), and the switch costs seconds of imports there
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.use_deterministic_algorithms(True)
        for _ in range(2):
            x = x0.to(device)
            for w in ws:
                x = torch.tanh(torch.matmul(x, w.to(device)))
            digests.append(hashlib.sha256(_raw_bytes(torch, x.cpu().contiguous())).hexdigest()[:32])
    finally:
        if gpu:
            torch.use_deterministic_algorithms(deterministic)
            torch.backends.cuda.matmul.allow_tf32 = tf32
    return {"digest": digests[0], "repeat_agree": digests[0] == digests[1],
            "what": "%d chained %dx%d fp32 GEMMs + tanh, seed %d, TF32 off" % (steps, n, n, SDC_SEED)}


def allreduce_soak(torch, dist, device, spec, emit):
    """The burn-in's all-reduce soak: `soak_rounds` rounds of about `soak_round_s` each, of one
    `soak_bytes` all-reduce repeated. Every rank does the same count: each round's count comes from the
    previous round's pace on the slowest rank (a MAX all-reduce), so a fabric that slows down shortens the
    next round instead of running it past the agent's op deadline. Returns {"bytes", "iters": [per round],
    "rounds": [the slowest rank's seconds per all-reduce, per round], "ok", "world"}: every rank holds the
    same figures; ok: a last reduction of (rank + 1) summed right on this rank."""
    count = max(1, int(spec.get("soak_bytes", 1 << 20)) // 4)
    buf = torch.ones(count, dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # untimed: the path is set up
    per_op = _slowest(torch, dist, device, _timed_allreduce(torch, dist, buf, device, 3) / 3)
    rounds, iters = [], []
    for _ in range(int(spec["soak_rounds"])):
        n = max(1, int(float(spec.get("soak_round_s", 1.0)) / max(per_op, 1e-6)))
        per_op = _slowest(torch, dist, device, _timed_allreduce(torch, dist, buf, device, n) / n)
        rounds.append(round(per_op, 6))
        iters.append(n)
        emit("compute_step", what="allreduce soak round %d" % len(rounds))
    world = dist.get_world_size()
    buf.fill_(float(dist.get_rank() + 1))
    dist.all_reduce(buf)
    ok = bool(buf.eq(float(world * (world + 1) // 2)).all().item())
    return {"bytes": count * 4, "iters": iters, "rounds": rounds, "ok": ok, "world": world}


def _slowest(torch, dist, device, seconds):
    """The largest of every rank's `seconds` (a MAX all-reduce): what the collective's pace is."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timed_allreduce(torch, dist, buf, device, iters):
    """Seconds for iters blocking all-reduces of buf (synchronised on a GPU before the clock is read)."""
    gpu = buf.is_cuda
    if gpu:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if gpu:
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _raw_bytes(torch, t):
    """A contiguous CPU tensor's bytes, read in place (t.numpy() would import numpy: seconds on a loaded node)."""
    import ctypes

    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


class _NvmlSampler(threading.Thread):
    """Samples this rank's GPU through NVML (pynvml, when the interpreter has it) while the compute
    phase runs: SM clock, memory clock, power, temperature and the clock-event (throttle) reasons."""

    def __init__(self, torch, device, every):
        threading.Thread.__init__(self, name="nvml-sampler", daemon=True)
        self.every, self.stop, self.samples, self.error, self.limits = every, threading.Event(), [], None, {}
        self.bus_id, self.index = None, device.index
        props = torch.cuda.get_device_properties(device)
        if hasattr(props, "pci_bus_id"):  # NVML's "domain:bus:device.function"; torch gives the numbers
            self.bus_id = "%08X:%02X:%02X.0" % (getattr(props, "pci_domain_id", 0), props.pci_bus_id,
                                                getattr(props, "pci_device_id", 0))
        # else (older torch): the CUDA index is taken as NVML's, true only with CUDA_DEVICE_ORDER=PCI_BUS_ID
        # and no CUDA_VISIBLE_DEVICES remapping

    def run(self):
        try:
            import pynvml
        except ImportError as exc:
            self.error = "no pynvml: %s" % exc
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - reported in the result, the load still runs
            self.error = "nvmlInit: %s" % exc
            return
        try:
            handle = self._handle(pynvml)
            self.limits = temperature_limits(pynvml, handle)
            self.samples.extend(sample_nvml(pynvml, handle, self.stop, self.every))
        except Exception as exc:  # noqa: BLE001 - as above
            self.error = "%s: %s" % (type(exc).__name__, exc)
        finally:
            pynvml.nvmlShutdown()

    def _handle(self, nvml):
        if self.bus_id:
            return nvml.nvmlDeviceGetHandleByPciBusId(self.bus_id)
        return nvml.nvmlDeviceGetHandleByIndex(self.index)


def temperature_limits(nvml, handle):
    """{"slowdown_c", "shutdown_c"}: the GPU's own thresholds (nvmlDeviceGetTemperatureThreshold), the
    burn-in's thermal trend is judged against; a value the part does not report is None."""
    out = {}
    for key, kind in (("slowdown_c", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                      ("shutdown_c", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN")):
        try:
            out[key] = int(nvml.nvmlDeviceGetTemperatureThreshold(handle, getattr(nvml, kind)))
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported on parts without it: the trend goes unjudged
            out[key] = None
    return out


def sample_nvml(nvml, handle, stop, every, limit=600):
    """NVML readings of one GPU every `every` seconds until stop is set (at most `limit` of them):
    [{"t", "sm_mhz", "mem_mhz", "power_w", "temp_c", "reasons"}], reasons the clock-event bitmask
    (nvmlDeviceGetCurrentClocksEventReasons; ...ThrottleReasons before nvidia-ml-py 12.535)."""
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    out = []
    while len(out) < limit:
        out.append({"t": round(time.time(), 3),
                    "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                    "mem_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
                    "power_w": round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),
                    "temp_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                    "reasons": int(reasons(handle))})
        if stop.wait(every):
            break
    return out

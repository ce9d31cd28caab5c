#!/usr/bin/env python3
"""How long a node's result takes to come back, by its size, over SSH and through srun, side by side.

One SimCluster node with a real sshd and a real Slurm (tests/sim). Its kernel log is made SIZE bytes of
messages that do not compress well, and the xid probe runs with capture, so the node's result document
carries the whole log back (as `preflight check --capture` does on a node with a long log). Each size is
run over SSH (transport.pool.SessionPool) and through srun (slurm.fleet.SlurmFleet, one step), interleaved,
`--repeats` times; the median wall time of each is printed with the ratio srun/SSH, and each run must
bring the log back whole (its SHA-256 is compared), else the script exits 1.

Then, without any transport, the time bundle.ResultReader takes to read the same node output fed the
way each transport feeds it (SSH: 64 KB reads; srun: one line at a time), per MB: a reader linear in the
result's size shows the same seconds per MB at every size.

    sudo .venv/bin/python benchmarks/result_size.py --sizes 1,4,10 --repeats 3
    PREFLIGHT_REPO=/path/to/other/tree sudo -E .venv/bin/python benchmarks/result_size.py   # another build

Read ratios from the same run: the node, sshd, slurmd and the controller share this machine's cores.
Needs root (network namespaces), iproute2, OpenSSH, slurmctld/slurmd/slurm-client/munge.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import statistics
import sys
import time

REPO = os.environ.get("PREFLIGHT_REPO") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

CONFIG = {"mode": "probe", "checks": {"xid": {}}, "probe_timeout_s": 120, "capture": True}


def kernel_log(size: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    out, total, ts = [], 0, 1.0
    while total < size:
        ts += rng.random()
        line = "[%12.6f] n001 kernel: usb 1-1: serial %s\n" % (ts, base64.b64encode(rng.getrandbits(576).to_bytes(72, "little")).decode())
        out.append(line)
        total += len(line)
    return "".join(out)


def captured(result) -> str:
    events = result["capture"]["xid"]["events"]
    return next(e["stdout"] for e in events if e["kind"] == "run" and e["argv"][0] == "journalctl").rstrip("\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,4,10", help="result sizes in MB (default 1,4,10)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]

    from preflight import inventory
    from preflight.slurm import fleet as slurm
    from preflight.transport import pool as ssh_pool
    from tests.sim.cluster import SimCluster

    failed = 0
    rows = []
    with SimCluster(1, slurm=True) as cluster:
        node = cluster.nodes[0]
        os.makedirs(os.path.join(node.sys_dir, "module", "nvidia"), exist_ok=True)
        path = os.path.join(node.dir, "kernel.log")
        node.install_executable("journalctl", "#!/bin/sh\nexec cat %s\n" % path)
        os.environ.update(cluster.slurm.env())
        spec = inventory.load(cluster.inventory(command_timeout=300)).nodes[0]
        with cluster.in_ctl():
            alloc = slurm.allocate(nodelist=node.name)
            srun = slurm.SlurmFleet(slurm.specs_for(alloc), alloc)
            ssh = ssh_pool.SessionPool([spec])
            try:
                for size in sizes:
                    text = kernel_log(int(size * 1e6))
                    with open(path, "w") as fh:
                        fh.write(text)
                    want = hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
                    times = {"ssh": [], "srun": []}
                    for _ in range(args.repeats):
                        for name, fleet, who in (("ssh", ssh, spec.name), ("srun", srun, node.name)):
                            started = time.monotonic()
                            outcome = fleet.run({who: CONFIG}, lambda s: 300)[who]
                            times[name].append(time.monotonic() - started)
                            if outcome.failure is not None or hashlib.sha256(captured(outcome.result).encode()).hexdigest() != want:
                                failed += 1
                                print("  %s %.1f MB: %s" % (name, size, outcome.failure or "log came back changed"))
                    ssh_s, srun_s = statistics.median(times["ssh"]), statistics.median(times["srun"])
                    rows.append((size, ssh_s, srun_s))
                    print("%5.1f MB result   ssh %6.2f s   srun %6.2f s   srun/ssh %.2f" % (size, ssh_s, srun_s, srun_s / ssh_s), flush=True)
            finally:
                ssh.close()
                srun.close()
    print()
    reader_alone(sizes)
    return 1 if failed else 0


def reader_alone(sizes) -> None:
    """The reader by itself on real bundle output, fed as each transport feeds it."""
    import signal
    import subprocess
    import tempfile

    from preflight.transport import bundle

    reader_class = getattr(bundle, "ResultReader", None)
    if reader_class is None:
        print("reader alone: this build has no bundle.ResultReader")
        return
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "klog"), "w") as fh:
                fh.write(kernel_log(int(size * 1e6)))
            os.makedirs(os.path.join(tmp, "bin"))
            os.makedirs(os.path.join(tmp, "sys", "module", "nvidia"))
            with open(os.path.join(tmp, "bin", "journalctl"), "w") as fh:
                fh.write("#!/bin/sh\nexec cat %s/klog\n" % tmp)
            os.chmod(os.path.join(tmp, "bin", "journalctl"), 0o755)
            env = dict(os.environ, PATH="%s/bin:%s" % (tmp, os.environ["PATH"]), PREFLIGHT_SYSFS_ROOT=tmp + "/sys")
            outputs = {}
            for name, line_max in (("ssh", None), ("srun", 900)):
                config = dict(CONFIG, deadline_s=300, **({"line_max": line_max} if line_max else {}))
                proc = subprocess.Popen([sys.executable, "-c", bundle.BOOTSTRAP], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
                proc.stdin.write(bundle.stdin_payload(config))
                proc.stdin.flush()
                outputs[name] = proc.stdout.read()
                proc.stdin.close()
                proc.wait()
        for name, out in outputs.items():
            pieces = [out[i:i + 65536] for i in range(0, len(out), 65536)] if name == "ssh" else \
                [line + b"\n" for line in out.split(b"\n")[:-1]]
            reader = reader_class()
            started = time.process_time()
            for piece in pieces:
                reader.feed(piece)
            spent = time.process_time() - started
            assert reader.result is not None
            print("reader alone, %5.1f MB result, fed as %-4s: %5.2f CPU s (%.3f s per MB; %.1f MB on the wire)"
                  % (size, name, spent, spent / size, len(out) / 1e6))


if __name__ == "__main__":
    sys.exit(main())

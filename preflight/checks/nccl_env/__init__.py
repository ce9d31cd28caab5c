"""nccl_env: the NCCL settings the nodes would give a job are the same everywhere and agree with preflight's env.

A job launched over SSH or srun gets the node's non-interactive environment (the probe's own
os.environ: it is started the same way), and NCCL then reads its configuration files. The order and
the format are NCCL's own (src/misc/param.cc, initEnvFunc/setEnvFile, NCCL 2.19 and later):

1. the environment wins: setEnvFile never overrides a variable that is already set;
2. the file NCCL_CONF_FILE names, or, when it is unset or empty, ~/.nccl.conf of the user running the
   job: found through the account's home directory (getpwuid(getuid())->pw_dir) before NCCL 2.30.3, and
   through $HOME from 2.30.3 on. The probe reads both when they differ; the rule takes the one the node's
   NCCL version reads (the driver check's facts; version unknown: the account's home directory);
3. /etc/nccl.conf.

A conf-file line is `KEY=VALUE`: a line starting with '#' is a comment, a line without '=' is
skipped, the key is everything before the first '=' and the value everything after it, verbatim (no
quotes removed, no spaces trimmed). So `export NCCL_DEBUG=INFO` sets a variable named
"export NCCL_DEBUG", i.e. nothing NCCL reads: such lines are reported (WARN).

Files are read under PREFLIGHT_HOST_ROOT when set (see preflight.probe.context).

Facts: {"environ": {key: value}, "user": str, "home": str|None (the account's), "home_env": str|None ($HOME),
        "files": [{"path": "/etc/nccl.conf", "role": "system"|"user", "exists": bool,
                   "via": ["NCCL_CONF_FILE"] | ["passwd", "HOME"] (user files: the lookups that reach it),
                   "error": str|None, "entries": [{"key", "value", "line"}], "malformed": [{"line", "text"}]}]}

Rule decisions:
- a setting that contradicts what preflight recommends (preflight.derived.ncclenv.derive over the same facts)
  FAILs, naming the file and line: NCCL_SOCKET_IFNAME that does not select the data interface
  (NCCL's matching: '^' excludes, '=' exact names, else prefixes) or also selects another interface with
  an address (NCCL's bootstrap takes the first match in interface order and its socket transport spreads
  over every match: '=eth0,eth1' on a node whose eth0 is the management port), GLOO_SOCKET_IFNAME other than the
  data interface, NCCL_IB_HCA that leaves out a usable HCA port, NCCL_IB_GID_INDEX other than the
  RoCE v2 index, NCCL_IB_DISABLE=1 where preflight found usable HCAs;
- a variable whose value differs from the other nodes' (the majority; a tie has no reference, so every
  node that differs is named), unless it is the per-node value the env file gives that node (an interface
  named differently, a RoCE GID index that differs): FAIL for variables that must agree across ranks or the job hangs or
  crawls (MUST_MATCH), WARN for the rest (NCCL_DEBUG differing is harmless);
- a conf-file line NCCL misreads: WARN;
- otherwise PASS, listing the variables and where each comes from.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "nccl_env"

CHECK = Check(
    name=NAME,
    claim="Every node gives a job the same NCCL_*/TORCH_NCCL_*/GLOO_* settings (environment, ~/.nccl.conf, "
    "/etc/nccl.conf), and none contradicts the env preflight recommends",
    why="NCCL reads these silently on every rank: one node whose /etc/nccl.conf still names the wrong "
    "interface or HCA, or turns InfiniBand off, hangs the job at init or drags every collective to socket "
    "speed, long after the launch looked fine.",
    fix="Edit or remove the named line (file:line) on the named nodes, or unset the variable in the "
    "environment sshd/slurmd gives jobs (/etc/environment, ~/.ssh/environment, the service's Environment=); "
    "keep site-wide NCCL settings in one file managed the same on every node.",
    needs=("nic", "ib_hca", "driver"),
    action="fix_config",
    reads="the environment, ~/.nccl.conf, /etc/nccl.conf",
    takes="< 0.1 s",
    order=85,
)

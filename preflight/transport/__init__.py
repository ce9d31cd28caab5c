"""How the probe bundle reaches the nodes over SSH or locally, over one written contract.

    contract.py     the contract every backend (this one, preflight/slurm/, preflight/k8s/) implements:
                    Fleet and Session protocols, Outcome, RunResult, NodeFailure
    bundle.py       the probe bundle and its wire protocol: what is sent (bootstrap, zip, config) and how
                    a node's output is read back (ResultReader: framed results, read in linear time)
    backends.py     the registry: one declaration per backend (ssh, slurm, k8s) with its options, its
                    inventory source, its fleet and its node actions (hooks modules: ssh_backend.py here,
                    preflight/slurm/backend.py, preflight/k8s/backend.py)
    pool.py         SessionPool, the SSH/local Fleet: one Session per node, driven by a bounded pool
    ssh_backend.py  the ssh backend's hooks (an inventory file or this machine; no node actions)
    ssh.py          SSHSession (fabric/paramiko), with known_hosts.py (host keys) and ssh_config.py
    local.py        LocalSession: this machine, the same protocol in a local process group
"""

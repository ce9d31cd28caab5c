"""How the probe bundle reaches the nodes over SSH or locally, over one written contract.

    contract.py     the contract every engine (this one, preflight/slurm/, a Kubernetes one) implements:
                    Fleet and Session protocols, Outcome, RunResult, NodeFailure
    bundle.py       the probe bundle and its wire protocol: what is sent (bootstrap, zip, config) and how
                    a node's output is read back (ResultReader: framed results, read in linear time)
    fleet.py        the SSH/local Fleet: one Session per node, driven by a bounded pool
    ssh.py          SSHSession (fabric/paramiko), with known_hosts.py (host keys) and ssh_config.py
    local.py        LocalSession: this machine, the same protocol in a local process group
"""

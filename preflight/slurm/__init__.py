"""Slurm as inventory, transport and node actions: scontrol parsing, allocations, one srun step per phase, drain/resume."""

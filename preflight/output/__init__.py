"""What a run writes: the terminal and JSON report, JUnit, Prometheus, the NCCL env file, hostfiles, history, diffs, captures."""

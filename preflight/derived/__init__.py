"""Derived facts: what several rules, the env file and the all-reduce read, computed once per run.

Each value is computed from every node's gathered facts on the controller and carried on the cluster view
(ClusterView.derive), so no rule recomputes another's reading or digs through another check's facts:
the data network a node's traffic takes (datanet), the RDMA rails (rails), typed GPU records (gpus), the NVLink
SHARP readiness (nvls), and the NCCL environment derived from them (envfabric, envvars).
Pure: no I/O, no printing. Below the rules, above the node side (tests/test_structure.py holds the order).
"""

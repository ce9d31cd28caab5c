"""allreduce: a timed all-reduce across every node completes, returns the right sums, and reaches its bus bandwidth.

This check has no probe half in the bundle sense: the controller runs preflight.probe.bench_agent on
every participating node at once (see that module for the config and result documents). The rule reads

    view.facts[node]["allreduce"]   that node's agent result document (or {"probe_error": "..."})
    view.cluster["allreduce"]       cluster-level metadata, filled by the controller
                                    (preflight.checks.allreduce.plan.cluster_meta() builds the skeleton from the
                                    configs it sent):
        backend      "nccl" | "gloo"
        world_size   total ranks
        nodes        participating node names, index = node_rank
        ranks        {node: [first_rank, last_rank]}: names the ranks of nodes that sent no document
        master       "198.19.0.2:29500", for messages
        deadlines    the deadlines sent to the agents ({"init_s", "op_s", "total_s"})
        unanswered   {node: why}: nodes whose agent returned nothing (outer deadline, SSH failure)
        gpu_model    NVML name, e.g. "NVIDIA H100 80GB HBM3" (for the built-in profile)
        nic_gbps     per-node aggregate line rate of the NICs the collective uses, Gb/s (multi-node profile)
        localization {"results": [group result, ...], "by_bandwidth": bool, "threshold_gbps": ...} from the
                     pair rounds (see preflight.checks.allreduce.localize.localize(); by_bandwidth false when localizing a
                     hang or an error); each group result carries its "round" (0: the screening) and
                     "control": true for a round's control pair
        node_rounds  [{"name": "loopback" | "nvlink" | "nic", "what", "results": [node result, ...],
                     "by_bandwidth", "sizes"}]: the partner-free tests, one result per node and "pass" (0: all
                     alone at once; 1: a suspect "beside" a known-good node, or that node as "control_for" it);
                     judged by preflight.checks.allreduce.judge.judge_nodes (named only once confirmed)
        slow_fraction  a confirmed node this share below the fleet FAILs, half of it WARNs (judge.py)
        skip         a reason: the test deliberately did not run (the rule then SKIPs)
        held         {node: {"pid", "uid"}}: another preflight run on this machine was testing these nodes,
                     so the test did not run (an ERROR, action retest; no node is judged)
        rails        {node: ["mlx5_0:1", ...]}: the HCA ports NCCL should use (ib_hca's usable_hcas, taken once
                     by the controller); a node absent here had no ib_hca facts

and `view.expect["busbw_gbps"]` (also `expect["nic_gbps"]` as a fallback for the NIC rate).

Verdict: per size the slowest rank's median time is the collective's time; algbw = bytes / time and
busbw = algbw * 2(n-1)/n (nccl-tests). The verdict is taken at the largest size >= 1 GiB on GPU (nccl),
or the largest size run on CPU (gloo), against expect.busbw_gbps, else the built-in profile
(preflight.checks.allreduce.busbw), else the figures are reported as WARN "no threshold applies". A sweep that
ends short of the verdict size, or is cut before a size more than SPARSE_STEP times the last one run,
proves nothing: ERROR, action fix_config. A hang, a rank error or a wrong sum is a FAIL naming the
stage, the ranks and the nodes (preflight.checks.allreduce.wording).
Per node, what NCCL chose (preflight.checks.allreduce.nccllog) is judged against the data path preflight chose.

The controller half is the package preflight.checks.allreduce: plan (launch, deadlines), run (over a fleet),
localize (pair rounds; the rule reports their verdict), judge (how a measurement is judged and
confirmed). Imports point one way: this module imports from that package (inside the rule functions),
never the reverse. It has no probe half, so the node bundle leaves it out.
"""

from __future__ import annotations

from preflight.model import Check, Setting

NAME = "allreduce"

CHECK = Check(
    name=NAME,
    claim="A timed all-reduce across every node completes, returns correct sums and reaches the expected "
    "bus bandwidth",
    why="The all-reduce is what a data-parallel job does every step: a rank that cannot join it hangs the "
    "job at start, one that stalls hangs it mid-run, and one slow link sets the pace for every GPU.",
    fix="For a hang at init check the rendezvous address/port and firewalls, and GLOO_SOCKET_IFNAME/"
    "NCCL_SOCKET_IFNAME; for a hang above small sizes compare MTUs along the path; for low bandwidth check "
    "NVLink (nvidia-smi nvlink -s), NIC link rates and NCCL_IB_HCA; exclude nodes named by the pair test.",
    # the launcher runs on the data interface the nic check chose, at the port the ports check verified,
    # with the env derived from the ib_hca and driver facts
    needs=("nic", "ib_hca", "ports", "driver"),
    action="isolate",
    reads="torch.distributed: a timed all-reduce across the nodes (NCCL on GPUs, gloo on CPUs)",
    takes="10-60 s (the sweep)",
    order=90,
    settings=(Setting("expect.busbw_gbps", "number", "the bus bandwidth the largest size must reach", low=0.001,
                      high=100000, unit="GB/s"),
              Setting("expect.nic_gbps", "number", "each node's NIC line rate, for the built-in bandwidth floor when "
                      "the HCA facts give none", low=0.001, high=100000, unit="Gb/s")),
)

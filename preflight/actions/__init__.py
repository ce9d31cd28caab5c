"""What preflight does to nodes after a run (drain, cordon, resume), decided once for every scheduler.

    policy.py   the scheduler-neutral policy: which findings take a node out of service, whose a node is
                (never touch one someone else took out, re-read just before acting), the blast-radius
                refusal, and the Applier contract a scheduler implements
    settings.py the history-backed drain policy's settings from the command line (--drain-after N/W,
                --drain-limit F[/W]) over the inventory's cluster.history
    tier_gate.py --resume --tier standard|burn-in: a node returns only after the tier's checks passed on it
                in this run

Appliers: preflight/slurm/drain.py (scontrol drain/resume) and preflight/k8s/nodes.py (cordon, taint,
annotation in one merge patch). The history's part of the policy (a retest-class or flapping fault drains
only after N in W, the circuit breaker across runs, --shadow) is decided from the database in
preflight/history/escalation.py and hands the appliers findings, never scheduler states.
"""

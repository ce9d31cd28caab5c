"""somaxconn end to end over SSH: the head's own network namespace's net.core.somaxconn, set with sysctl in the
simulated node (the real per-namespace value the probe reads), judged against the inventory's ranks."""

from __future__ import annotations

from tests.e2e.test_catalogue import results, run_preflight


def _by_node(doc):
    return {r["node"]: r for r in results(doc, "somaxconn")}


def test_a_head_whose_backlog_is_below_the_ranks_warns_and_its_twins_pass(sim_cluster):
    """3 nodes of 8 GPUs (the inventory's): 24 ranks. The head at 16 WARNs naming itself, the value, the ranks and
    the sysctl; a non-head at 8 is not judged; the head at 24 (the ranks) passes saying its value."""
    cluster = sim_cluster(3)
    inv = cluster.inventory(gpus_per_node=8)
    for node, value in (("n001", 16), ("n002", 8)):
        cluster.node_exec(node, ["sysctl", "-qw", "net.core.somaxconn=%d" % value], check=True)
    rc, doc, err = run_preflight(cluster, inv, "--only", "somaxconn")
    assert rc == 0, err  # a warning, not a failure
    found = _by_node(doc)
    head = found["n001"]
    assert (head["status"], head["action"], head["actual"]) == ("warn", "fix_config", "16"), head
    assert head["message"].startswith("n001: net.core.somaxconn is 16, below the 24 ranks that connect to the "
                                      "rendezvous store at once (one per GPU: 8 GPUs on each of 3 nodes)"), head
    assert "fix on n001: sysctl -w net.core.somaxconn=4096" in head["message"], head
    assert {found[n]["status"] for n in ("n002", "n003")} == {"skip"}
    cluster.node_exec("n001", ["sysctl", "-qw", "net.core.somaxconn=24"], check=True)
    rc, doc, err = run_preflight(cluster, inv, "--only", "somaxconn")
    assert rc == 0, err
    head = _by_node(doc)["n001"]
    assert head["status"] == "pass" and head["message"].startswith("n001: net.core.somaxconn 24 holds the 24 ranks"), head
    assert cluster.leftover_processes() == {}

"""storage: mountinfo parsing, the two-phase token probe on a real directory, plan and rule."""

import os


from preflight.checks.storage import probe as storage_probe
from preflight.checks.storage import rule as storage_rule
from preflight.model import NodeInfo, Status
from preflight.probe.context import NodeContext
from tests import builders

GiB = 1 << 30


def test_mount_of_takes_the_longest_and_last_mount_point():
    mounts = [{"mount_point": "/", "fstype": "ext4", "source": "/dev/sda1"},
              {"mount_point": "/shared", "fstype": "nfs4", "source": "a:/x"},
              {"mount_point": "/shared", "fstype": "tmpfs", "source": "tmpfs"},
              {"mount_point": "/sharedother", "fstype": "xfs", "source": "/dev/sdb"}]
    assert storage_probe.mount_of(mounts, "/shared/ckpt")["fstype"] == "tmpfs"
    assert storage_probe.mount_of(mounts, "/sharedx")["fstype"] == "ext4"


def _view(n, paths, facts, expect=None):
    nodes = [NodeInfo("n%d" % i, "h%d" % i, 0, is_head=(i == 1)) for i in range(1, n + 1)]
    return builders.view({k: {"storage": v} for k, v in facts.items()},
                         nodes=nodes, expect=expect or {}, cluster={"shared_paths": paths})


def test_two_phases_on_a_real_directory(tmp_path):
    shared = str(tmp_path)
    head1 = storage_probe.probe(NodeContext(storage_rule.prepare({"shared_paths": [shared]}, "n1", True)))
    other1 = storage_probe.probe(NodeContext(storage_rule.prepare({"shared_paths": [shared]}, "n2", False)))
    assert head1["tokens"][0]["error"] is None and other1["tokens"] == []
    view = _view(2, [shared], {"n1": head1, "n2": other1})
    plans = storage_rule.plan(view)
    assert plans["n2"]["paths"][0]["token"] == head1["tokens"][0]["token"]
    facts = {n: storage_probe.probe(NodeContext(cfg)) for n, cfg in plans.items()}
    assert facts["n2"]["paths"][0]["token"] == "match" and facts["n2"]["paths"][0]["writable"]
    assert sorted(os.listdir(shared)) == [storage_probe.TOKEN_FILE]  # the write tests left nothing behind
    out = storage_rule.rule(_view(2, [shared], facts))
    assert {f.status for f in out} == {Status.PASS}, out
    assert "shared with n1 and writable: %s (" % shared in out[0].message
    # a different directory on n2: the head's token is not there
    other = tmp_path / "elsewhere"
    other.mkdir()
    cfg = {"paths": [{"path": str(other), "token": head1["tokens"][0]["token"]}]}
    p = storage_probe.probe(NodeContext(cfg))["paths"][0]
    assert p["token"] == "missing"


def _path(path="/shared", token="match", writable=True, free=100 * GiB, exists=True):
    return {"path": path, "exists": exists, "is_dir": exists, "writable": writable,
            "write_error": None if writable else "Read-only file system", "token": token, "free_bytes": free,
            "mount": {"mount_point": "/shared", "fstype": "nfs4", "source": "10.0.0.5:/export"}}


def test_rule_names_each_fault():
    facts = {
        "n1": {"paths": [_path()]},
        "n2": {"paths": [_path(token="missing")]},
        "n3": {"paths": [_path(writable=False, free=10 * GiB)]},
        "n4": {"paths": [_path(exists=False)]},
    }
    out = {f.node: f for f in storage_rule.rule(_view(4, ["/shared"], facts, {"shared_free_gib": 50}))}
    assert out["n1"].status is Status.PASS
    assert out["n2"].status is Status.FAIL and "is not the filesystem the head n1 sees" in out["n2"].message
    assert "not writable (Read-only file system)" in out["n3"].message and "10.0 GiB free (expected >= 50 GiB)" in out["n3"].message
    assert "/shared does not exist" in out["n4"].message


def test_no_shared_paths_skips_with_reason_and_missing_facts_error():
    out = storage_rule.rule(_view(2, [], {"n1": {}, "n2": {}}))
    assert {f.status for f in out} == {Status.SKIP} and "no cluster.shared_paths" in out[0].message
    out = {f.node: f for f in storage_rule.rule(_view(2, ["/s"], {"n1": {"paths": [_path("/s")]}, "n2": {"skipped": "head wrote no token"}}))}
    assert out["n2"].status is Status.ERROR


def test_head_that_cannot_write_is_named_and_others_not_tested():
    head1 = {"phase": 1, "paths": ["/ro"], "head": True, "tokens": [{"path": "/ro", "token": None, "error": "/ro/.preflight-shared-token: Read-only file system"}]}
    plans = storage_rule.plan(_view(2, ["/ro"], {"n1": head1, "n2": {"phase": 1, "tokens": []}}))
    assert "skip" in plans["n2"]
    assert plans["n1"]["paths"][0]["write_error"].endswith("Read-only file system")

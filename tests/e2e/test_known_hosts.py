"""known_hosts as OpenSSH writes and reads it (sshd(8) SSH_KNOWN_HOSTS FILE FORMAT): markers and damaged
lines never crash a run; @revoked keys are refused as OpenSSH refuses them, even with accept-new."""

from __future__ import annotations

import json
import sys
from tests.paths import REPO



def run(cluster, inv, *extra):
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", inv, "--only", "ssh", "--json", "-", "--no-progress",
                        *extra], cwd=REPO, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return proc, {r["node"]: r for r in doc["results"] if r["check"] == "ssh"}


def test_markers_and_damaged_lines_are_skipped_with_a_note_and_revoked_keys_refused(sim_cluster, tmp_path):
    cluster = sim_cluster(2)
    good = open(cluster.known_hosts).read()
    key2 = b" ".join(cluster.node(2).host_pubkey.split()[:2]).decode()
    known = tmp_path / "known_hosts"
    known.write_text(
        "@cert-authority *.example.com %s\n" % key2
        + "@revoked * %s\n" % key2
        + "%s ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqq\n" % cluster.node(1).mgmt_ip  # truncated key
        + "%s ssh-ed25519\n" % cluster.node(1).mgmt_ip
        + good
    )
    inv = cluster.inventory(known_hosts=str(known))
    for extra in ([], ["--accept-new-host-keys"]):
        proc, ssh = run(cluster, inv, *extra)
        assert proc.returncode == 1
        assert ssh["n001"]["status"] == "pass"
        assert ssh["n002"]["status"] == "fail" and "revoked at %s:2" % known in ssh["n002"]["message"], ssh["n002"]
        assert "%s:1: @cert-authority" % known in proc.stderr and "%s:3: unreadable" % known in proc.stderr
    assert known.read_text().count(cluster.node(2).mgmt_ip) == 1  # accept-new did not record the revoked key

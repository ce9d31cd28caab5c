"""Inventory loading: good files load; every malformed file is one `file:line` line, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from preflight import cli, inventory
from preflight.errors import InventoryError
from tests.builders import assert_one_located_line
from tests.paths import REPO


# (case id, inventory text, line the error must name (None = no line), words the message must contain)
BAD = [
    ("yaml-syntax", "nodes:\n  - a\n  - [b\n", 4, "YAML syntax"),
    ("tab-indent", "nodes:\n\t- a\n", 2, "YAML syntax"),
    ("unknown-top-key", "nodes: [a]\nnodez: [b]\n", 2, "unknown key 'nodez'"),
    ("unknown-default-key", "defaults:\n  usr: root\nnodes: [a]\n", 2, "did you mean 'user'"),
    ("port-type", "defaults:\n  port: twenty-two\nnodes: [a]\n", 2, "port must be an integer"),
    ("port-range", "defaults:\n  port: 70000\nnodes: [a]\n", 2, "out of range"),
    ("gpus-negative", "nodes:\n  - host: a\n    gpus_per_node: -1\n", 3, "out of range"),
    ("timeout-bool", "defaults:\n  command_timeout: yes\nnodes: [a]\n", 2, "must be a number"),
    ("no-nodes", "defaults:\n  user: root\n", None, "no nodes"),
    ("empty-nodes", "nodes: []\n", 1, "no nodes"),
    ("empty-file", "", 1, "empty"),
    ("nodes-not-list", "nodes: a\n", 1, "must be a list"),
    ("duplicate-node", "nodes:\n  - a\n  - b\n  - a\n", 4, "duplicate node 'a'"),
    ("duplicate-in-range", "nodes:\n  - gpu-[01-03]\n  - gpu-02\n", 3, "duplicate node"),
    ("bad-range", "nodes:\n  - gpu-[05-01\n", 2, "bad host range"),
    ("shell-in-host", 'nodes:\n  - host: "a; touch /tmp/x"\n', 2, "not a valid host"),
    ("subst-in-host", 'nodes:\n  - "$(reboot)"\n', 2, "not a valid host"),
    ("bad-user", 'defaults:\n  user: "root; id"\nnodes: [a]\n', 2, "user"),
    ("bad-python", 'defaults:\n  python: "python3 -c evil"\nnodes: [a]\n', 2, "python"),
    ("missing-identity", "defaults:\n  identity_file: /nonexistent/key\nnodes: [a]\n", 2, "does not exist"),
    ("node-without-host", "nodes:\n  - name: x\n", 2, "no host"),
    ("duplicate-key", "defaults:\n  user: a\n  user: b\nnodes: [a]\n", 3, "duplicate key 'user'"),
    ("head-unknown", "cluster:\n  head: zz\nnodes: [a]\n", 2, "head 'zz'"),
    ("expect-unknown", "cluster:\n  expect:\n    driver: '550'\nnodes: [a]\n", 3, "did you mean 'driver_version'"),
    ("bad-ifname", 'nodes:\n  - host: a\n    data_interface: "eth0 $(id)"\n', 3, "data_interface"),
    ("node-is-number-list", "nodes:\n  - [a, b]\n", 2, "host string or a mapping"),
    ("name-for-range", "nodes:\n  - host: gpu-[1-2]\n    name: one\n", 3, "name given for a range"),
    ("bad-proxy", 'defaults:\n  proxy_jump: "bastion;id"\nnodes: [a]\n', 2, "proxy_jump"),
    ("slow-fraction-range", "cluster:\n  allreduce:\n    slow_fraction: 20\nnodes: [a]\n", 3, "slow_fraction must be"),
    ("node-round-type", "cluster:\n  allreduce:\n    node_round: sometimes\nnodes: [a]\n", 3, "node_round must be"),
    ("iters-min-over-cap", "cluster:\n  allreduce:\n    iters: 4\n    iters_min: 6\nnodes: [a]\n", 4,
     "iters_min 6 is above iters 4"),
    ("xid-window-text", "cluster:\n  xid_window_s: one day\nnodes: [a]\n", 2, "xid_window_s must be a number"),
    ("xid-window-zero", "cluster:\n  xid_window_s: 0\nnodes: [a]\n", 2, "xid_window_s 0 is out of range"),
]


@pytest.mark.parametrize("case,text,line,words", BAD, ids=[c[0] for c in BAD])
def test_malformed_inventory_is_one_line_exit_2(tmp_path, capsys, case, text, line, words):
    assert_one_located_line(tmp_path, capsys, text, line, words)


def test_missing_file_and_directory(tmp_path, capsys):
    assert cli.main(["check", str(tmp_path / "nope.yaml")]) == 2
    assert "inventory file not found" in capsys.readouterr().err
    assert cli.main(["check", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_shell_injection_host_runs_nothing(tmp_path):
    """The whole CLI, as a user runs it: rejected with exit 2, and the injected command never ran."""
    marker = tmp_path / "pwned"
    inv = tmp_path / "hosts.yaml"
    inv.write_text('nodes:\n  - host: "a; touch %s"\n' % marker)
    proc = subprocess.run([sys.executable, "-m", "preflight", "check", str(inv)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "%s:2:" % inv in proc.stderr
    assert not marker.exists()


def test_good_inventory_expands_ranges_and_applies_defaults(tmp_path):
    key = tmp_path / "id"
    key.write_text("k")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        textwrap.dedent(
            """\
            defaults:
              user: ubuntu
              identity_file: %s
              gpus_per_node: 8
            cluster:
              master_port: 29600
              head: head
              expect: {driver_version: 550.54.15, mtu: 9000}
            nodes:
              - gpu-[001-003]
              - host: 10.0.0.5
                name: head
                user: root
                gpus_per_node: 0
              - host: "fe80::1"
            """
            % key
        )
    )
    loaded = inventory.load(str(inv))
    assert [n.name for n in loaded.nodes] == ["gpu-001", "gpu-002", "gpu-003", "head", "fe80::1"]
    head = loaded.nodes[3]
    assert (head.host, head.user, head.gpus_per_node) == ("10.0.0.5", "root", 0)
    assert loaded.nodes[0].user == "ubuntu" and loaded.nodes[0].identity_file == str(key)
    assert loaded.master_port == 29600 and loaded.head_name == "head"
    assert loaded.expect == {"driver_version": "550.54.15", "mtu": 9000}
    assert loaded.nodes[0].line == 10 and head.line == 11


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(os.path.join(REPO, "inventory")) if n.endswith(".example.yaml")))
def test_example_inventories_load(name):
    """Every inventory users copy loads (inventory/*.example.yaml; k8s-training-job.yaml is a Kubernetes
    manifest, validated by tests/transport/test_k8s_unit.py)."""
    loaded = inventory.load(os.path.join(REPO, "inventory", name))
    assert loaded.nodes


def test_error_type_carries_location(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("nodes:\n  - host: a\n    port: 0\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(str(path))
    assert info.value.line == 3 and "port 0 is out of range" in str(info.value)


def test_valid_host_syntax():
    good = ["gpu-001", "node.example.org", "10.0.0.1", "fe80::1", "a_b"]
    bad = ["a b", "a;b", "$(id)", "`id`", "-oProxyCommand=x", "a/b", ""]
    assert all(inventory.valid_host(h) for h in good)
    assert not any(inventory.valid_host(h) for h in bad)

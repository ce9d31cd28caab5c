"""Hostile and careless inventories: bounded, located (file:line), one line, exit 2, never a traceback."""

from __future__ import annotations

import pytest

from preflight import cli, inventory
from tests.builders import assert_one_located_line

BOMB = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    "%s: &%s [%s]\n" % (c, c, ",".join(["*%s" % p] * 10)) for p, c in zip("abcdefgh", "bcdefghi")
) + "nodes: [n1]\n"

# (case id, inventory text, line the error must name, words the message must contain)
BAD = [
    ("alias-bomb", "defaults:\n  x: 1\n" if False else BOMB, None, "alias"),
    ("recursive-alias", "cluster:\n  expect: &a\n    - *a\nnodes: [n1]\n", 2, "recursive"),
    ("complex-key", "nodes:\n  - host: a\n    ? [a, b]\n    : 1\n", 3, "key"),
    ("head-not-string", "cluster:\n  head: [a]\nnodes: [a]\n", 2, "head"),
    ("head-mapping", "cluster:\n  head: {a: 1}\nnodes: [a]\n", 2, "head"),
    ("range-to-nothing", "nodes:\n  - n1\n  - gpu-[1-2]!gpu-[1-2]\n", 3, "host range"),
    ("control-char", "nodes:\n  - n1\n  - n\x072\n", 3, "control character"),
    ("huge-range", "nodes:\n  - gpu-[1-9999999]\n", 2, "max_nodes"),
    ("over-limit-key", "cluster:\n  max_nodes: 3\nnodes:\n  - gpu-[1-2]\n  - gpu-[3-4]\n", 5, "limit of 3"),
    ("port-22-is-default", "nodes:\n  - {host: x, name: a}\n  - {host: x, name: b, port: 22}\n", 3, "duplicate host 'x' port 22"),
    ("default-port-22", "defaults:\n  port: 22\nnodes:\n  - {host: x, name: a}\n  - {host: x, name: b, port: null}\n", 5, "duplicate host"),
]


@pytest.mark.parametrize("case,text,line,words", BAD, ids=[c[0] for c in BAD])
def test_bad_inventory_is_one_located_line(tmp_path, capsys, case, text, line, words):
    assert_one_located_line(tmp_path, capsys, text, line, words)


def test_max_nodes_can_be_raised(tmp_path, capsys):
    path = tmp_path / "hosts.yaml"
    path.write_text("nodes:\n  - gpu-[1-12]\n")
    assert len(inventory.load(str(path)).nodes) == 12
    with pytest.raises(inventory.InventoryError, match="limit of 10"):
        inventory.load(str(path), max_nodes=10)
    path.write_text("cluster:\n  max_nodes: 20000\nnodes:\n  - gpu-[1-10001]\n")
    assert len(inventory.load(str(path)).nodes) == 10001
    assert len(inventory.load(str(path), max_nodes=10001).nodes) == 10001
    assert cli.main(["check", str(path), "--max-nodes", "5", "--no-progress"]) == 2
    assert "limit of 5" in capsys.readouterr().err


def test_aliases_still_work_for_shared_settings(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("nodes:\n  - &n {host: a, gpus_per_node: 4}\n  - {<<: *n, host: b}\n")
    loaded = inventory.load(str(path))
    assert [(n.host, n.gpus_per_node) for n in loaded.nodes] == [("a", 4), ("b", 4)]


def test_range_size_counts_without_expanding():
    assert inventory.range_size("gpu-[1-9999999]") == 9999999
    assert inventory.range_size("r[1-4]n[01-10],x") == 41
    assert inventory.range_size("a[1-9/2]") == 5

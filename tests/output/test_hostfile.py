"""Hostfiles: each format read back the way its launcher reads it; unsafe host names refused."""

import re
import shlex

import pytest
from ClusterShell.NodeSet import NodeSet

from preflight.output.hostfile import FORMATS, render_hostfile, validate_host, write_hostfile

NODES = [("gpu-001", 8), ("gpu-002", 8), ("gpu-003", 4), ("gpu-005", 8)]


def _deepspeed_parse(text):
    """DeepSpeed launcher/runner.py `_parse_hostfile`: `^(\\S+)\\s+slots=(\\d+)`, # comments, no duplicates."""
    pool = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.search(r"^(\S+)\s+slots=(\d+)", line)
        assert m, "DeepSpeed would reject line %r" % line
        assert m.group(1) not in pool
        pool[m.group(1)] = int(m.group(2))
    return pool


def _openmpi_parse(text):
    """Open MPI hostfile: `host [slots=N] [max_slots=N]`, whitespace separated, # starts a comment."""
    out = []
    for line in text.splitlines():
        tokens = line.split("#", 1)[0].split()
        if not tokens:
            continue
        host, opts = tokens[0], dict(t.split("=", 1) for t in tokens[1:])
        assert set(opts) <= {"slots", "max_slots", "max-slots"}
        out.append((host, int(opts.get("slots", 1))))
    return out


def _mpich_parse(text):
    """MPICH Hydra machinefile: `host[:N]` per line."""
    out = []
    for line in text.splitlines():
        host, _, n = line.strip().partition(":")
        out.append((host, int(n or 1)))
    return out


def test_plain():
    text = render_hostfile(NODES, "plain")
    assert text == "gpu-001\ngpu-002\ngpu-003\ngpu-005\n"
    assert [shlex.split(line) for line in text.splitlines()] == [[h] for h, _ in NODES]


def test_deepspeed():
    text = render_hostfile(NODES, "deepspeed")
    assert text.splitlines()[0] == "gpu-001 slots=8"
    assert _deepspeed_parse(text) == dict(NODES)


def test_mpi_is_open_mpi_syntax():
    text = render_hostfile(NODES, "mpi")
    assert text.splitlines()[2] == "gpu-003 slots=4"
    assert _openmpi_parse(text) == NODES


def test_mpich():
    text = render_hostfile(NODES, "mpich")
    assert text.splitlines() == ["gpu-001:8", "gpu-002:8", "gpu-003:4", "gpu-005:8"]
    assert _mpich_parse(text) == NODES


def test_slurm_folds_on_one_line():
    text = render_hostfile(NODES, "slurm")
    assert text == "gpu-[001-003,005]\n"
    assert list(NodeSet(text.strip())) == [h for h, _ in NODES]


def test_slurm_mixed_names_and_ips_expand_back():
    nodes = [("rack2-n01", 8), ("rack1-n01", 8), ("10.0.0.7", 8), ("10.0.0.8", 8), ("head", 1)]
    text = render_hostfile(nodes, "slurm")
    assert len(text.splitlines()) == 1
    assert set(NodeSet(text.strip())) == {h for h, _ in nodes}


def test_ipv6_allowed_where_unambiguous():
    assert render_hostfile([("fe80::1", 8)], "mpi") == "fe80::1 slots=8\n"
    for fmt in ("mpich", "slurm"):
        with pytest.raises(ValueError, match="fe80::1"):
            render_hostfile([("fe80::1", 8)], fmt)


@pytest.mark.parametrize(
    "bad",
    ["gpu 001", "gpu\t001", "gpu\n001", "gpu'001", 'gpu"001', "gpu;rm", "gpu$(id)", "gpu`id`", "gpu|x",
     "gpu&", "gpu>x", "gpu*", "gpu[1-2]", "gpu,gpu2", "#gpu", "-oProxyCommand=x", "gpu\\x", "", ".gpu",
     "gpu{1,2}", "user@gpu", "a" * 254],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_unsafe_names_refused_with_the_name(bad, fmt):
    with pytest.raises(ValueError) as exc:
        render_hostfile([("gpu-001", 8), (bad, 8)], fmt)
    assert repr(bad) in str(exc.value)


def test_validate_host_returns_good_names():
    for good in ("gpu-001", "n001.cluster.local", "198.18.0.2", "node_7", "DGX-A100-01"):
        assert validate_host(good) == good


def test_duplicates_and_bad_slots_refused():
    with pytest.raises(ValueError, match="duplicate host 'gpu-001'"):
        render_hostfile([("gpu-001", 8), ("gpu-001", 8)], "plain")
    for slots in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="gpu-001"):
            render_hostfile([("gpu-001", slots)], "deepspeed")
    assert render_hostfile([("cpu-001", 0)], "plain") == "cpu-001\n"  # plain has no slots


def test_unknown_format_and_empty():
    with pytest.raises(ValueError, match="unknown hostfile format 'pbs'"):
        render_hostfile(NODES, "pbs")
    assert all(render_hostfile([], fmt) == "" for fmt in FORMATS)


def test_write_hostfile_validates_before_writing(tmp_path):
    path = tmp_path / "hostfile"
    write_hostfile(NODES, "deepspeed", path)
    assert _deepspeed_parse(path.read_text()) == dict(NODES)
    with pytest.raises(ValueError):
        write_hostfile([("bad host", 8)], "deepspeed", path)
    assert _deepspeed_parse(path.read_text()) == dict(NODES)  # old file untouched
    assert [p.name for p in tmp_path.iterdir()] == ["hostfile"]

"""preflight.checks.allreduce.busbw: nccl-tests' busbw, the curve over the ranks' timings, the built-in profiles."""

from __future__ import annotations

import pytest

from preflight.checks.allreduce import busbw

from tests.allreduce_docs import GiB, KiB, MiB, eight_ranks_on


def test_busbw_factor_is_the_nccl_tests_definition():
    assert busbw.busbw_factor(8) == 1.75
    assert busbw.busbw_factor(2) == 1.0
    assert busbw.busbw_factor(1) == 0.0


def test_curve_takes_the_slowest_rank_per_size():
    sizes = [MiB, GiB]
    docs = eight_ranks_on(2, 4, sizes, time_s=0.01, slow={5: 2.0, 2: 0.5})
    points = busbw.curve({"a": docs[0], "b": docs[1]}, 8)
    top = points[-1]
    assert top["bytes"] == GiB and top["time_s"] == pytest.approx(0.02)
    assert (top["slowest_rank"], top["fastest_rank"]) == (5, 2)
    assert top["algbw_gbps"] == pytest.approx(GiB / 0.02 / 1e9, rel=1e-4)
    assert top["busbw_gbps"] == pytest.approx(top["algbw_gbps"] * 1.75, rel=1e-4)
    assert set(top) >= {"bytes", "time_s", "algbw_gbps", "busbw_gbps", "slowest_rank", "fastest_rank"}


def test_curve_skips_sizes_not_every_rank_reported():
    docs = eight_ranks_on(1, 2, [KiB, 2 * KiB])
    docs[0]["ranks"][1]["sizes"].pop()
    assert [p["bytes"] for p in busbw.curve({"a": docs[0]}, 2)] == [KiB]


@pytest.mark.parametrize("backend,nodes,gpus,model,nic,gbps,words", [
    ("nccl", 1, 8, "NVIDIA H100 80GB HBM3", None, 315.0, ["H100 SXM"]),
    ("nccl", 1, 8, "NVIDIA A100-SXM4-80GB", None, 210.0, []),
    ("nccl", 1, 8, "NVIDIA H100 PCIe", None, None, []),
    ("nccl", 1, 4, "NVIDIA H100 80GB HBM3", None, None, []),
    ("nccl", 4, 8, "NVIDIA H100 80GB HBM3", 3200, 280.0, ["3200 Gb/s"]),
    ("nccl", 4, 8, "NVIDIA H100 80GB HBM3", None, None, []),
    ("gloo", 4, 0, None, 100, None, []),
])
def test_builtin_profiles(backend, nodes, gpus, model, nic, gbps, words):
    """The FAIL floor: LINE_RATE_FRACTION of the NVLink (one node) or NIC (several) line rate."""
    found = busbw.profile_threshold(backend, nodes, gpus, model, nic)
    if gbps is None:
        assert found is None
    else:
        assert found[0] == gbps and all(w in found[1] for w in words), found


ANY = object()  # the row checks the source only


@pytest.mark.parametrize("backend,nodes,gpus,model,nic,gbps,words", [
    ("nccl", 1, 8, "NVIDIA H100 80GB HBM3", None, 368.0, ["460", "alayanew"]),
    ("nccl", 2, 8, "NVIDIA H200", 3200, 320.0, []),
    ("nccl", 2, 8, "NVIDIA H200", 1600, None, []),  # fewer NICs than it was measured with
    ("nccl", 4, 8, "NVIDIA B200", 3200, 320.0, []),
    ("nccl", 2, 8, "NVIDIA A100-SXM4-80GB", 1600, ANY, ["NVIDIA/nccl#778"]),
    ("gloo", 2, 0, None, None, None, []),
])
def test_sku_profiles_warn_below_the_published_figure(backend, nodes, gpus, model, nic, gbps, words):
    found = busbw.sku_warn_level(backend, nodes, gpus, model, nic)
    if gbps is None:
        assert found is None
    else:
        assert (gbps is ANY or found[0] == gbps) and all(w in found[1] for w in words), found

"""preflight.checks.allreduce.nccllog: what the NCCL log fixtures must cover, and NCCL_SOCKET_IFNAME's syntax.

Every case under tests/fixtures/allreduce runs through parse_nccl_log in tests/test_fixtures.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.checks.allreduce import nccllog


_NCCL_FIXTURES = Path(__file__).parent / "fixtures" / "allreduce"


_NCCL_CASES = sorted(p.stem for p in _NCCL_FIXTURES.glob("*.json"))


def test_nccl_fixtures_cover_the_four_paths():
    got = {c: json.loads((_NCCL_FIXTURES / (c + ".json")).read_text()).get("expected") for c in _NCCL_CASES}
    assert got["ib_gdr"]["transport"] == "NET/IB" and got["ib_gdr"]["gdr_used"] is True
    assert got["ib_no_gdr"]["gdr"] == {"mlx5_0": False, "mlx5_1": False} and got["ib_no_gdr"]["gdr_used"] is False
    assert got["socket_fallback"]["transport"] == "NET/Socket" and got["socket_fallback"]["ib_no_device"]
    assert got["wrong_interface"]["devices"] == [{"name": "lo", "addr": "127.0.0.1"}]
    assert got["old_2_4_socket"]["intra"] == ["SHM"] and got["old_2_4_socket"]["version"] == "2.4.7"
    assert "NVLS" in got["plugin_ibext_nvls"]["intra"]


@pytest.mark.parametrize("spec,name,ok", [
    ("=eth1", "eth1", True), ("=eth1", "eth10", False), ("eth", "eth10", True), ("^docker,lo", "eth0", True),
    ("^docker,lo", "docker0", False), (None, "lo", False), (None, "ens3", True), ("=eth1,ib0", "ib0", True)])
def test_ifname_syntax(spec, name, ok):
    assert nccllog.ifname_allows(spec, name) is ok

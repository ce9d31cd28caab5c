"""Real NCCL_DEBUG=INFO logs (../shared/realworld/nccl_info, beside the checkout) read as their facts say.

Each `<name>.log` there has a `<name>.expect.json` written by hand from the log (its SOURCES.md names the
GitHub issue or file each came from): NCCL version, the transport between nodes, GPUDirect RDMA, the IB
devices, the socket interface, intra-node transports, the error, the rank count. preflight's parser
(preflight.checks.allreduce.nccllog) must read the same facts. The logs are public data and are not committed
here (tests/fixtures/allreduce/ holds small cases modelled on each variation); when the folder is absent
every test here skips with the reason (PREFLIGHT_REALWORLD=DIR points elsewhere).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Dict, List, Optional

import pytest

from preflight.checks.allreduce.nccllog import NET_FAULTS, parse_nccl_log, suspect_iface
from tests.paths import REPO

REAL = os.environ.get("PREFLIGHT_REALWORLD") or os.path.normpath(os.path.join(REPO, "..", "shared", "realworld"))
LOGS = sorted(glob.glob(os.path.join(REAL, "nccl_info", "*.log")))
pytestmark = pytest.mark.skipif(not LOGS, reason="no real NCCL logs at %s/nccl_info (they sit beside the "
                                                  "checkout in CI)" % REAL)

# Facts the hand-written expectation states that no line of the log says: the parser must not invent them.
NOT_IN_THE_LOG = {
    # "ranks": 2 was read by the person from "0[18000] -> 1[18000] via NET": two processes, no "nranks" line.
    "oneflow3586_socket_ib_no_device_veth_connect_timeout_excerpt": {"ranks"},
}


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".log")]


def read_as_a_person_would(log: Dict[str, Any]) -> Dict[str, Any]:
    """The parser's facts in the vocabulary of the .expect.json files."""
    network, provider = log["network"], log["provider"]
    if log["gdr_used"] is True:
        gdr: Optional[bool] = True
    elif (log["gdr"] and not any(log["gdr"].values())) or (log["gdr_used"] is False and network != "Socket"):
        gdr = False
    else:
        gdr = None
    if network == "Socket" and log["devices"]:
        ifaces: List[str] = [d["name"] for d in log["devices"]]
    elif log["env"].get("NCCL_SOCKET_IFNAME"):
        ifaces = [log["env"]["NCCL_SOCKET_IFNAME"]]
    elif log["oob"]:
        ifaces = [log["oob"]["name"]]
    else:
        ifaces = [d["name"] for d in log["bootstrap"]]
    return {
        "nccl_version": log["version"],
        "transports_between_nodes": [provider.upper() if provider else network] if network else [],
        "gdr": gdr,
        "ib_devices": list(log["devices"]) if network == "IB" else [],
        "socket_ifname": ",".join(ifaces) or None,
        "intra_node": log["intra"],
        "ranks": log["nranks"],
        "network": network,
        "plugin": log["plugin"],
        "ib_no_device": log["ib_no_device"],
    }


@pytest.mark.parametrize("path", LOGS, ids=[_name(p) for p in LOGS])
def test_a_real_nccl_log_is_read_as_its_facts_say(path):
    with open(path, errors="replace") as fh:
        log = parse_nccl_log(fh.read())
    with open(path[: -len(".log")] + ".expect.json") as fh:
        expect = json.load(fh)
    got = read_as_a_person_would(log)
    skip = NOT_IN_THE_LOG.get(_name(path), set())
    for key, want in expect.items():
        if key in ("note", "error", "link_layer") or key in skip:
            continue
        assert got[key] == want, "%s: %s read %r, the log says %r" % (_name(path), key, got[key], want)
    for key in skip:
        assert got[key] is None, "%s: %s %r invented" % (_name(path), key, got[key])
    if expect.get("link_layer"):
        assert all(d.endswith("/" + expect["link_layer"]) for d in log["devices"])
    if expect["error"] is None:
        assert log["net_faults"] == [] and log["warnings"] == []
    else:  # the network fault the person named is among what the parser kept as evidence
        named = [f for f in NET_FAULTS if f in expect["error"]]
        assert named, "expectation names no known network fault: %r" % expect["error"]
        assert any(f in line for f in named for line in log["net_faults"]), (named, log["net_faults"])


def test_the_veth_and_link_local_interface_nccl_chose_are_named():
    path = os.path.join(REAL, "nccl_info", "oneflow3586_socket_ib_no_device_veth_connect_timeout_excerpt.log")
    with open(path) as fh:
        log = parse_nccl_log(fh.read())
    reasons = [suspect_iface(d) for d in log["devices"]]
    assert reasons[0] is None  # eno1 with a routable IPv4 address
    assert reasons[1] == ("veth25f2e72 is a container/bridge interface and has only an IPv6 link-local "
                          "address (fe80::380d:bfff:fe5b:54d2)")
    assert log["net_paths"] == ["NET/Socket/1"]  # and NCCL's channels ran over it


def _verdict(text: str):
    """The allreduce check's NCCL finding for a node whose one rank logged `text` and finished its sweep."""
    from preflight.checks.allreduce import rule as ar_rule
    from tests.allreduce_docs import GiB, cluster, eight_ranks_on

    docs = eight_ranks_on(1, 1, [GiB], time_s=0.01)
    docs[0]["ranks"][0]["nccl_log"] = text
    view = cluster(docs, gpus=1, env={})
    meta = view.cluster["allreduce"]
    return ar_rule.nccl_findings(view, meta, {meta["nodes"][0]: docs[0]})


@pytest.mark.parametrize("path", LOGS, ids=[_name(p) for p in LOGS])
def test_a_real_nccl_log_keeps_its_verdict(path):
    """A healthy capture (no error in its expectation) gives a PASS, never a new WARN/FAIL; one whose
    expectation names an error is not a PASS, and its finding quotes what NCCL said. The one capture of a
    veth with an IPv6 link-local address that NCCL's channels ran over is a FAIL (fix_config)."""
    from preflight.model import Status

    with open(path, errors="replace") as fh:
        findings = _verdict(fh.read())
    with open(path[: -len(".log")] + ".expect.json") as fh:
        expect = json.load(fh)
    (f,) = findings
    if expect["error"] is None:
        assert f.status is Status.PASS, (f.status, f.message)
        return
    assert f.status in (Status.WARN, Status.FAIL) and f.action == "fix_config", (f.status, f.message)
    failures = f.data["nccl"]["failures"]
    assert failures and failures[0]["line"][:60] in f.message, f.message
    if "veth" in expect["error"]:
        assert f.status is Status.FAIL and "NCCL sent traffic over veth25f2e72" in f.message, f.message

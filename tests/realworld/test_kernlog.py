"""Every real capture (../shared/realworld, beside the checkout) read as a kernel log: no event, no new WARN/FAIL.

None of the captures there is a kernel log; they are what a node's kernel log must never be mistaken for
(NCCL logs, nvidia-smi, DCGM, Slurm, ip, sysfs text: lines that mention GPUs, PCI addresses, Xid-like words,
"Fatal", "Timeout", "heartbeat"). Each is parsed as dmesg output by the xid and ib_errors parsers and judged by
the xid rule: no Xid/SXid, no non-Xid GPU failure, no link event, and the verdict is PASS. The real kernel-log
captures found in public issues are fixtures in tests/fixtures/xid/ (sources in each case's json), judged in
tests/checks/test_xid.py. The folder is not committed; when it is absent every test here skips with the reason
(PREFLIGHT_REALWORLD=DIR points elsewhere).
"""

from __future__ import annotations

import os
from typing import List

import pytest

from preflight.checks.ib_errors import probe as ib_errors_probe
from preflight.checks.xid import probe as xid_probe
from preflight.checks.xid import rule as xid_rule
from preflight.model import Status
from tests.paths import REPO
from tests import builders

REAL = os.environ.get("PREFLIGHT_REALWORLD") or os.path.normpath(os.path.join(REPO, "..", "shared", "realworld"))
HAVE = os.path.isdir(REAL)
pytestmark = pytest.mark.skipif(not HAVE, reason="no real captures at %s (they sit beside the checkout in CI)" % REAL)


def _captures() -> List[str]:
    out = []
    for dirpath, _dirs, files in sorted(os.walk(REAL)) if HAVE else []:
        out += [os.path.join(dirpath, f) for f in sorted(files) if not f.endswith(".expect.json") and f != "SOURCES.md"]
    return out


@pytest.mark.parametrize("path", _captures(), ids=lambda p: os.path.relpath(p, REAL))
def test_capture_read_as_a_kernel_log_gives_no_event_and_passes(path):
    with open(path, errors="replace") as fh:
        text = fh.read()
    facts = xid_probe.parse_kernel_log(text, "dmesg")
    assert facts["events"] == [] and facts["nvrm"] == [] and facts["unparsed"] == []
    assert ib_errors_probe.parse_link_events(text, "dmesg")["events"] == []
    view = builders.view({"n1": {"xid": {"nvidia": True, "source": "dmesg", "log_error": None,
                                         "uptime_s": 1e6, "log": facts}}}, cluster={})
    assert [f.status for f in xid_rule.rule(view)] == [Status.PASS]


def test_there_are_captures():
    assert len(_captures()) >= 100

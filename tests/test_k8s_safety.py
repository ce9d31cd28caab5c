"""Acting on a Kubernetes fleet safely (issue 39), through the real kubectl against the API-server double.

Never undo an admin's decision (a hand uncordon, then a maintenance cordon, survives --resume), name a
stuck agent pod at once, keep every rank's all-reduce result when one rank exits, and fail closed when
the controller is SIGKILLed: the next run names and cleans what a dead run left.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.test_k8s_e2e import SELECT, _MISSING, _env, _run, deployed, kube  # noqa: F401 - the fixtures

pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING)
SSH = ["--only", "ssh", "--no-progress"]


def _kubectl(api, *argv):
    out = subprocess.run(["kubectl", *argv], env=_env(api), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _marks(api, name):
    node = api.get("nodes", name)
    return (bool(node["spec"].get("unschedulable")), (node["metadata"].get("annotations") or {}).get("preflight/drained"),
            [t["key"] for t in node["spec"].get("taints") or []])


def test_resume_never_undoes_an_admins_cordon_made_after_a_hand_uncordon(deployed):
    """preflight cordons n004; an admin uncordons it by hand; a nightly --drain run passes it and clears
    preflight's marks; the admin cordons it for maintenance; --resume leaves it cordoned."""
    cluster, api = deployed
    api.dead_node("n004")
    out = _run(api, SELECT + SSH + ["--drain"])
    assert out.returncode == 1 and _marks(api, "n004")[0] is True, out.stdout
    api.revive("n004")
    _kubectl(api, "uncordon", "n004")  # the admin: back to service by hand, preflight's marks still on it
    assert _marks(api, "n004")[0] is False and _marks(api, "n004")[2] == ["preflight/unhealthy"]
    out = _run(api, SELECT + SSH + ["--drain"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n004") == (False, None, [])  # the hand-uncordoned node keeps no stale taint
    said = " ".join(out.stdout.split())
    assert "cleared preflight's annotation and taint from n004" in said, out.stdout
    _kubectl(api, "cordon", "n004")  # the admin: maintenance, not preflight's
    out = _run(api, SELECT + SSH + ["--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n004") == (True, None, []), out.stdout
    assert "left alone: n004" in out.stdout


def test_a_cordon_whose_taint_an_admin_removed_is_not_resumed(deployed):
    """The healthy-but-unusual twin: preflight's annotation on a cordoned node whose taint an admin took
    off is no longer preflight's whole cordon; a cordon that is whole is resumed."""
    cluster, api = deployed
    for name in ("n002", "n003"):
        api.dead_node(name)
    out = _run(api, SELECT + SSH + ["--drain", "--max-drain-fraction", "0.5"])
    assert out.returncode == 1 and _marks(api, "n002")[0] and _marks(api, "n003")[0], out.stdout
    for name in ("n002", "n003"):
        api.revive(name)
    _kubectl(api, "taint", "node", "n002", "preflight/unhealthy-")
    out = _run(api, SELECT + SSH + ["--resume"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _marks(api, "n002")[0] is True and "left alone: n002" in out.stdout
    assert _marks(api, "n003") == (False, None, [])

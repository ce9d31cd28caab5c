"""envfile: derive() on ClusterViews built here (facts in the shapes the nic, ib_hca, ports and driver
probes produce, and the allreduce check's NCCL-log facts from parse_nccl_log), and render()'s file read
back the way users read it: `bash -n`, then sourced by bash and by sh (twice, under `set -eu`) in an
empty environment, which must set exactly the listed variables and print nothing, and over a hostile
pre-set environment (leftover NCCL_IB_DISABLE=1, an interface list, async error handling 1, the user's own
NCCL_DEBUG and MASTER_*, an odd IFS), where the authoritative values must win and the user's must stay."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from preflight import __version__
from preflight.output import envfile
from preflight.engine import RunReport
from preflight.model import ClusterView, Finding, NodeInfo, Status
from tests.builders import iface
from tests.builders import ib_port as port

HOSTILE = ["x$(id)", "e;reboot", "a\nb", "a'b", "a,b", "=eth7", "^eth7", "`id`", "e$(id>p)", "qq zz", "a\"b", "x\\y"]


# ------------------------------------------------------------------------------------------------ facts


def mgmt_ip(i):
    return "10.0.0.%d" % (10 + i)


def data_ip(i):
    return "10.1.0.%d" % (10 + i)


def cluster(n=3, data=None, torch="2.4.0+cu121", ib=None, ports=None, drop=(), master_port=29500, nccl=None, extra=None):
    """A ClusterView of n nodes: lo, a 1 GbE management eno1, a 100 GbE data interface (eth1 unless
    `data` names another per node), docker0 with the same address everywhere; ports verified unless
    `ports` overrides a node's facts; torch as given (a str, or {node: str|None}); ib {node: [ports]};
    nccl: the nvidia-nccl-cu12 wheel's version (a str, or {node: str|None}; None: no NCCL);
    extra {node: [more interfaces]}."""
    names = ["n%03d" % i for i in range(1, n + 1)]
    data = data or {}
    ib = ib or {}
    ports = ports or {}
    infos, facts = [], {}
    for i, name in enumerate(names, 1):
        infos.append(NodeInfo(name, mgmt_ip(i), 8, is_head=(i == 1)))
        version = torch.get(name) if isinstance(torch, dict) else torch
        nccl_version = nccl.get(name) if isinstance(nccl, dict) else nccl
        if i == 1:
            port_facts = {"role": "listen", "port": master_port, "bind_ip": "0.0.0.0", "listening": True,
                          "peers": [{"ip": data_ip(j), "name": names[j - 1], "at_s": 0.1} for j in range(2, n + 1)]}
        else:
            port_facts = {"role": "connect", "host": data_ip(1), "port": master_port, "connected": True,
                          "handshake": True, "reply": "preflight-ok n001", "attempts": 1, "elapsed_s": 0.01, "error": None}
        facts[name] = {
            "ssh": {"memlock_soft": None},
            "nic": {
                "interfaces": [
                    dict(iface("lo", "127.0.0.1", 8, 65536, None, physical=False), kind="loopback", link_type="loopback"),
                    iface("eno1", mgmt_ip(i), 24, 1500, 1000),
                    iface(data.get(name, "eth1"), data_ip(i), 16, 9000, 100000),
                    iface("docker0", "172.17.0.1", 16, 1500, None, kind="bridge", physical=False),
                ] + list((extra or {}).get(name, [])),
                "ssh_ip": mgmt_ip(i),
            },
            "ib_hca": {"hcas": {}, "ports": ib.get(name, [])},
            "ports": ports.get(name, port_facts),
            "driver": {"torch": {"version": version, "cuda": None, "path": "/opt/torch"} if version else None,
                       "nccl_python": {"distribution": "nvidia-nccl-cu12", "version": nccl_version} if nccl_version else None,
                       "nccl_system": []},
        }
    for name in drop:
        del facts[name]
    return ClusterView(infos, facts, cluster={"master_port": master_port})


def names(derived):
    return [v.key for v in derived.variables]


def report(view, findings=(), env=None, allreduce=None, path="/etc/preflight/hosts.yaml"):
    inv = SimpleNamespace(path=path, sha256="ab" * 32)
    return RunReport(inventory=inv, selected=[], findings=list(findings), view=view, started_at="", duration_s=0.0,
                     allreduce=allreduce, env=env)


# ------------------------------------------------------------------------------------------- sourcing


#: A launch environment as users have them: leftovers the file must override, the user's own choices it must
#: keep, and an IFS that would split unquoted expansions.
HOSTILE_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_SOCKET_IFNAME": "=eno1,eth1",
    "GLOO_SOCKET_IFNAME": "docker0",
    "NCCL_IB_HCA": "mlx5",
    "NCCL_IB_GID_INDEX": "0",
    "NCCL_NET_PLUGIN": "none",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_DEBUG": "INFO",
    "MASTER_ADDR": "10.9.9.9",
    "MASTER_PORT": "1234",
    "IFS": " ,=:'./-",
}
#: The file's two line shapes: authoritative, and the user's value wins.
EXPORT_RE = re.compile(r"^export ([A-Z_]+)='([^'\n]*)'$")
DEFAULT_RE = re.compile(r"^([A-Z_]+)=\$\{\1:-'([^'\n]*)'\}; export \1$")


def lines_of(text):
    """{key: (value, user's value wins)} for every assignment line; every non-comment line must be one."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = EXPORT_RE.match(line) or DEFAULT_RE.match(line)
        assert m, "not an assignment the file may hold: %r" % line
        out[m.group(1)] = (m.group(2), m.re is DEFAULT_RE)
    return out


def sourced(shell, path, cwd, preset=None):
    """({name: value} the file leaves set that an empty file would not, (stdout, stderr) of sourcing), with
    `preset` in the environment before, the file sourced twice under `set -eu`."""
    preset = dict(preset or {})

    def run(target):
        argv = ["env", "-i"] + ["%s=%s" % kv for kv in preset.items()]
        script = 'set -eu; . "$0"; . "$0"; printf "\\0--\\0"; env -0'
        proc = subprocess.run(argv + [shell, "-c", script, target], cwd=str(cwd), capture_output=True, timeout=30)
        assert proc.returncode == 0, proc
        before, _, env = proc.stdout.partition(b"\0--\0")
        pairs = dict(item.decode().split("=", 1) for item in env.split(b"\0") if item)
        return pairs, (before, proc.stderr)

    base, _ = run("/dev/null")
    after, output = run(str(path))
    assert set(base) - set(after) == set(), "sourcing unset variables"
    return {k: v for k, v in after.items() if (base.get(k) != v or k in preset) and k not in ("_", "IFS")}, output


def check_sources_cleanly(text, tmp_path):
    """bash -n passes; bash and sh set exactly the variables listed, print nothing, run nothing; over
    HOSTILE_ENV the authoritative values replace the leftovers and the user's own values stay."""
    path = tmp_path / "nccl.env"
    path.write_text(text)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0 and syntax.stderr == "", syntax.stderr
    parsed = lines_of(text)
    listed = {k: v for k, (v, _) in parsed.items()}
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    preset = {k: v for k, v in HOSTILE_ENV.items() if k != "IFS"}
    for shell in ("bash", "sh"):
        got, output = sourced(shell, path, cwd)
        assert got == listed, (shell, got, listed)
        assert output == (b"", b""), (shell, output)
        got, output = sourced(shell, path, cwd, HOSTILE_ENV)
        want = dict(preset)
        want.update({k: (preset[k] if default and k in preset else v) for k, (v, default) in parsed.items()})
        assert got == want, (shell, got, want)
        assert output == (b"", b""), (shell, output)
    assert os.listdir(cwd) == [], "sourcing created files: %s" % os.listdir(cwd)
    return listed


# ---------------------------------------------------------------------------------------------- derive


def test_uniform_names_give_exact_match_and_head_data_address():
    derived = envfile.derive(cluster(3))
    assert derived.as_dict() == {
        "NCCL_SOCKET_IFNAME": "=eth1",
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_IB_DISABLE": "1",
        "MASTER_ADDR": data_ip(1),
        "MASTER_PORT": "29500",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "NCCL_DEBUG": "WARN",
    }
    assert [v.key for v in derived.variables if v.default] == ["MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG"]
    assert derived.refused == [] and derived.left_out == {} and derived.nodes == ["n001", "n002", "n003"]
    why = " ".join(w for v in derived.variables for w in v.why)
    assert "nic check" in why and "ports check: n001 listened on 29500 and n[002-003] connected to it" in why
    assert "eth1 in 10.1.0.0/16, mtu 9000" in why


def test_differing_names_list_every_exact_name_and_leave_gloo_out():
    derived = envfile.derive(cluster(3, data={"n003": "ens1f0"}))
    env = derived.as_dict()
    assert env["NCCL_SOCKET_IFNAME"] == "=ens1f0,eth1"
    assert "GLOO_SOCKET_IFNAME" not in env
    assert any("GLOO_SOCKET_IFNAME not written" in n and "ens1f0, eth1" in n for n in derived.notes)
    assert env["MASTER_ADDR"] == data_ip(1)


def test_healthy_subset_only():
    view = cluster(4, data={"n004": "ens1f0"})
    derived = envfile.derive(view, ["n001", "n002", "n003"])
    assert derived.as_dict()["NCCL_SOCKET_IFNAME"] == "=eth1" and derived.as_dict()["GLOO_SOCKET_IFNAME"] == "eth1"
    assert derived.nodes == ["n001", "n002", "n003"]


def test_ib_uniform_gives_exact_hca_list():
    ports = [port("mlx5_0"), port("mlx5_1")]
    derived = envfile.derive(cluster(3, ib={n: ports for n in ("n001", "n002", "n003")}))
    env = derived.as_dict()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_DISABLE"] == "0" and "NCCL_IB_GID_INDEX" not in env
    hca = next(v for v in derived.variables if v.key == "NCCL_IB_HCA")
    assert "the 2 ACTIVE InfiniBand port(s) at 400 Gb/s, identical on n[001-003]" in hca.why[0]


def test_down_port_on_one_node_writes_no_hca_list_and_says_why():
    good = [port("mlx5_0"), port("mlx5_1")]
    down = [port("mlx5_0"), port("mlx5_1", state="DOWN", phys="Disabled")]
    derived = envfile.derive(cluster(3, ib={"n001": good, "n002": down, "n003": good}))
    env = derived.as_dict()
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_DISABLE" not in env
    note = next(n for n in derived.notes if n.startswith("NCCL_IB_HCA not written"))
    assert "n002: mlx5_0:1" in note and "n[001,003]: mlx5_0:1,mlx5_1:1" in note


def test_slow_port_on_one_node_is_not_usable():
    good = [port("mlx5_0"), port("mlx5_1")]
    slow = [port("mlx5_0"), port("mlx5_1", rate=200)]
    derived = envfile.derive(cluster(3, ib={"n001": good, "n002": slow, "n003": good}))
    assert "NCCL_IB_HCA" not in derived.as_dict()


def test_missing_hca_facts_write_nothing_about_ib():
    view = cluster(2, ib={"n001": [port("mlx5_0")], "n002": [port("mlx5_0")]})
    view.facts["n002"]["ib_hca"] = {"probe_error": "boom"}
    derived = envfile.derive(view)
    assert not {"NCCL_IB_HCA", "NCCL_IB_DISABLE"} & set(derived.as_dict())
    assert any("no HCA facts from n002" in n for n in derived.notes)


def test_roce_gid_index():
    roce = [port("mlx5_0", rate=200, layer="roce", gid=3), port("mlx5_1", rate=200, layer="roce", gid=3)]
    env = envfile.derive(cluster(2, ib={"n001": roce, "n002": roce})).as_dict()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env["NCCL_IB_GID_INDEX"] == "3"
    other = [port("mlx5_0", rate=200, layer="roce", gid=5), port("mlx5_1", rate=200, layer="roce", gid=5)]
    derived = envfile.derive(cluster(2, ib={"n001": roce, "n002": other}))
    assert "NCCL_IB_GID_INDEX" not in derived.as_dict() and "NCCL_IB_HCA" in derived.as_dict()
    assert any("NCCL_IB_GID_INDEX not written" in n for n in derived.notes)


@pytest.mark.parametrize(
    "torch,written,note",
    [
        ("2.4.0", "3", None),
        ("2.2.0", "3", None),
        ("2.1.2+cu121", None, "NCCL_ASYNC_ERROR_HANDLING not written: torch 2.1 on n[001-002] reads that name"),
        ({"n001": "2.1.0", "n002": "2.4.1"}, "3", "NCCL_ASYNC_ERROR_HANDLING not written: torch 2.1, 2.4 on n001"),
        (None, None, "TORCH_NCCL_ASYNC_ERROR_HANDLING not written: torch's version was not found"),
    ],
)
def test_async_error_handling_is_torchs_safe_default_never_the_hang_prone_mode(torch, written, note):
    """Issue 25.2: 1 (TearDown) calls ncclCommAbort, which can itself hang; torch 2.2+ defaults to 3. The file
    writes 3 where torch reads TORCH_NCCL_ASYNC_ERROR_HANDLING (so a leftover 1 does not win), nothing else."""
    derived = envfile.derive(cluster(2, torch=torch))
    env = derived.as_dict()
    assert env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == written
    assert "NCCL_ASYNC_ERROR_HANDLING" not in env
    assert all(v != "1" for k, v in env.items() if k.endswith("ASYNC_ERROR_HANDLING"))
    assert (note is None) == (not any("ASYNC_ERROR_HANDLING not written" in n for n in derived.notes))
    if note:
        assert any(n.startswith(note) for n in derived.notes), derived.notes
    if written:
        why = " ".join(next(v for v in derived.variables if v.key == "TORCH_NCCL_ASYNC_ERROR_HANDLING").why)
        assert "without calling ncclCommAbort" in why and "leftover 1" in why


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_interface_name_is_refused_and_its_node_left_out(hostile, tmp_path):
    view = cluster(3, data={"n002": hostile})
    derived = envfile.derive(view)
    assert [(f.check, f.node, f.status) for f in derived.refused] == [("nic", "n002", Status.FAIL)]
    finding = derived.refused[0]
    assert repr(hostile) in finding.message and "refused" in finding.message and "\n" not in finding.message
    assert derived.left_out == {"n002": "its data interface name was refused (nic)"}
    assert derived.nodes == ["n001", "n003"]
    env = derived.as_dict()
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    text = envfile.render(report(view, derived.refused, env=derived))
    assert hostile not in text and "left out: n002 (failed: nic)" in text
    check_sources_cleanly(text, tmp_path)


def test_hostile_name_on_the_head_leaves_out_the_rendezvous(tmp_path):
    view = cluster(3, data={"n001": "e$(id>p)"})
    derived = envfile.derive(view)
    env = derived.as_dict()
    assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1"
    assert any("head node n001 did not pass" in n for n in derived.notes)
    text = envfile.render(report(view, derived.refused, env=derived))
    assert "e$(id>p)" not in text
    check_sources_cleanly(text, tmp_path)


def test_same_hostile_name_everywhere_writes_nothing(tmp_path):
    view = cluster(2, data={"n001": "x$(id)", "n002": "x$(id)"})
    derived = envfile.derive(view)
    assert derived.variables == [] and {f.node for f in derived.refused} == {"n001", "n002"}
    text = envfile.render(report(view, derived.refused, env=derived))
    assert check_sources_cleanly(text, tmp_path) == {}


@pytest.mark.parametrize("hca", ["mlx5_0$(id)", "mlx5 0", "mlx5_0;reboot"])
def test_hostile_hca_name_is_refused(hca, tmp_path):
    ports = [dict(port("mlx5_0"), hca=hca)]
    view = cluster(2, ib={"n001": ports, "n002": ports})
    derived = envfile.derive(view)
    assert not {"NCCL_IB_HCA", "NCCL_IB_DISABLE"} & set(derived.as_dict())
    assert [(f.check, f.status) for f in derived.refused] == [("ib_hca", Status.FAIL)]
    text = envfile.render(report(view, derived.refused, env=derived))
    assert hca not in text
    check_sources_cleanly(text, tmp_path)


def test_rendezvous_needs_the_ports_check_verified():
    # a node that did not complete the handshake: no MASTER_*, with a note naming it
    failed = {"role": "connect", "port": 29500, "connected": False, "handshake": False, "error": "refused"}
    derived = envfile.derive(cluster(3, ports={"n003": failed}))
    assert "MASTER_ADDR" not in derived.as_dict()
    assert any("did not verify that n003 reach n001:29500" in n for n in derived.notes)
    # the head could not listen
    busy = {"role": "listen", "port": 29500, "listening": False, "errno": "EADDRINUSE", "peers": []}
    assert "MASTER_PORT" not in envfile.derive(cluster(3, ports={"n001": busy})).as_dict()
    # facts for another port than the one the job will use
    view = cluster(2)
    view.cluster["master_port"] = 29501
    assert "MASTER_PORT" not in envfile.derive(view).as_dict()
    # the probe failed on the head
    assert "MASTER_ADDR" not in envfile.derive(cluster(2, ports={"n001": {"probe_error": "x"}})).as_dict()
    # another port, verified
    assert envfile.derive(cluster(2, master_port=29600)).as_dict()["MASTER_PORT"] == "29600"


def test_no_healthy_node_writes_nothing(tmp_path):
    view = cluster(2)
    derived = envfile.derive(view, [])
    assert derived.variables == [] and derived.notes == ["no node passed its checks: nothing could be verified"]
    assert check_sources_cleanly(envfile.render(report(view, env=derived)), tmp_path) == {}


# ---------------------------------------------------------------------------------------------- render


def test_render_header_and_file_source_cleanly(tmp_path):
    view = cluster(4, drop=("n004",), ib={n: [port("mlx5_0", layer="roce", rate=200, gid=3)] for n in ("n001", "n002", "n003")})
    view.unreachable["n004"] = "connection refused"
    findings = [
        Finding("ssh", "n004", Status.FAIL, "unreachable: connection refused"),
        Finding("nic", "n004", Status.ERROR, "not checked: node unreachable (see ssh)"),
        Finding("gpu", "n003", Status.FAIL, "7 GPUs (expected 8)", data={"count": 7}),
        Finding("mtu", None, Status.FAIL, "cluster-wide trouble"),
        Finding("nic", "n001", Status.PASS, "eth1"),
    ]
    derived = envfile.derive(view, ["n001", "n002"])
    text = envfile.render(report(view, findings, env=derived))
    head = text.split("\n\n")[0].splitlines()
    assert head[0] == "# NCCL environment recommended by preflight %s; source it in your launch script (bash or sh)." % __version__
    assert re.match(r"^# generated \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ from /etc/preflight/hosts\.yaml \(sha256 abababababababab\)$", head[1]), head[1]
    assert head[2] == "# nodes: n[001-002] (2 of 4)"
    assert "# left out: n003 (failed: gpu)" in head
    assert "# left out: n004 (unreachable: ssh)" in head
    assert "# checks that failed or errored: ssh (n004), gpu (n003), mtu (cluster-wide)" in head
    assert "# not yet proven by the all-reduce test (run `preflight check` with the allreduce check)" in head
    listed = check_sources_cleanly(text, tmp_path)
    assert listed == derived.as_dict()
    assert listed["NCCL_IB_HCA"] == "=mlx5_0:1" and listed["NCCL_IB_GID_INDEX"] == "3"
    # every variable is preceded by its comment
    for key in listed:
        before = re.split(r"^(?:export )?%s=" % key, text, flags=re.M)[0].rstrip("\n").splitlines()[-1]
        assert before.startswith("# ") and len(before) > 10, (key, before)


def test_render_says_whether_the_allreduce_proved_the_env():
    view = cluster(2)
    derived = envfile.derive(view)
    ok = Finding("allreduce", None, Status.WARN, "all-reduce busbw 1 GB/s across 2 ranks", data={"curve": []})
    meta = {"verdict": "warn", "summary": ok.message, "nodes": ["n001", "n002"]}
    text = envfile.render(report(view, [ok], env=derived, allreduce=meta))
    assert "# proven: the all-reduce test ran with exactly these variables on n[001-002]: all-reduce busbw 1 GB/s" in text
    bad = Finding("allreduce", None, Status.FAIL, "rank 1 on n002 timed out at init")
    text = envfile.render(report(view, [bad], env=derived, allreduce=dict(meta, verdict="fail", summary=None)))
    assert "# NOT proven: the all-reduce test with these variables on n[001-002] did not pass (fail)" in text
    text = envfile.render(report(view, [], env=derived, allreduce={"verdict": "skip", "reason": "disabled"}))
    assert "# not proven: the all-reduce test was skipped (disabled)" in text


def test_render_without_a_derived_env_derives_for_the_healthy_nodes(tmp_path):
    view = cluster(3, data={"n003": "ens1f0"})
    findings = [Finding("nic", "n003", Status.FAIL, "whatever")]
    text = envfile.render(report(view, findings))
    assert check_sources_cleanly(text, tmp_path)["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_comments_stay_comments_whatever_the_facts_hold(tmp_path):
    view = cluster(2)
    derived = envfile.derive(view)
    derived.notes.append("evil\nexport EVIL=1\r\n$(touch p)\x00\x1b[2J\u2028export EVIL2=1")
    text = envfile.render(report(view, env=derived, path="/tmp/x\nexport EVIL3=1"))
    lines_of(text)  # every line is a comment or one of the two assignment shapes
    assert "\x00" not in text and "\x1b" not in text
    listed = check_sources_cleanly(text, tmp_path)
    assert not any(k.startswith("EVIL") for k in listed)


@pytest.mark.parametrize("value", ["plain", "a'b", "''", "$(id)", "`id`", "a\\b", "x\ny", "!x", "~", "*"])
def test_quote_round_trips_in_bash_and_sh(value):
    for shell in ("bash", "sh"):
        out = subprocess.run(["env", "-i", shell, "-c", "V=%s; printf %%s \"$V\"" % envfile.quote(value)],
                             capture_output=True, text=True)
        assert out.stdout == value and out.stderr == "", (shell, value, out)


def test_shells_present():
    assert shutil.which("bash") and shutil.which("sh")


def test_hostfile_name_a_launcher_would_misread_is_a_usage_error_before_any_connection(tmp_path, capsys):
    from preflight import cli

    inv = tmp_path / "hosts.yaml"
    inv.write_text("nodes:\n  - {host: 192.0.2.1, name: '-n1'}\n  - {host: 192.0.2.2, name: n2}\n")
    rc = cli.main(["check", str(inv), "--hostfile", str(tmp_path / "hosts"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "invalid host name '-n1'" in err and "Traceback" not in err, err
    assert not (tmp_path / "hosts").exists()


def test_env_command_needs_an_env_file(tmp_path, capsys):
    from preflight import cli

    inv = tmp_path / "hosts.yaml"
    inv.write_text("nodes:\n  - {host: 192.0.2.1}\n")
    assert cli.main(["env", str(inv), "--no-progress"]) == 2
    assert "needs --env-file" in capsys.readouterr().err


def test_render_leaves_out_a_refused_node_even_when_the_caller_did_not_list_the_finding(tmp_path):
    view = cluster(3, data={"n003": "x$(id)"})
    text = envfile.render(report(view))  # no findings at all, no derived env: render derives it
    assert "# nodes: n[001-002] (2 of 3)" in text and "# left out: n003 (failed: nic)" in text
    assert "x$(id)" not in text
    assert check_sources_cleanly(text, tmp_path)["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_h100_rails_plus_bluefield_ethernet_port_write_the_rails():
    """Issue 12.3: 8 InfiniBand rails plus a BlueField-3 Ethernet port: NCCL_IB_HCA names the rails and
    the file says which port was left out and why."""
    from tests.builders import H100_RAILS, h100_bf3_ports

    view = cluster(2, ib={"n001": h100_bf3_ports(), "n002": h100_bf3_ports()})
    derived = envfile.derive(view)
    assert derived.as_dict()["NCCL_IB_HCA"] == "=" + ",".join(H100_RAILS)
    hca = next(v for v in derived.variables if v.key == "NCCL_IB_HCA")
    assert "the 8 ACTIVE InfiniBand port(s) at 400 Gb/s, identical on n[001-002]" in hca.why[0]
    assert any(
        "left out mlx5_bond_0:1 on n[001-002]: RoCE at 200 Gb/s; the rails are InfiniBand at 400 Gb/s" in w
        for w in hca.why
    )
    assert not any("mix InfiniBand and RoCE" in n for n in derived.notes)


def test_tied_link_layers_write_no_hca_list_and_say_why():
    ports = [port("mlx5_0"), port("mlx5_1", rate=200, layer="roce")]
    derived = envfile.derive(cluster(2, ib={"n001": ports, "n002": ports}))
    assert "NCCL_IB_HCA" not in derived.as_dict()
    assert any("NCCL_IB_HCA not written" in n and "as many InfiniBand as RoCE" in n and "no majority link layer" in n for n in derived.notes)


def test_management_network_chosen_is_called_the_management_network():
    """A cluster whose only shared subnet is the management network: the comment must not say otherwise."""
    view = cluster(2)
    for f in view.facts.values():
        f["nic"]["interfaces"] = [i for i in f["nic"]["interfaces"] if i["name"] != "eth1"]
    derived = envfile.derive(view, ["n001", "n002"])
    sock = next(v for v in derived.variables if v.key == "NCCL_SOCKET_IFNAME")
    assert sock.value == "=eno1"
    assert "not loopback, a container bridge or the management network" not in sock.why[0]
    assert "the management network" in sock.why[0] and "no other subnet" in sock.why[0]

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
from preflight.derived import ncclenv
from preflight.output import envfile
from preflight.engine import RunReport
from preflight.model import Finding, Status
from tests.builders import data_ip, env_view, iface, roce_port
from tests.builders import ib_port as port

HOSTILE = ["x$(id)", "e;reboot", "a\nb", "a'b", "a,b", "=eth7", "^eth7", "`id`", "e$(id>p)", "qq zz", "a\"b", "x\\y"]


# ------------------------------------------------------------------------------------------------ facts


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
    derived = ncclenv.derive(env_view(3))
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
    derived = ncclenv.derive(env_view(3, data={"n003": "ens1f0"}))
    env = derived.as_dict()
    assert env["NCCL_SOCKET_IFNAME"] == "=ens1f0,eth1"
    assert "GLOO_SOCKET_IFNAME" not in env
    assert any("GLOO_SOCKET_IFNAME not written" in n and "ens1f0, eth1" in n for n in derived.notes)
    assert env["MASTER_ADDR"] == data_ip(1)


def test_healthy_subset_only():
    view = env_view(4, data={"n004": "ens1f0"})
    derived = ncclenv.derive(view, ["n001", "n002", "n003"])
    assert derived.as_dict()["NCCL_SOCKET_IFNAME"] == "=eth1" and derived.as_dict()["GLOO_SOCKET_IFNAME"] == "eth1"
    assert derived.nodes == ["n001", "n002", "n003"]


def test_ib_uniform_gives_exact_hca_list():
    ports = [port("mlx5_0"), port("mlx5_1")]
    derived = ncclenv.derive(env_view(3, ib={n: ports for n in ("n001", "n002", "n003")}))
    env = derived.as_dict()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_DISABLE"] == "0" and "NCCL_IB_GID_INDEX" not in env
    hca = next(v for v in derived.variables if v.key == "NCCL_IB_HCA")
    assert "the 2 ACTIVE InfiniBand port(s) at 400 Gb/s, identical on n[001-003]" in hca.why[0]


def test_down_port_on_one_node_writes_no_hca_list_and_says_why():
    good = [port("mlx5_0"), port("mlx5_1")]
    down = [port("mlx5_0"), port("mlx5_1", state="DOWN", phys="Disabled")]
    derived = ncclenv.derive(env_view(3, ib={"n001": good, "n002": down, "n003": good}))
    env = derived.as_dict()
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_DISABLE" not in env
    note = next(n for n in derived.notes if n.startswith("NCCL_IB_HCA not written"))
    assert "n002: mlx5_0:1" in note and "n[001,003]: mlx5_0:1,mlx5_1:1" in note


def test_slow_port_on_one_node_is_not_usable():
    good = [port("mlx5_0"), port("mlx5_1")]
    slow = [port("mlx5_0"), port("mlx5_1", rate=200)]
    derived = ncclenv.derive(env_view(3, ib={"n001": good, "n002": slow, "n003": good}))
    assert "NCCL_IB_HCA" not in derived.as_dict()


def test_missing_hca_facts_write_nothing_about_ib():
    view = env_view(2, ib={"n001": [port("mlx5_0")], "n002": [port("mlx5_0")]})
    view.facts["n002"]["ib_hca"] = {"probe_error": "boom"}
    derived = ncclenv.derive(view)
    assert not {"NCCL_IB_HCA", "NCCL_IB_DISABLE"} & set(derived.as_dict())
    assert any("no HCA facts from n002" in n for n in derived.notes)


def test_roce_gid_index():
    roce = [port("mlx5_0", rate=200, layer="roce", gid=3), port("mlx5_1", rate=200, layer="roce", gid=3)]
    env = ncclenv.derive(env_view(2, ib={"n001": roce, "n002": roce})).as_dict()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env["NCCL_IB_GID_INDEX"] == "3"
    other = [port("mlx5_0", rate=200, layer="roce", gid=5), port("mlx5_1", rate=200, layer="roce", gid=5)]
    derived = ncclenv.derive(env_view(2, ib={"n001": roce, "n002": other}))
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
    derived = ncclenv.derive(env_view(2, torch=torch))
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
    view = env_view(3, data={"n002": hostile})
    derived = ncclenv.derive(view)
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
    view = env_view(3, data={"n001": "e$(id>p)"})
    derived = ncclenv.derive(view)
    env = derived.as_dict()
    assert "MASTER_ADDR" not in env and "MASTER_PORT" not in env
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1"
    assert any("head node n001 did not pass" in n for n in derived.notes)
    text = envfile.render(report(view, derived.refused, env=derived))
    assert "e$(id>p)" not in text
    check_sources_cleanly(text, tmp_path)


def test_same_hostile_name_everywhere_writes_nothing(tmp_path):
    view = env_view(2, data={"n001": "x$(id)", "n002": "x$(id)"})
    derived = ncclenv.derive(view)
    assert derived.variables == [] and {f.node for f in derived.refused} == {"n001", "n002"}
    text = envfile.render(report(view, derived.refused, env=derived))
    assert check_sources_cleanly(text, tmp_path) == {}


@pytest.mark.parametrize("hca", ["mlx5_0$(id)", "mlx5 0", "mlx5_0;reboot"])
def test_hostile_hca_name_is_refused(hca, tmp_path):
    ports = [dict(port("mlx5_0"), hca=hca)]
    view = env_view(2, ib={"n001": ports, "n002": ports})
    derived = ncclenv.derive(view)
    assert not {"NCCL_IB_HCA", "NCCL_IB_DISABLE"} & set(derived.as_dict())
    assert [(f.check, f.status) for f in derived.refused] == [("ib_hca", Status.FAIL)]
    text = envfile.render(report(view, derived.refused, env=derived))
    assert hca not in text
    check_sources_cleanly(text, tmp_path)


def test_rendezvous_needs_the_ports_check_verified():
    # a node that did not complete the handshake: no MASTER_*, with a note naming it
    failed = {"role": "connect", "port": 29500, "connected": False, "handshake": False, "error": "refused"}
    derived = ncclenv.derive(env_view(3, ports={"n003": failed}))
    assert "MASTER_ADDR" not in derived.as_dict()
    assert any("did not verify that n003 reach n001:29500" in n for n in derived.notes)
    # the head could not listen
    busy = {"role": "listen", "port": 29500, "listening": False, "errno": "EADDRINUSE", "peers": []}
    assert "MASTER_PORT" not in ncclenv.derive(env_view(3, ports={"n001": busy})).as_dict()
    # facts for another port than the one the job will use
    view = env_view(2)
    view.cluster["master_port"] = 29501
    assert "MASTER_PORT" not in ncclenv.derive(view).as_dict()
    # the probe failed on the head
    assert "MASTER_ADDR" not in ncclenv.derive(env_view(2, ports={"n001": {"probe_error": "x"}})).as_dict()
    # another port, verified
    assert ncclenv.derive(env_view(2, master_port=29600)).as_dict()["MASTER_PORT"] == "29600"


def test_no_healthy_node_writes_nothing(tmp_path):
    view = env_view(2)
    derived = ncclenv.derive(view, [])
    assert derived.variables == [] and derived.notes == ["no node passed its checks: nothing could be verified"]
    assert check_sources_cleanly(envfile.render(report(view, env=derived)), tmp_path) == {}


# ---------------------------------------------------------------------------------------------- render


def test_render_header_and_file_source_cleanly(tmp_path):
    view = env_view(4, drop=("n004",), ib={n: [port("mlx5_0", layer="roce", rate=200, gid=3)] for n in ("n001", "n002", "n003")})
    view.unreachable["n004"] = "connection refused"
    findings = [
        Finding("ssh", "n004", Status.FAIL, "unreachable: connection refused"),
        Finding("nic", "n004", Status.ERROR, "not checked: node unreachable (see ssh)"),
        Finding("gpu", "n003", Status.FAIL, "7 GPUs (expected 8)", data={"count": 7}),
        Finding("mtu", None, Status.FAIL, "cluster-wide trouble"),
        Finding("nic", "n001", Status.PASS, "eth1"),
    ]
    derived = ncclenv.derive(view, ["n001", "n002"])
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
    view = env_view(2)
    derived = ncclenv.derive(view)
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
    view = env_view(3, data={"n003": "ens1f0"})
    findings = [Finding("nic", "n003", Status.FAIL, "whatever")]
    text = envfile.render(report(view, findings))
    assert check_sources_cleanly(text, tmp_path)["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_comments_stay_comments_whatever_the_facts_hold(tmp_path):
    view = env_view(2)
    derived = ncclenv.derive(view)
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
    view = env_view(3, data={"n003": "x$(id)"})
    text = envfile.render(report(view))  # no findings at all, no derived env: render derives it
    assert "# nodes: n[001-002] (2 of 3)" in text and "# left out: n003 (failed: nic)" in text
    assert "x$(id)" not in text
    assert check_sources_cleanly(text, tmp_path)["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_h100_rails_plus_bluefield_ethernet_port_write_the_rails():
    """Issue 12.3: 8 InfiniBand rails plus a BlueField-3 Ethernet port: NCCL_IB_HCA names the rails and
    the file says which port was left out and why."""
    from tests.builders import H100_RAILS, h100_bf3_ports

    view = env_view(2, ib={"n001": h100_bf3_ports(), "n002": h100_bf3_ports()})
    derived = ncclenv.derive(view)
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
    derived = ncclenv.derive(env_view(2, ib={"n001": ports, "n002": ports}))
    assert "NCCL_IB_HCA" not in derived.as_dict()
    assert any("NCCL_IB_HCA not written" in n and "as many InfiniBand as RoCE" in n and "no majority link layer" in n for n in derived.notes)


def test_management_network_chosen_is_called_the_management_network():
    """A cluster whose only shared subnet is the management network: the comment must not say otherwise."""
    view = env_view(2)
    for f in view.facts.values():
        f["nic"]["interfaces"] = [i for i in f["nic"]["interfaces"] if i["name"] != "eth1"]
    derived = ncclenv.derive(view, ["n001", "n002"])
    sock = next(v for v in derived.variables if v.key == "NCCL_SOCKET_IFNAME")
    assert sock.value == "=eno1"
    assert "not loopback, a container bridge or the management network" not in sock.why[0]
    assert "the management network" in sock.why[0] and "no other subnet" in sock.why[0]


# ------------------------------------------------------------------------------- issue 25: env file v2


def test_interface_list_that_would_select_the_management_port_is_not_written_globally(tmp_path):
    """25.1: n003's data NIC is ens1f0, and on n001 an ens1f0 exists too (a 1 GbE port in another subnet):
    '=ens1f0,eth1' would make n001's NCCL match both. No global value; per-node values, said so."""
    extra = {"n001": [iface("ens1f0", "10.2.0.1", 24, 1500, 1000)]}
    view = env_view(3, data={"n003": "ens1f0"}, extra=extra)
    derived = ncclenv.derive(view)
    env = derived.as_dict()
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env
    assert derived.per_node == {
        "n001": {"NCCL_SOCKET_IFNAME": "=eth1", "GLOO_SOCKET_IFNAME": "eth1"},
        "n002": {"NCCL_SOCKET_IFNAME": "=eth1", "GLOO_SOCKET_IFNAME": "eth1"},
        "n003": {"NCCL_SOCKET_IFNAME": "=ens1f0", "GLOO_SOCKET_IFNAME": "ens1f0"},
    }
    note = next(n for n in derived.notes if n.startswith("NCCL_SOCKET_IFNAME not written"))
    assert "'=ens1f0,eth1' would also select ens1f0 on n001" in note and "first match in interface order" in note
    text = envfile.render(report(view, env=derived))
    assert "# n[001-002]: GLOO_SOCKET_IFNAME='eth1' NCCL_SOCKET_IFNAME='=eth1'" in text
    assert "# n003: GLOO_SOCKET_IFNAME='ens1f0' NCCL_SOCKET_IFNAME='=ens1f0'" in text
    assert "takes the one of these exact names each node has" not in text
    check_sources_cleanly(text, tmp_path)


def test_interface_list_is_written_where_each_node_has_exactly_one_of_the_names(tmp_path):
    """25.1, the healthy twin: names differ, but no node has the other name: the list selects the data NIC only."""
    view = env_view(3, data={"n003": "ens1f0"})
    derived = ncclenv.derive(view)
    var = next(v for v in derived.variables if v.key == "NCCL_SOCKET_IFNAME")
    assert var.value == "=ens1f0,eth1"
    assert "on every node exactly one of them exists, and it is that node's data interface" in " ".join(var.why)
    assert not any("takes the one of these exact names each node has" in w for w in var.why)
    assert derived.per_node == {n: {"GLOO_SOCKET_IFNAME": i} for n, i in (("n001", "eth1"), ("n002", "eth1"), ("n003", "ens1f0"))}
    assert check_sources_cleanly(envfile.render(report(view, env=derived)), tmp_path)["NCCL_SOCKET_IFNAME"] == "=ens1f0,eth1"


def test_ib_rails_turn_ib_on_over_a_leftover_disable(tmp_path):
    """25.3: NCCL_IB_DISABLE=0 beside NCCL_IB_HCA, so a leftover NCCL_IB_DISABLE=1 (environment, ~/.nccl.conf,
    /etc/nccl.conf: the environment beats both) cannot keep IB off; sourcing over one leaves it 0."""
    view = env_view(2, ib={n: [port("mlx5_0"), port("mlx5_1")] for n in ("n001", "n002")})
    derived = ncclenv.derive(view)
    assert derived.as_dict()["NCCL_IB_DISABLE"] == "0"
    why = next(v for v in derived.variables if v.key == "NCCL_IB_DISABLE").why[0]
    assert "environment beats both files" in why
    path = tmp_path / "nccl.env"
    path.write_text(envfile.render(report(view, env=derived)))
    for shell in ("bash", "sh"):
        got, _ = sourced(shell, path, tmp_path, {"NCCL_IB_DISABLE": "1"})
        assert got["NCCL_IB_DISABLE"] == "0" and got["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"


@pytest.mark.parametrize(
    "nccl,written,says",
    [
        ("2.19.3", {"NCCL_IB_GID_INDEX": "3"}, "NCCL 2.19.3: before 2.21 NCCL uses GID index 0 (RoCE v1) unless told"),
        (None, {"NCCL_IB_GID_INDEX": "3"}, "NCCL's version was not found on n[001-002]; pinned, as NCCL before 2.21 needs"),
        ("2.21.5", {}, "NCCL_IB_GID_INDEX not written: NCCL 2.21.5 (2.21 and later) picks the first RoCE v2 IPv4 GID per port itself, here GID 3"),
        ({"n001": "2.21.5", "n002": "2.19.3"}, {"NCCL_IB_GID_INDEX": "3"}, "NCCL 2.19.3, 2.21.5: before 2.21"),
    ],
)
def test_roce_gid_index_follows_the_nccl_version(nccl, written, says):
    """25.4: before NCCL 2.21 the index must be pinned (NCCL uses GID 0 otherwise); from 2.21 NCCL picks it per
    port, and a pinned index would freeze a table that can change."""
    ports = [roce_port("mlx5_0", [(3, "10.1.0.%d" % i, "ens1f0np0")]) for i in (1, 2)]
    derived = ncclenv.derive(env_view(2, nccl=nccl, ib={"n001": [ports[0]], "n002": [ports[1]]}))
    env = derived.as_dict()
    assert {k: env[k] for k in env if k in ("NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_RANGE")} == written
    said = " ".join(derived.notes + [w for v in derived.variables for w in v.why])
    assert says in said, said


def test_roce_gid_index_differing_across_nodes_before_2_21_gives_per_node_values(tmp_path):
    """25.4: NCCL 2.19 and the RoCE v2 entry at GID 3 on n001, GID 5 on n002: no single index is right, and
    NCCL's default (GID 0, RoCE v1) is wrong everywhere: per-node values, not only a note."""
    a = roce_port("mlx5_0", [(3, "10.1.0.11", "ens1f0np0")])
    b = roce_port("mlx5_0", [(5, "10.1.0.12", "ens1f0np0")])
    view = env_view(2, nccl="2.19.3", ib={"n001": [a], "n002": [b]})
    derived = ncclenv.derive(view)
    assert "NCCL_IB_GID_INDEX" not in derived.as_dict()
    assert derived.per_node == {"n001": {"NCCL_IB_GID_INDEX": "3"}, "n002": {"NCCL_IB_GID_INDEX": "5"}}
    text = envfile.render(report(view, env=derived))
    assert "# n001: NCCL_IB_GID_INDEX='3'" in text and "# n002: NCCL_IB_GID_INDEX='5'" in text
    check_sources_cleanly(text, tmp_path)


def vlan_ports(i):
    """A RoCE port whose untagged netdev holds 10.3.0.x (GID 3) and whose VLAN 100 holds the data address (GID 5)."""
    return [roce_port("mlx5_0", [(3, "10.3.0.%d" % i, "ens1f0np0"), (5, data_ip(i), "ens1f0np0.100")])]


def test_roce_gid_is_the_entry_in_the_data_subnet_not_the_lowest():
    """25.5: the lowest RoCE v2 IPv4 GID is the untagged (lossy) one; the data subnet 10.1.0.0/16 is on the VLAN."""
    derived = ncclenv.derive(env_view(2, nccl="2.19.3", ib={"n001": vlan_ports(1), "n002": vlan_ports(2)}))
    env = derived.as_dict()
    assert env["NCCL_IB_GID_INDEX"] == "5"
    assert "(the entry in the data subnet 10.1.0.0/16)" in next(v for v in derived.variables if v.key == "NCCL_IB_GID_INDEX").why[0]
    # NCCL 2.21+ would pick GID 3 itself (the first RoCE v2 IPv4 entry): the subnet range keeps it on the VLAN
    derived = ncclenv.derive(env_view(2, nccl="2.23.4", ib={"n001": vlan_ports(1), "n002": vlan_ports(2)}))
    env = derived.as_dict()
    assert env["NCCL_IB_ADDR_RANGE"] == "10.1.0.0/16" and "NCCL_IB_GID_INDEX" not in env
    why = " ".join(next(v for v in derived.variables if v.key == "NCCL_IB_ADDR_RANGE").why)
    assert "first RoCE v2 IPv4 GID is GID 3, outside the data subnet; GID 5 (10.1.0.11 on ens1f0np0.100) is in it" in why


def test_roce_gids_outside_the_data_subnet():
    """25.5, twins: one RoCE v2 IPv4 GID (outside the data subnet: rails have their own subnets) is the one;
    two and none in the data subnet: not guessed, said so."""
    one = {n: [roce_port("mlx5_0", [(3, "10.7.0.%d" % i, "ens1f0np0")])] for i, n in ((1, "n001"), (2, "n002"))}
    assert ncclenv.derive(env_view(2, nccl="2.19.3", ib=one)).as_dict()["NCCL_IB_GID_INDEX"] == "3"
    two = {n: [roce_port("mlx5_0", [(3, "10.7.0.%d" % i, "ens1f0np0"), (5, "10.8.0.%d" % i, "ens1f0np0.7")])]
           for i, n in ((1, "n001"), (2, "n002"))}
    derived = ncclenv.derive(env_view(2, nccl="2.19.3", ib=two))
    assert "NCCL_IB_GID_INDEX" not in derived.as_dict() and "NCCL_IB_HCA" in derived.as_dict()
    assert any("2 RoCE v2 IPv4 GIDs, none in the data subnet 10.1.0.0/16" in n for n in derived.notes), derived.notes


def test_users_own_debug_and_rendezvous_win_and_the_file_says_which_values_are_authoritative(tmp_path):
    """25.6: NCCL_DEBUG, MASTER_ADDR, MASTER_PORT keep a value the launch environment set; the rest replace it."""
    view = env_view(2)
    text = envfile.render(report(view, env=ncclenv.derive(view)))
    assert "# authoritative (the file's value replaces one already set): NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, " \
           "NCCL_IB_DISABLE, TORCH_NCCL_ASYNC_ERROR_HANDLING" in text
    assert "# yours win (kept when already set, else the file's): MASTER_ADDR, MASTER_PORT, NCCL_DEBUG" in text
    path = tmp_path / "nccl.env"
    path.write_text(text)
    for shell in ("bash", "sh"):
        got, _ = sourced(shell, path, tmp_path, {"NCCL_DEBUG": "INFO", "MASTER_ADDR": "10.9.9.9", "NCCL_SOCKET_IFNAME": "=eno1,eth1"})
        assert (got["NCCL_DEBUG"], got["MASTER_ADDR"], got["MASTER_PORT"]) == ("INFO", "10.9.9.9", "29500")
        assert got["NCCL_SOCKET_IFNAME"] == "=eth1"
        got, _ = sourced(shell, path, tmp_path, {"NCCL_DEBUG": "", "MASTER_PORT": ""})  # set but empty: the file's
        assert (got["NCCL_DEBUG"], got["MASTER_PORT"]) == ("WARN", "29500")
    check_sources_cleanly(text, tmp_path)


# NCCL_DEBUG=INFO lines in the shapes of real logs: NVIDIA/nccl#892 (the RDMA plugin v5 loaded on NCCL 2.18),
# a DGX Spark NCCL 2.28.9 log ("NET/Plugin: Could not find: libnccl-net.so", "Initialized NET plugin IB"),
# aws-samples/aws-efa-eks's README (EFA, aws-ofi-nccl: "Using network AWS Libfabric"), and
# tests/fixtures/allreduce/plugin_ibext_nvls.log (HPC-X SHARP "Plugin Path", NVIDIA/nccl#1737).
LOG_HEAD = "gpu-001:4052:4052 [0] NCCL INFO "
LOGS = {
    "loaded_but_internal_ib": [
        "NCCL version 2.18.5+cuda12.2",
        "NET/Plugin: Failed to find ncclNetPlugin_v6 symbol.",
        "NET/Plugin: Loaded net plugin NCCL RDMA Plugin (v5)",
        "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth1:10.1.0.11<0>",
        "Using network IB",
        "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
    ],
    "internal_ib": [
        "NCCL version 2.28.9+cuda13.0",
        "NET/Plugin: Could not find: libnccl-net.so",
        "Initialized NET plugin IB",
        "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth1:10.1.0.11<0>",
        "Using network IB",
        "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
    ],
    "efa": [
        "NCCL version 2.9.9+cuda11.0",
        "NET/OFI Selected Provider is efa",
        "NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.",
        "Using network AWS Libfabric",
        "Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA",
    ],
    "efa_named": [
        "NCCL version 2.21.5+cuda12.4",
        "Plugin Path : /opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so",
        "Using network AWS Libfabric",
        "Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA",
    ],
}


def proof(name, nodes=("n001", "n002")):
    """The allreduce findings a proven NCCL run leaves (data["nccl"] as nccl_findings builds it from the log)."""
    from preflight.checks.allreduce.nccllog import nccl_summary, parse_nccl_log

    facts = nccl_summary([parse_nccl_log("\n".join((LOG_HEAD + line) if not line.startswith("NCCL version") else line
                                                  for line in LOGS[name]))])
    findings = [Finding("allreduce", n, Status.PASS, "NCCL ...", data={"nccl": facts}) for n in nodes]
    ok = Finding("allreduce", None, Status.PASS, "all-reduce busbw 180 GB/s across 16 ranks")
    return findings + [ok], {"verdict": "pass", "summary": ok.message, "nodes": list(nodes)}


@pytest.mark.parametrize(
    "log,ib,plugin,says",
    [
        ("loaded_but_internal_ib", True, "none", "the net plugin NCCL RDMA Plugin (v5) was loaded, but the traffic went over NCCL's internal IB"),
        ("internal_ib", True, None, "NCCL_NET_PLUGIN not written: the proven run on n[001-002] loaded no net plugin and used NCCL's internal IB"),
        ("efa", False, None, "NCCL_NET_PLUGIN not written: the proven run's traffic on n[001-002] went over the net plugin AWS Libfabric"),
        ("efa_named", False, "ofi", "pinned by name: NCCL loads libnccl-net-ofi.so"),
    ],
)
def test_net_plugin_follows_the_proofs_nccl_log(log, ib, plugin, says, tmp_path):
    """25.7: 'none' only where the proven run used NCCL's internal IB beside a loaded plugin; never on EFA; the
    NCCL_IB_DISABLE=1 comment names the plugin that carries the traffic instead of 'NCCL uses sockets'."""
    ports = {n: [port("mlx5_0"), port("mlx5_1")] for n in ("n001", "n002")} if ib else None
    view = env_view(2, ib=ports, nccl="2.21.5")
    derived = ncclenv.derive(view)
    findings, meta = proof(log)
    text = envfile.render(report(view, findings, env=derived, allreduce=meta))
    listed = check_sources_cleanly(text, tmp_path)
    assert listed.get("NCCL_NET_PLUGIN") == plugin
    assert says in " ".join(text.split()), text
    if not ib:
        disable = text.split("export NCCL_IB_DISABLE=")[0].rstrip("\n").splitlines()[-1]
        assert "AWS Libfabric" in disable and "which this does not turn off" in disable
        assert "NCCL uses sockets" not in text
    version = {"loaded_but_internal_ib": "2.18.5", "internal_ib": "2.28.9", "efa": "2.9.9", "efa_named": "2.21.5"}[log]
    assert "# proven with NCCL %s (the all-reduce's NCCL log) and torch 2.4.0+cu121 (driver check)" % version in text


def test_header_names_the_versions_found_when_not_proven():
    """25.4: the header says which NCCL and torch the file was derived for (the driver check's facts)."""
    view = env_view(2, nccl={"n001": "2.21.5", "n002": "2.21.5"})
    text = envfile.render(report(view, env=ncclenv.derive(view)))
    assert "# on the nodes: NCCL 2.21.5, torch 2.4.0+cu121 (driver check)" in text
    text = envfile.render(report(env_view(2, torch=None), env=ncclenv.derive(env_view(2, torch=None))))
    assert "# on the nodes: NCCL not found, torch not found (driver check)" in text


def test_roce_range_is_not_written_where_a_rail_is_addressed_outside_the_data_subnet():
    """25.5 with NCCL 2.21+: mlx5_0's data-subnet GID is its VLAN's (5), but mlx5_1 holds its only RoCE address
    in another subnet: NCCL_IB_ADDR_RANGE would leave mlx5_1 without a GID, so the index (5 on both) is pinned."""
    ib = {n: vlan_ports(i) + [roce_port("mlx5_1", [(5, "10.7.0.%d" % i, "ens2f0np0")], netdev="ens2f0np0")]
          for i, n in ((1, "n001"), (2, "n002"))}
    derived = ncclenv.derive(env_view(2, nccl="2.23.4", ib=ib))
    env = derived.as_dict()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and env["NCCL_IB_GID_INDEX"] == "5" and "NCCL_IB_ADDR_RANGE" not in env
    why = " ".join(next(v for v in derived.variables if v.key == "NCCL_IB_GID_INDEX").why)
    assert "NCCL_IB_ADDR_RANGE cannot serve n001 mlx5_1:1, n002 mlx5_1:1, addressed outside it" in why, why

"""ssh_config `Include` is followed as OpenSSH follows it (ssh_config(5)): a host defined in an included
file is reached, conditional includes stay conditional, and a broken Include is one located line."""

from __future__ import annotations

import json
import sys

from preflight import cli
from preflight.transport.ssh_config import read_ssh_config
from tests.paths import REPO



def test_host_defined_in_an_included_file_is_reached(sim_cluster, tmp_path):
    cluster = sim_cluster(1)
    confd = tmp_path / "conf.d"
    confd.mkdir()
    (confd / "10-gpu.conf").write_text("Host gpu-alias\n    HostName %s\n    User root\n" % cluster.node(1).mgmt_ip)
    config = tmp_path / "ssh_config"
    config.write_text("Include %s/*.conf\n" % confd)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        "defaults:\n  identity_file: %s\n  known_hosts: %s\n  ssh_config: %s\nnodes:\n  - host: gpu-alias\n"
        % (cluster.identity_file, cluster.known_hosts, config)
    )
    proc = cluster.ctl([sys.executable, "-m", "preflight", "check", str(inv), "--only", "ssh", "--json", "-",
                        "--no-progress"], cwd=REPO, timeout=120)
    doc = json.loads(proc.stdout)
    ssh = [r for r in doc["results"] if r["check"] == "ssh"][0]
    assert proc.returncode == 0 and ssh["status"] == "pass", ssh


def test_include_inside_a_block_stays_conditional(tmp_path):
    import paramiko

    (tmp_path / "inc").write_text("User inner\nHost other\n    Port 2222\n")
    config = tmp_path / "config"
    config.write_text("Host a\n    Include %s/inc\n    HostName 198.18.0.9\nHost *\n    User outer\n" % tmp_path)
    parsed = paramiko.SSHConfig.from_text(read_ssh_config(str(config)))
    assert parsed.lookup("a")["user"] == "inner" and parsed.lookup("a")["hostname"] == "198.18.0.9"
    assert parsed.lookup("other")["port"] == "2222" and parsed.lookup("other")["hostname"] == "other"
    assert parsed.lookup("b")["user"] == "outer"


def test_include_loop_is_one_located_line(tmp_path, capsys):
    config = tmp_path / "config"
    config.write_text("Include %s\n" % config)
    inv = tmp_path / "hosts.yaml"
    inv.write_text("defaults:\n  ssh_config: %s\nnodes: [a]\n" % config)
    assert cli.main(["check", str(inv), "--only", "ssh", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested more than 16" in err[0], err

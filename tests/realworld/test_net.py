"""Real captures of network facts (../shared/realworld) through preflight's own probes, parsers and rules.

Every capture in ib_sysfs/, ip_addr_json/, ping/ and lspci/ is one parametrised case, so pytest's counts
are the survey's counts: `test_parses` (no parser raises on a well-formed capture), `test_agrees` (the
facts agree with the capture, read here independently with plain string handling, and a healthy capture
raises no warning). The captures are public data kept outside the repository (see its SOURCES.md);
without that folder every case is skipped with the reason. Nothing from it is copied into tests/.

    .venv/bin/python -m pytest -q tests/realworld/test_net.py -rs
"""

import ipaddress
import json
import os
import re
import sys
from pathlib import Path

import pytest

from preflight.checks.gpudirect import probe as gpudirect_probe
from preflight.checks.gpudirect import rule as gpudirect_rule
from preflight.checks.ib_hca import probe as ib_hca_probe
from preflight.checks.ib_hca import rule as ib_hca_rule
from preflight.checks.mtu import probe as mtu_probe
from preflight.checks.mtu import rule as mtu_rule
from preflight.checks.nic import probe as nic_probe
from preflight.checks.nic import rule as nic_rule
from preflight.output.envfile import derive
from preflight.model import NodeInfo, Status
from preflight.derived import rails as derived_rails
from preflight.probe.context import NodeContext
from tests import builders
from tests.paths import REPO

REALWORLD = Path(os.environ.get("PREFLIGHT_REALWORLD") or os.path.join(REPO, "..", "shared", "realworld")).resolve()
KINDS = ("ib_sysfs", "ip_addr_json", "ping", "lspci")
PROBLEMS = (Status.WARN, Status.FAIL, Status.ERROR)


def _captures():
    if not REALWORLD.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="no real captures at %s" % REALWORLD))]
    out = []
    for kind in KINDS:
        folder = REALWORLD / kind
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            if kind == "ip_addr_json" and entry.name.endswith(".sysfs.txt"):
                continue  # the sysfs attributes that go with an addr/link pair, read by that case
            out.append(pytest.param(kind, entry, id="%s/%s" % (kind, entry.name)))
    return out


CAPTURES = _captures()


# ------------------------------------------------------------------------------------ reading captures


def _probe_ib(tree):
    return ib_hca_probe.probe(NodeContext(sysfs_root=str(tree)))


def _raw_ib_ports(tree):
    """[(hca, port, state, rate Gb/s, link layer)] read straight from the files."""
    root = tree / "class" / "infiniband"
    out = []
    for hca in sorted(os.listdir(str(root))):
        for port in sorted(os.listdir(str(root / hca / "ports"))):
            pdir = root / hca / "ports" / port
            state = (pdir / "state").read_text().split(":", 1)[1].strip()
            rate = float((pdir / "rate").read_text().split()[0])
            layer = (pdir / "link_layer").read_text().strip()
            out.append((hca, int(port), state, rate, {"InfiniBand": "ib", "Ethernet": "roce"}[layer]))
    return sorted(out)


def _ip_kind(path):
    return "link" if "link" in path.name else "addr"


def _sysfs_attrs(path):
    """The `name/attr=value` lines of a *.sysfs.txt beside an ip capture, as a sysfs tree description."""
    side = Path(str(path).replace(".addr.json", ".sysfs.txt").replace(".link.json", ".sysfs.txt"))
    if side == path or not side.exists():
        return None
    attrs = {}
    for line in side.read_text().splitlines():
        key, _, value = line.partition("=")
        attrs[key] = value
    return attrs


def _write_sysfs(attrs, root):
    for key, value in attrs.items():
        name, attr = key.split("/", 1)
        d = root / "class" / "net" / name
        d.mkdir(parents=True, exist_ok=True)
        if attr == "device":
            if value == "present":
                (d / "device").mkdir(exist_ok=True)
        elif value != "<unreadable>":
            (d / attr).write_text(value + "\n")


FAKE_IP = """#!{python}
import sys
files = {{("-j", "-d", "addr", "show"): {both!r}}}
name = files.get(tuple(sys.argv[1:]))
if name is None:
    sys.stderr.write("ip: unexpected arguments %r\\n" % (sys.argv[1:],))
    sys.exit(255)
sys.stdout.write(open(name).read())
"""


def _d_addr(addr_path, link_path, out):
    """What `ip -j -d addr show` prints on the node of an `ip -j addr show` capture and its `ip -j -d link show`
    twin: each addr entry with its link's linkinfo (the addr capture alone where there is no twin; a
    `-d -j addr` capture, such as netplan's, already carries it)."""
    entries = json.loads(addr_path.read_text())
    if link_path.exists() and link_path != addr_path:
        info = {item["ifname"]: item.get("linkinfo") for item in json.loads(link_path.read_text())}
        for item in entries:
            if info.get(item.get("ifname")) is not None:
                item["linkinfo"] = info[item["ifname"]]
    out.write_text(json.dumps(entries))
    return out


def _nic_probe(addr_path, tmp_path, monkeypatch):
    """nic_probe.probe on a node whose `ip -j -d addr show` prints the capture (with its link twin's linkinfo when
    there is one) and whose sysfs holds the side attributes."""
    both = _d_addr(addr_path, Path(str(addr_path).replace(".addr.json", ".link.json")), tmp_path / "ip-d-addr.json")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ip"
    script.write_text(FAKE_IP.format(python=sys.executable, both=str(both)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    monkeypatch.delenv("SSH_CONNECTION", raising=False)
    sysroot = tmp_path / "sys"
    sysroot.mkdir()
    attrs = _sysfs_attrs(addr_path)
    if attrs:
        _write_sysfs(attrs, sysroot)
    return nic_probe.probe(NodeContext(sysfs_root=str(sysroot)))


def _raw_ip(path):
    """{ifname: (mtu, sorted non-link-local addresses)} straight from the JSON."""
    out = {}
    for item in json.loads(path.read_text()):
        addrs = []
        for info in item.get("addr_info") or []:
            if info.get("family") not in ("inet", "inet6"):
                continue
            if info["family"] == "inet6" and info["local"].lower().startswith("fe80:"):
                continue
            addrs.append("%s/%s" % (info["local"], info["prefixlen"]))
        out[item["ifname"]] = (item["mtu"], sorted(addrs))
    return out


def _raw_ping(text):
    """(transmitted, received, loss %, refused as too big, reported mtu) with plain string handling."""
    tx = rx = loss = None
    for line in text.splitlines():
        if "packets transmitted" in line:
            parts = [p.strip() for p in line.split(",")]
            tx = int(parts[0].split()[0])
            rx = int(parts[1].split()[0])
            loss = float(next(p for p in parts if p.endswith("packet loss")).split("%")[0])
    lowered = text.lower()
    too_big = "message too long" in lowered or "frag needed" in lowered
    mtus = [int(m) for m in re.findall(r"mtu\s*[=:]?\s*=?\s*(\d+)", lowered)]
    return tx, rx, loss, too_big, (mtus[-1] if mtus else None)


# -------------------------------------------------------------------------------------------- the tests


def _parse(kind, path, tmp_path, monkeypatch):
    if kind == "ib_sysfs":
        return _probe_ib(path)
    if kind == "ip_addr_json":
        text = path.read_text()
        if _ip_kind(path) == "link":
            return nic_probe.parse_ip_link(text)
        nic_probe.parse_ip_addr(text)
        return _nic_probe(path, tmp_path, monkeypatch)
    if kind == "ping":
        return mtu_probe.parse_ping(path.read_text(), "", 1)
    return gpudirect_probe.parse_lspci_acs(path.read_text())


@pytest.mark.parametrize("kind, path", CAPTURES)
def test_parses(kind, path, tmp_path, monkeypatch):
    facts = _parse(kind, path, tmp_path, monkeypatch)
    json.dumps(facts)


def _one_view(name_facts, check, ssh=True):
    nodes = [NodeInfo(n, n, 8, is_head=(i == 0)) for i, n in enumerate(name_facts)]
    facts = {}
    for n, f in name_facts.items():
        facts[n] = {check: f}
        if ssh:
            facts[n]["ssh"] = {"memlock_soft": None}
    return builders.view(facts, nodes=nodes)


def _agree_ib(path, facts):
    got = sorted((p["hca"], p["port"], p["state"], float(p["rate_gbps"]), p["link_layer"]) for p in facts["ports"])
    assert got == _raw_ib_ports(path)
    if path.name.startswith("procfs_"):
        return  # a composite of adapters from different machines (SOURCES.md): only the parse is judged
    # The capture is one healthy node; two of them make a cluster: nothing may warn, and the env file
    # must name the node's rails.
    view = _one_view({"n1": facts, "n2": facts}, "ib_hca")
    problems = [f.message for f in ib_hca_rule.rule(view) if f.status in PROBLEMS]
    assert problems == []
    usable = derived_rails.usable_hcas(view)
    layers = {}
    for p in facts["ports"]:
        layers.setdefault(p["link_layer"], []).append(derived_rails.port_label(p))
    rail_ports = max(layers.values(), key=len)
    derived = derive(view)
    assert derived.as_dict().get("NCCL_IB_HCA") == "=" + ",".join(rail_ports), derived.notes
    assert usable["nodes"]["n1"] == rail_ports


def _agree_ip(path, facts):
    raw = _raw_ip(path)
    if _ip_kind(path) == "link":
        kinds = {name: (item.get("linkinfo") or {}).get("info_kind") for name, item in
                 ((i["ifname"], i) for i in json.loads(path.read_text()))}
        assert facts == kinds
        return
    got = {
        i["name"]: (i["mtu"], sorted("%s/%s" % (a["ip"], a["prefixlen"]) for a in i["addresses"]))
        for i in facts["interfaces"]
    }
    assert got == raw
    twin = Path(str(path).replace(".addr.json", ".link.json"))
    if twin != path and twin.exists():  # the link kinds the one `ip -j -d addr show` carries are the twin's
        kinds = {i["ifname"]: (i.get("linkinfo") or {}).get("info_kind") for i in json.loads(twin.read_text())}
        assert {i["name"]: i["kind"] for i in facts["interfaces"] if kinds.get(i["name"])} == \
            {name: kind for name, kind in kinds.items() if kind}
    # A healthy single node: the nic rule picks an interface and raises nothing.
    view = builders.view({"n1": {"nic": facts}}, nodes=[NodeInfo("n1", "n1", 8, is_head=True)])
    findings = nic_rule.rule(view)
    assert [f.message for f in findings if f.status in PROBLEMS] == []
    assert [f.status for f in findings] == [Status.PASS]
    chosen = findings[0].data["iface"]
    addrs = [a for a in raw[chosen][1] if ipaddress.ip_interface(a).version == 4]
    assert addrs, "chose %s, which has no IPv4 address in the capture" % chosen


def _agree_ping(path, facts):
    tx, rx, loss, too_big, reported_mtu = _raw_ping(path.read_text())
    if tx is None:
        assert facts["transmitted"] == 0 and facts["received"] == 0 and facts["loss_pct"] == 100.0
    else:
        assert (facts["transmitted"], facts["received"], facts["loss_pct"]) == (tx, rx, loss)
    assert facts["too_long"] is too_big
    assert facts["path_mtu"] == reported_mtu
    local = re.search(r"local error: message too long, mtu\s*[=:]\s*(\d+)", path.read_text(), re.I)
    if local:  # the sender's own kernel refused the size: reported as such (parse_ping's contract)
        assert facts["error"] == "message too long, mtu=%s" % local.group(1)
    # As the mtu rule sees it: a clean capture is no problem, a refused one names the MTU.
    target = {
        "peer": "n2", "size": 8972, "small_size": 1000, "jumbo_ok": facts["received"] > 0,
        "small_ok": True, "loss_pct": facts["loss_pct"], "error": facts["error"],
        "small_error": None, "too_long": facts["too_long"], "path_mtu": facts["path_mtu"],
    }
    found = mtu_rule._path_problem("n1", target, None)
    if rx and rx == tx:
        assert found is None
    else:
        assert found is not None and found[0] == Status.FAIL
        if reported_mtu is not None:
            assert "mtu=%d" % reported_mtu in found[1] or "mtu = %d" % reported_mtu in found[1]


def _raw_lspci(text):
    """{bdf with the 0000 domain: (ACSCtl line or None, access denied)} read straight from the capture."""
    out, current = {}, None
    for raw in text.splitlines():
        if raw.strip() and not raw[0].isspace():
            bdf = raw.split(" ", 1)[0].lower()
            current = bdf if bdf.count(":") == 2 else "0000:" + bdf
            out[current] = [None, False]
        elif raw.strip().startswith("ACSCtl:"):
            out[current][0] = raw.strip()
        elif raw.strip() == "Capabilities: <access denied>":
            out[current][1] = True
    return out


def _agree_lspci(path, facts):
    raw = _raw_lspci(path.read_text())
    assert sorted(facts) == sorted(raw)
    for bdf, (acs_line, denied) in raw.items():
        assert (facts[bdf]["acs_ctl"] is not None) == (acs_line is not None), bdf
        assert facts[bdf]["access_denied"] is denied, bdf
        for flag in gpudirect_probe.REDIRECTS:
            if acs_line is not None:
                assert facts[bdf]["acs_ctl"][flag] is (flag + "+" in acs_line), (bdf, acs_line)
    # As gpudirect judges a healthy node: every bridge in the capture taken as a GPU<->HCA switch port
    lines = {}
    for line in path.read_text().splitlines():
        if line[:1].strip():
            bdf, what = line.split(" ", 1)
            lines[bdf if bdf.count(":") == 2 else "0000:" + bdf] = what
    gpus = sorted(b for b, what in lines.items() if "NVIDIA" in what and ("3D controller" in what or "VGA" in what))
    hcas = sorted(b for b, what in lines.items() if "Mellanox" in what and "controller" in what)
    bridges = sorted(b for b, what in lines.items() if "bridge" in what)
    if not gpus or not hcas:
        return  # nothing gpudirect would judge (no GPU or no HCA in this capture)
    node = {"gpus": gpus, "hcas": [{"name": "mlx5_%d" % i, "bdf": h} for i, h in enumerate(hcas)],
            "paths": [{"gpu": gpus[0], "hca": "mlx5_0", "bridges": bridges}], "acs": facts,
            "peermem": "nvidia_peermem", "virtual": None, "iommu": "off"}
    view = builders.view({"n1": {"gpudirect": node}}, gpus=len(gpus))
    findings = gpudirect_rule.rule(view)
    assert [f.message for f in findings if f.status in PROBLEMS] == []
    assert [f.status for f in findings] == [Status.PASS]


@pytest.mark.parametrize("kind, path", CAPTURES)
def test_agrees(kind, path, tmp_path, monkeypatch):
    facts = _parse(kind, path, tmp_path, monkeypatch)
    {"ib_sysfs": _agree_ib, "ip_addr_json": _agree_ip, "ping": _agree_ping, "lspci": _agree_lspci}[kind](path, facts)

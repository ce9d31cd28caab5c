"""nccl_env: the NCCL settings the nodes would give a job are the same everywhere and agree with preflight's env.

A job launched over SSH or srun gets the node's non-interactive environment (the probe's own
os.environ: it is started the same way), and NCCL then reads its configuration files. The order and
the format are NCCL's own (src/misc/param.cc, initEnvFunc/setEnvFile, NCCL 2.19 and later):

1. the environment wins: setEnvFile never overrides a variable that is already set;
2. the file NCCL_CONF_FILE names, or, when it is unset or empty, ~/.nccl.conf of the user running the
   job: found through the account's home directory (getpwuid(getuid())->pw_dir) before NCCL 2.30.3, and
   through $HOME from 2.30.3 on. The probe reads both when they differ; the rule takes the one the node's
   NCCL version reads (the driver check's facts; version unknown: the account's home directory);
3. /etc/nccl.conf.

A conf-file line is `KEY=VALUE`: a line starting with '#' is a comment, a line without '=' is
skipped, the key is everything before the first '=' and the value everything after it, verbatim (no
quotes removed, no spaces trimmed). So `export NCCL_DEBUG=INFO` sets a variable named
"export NCCL_DEBUG", i.e. nothing NCCL reads: such lines are reported (WARN).

Files are read under PREFLIGHT_HOST_ROOT when set (see preflight.probe.context).

Facts: {"environ": {key: value}, "user": str, "home": str|None (the account's), "home_env": str|None ($HOME),
        "files": [{"path": "/etc/nccl.conf", "role": "system"|"user", "exists": bool,
                   "via": ["NCCL_CONF_FILE"] | ["passwd", "HOME"] (user files: the lookups that reach it),
                   "error": str|None, "entries": [{"key", "value", "line"}], "malformed": [{"line", "text"}]}]}

Rule decisions:
- a setting that contradicts what preflight recommends (preflight.output.envfile.derive over the same facts)
  FAILs, naming the file and line: NCCL_SOCKET_IFNAME that does not select the data interface
  (NCCL's matching: '^' excludes, '=' exact names, else prefixes) or also selects another interface with
  an address (NCCL's bootstrap takes the first match in interface order and its socket transport spreads
  over every match: '=eth0,eth1' on a node whose eth0 is the management port), GLOO_SOCKET_IFNAME other than the
  data interface, NCCL_IB_HCA that leaves out a usable HCA port, NCCL_IB_GID_INDEX other than the
  RoCE v2 index, NCCL_IB_DISABLE=1 where preflight found usable HCAs;
- a variable whose value differs from the other nodes' (the majority; a tie has no reference, so every
  node that differs is named), unless it is the per-node value the env file gives that node (an interface
  named differently, a RoCE GID index that differs): FAIL for variables that must agree across ranks or the job hangs or
  crawls (MUST_MATCH), WARN for the rest (NCCL_DEBUG differing is harmless);
- a conf-file line NCCL misreads: WARN;
- otherwise PASS, listing the variables and where each comes from.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from preflight.common import nccl_list, nccl_selects
from preflight.model import Check, ClusterView, Finding, ParseError, Status, probe_error
from preflight.probe.ncclconf import CONF_ENV, HOME_FROM_ENV, PREFIXES, effective, read_by_nccl, relevant  # noqa: F401  (this module's API too)

NAME = "nccl_env"
SYSTEM_CONF = "/etc/nccl.conf"
USER_CONF = ".nccl.conf"
#: Variables whose value must agree across ranks: NCCL picks its transport, protocol, algorithm and
#: buffer sizes per rank, and ranks that disagree hang at the first collective or fall back to a slow path.
MUST_MATCH = frozenset(
    (
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_BUFFSIZE",
        "NCCL_NET",
        "NCCL_NET_PLUGIN",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        # the traffic class / service level of NCCL's RDMA traffic: a node on another class puts its
        # traffic in the lossy queue (no PFC), and the whole ring runs at its retransmission pace
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "NCCL_IB_FIFO_TC",
        "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_FAMILY",
        "NCCL_COLLNET_ENABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_CROSS_NIC",
        "NCCL_NET_GDR_LEVEL",
        "GLOO_SOCKET_IFNAME",
    )
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
UNSET = "(unset)"


# ----------------------------------------------------------------------------------------------- parse


def parse_nccl_conf(text: str, path: str = SYSTEM_CONF) -> Dict[str, Any]:
    """An nccl.conf file → {"entries": [{key, value, line}], "malformed": [{line, text}]}, as NCCL reads it.

    Every `KEY=VALUE` line is an entry (all keys, as NCCL sets them all); a key that is not a variable
    name ('export NCCL_DEBUG', 'NCCL_DEBUG ') is listed under malformed instead. A file with NUL bytes is
    not a text file: ParseError.
    """
    if "\x00" in text:
        raise ParseError("%s: not a text file (NUL bytes)" % path)
    entries: List[Dict[str, Any]] = []
    malformed: List[Dict[str, Any]] = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if _NAME.match(key):
            entries.append({"key": key, "value": value, "line": number})
        else:
            malformed.append({"line": number, "text": line[:200]})
    return {"entries": entries, "malformed": malformed}


# ----------------------------------------------------------------------------------------------- probe


def _read_conf(ctx: Any, path: str, role: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {"path": path, "role": role, "exists": False, "error": None, "entries": [], "malformed": []}
    real = ctx.host_path(path)
    try:
        with open(real, "r", errors="replace") as handle:
            text = handle.read(1 << 20)
    except FileNotFoundError:
        return out
    except OSError as exc:  # unreadable for this user: NCCL (same user) cannot read it either
        out.update(exists=True, error=exc.strerror or str(exc))
        return out
    out["exists"] = True
    out.update(parse_nccl_conf(text, path))
    return out


def _home() -> Tuple[str, Optional[str]]:
    """(user name, home directory) the way NCCL finds it: getpwuid(getuid()), not $HOME."""
    import pwd

    try:
        entry = pwd.getpwuid(os.getuid())
    except KeyError:
        return str(os.getuid()), None
    return entry.pw_name, entry.pw_dir


def probe(ctx: Any) -> Dict[str, Any]:
    """The NCCL-related variables of this (non-interactive) session and the conf files NCCL would read:
    the user file through the account's home directory and through $HOME (one file when they agree)."""
    environ = {k: v for k, v in os.environ.items() if relevant(k)}
    user, home = _home()
    home_env = os.environ.get("HOME") or None
    files = []
    conf_file = os.environ.get(CONF_ENV)
    if conf_file:
        files.append(dict(_read_conf(ctx, conf_file, "user"), via=[CONF_ENV]))
    else:
        paths: Dict[str, List[str]] = {}
        for via, base in (("passwd", home), ("HOME", home_env)):
            if base:
                paths.setdefault(os.path.join(base, USER_CONF), []).append(via)
        for path, via in paths.items():
            files.append(dict(_read_conf(ctx, path, "user"), via=via))
    files.append(_read_conf(ctx, SYSTEM_CONF, "system"))
    return {"environ": environ, "user": user, "home": home, "home_env": home_env, "files": files}


# ------------------------------------------------------------------------------------------------ rule


def selects(spec: str, name: str, port: Optional[int] = None) -> bool:
    """Whether an NCCL list spec selects the interface `name` (or HCA `name` port `port`)."""
    return nccl_selects(spec, name, port)


def _recommended_names(value: str) -> List[str]:
    return nccl_list(value)[2]


def _contradiction(key: str, value: str, rec: Dict[str, str], node_iface: Optional[str], addressed: Dict[str, str]) -> Optional[str]:
    """Why a node's setting contradicts the recommended env (None when it does not).

    addressed: {interface: address} of the node's interfaces that hold an address (what NCCL's socket
    code can match)."""
    if key == "NCCL_SOCKET_IFNAME" and node_iface:
        recommended = rec.get(key) or "=" + node_iface
        if not selects(value, node_iface):
            return "does not select the data interface %s (recommended %s)" % (node_iface, recommended)
        others = sorted(name for name in addressed if name != node_iface and selects(value, name))
        if others:
            return (
                "also selects %s, not the data interface %s: NCCL's bootstrap takes the first match in interface order and its "
                "socket transport spreads over every match (recommended %s)"
                % (", ".join("%s (%s)" % (name, addressed[name]) for name in others), node_iface, recommended)
            )
    elif key == "GLOO_SOCKET_IFNAME" and node_iface:
        if value != node_iface:
            return "is not the data interface %s" % node_iface
    elif key == "NCCL_IB_HCA" and "NCCL_IB_HCA" in rec:
        left = []
        for label in _recommended_names(rec[key]):
            dev, _, port = label.partition(":")
            if not selects(value, dev, int(port) if port.isdigit() else None):
                left.append(label)
        if left:
            return "leaves out the usable HCA port%s %s (recommended %s)" % (
                "" if len(left) == 1 else "s",
                ", ".join(left),
                rec[key],
            )
    elif key == "NCCL_IB_GID_INDEX" and key in rec and value.strip() != rec[key]:
        return "is not the RoCE v2 GID index %s" % rec[key]
    elif key == "NCCL_IB_DISABLE" and "NCCL_IB_HCA" in rec and value.strip() not in ("", "0"):
        return "turns InfiniBand/RoCE off although %s are usable: NCCL falls back to sockets" % rec["NCCL_IB_HCA"].lstrip("=")
    return None


def _addressed(view: ClusterView, node: str) -> Dict[str, str]:
    """{name: first address} of the node's interfaces holding an IPv4 or a global IPv6 address (nic facts):
    the ones NCCL's interface matching can select (it skips link-local IPv6 and address-less interfaces)."""
    nic = (view.facts.get(node) or {}).get("nic")
    out: Dict[str, str] = {}
    for iface in (nic.get("interfaces") if isinstance(nic, dict) else None) or []:
        if not isinstance(iface, dict) or not isinstance(iface.get("name"), str):
            continue
        for addr in iface.get("addresses") or []:
            ip = str((addr or {}).get("ip") or "")
            if ip and not ip.lower().startswith("fe80") and iface["name"] not in out:
                out[iface["name"]] = ip
    return out


def _node_ifaces(view: ClusterView) -> Dict[str, str]:
    from preflight import datanet

    choice = datanet.of(view)
    out = {}
    for node in view.live:
        entry = choice.get(node.name)
        if entry and entry.get("iface"):
            out[node.name] = entry["iface"]
    return out


def _nccl_versions(view: ClusterView) -> Dict[str, Optional[Tuple[int, int, int]]]:
    """{node: its NCCL version as a tuple}, from the driver check's facts (the env writer's reading)."""
    from preflight.output import envfabric, envvars

    names = [n.name for n in view.live]
    return {n: envvars.version_key(v) for n, v in envfabric.nccl_versions(view, names).items()}


def _recommended(view: ClusterView, nodes: List[str]) -> Tuple[Dict[str, str], Dict[str, Dict[str, str]]]:
    """(the env file's variables, {node: its per-node values}) derived over the same facts."""
    from preflight.output import envfile

    if not nodes:
        return {}, {}
    derived = envfile.derive(view, nodes)
    return derived.as_dict(), derived.per_node


def rule(view: ClusterView) -> List[Finding]:
    from preflight.common import fold, majority

    out: List[Finding] = []
    versions = _nccl_versions(view)
    settings: Dict[str, Dict[str, Tuple[str, str]]] = {}
    malformed: Dict[str, List[str]] = {}
    for name, facts in view.of(NAME).items():
        err = probe_error(NAME, name, facts, listed=("files", "conf-file list"))
        if err:
            out.append(err)
            continue
        settings[name] = effective(facts, versions.get(name))
        malformed[name] = [
            "%s:%d %r (NCCL reads the key %r, not a variable name: write KEY=VALUE)"
            % (f["path"], m["line"], m["text"], m["text"].split("=", 1)[0])
            for f in facts["files"]
            for m in f.get("malformed") or []
        ]
    if not settings:
        return out
    nodes = [n.name for n in view.live if n.name in settings]
    common, per_node = _recommended(view, nodes)
    ifaces = _node_ifaces(view)
    problems: Dict[str, List[Finding]] = {n: [] for n in nodes}

    contradicted = set()
    for name in nodes:
        rec = dict(common, **per_node.get(name, {}))
        for key, (value, where) in sorted(settings[name].items()):
            why = _contradiction(key, value, rec, ifaces.get(name), _addressed(view, name))
            if why:
                contradicted.add((name, key))
                problems[name].append(
                    Finding(
                        NAME,
                        name,
                        Status.FAIL,
                        "%s: %s=%s (%s) %s" % (name, key, value, where, why),
                        expected=rec.get(key) or ("unset or 0" if key == "NCCL_IB_DISABLE" else
                                                  "=" + ifaces[name] if key == "NCCL_SOCKET_IFNAME" and name in ifaces else None),
                        actual=value,
                        data={"key": key, "value": value, "source": where},
                    )
                )

    keys = sorted({k for s in settings.values() for k in s})
    for key in keys:
        values = [settings[n][key][0] if key in settings[n] else UNSET for n in nodes]
        ref, count, _ = majority(values)
        if ref is not None and count == len(nodes):
            continue
        holders = {}
        for n, v in zip(nodes, values):
            holders.setdefault(v, []).append(n)
        for name, value in zip(nodes, values):
            if value == ref or (name, key) in contradicted or per_node.get(name, {}).get(key) == value:
                continue  # (a per-node value the env file asks for is no drift)
            where = settings[name][key][1] if key in settings[name] else "not set"
            if ref is not None:
                basis = "%s: %s" % (fold(holders[ref]), "unset" if ref == UNSET else "%s=%s" % (key, ref))
            else:
                basis = "no majority: " + " · ".join(
                    "%s %s" % (fold(ns), "unset" if v == UNSET else "=" + v) for v, ns in sorted(holders.items())
                )
            shown = "%s unset" % key if value == UNSET else "%s=%s (%s)" % (key, value, where)
            problems[name].append(
                Finding(
                    NAME,
                    name,
                    Status.FAIL if key in MUST_MATCH else Status.WARN,
                    "%s: %s differs from the other nodes (%s)" % (name, shown, basis),
                    expected=None if ref is None else ("unset" if ref == UNSET else ref),
                    actual="unset" if value == UNSET else value,
                    data={"key": key, "value": None if value == UNSET else value, "source": where},
                )
            )

    for name in nodes:
        node_out = problems[name]
        for text in malformed[name]:
            node_out.append(Finding(NAME, name, Status.WARN, "%s: conf line %s" % (name, text)))
        if not node_out:
            mine = settings[name]
            listed = ", ".join("%s=%s (%s)" % (k, v, w) for k, (v, w) in sorted(mine.items()))
            node_out.append(
                Finding(
                    NAME,
                    name,
                    Status.PASS,
                    ("%d NCCL variable%s, as on every node: %s" % (len(mine), "" if len(mine) == 1 else "s", listed))
                    if mine
                    else "no NCCL variables set (NCCL defaults), as on every node",
                    actual=str(len(mine)),
                )
            )
        out.extend(node_out)
    return out


CHECK = Check(
    name=NAME,
    claim="Every node gives a job the same NCCL_*/TORCH_NCCL_*/GLOO_* settings (environment, ~/.nccl.conf, "
    "/etc/nccl.conf), and none contradicts the env preflight recommends",
    why="NCCL reads these silently on every rank: one node whose /etc/nccl.conf still names the wrong "
    "interface or HCA, or turns InfiniBand off, hangs the job at init or drags every collective to socket "
    "speed, long after the launch looked fine.",
    fix="Edit or remove the named line (file:line) on the named nodes, or unset the variable in the "
    "environment sshd/slurmd gives jobs (/etc/environment, ~/.ssh/environment, the service's Environment=); "
    "keep site-wide NCCL settings in one file managed the same on every node.",
    probe=probe,
    rule=rule,
    needs=("nic", "ib_hca", "driver"),
    action="fix_config",
    reads="the environment, ~/.nccl.conf, /etc/nccl.conf",
    takes="< 0.1 s",
    order=85,
)

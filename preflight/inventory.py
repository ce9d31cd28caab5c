"""Load and validate an inventory (hosts.yaml) into typed node specs.

Every problem is an InventoryError naming file:line and the fix. Hosts, users, paths and interface
names are checked against strict syntax here, so no inventory value can ever smuggle shell syntax
anywhere later.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preflight import common
from preflight.errors import InventoryError
from preflight.located_yaml import Located
from preflight.transport import backends

# --- what may appear where ---------------------------------------------------------------------

NODE_KEYS = (
    "user",
    "port",
    "identity_file",
    "known_hosts",
    "ssh_config",
    "proxy_jump",
    "python",
    "gpus_per_node",
    "connect_timeout",
    "command_timeout",
    "data_interface",
    "host_key_checking",
)
#: the run's own `cluster:` keys; the checks' keys (and every `expect:` key) come from their CHECK's
#: settings (preflight.checks.settings()), so a new check's key needs no edit here
CLUSTER_KEYS = ("master_port", "head", "expect", "allreduce", "transport", "max_nodes", "history")
ALLREDUCE_KEYS = ("sizes", "warmup", "iters", "iters_min", "init_timeout", "op_timeout", "total_timeout", "enabled", "slow_fraction",
                  "node_round", "warm")
TOP_KEYS = ("defaults", "cluster", "nodes")

DEFAULTS: Dict[str, Any] = {
    "user": None,  # None: ssh_config's User, else the local user
    "port": None,  # None: ssh_config's Port, else 22
    "identity_file": None,
    "known_hosts": "~/.ssh/known_hosts",
    "ssh_config": None,
    "proxy_jump": None,
    "python": "python3",
    "gpus_per_node": 8,
    "connect_timeout": 10.0,
    "command_timeout": 60.0,
    "data_interface": None,
    "host_key_checking": "strict",
}

_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOSTNAME_RE = re.compile(r"^%s(\.%s)*\.?$" % (_LABEL, _LABEL))
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PATH_RE = re.compile(r"^[^\x00-\x1f]+$")


SCOPE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: what a host range may hold before expansion: names, digits, brackets, commas (no groups, no operators)
RANGE_RE = re.compile(r"^[A-Za-z0-9_.,\[\]/-]+$")
#: the default bound on how many nodes an inventory may expand to (`max_nodes:` or --max-nodes raise it)
MAX_NODES = 10000


def valid_host(host: str) -> bool:
    """A DNS name or an IPv4/IPv6 literal (an IPv6 scope id only of [A-Za-z0-9_.-]), nothing else."""
    address, percent, scope = host.partition("%")
    if percent and not SCOPE_RE.match(scope):
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return not percent and bool(HOSTNAME_RE.match(host)) and len(host) <= 253


def range_size(pattern: str) -> int:
    """How many names a host range names, counted without expanding it (gpu-[1-9999999] is 9999999).

    Counts the product of every bracket's members, summed over comma-separated parts; an upper bound
    (duplicates counted twice). Raises ValueError for a bracket it cannot read.
    """
    total = 0
    for part in re.split(r",(?![^\[]*\])", pattern):
        size = 1
        for body in re.findall(r"\[([^\]]*)\]", part):
            members = 0
            for item in body.split(","):
                match = re.match(r"^(\d+)(?:-(\d+))?(?:/(\d+))?$", item.strip())
                if not match:
                    raise ValueError("bad range %r" % item)
                low = int(match.group(1))
                high = int(match.group(2)) if match.group(2) else low
                step = int(match.group(3) or 1) or 1
                members += max(0, (high - low) // step + 1)
            size *= members
        total += size
    return total


@dataclass(frozen=True)
class NodeSpec:
    """One node as the inventory describes it, with defaults applied."""

    name: str
    host: str
    line: int
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    known_hosts: Optional[str] = "~/.ssh/known_hosts"
    ssh_config: Optional[str] = None
    proxy_jump: Optional[str] = None
    python: str = "python3"
    gpus_per_node: int = 8
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    data_interface: Optional[str] = None
    host_key_checking: str = "strict"
    local: bool = False


@dataclass
class Inventory:
    path: str
    nodes: List[NodeSpec]
    master_port: int = 29500
    head: Optional[str] = None
    expect: Dict[str, Any] = field(default_factory=dict)
    cluster: Dict[str, Any] = field(default_factory=dict)
    sha256: str = ""
    transport: str = "ssh"  # the registered backend that reaches the nodes (preflight.transport.backends)
    allocation: Any = None  # the scheduler's hold on the nodes (a Slurm Allocation, a Kubernetes Target); None: the transport makes one

    @property
    def head_name(self) -> str:
        return self.head or self.nodes[0].name


# --- validation ----------------------------------------------------------------------------------


class _Validator:
    def __init__(self, doc: Located) -> None:
        self.doc = doc
        self.path = doc.path

    def fail(self, where: Tuple[Any, ...], message: str, fix: str) -> InventoryError:
        return InventoryError(self.path, self.doc.line(*where), message, fix)

    def mapping(self, value: Any, where: Tuple[Any, ...], allowed: Tuple[str, ...], what: str) -> Dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(where, "%s must be a mapping, not %s" % (what, _kind(value)), "write key: value pairs")
        for key in value:
            if key not in allowed:
                guess = difflib.get_close_matches(str(key), allowed, n=1)
                hint = "did you mean %r?" % guess[0] if guess else "allowed keys: %s" % ", ".join(allowed)
                raise self.fail(where + (key,), "unknown key %r in %s" % (key, what), hint)
        return value

    def node_settings(self, raw: Dict[str, Any], where: Tuple[Any, ...]) -> Dict[str, Any]:
        """Validate the per-node keys (shared by defaults and node entries)."""
        out: Dict[str, Any] = {}
        for key, value in raw.items():
            if key not in NODE_KEYS:
                continue
            at = where + (key,)
            if value is None:
                out[key] = None
                continue
            if key == "user":
                out[key] = self.string(value, at, key, USER_RE, "a login name such as root or ubuntu")
            elif key == "port":
                out[key] = self.integer(value, at, key, 1, 65535)
            elif key in ("identity_file", "known_hosts", "ssh_config"):
                text = self.string(value, at, key, PATH_RE, "a file path")
                expanded = os.path.expanduser(text)
                if key != "known_hosts" and not os.path.isfile(expanded):
                    raise self.fail(at, "%s %s does not exist" % (key, text), "give the path of an existing file")
                out[key] = expanded
            elif key == "proxy_jump":
                out[key] = self.proxy_jump(value, at)
            elif key == "python":
                out[key] = self.string(
                    value, at, key, PYTHON_RE, "an interpreter name or absolute path such as /usr/bin/python3"
                )
            elif key == "gpus_per_node":
                out[key] = self.integer(value, at, key, 0, 64)
            elif key in ("connect_timeout", "command_timeout"):
                out[key] = self.number(value, at, key, 0.1, 3600)
            elif key == "data_interface":
                out[key] = self.string(value, at, key, IFNAME_RE, "a network interface name such as eth1 or ib0")
            elif key == "host_key_checking":
                if value not in ("strict", "accept-new"):
                    raise self.fail(at, "host_key_checking must be strict or accept-new", "use strict (default)")
                out[key] = value
        return out

    def string(self, value: Any, where: Tuple[Any, ...], key: str, pattern: "re.Pattern[str]", want: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(where, "%s must be a string, not %s" % (key, _kind(value)), "write %s" % want)
        text = str(value)
        if not pattern.match(text):
            raise self.fail(where, "%s %r is not valid" % (key, text), "write %s" % want)
        return text

    def integer(self, value: Any, where: Tuple[Any, ...], key: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, "%s must be an integer, not %s" % (key, _kind(value)), "write a number %d-%d" % (low, high))
        if not low <= value <= high:
            raise self.fail(where, "%s %d is out of range" % (key, value), "use a value from %d to %d" % (low, high))
        return value

    def number(self, value: Any, where: Tuple[Any, ...], key: str, low: float, high: float, unit: str = "seconds") -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, "%s must be a number, not %s" % (key, _kind(value)), "write %s, e.g. 10" % unit)
        if not low <= value <= high:
            raise self.fail(where, "%s %g is out of range" % (key, value), "use %g to %g %s" % (low, high, unit))
        return float(value)

    def proxy_jump(self, value: Any, where: Tuple[Any, ...]) -> str:
        text = self.string(value, where, "proxy_jump", re.compile(r"^[^\s]+$"), "[user@]host[:port][,...]")
        for hop in text.split(","):
            user, _, hostport = hop.rpartition("@")
            host, port = _split_port(hostport)
            if (user and not USER_RE.match(user)) or not valid_host(host) or (port is not None and not 0 < port < 65536):
                raise self.fail(where, "proxy_jump hop %r is not valid" % hop, "write [user@]host[:port], comma-separated")
        return text


def _split_port(hostport: str) -> Tuple[str, Optional[int]]:
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
        return host, int(port) if port.isdigit() else -1
    return hostport, None


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", type(None): "empty"}.get(
        type(value), type(value).__name__
    )


def _expand(pattern: str, limit: int) -> List[str]:
    """gpu-[001-004] → gpu-001 … gpu-004, via ClusterShell's NodeSet with group resolution off.

    Only names, brackets and commas are accepted: `@group`, the set operators (! & ^) and anything
    else ClusterShell would resolve or interpret are refused before ClusterShell sees the pattern, and
    the size is counted first so `gpu-[1-9999999]` is never expanded.
    """
    if not RANGE_RE.match(pattern):
        raise ValueError("only names, digits, '[a-b]' ranges and commas are allowed (no '@' groups or ! & ^ operators)")
    size = range_size(pattern)
    if size > limit:
        raise _TooMany(size)
    names = common.expand(pattern)
    if not names:
        raise ValueError("the range names no host")
    return names


class _TooMany(ValueError):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _read(path: str) -> Tuple[bytes, Located]:
    """The file's bytes and its parsed YAML (with lines); a file that cannot be read is an InventoryError."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise InventoryError(path, None, "inventory file not found", "check the path, or run `preflight check` with no argument to check this machine") from None
    except IsADirectoryError:
        raise InventoryError(path, None, "is a directory, not an inventory file", "give the path of a hosts.yaml") from None
    except OSError as exc:
        raise InventoryError(path, None, "cannot read: %s" % exc.strerror, "check the file's permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InventoryError(path, line, "not UTF-8 text", "save the file as UTF-8") from None
    return raw, Located(path, text)


def _cluster(v: _Validator, top: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """(cluster's raw keys, `expect:` validated, the run's cluster settings: the checks' keys, master_port,
    allreduce) from `cluster:`."""
    declared = check_settings()
    check_keys = tuple(k for k in declared if "." not in k)
    expect_keys = tuple(k.split(".", 1)[1] for k in declared if k.startswith("expect."))
    cluster_raw = v.mapping(top.get("cluster"), ("cluster",), CLUSTER_KEYS + check_keys, "cluster")
    master_port = 29500
    if cluster_raw.get("master_port") is not None:
        master_port = v.integer(cluster_raw["master_port"], ("cluster", "master_port"), "master_port", 1, 65535)
    expect = dict(v.mapping(cluster_raw.get("expect"), ("cluster", "expect"), expect_keys, "cluster.expect"))
    for key in list(expect):
        expect[key] = _setting_value(v, declared["expect." + key], expect[key], ("cluster", "expect", key))
    allreduce = dict(v.mapping(cluster_raw.get("allreduce"), ("cluster", "allreduce"), ALLREDUCE_KEYS, "cluster.allreduce"))
    _check_allreduce(v, allreduce)
    check_values = {
        key: _copy(declared[key].default) if cluster_raw.get(key) is None
        else _setting_value(v, declared[key], cluster_raw[key], ("cluster", key))
        for key in check_keys
    }
    return cluster_raw, expect, dict(check_values, master_port=master_port, allreduce=allreduce)


def _transport(v: _Validator, cluster_raw: Dict[str, Any]) -> str:
    """`cluster: transport:`, one of the registered backends an inventory may name (preflight.transport.backends)."""
    names = backends.inventory_names()
    transport = cluster_raw.get("transport", "ssh")
    if transport not in names:
        raise v.fail(("cluster", "transport"), "transport %r is not one of %s" % (transport, ", ".join(names)),
                     "write %s" % " or ".join("`transport: %s`" % n for n in names))
    return transport


def _entry(v: _Validator, item: Any, where: Tuple[Any, ...]) -> Tuple[str, Dict[str, Any], Optional[str], Tuple[Any, ...]]:
    """(host pattern, its node settings, its name or None, where its host is) of one `nodes:` item."""
    if isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool)):
        return str(item), {}, None, where
    if not isinstance(item, dict):
        raise v.fail(where, "a node must be a host string or a mapping, not %s" % _kind(item), "write `- host` or `- host: ...`")
    v.mapping(item, where, ("host", "name") + NODE_KEYS, "a node entry")
    if "host" not in item or item["host"] in (None, ""):
        raise v.fail(where, "node entry has no host", "add `host: NAME-OR-ADDRESS`")
    if not isinstance(item["host"], str):
        raise v.fail(where + ("host",), "host must be a string", "write the host name or address")
    name = item.get("name")
    if name is not None and (not isinstance(name, str) or not NAME_RE.match(name)):
        raise v.fail(where + ("name",), "name %r is not valid" % (name,), "use letters, digits, '.', '_' and '-'")
    return item["host"], v.node_settings(item, where), name, where + ("host",)


def _hosts_of(v: _Validator, pattern: str, where: Tuple[Any, ...], limit: int, before: int) -> List[str]:
    """The hosts a pattern names (a range expanded), within the node limit."""
    try:
        return _expand(pattern, limit - before) if "[" in pattern else [pattern]
    except _TooMany as exc:
        raise v.fail(
            where,
            "host range %r names %d hosts; with the %d before it that is more than the limit of %d nodes"
            % (pattern, exc.size, before, limit),
            "check the range; for a cluster this large set `cluster: max_nodes:` or pass --max-nodes",
        ) from None
    except ValueError as exc:
        raise v.fail(where, "bad host range %r: %s" % (pattern, exc), "write ranges like gpu-[001-064,070]") from None


def _nodes(v: _Validator, nodes_raw: Any, defaults: Dict[str, Any], limit: int) -> Tuple[List[NodeSpec], Dict[str, int]]:
    """Every node of `nodes:` with its settings, and {name: line}; duplicates and the limit refused."""
    if nodes_raw is None or nodes_raw == []:
        raise v.fail(("nodes",), "no nodes in the inventory", "list hosts under `nodes:`, e.g. `- gpu-[001-004]`")
    if not isinstance(nodes_raw, list):
        raise v.fail(("nodes",), "nodes must be a list, not %s" % _kind(nodes_raw), "write one `- host` item per line")
    nodes: List[NodeSpec] = []
    names: Dict[str, int] = {}
    hosts: Dict[Tuple[str, Any], int] = {}
    for index, item in enumerate(nodes_raw):
        line = v.doc.line("nodes", index) or 0
        pattern, settings, name, where = _entry(v, item, ("nodes", index))
        expanded = _hosts_of(v, pattern, where, limit, len(nodes))
        if name is not None and len(expanded) > 1:
            raise v.fail(("nodes", index, "name"), "name given for a range of %d hosts" % len(expanded), "drop `name:` or list the hosts one by one")
        for host in expanded:
            if not valid_host(host):
                raise v.fail(where, "host %r is not a valid host name or address" % host, "use a DNS name or an IP address; no spaces or shell characters")
            spec = NodeSpec(name=name or host, host=host, line=line, **dict(defaults, **settings))
            if spec.name in names:
                raise v.fail(where, "duplicate node %r (first at line %d)" % (spec.name, names[spec.name]), "list each node once")
            key = (host, spec.port or 22)  # `host: X` and `host: X, port: 22` are the same sshd
            if key in hosts:
                raise v.fail(where, "duplicate host %r port %d (first at line %d)" % (host, key[1], hosts[key]),
                             "list each host once (port 22 is the default)")
            if len(nodes) >= limit:
                raise v.fail(where, "more than %d nodes" % limit, "set `cluster: max_nodes:` or pass --max-nodes for a cluster this large")
            names[spec.name] = line
            hosts[key] = line
            nodes.append(spec)
    return nodes, names


def load(path: str, max_nodes: Optional[int] = None) -> Inventory:
    """Read, parse and validate an inventory file. Raises InventoryError."""
    raw, doc = _read(path)
    v = _Validator(doc)
    top = doc.data
    if top is None:
        raise InventoryError(path, 1, "the inventory is empty", "list your hosts under `nodes:` (see inventory/hosts.example.yaml)")
    top = v.mapping(top, (), TOP_KEYS, "the inventory")
    defaults = dict(DEFAULTS)
    defaults.update(v.node_settings(v.mapping(top.get("defaults"), ("defaults",), NODE_KEYS, "defaults"), ("defaults",)))
    cluster_raw, expect, cluster = _cluster(v, top)
    transport = _transport(v, cluster_raw)
    limit = max_nodes if max_nodes is not None else MAX_NODES
    if max_nodes is None and cluster_raw.get("max_nodes") is not None:
        limit = v.integer(cluster_raw["max_nodes"], ("cluster", "max_nodes"), "max_nodes", 1, 10**7)
    nodes, names = _nodes(v, top.get("nodes"), defaults, limit)
    head = cluster_raw.get("head")
    if head is not None and not isinstance(head, str):
        raise v.fail(("cluster", "head"), "head must be a node name, not %s" % _kind(head), "write `head: NODE-NAME`")
    if head is not None and head not in names:
        raise v.fail(("cluster", "head"), "head %r is not one of the nodes" % (head,), "use a node's name as listed under nodes:")
    cluster["history"] = _history_settings(v, cluster_raw.get("history"))
    return Inventory(path=path, nodes=nodes, master_port=cluster["master_port"], head=head, expect=expect,
                     cluster=cluster, sha256=hashlib.sha256(raw).hexdigest(), transport=transport)


def check_settings() -> Dict[str, Any]:
    """{key: preflight.model.Setting} every check declares (imported here, when an inventory is read)."""
    from preflight import checks

    return checks.settings()


def _copy(default: Any) -> Any:
    """A setting's default as a fresh value (a tuple default becomes the list an inventory would give)."""
    return list(default) if isinstance(default, (list, tuple)) else default


def _setting_value(v: _Validator, setting: Any, raw: Any, at: Tuple[Any, ...]) -> Any:
    """A check setting's value validated by its declared kind (preflight.model.SETTING_KINDS)."""
    key = setting.key.rsplit(".", 1)[-1]
    if setting.kind == "bool":
        if not isinstance(raw, bool):
            raise v.fail(at, "%s must be true or false" % key, "write true or false")
        return raw
    if setting.kind == "int":
        return v.integer(raw, at, key, int(setting.low), int(setting.high))
    if setting.kind == "number":
        return v.number(raw, at, key, setting.low, setting.high, setting.unit)
    if setting.kind == "version":
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise v.fail(at, "%s must be a version string" % key, 'quote it, e.g. "550.54.15"')
        return str(raw)
    if setting.kind == "paths":
        return _paths(v, key, raw, at)
    raise ValueError("setting %s: unknown kind %r" % (setting.key, setting.kind))  # a catalogue bug, guarded by tests


def _paths(v: _Validator, key: str, raw: Any, at: Tuple[Any, ...]) -> List[str]:
    """Absolute directory paths (one path or a list), normalised, without duplicates."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise v.fail(at, "%s must be a list of paths, not %s" % (key, _kind(raw)), "write e.g. `%s: [/shared/checkpoints]`" % key)
    out: List[str] = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not item.startswith("/") or any(c in item for c in "\x00\n\r"):
            raise v.fail(at + (i,), "shared path %r is not an absolute path" % (item,), "write an absolute directory path such as /shared/checkpoints")
        path = "/" + "/".join(p for p in item.split("/") if p)
        if path not in out:
            out.append(path)
    return out


#: cluster.history: the history's escalation ladder, drain policy and retention (preflight.history.escalation
#: reads them): key -> (default, low, high, what it is)
HISTORY_SETTINGS: Dict[str, Tuple[Any, float, float, str]] = {
    "escalation_window_s": (7 * 86400, 60, 366 * 86400, "a fault recurring on the same GPU or port within this climbs the ladder"),
    "reset_attempts": (1, 0, 10, "GPU resets before the ladder moves to reboot"),
    "reboot_threshold": (2, 0, 10, "reboots before the ladder moves to inspect/RMA (gpud's DefaultRebootThreshold)"),
    "drain_after": (2, 1, 100, "runs a retest-class, config or flapping fault must be seen in before it drains"),
    "drain_window_s": (7 * 86400, 60, 366 * 86400, "window for drain_after"),
    "breaker_fraction": (0.5, 0.0, 1.0, "most of the fleet preflight may have drained within breaker_window_s"),
    "breaker_window_s": (300, 1, 366 * 86400, "window of the circuit breaker (NVSentinel: 5 minutes)"),
    "retention_runs": (None, 1, 10**7, "keep only this many runs in the history database"),
    "retention_days": (None, 1, 36500, "drop runs older than this from the history database"),
}
HISTORY_FLAP_CHECKS = ("ib_errors", "ssh", "allreduce")


def _history_settings(v: _Validator, raw: Any) -> Dict[str, Any]:
    """cluster.history: the escalation ladder, drain policy and retention (preflight.history.escalation)."""
    from preflight import checks

    values = dict(v.mapping(raw, ("cluster", "history"), tuple(HISTORY_SETTINGS) + ("flap_checks",), "cluster.history"))
    for key, value in list(values.items()):
        at = ("cluster", "history", key)
        if key == "flap_checks":
            names = value if isinstance(value, list) else None
            if names is None or any(n not in checks.CHECK_NAMES for n in names):
                raise v.fail(at, "flap_checks must list check names, not %r" % (value,), "e.g. flap_checks: [ib_errors, ssh]")
            values[key] = list(names)
            continue
        default, low, high, _ = HISTORY_SETTINGS[key]
        if key in ("breaker_fraction",) or key.endswith("_s") or key == "retention_days":
            values[key] = v.number(value, at, key, low, high, "" if key == "breaker_fraction" else "seconds" if key.endswith("_s") else "days")
        else:
            values[key] = v.integer(value, at, key, int(low), int(high))
    return values


def _check_allreduce(v: _Validator, allreduce: Dict[str, Any]) -> None:
    for key, value in allreduce.items():
        at = ("cluster", "allreduce", key)
        if key == "sizes":
            if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) and 4 <= s <= 2**36 for s in value):
                raise v.fail(at, "sizes must be a list of byte counts", "e.g. [1048576, 16777216] (4 B to 64 GiB)")
        elif key in ("warmup", "iters", "iters_min"):
            allreduce[key] = v.integer(value, at, key, 0 if key == "warmup" else 1, 1000)
        elif key in ("enabled", "node_round", "warm"):
            if not isinstance(value, bool):
                raise v.fail(at, "%s must be true or false" % key, "write true or false")
        elif key == "slow_fraction":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.01 <= value <= 0.95:
                raise v.fail(at, "slow_fraction must be a number from 0.01 to 0.95, not %r" % (value,),
                             "write the share of the fleet median a node may fall below, e.g. 0.2")
            allreduce[key] = float(value)
        else:
            allreduce[key] = v.number(value, at, key, 1, 3600)
    if allreduce.get("iters_min", 1) > allreduce.get("iters", 5):
        raise v.fail(("cluster", "allreduce", "iters_min"), "iters_min %d is above iters %d (the cap)" % (
            allreduce["iters_min"], allreduce.get("iters", 5)), "set iters_min at most iters")


def local_inventory(gpus_per_node: Optional[int] = None) -> Inventory:
    """An inventory of this machine alone, checked locally without SSH."""
    import sys

    name = socket.gethostname() or "localhost"
    if not NAME_RE.match(name):
        name = "localhost"
    gpus = gpus_per_node if gpus_per_node is not None else _local_gpu_count()
    node = NodeSpec(name=name, host="localhost", line=0, python=sys.executable, gpus_per_node=gpus, local=True)
    return Inventory(path="(this machine)", nodes=[node], cluster={"master_port": 29500, "mtu_full_mesh": False, "allreduce": {}})


def _local_gpu_count() -> int:
    """GPUs the NVIDIA driver registered on this machine (0 without a driver)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0

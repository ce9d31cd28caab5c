"""What the env writer's parts share: a variable, the derived env, and the validation every value passes.

Every value the env file writes comes from a node's facts, so it is checked against the characters NCCL,
gloo and torch accept for that variable before it is written (single-quoted, see quote); a value that
fails is refused with a named finding (refuse) and never written.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from preflight.common import fold, version_key
from preflight.model import Finding, Status

#: Interface names NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME can carry. Linux allows almost anything in a
#: name (`x$(id)`, `a,b`); ',' splits the lists, a leading '^' or '=' changes NCCL's matching, so only
#: plain names pass. 15 characters is the kernel's limit (IFNAMSIZ - 1).
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")

#: An NCCL_IB_HCA entry as ib_hca.port_label writes it: device name, ':', port number.
HCA_PORT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}:[0-9]{1,3}$")


@dataclass
class EnvVar:
    """One variable; default=True: the user's value wins (`K=${K:-'v'}`), else the file's (`export K='v'`)."""

    key: str
    value: str
    why: List[str] = field(default_factory=list)
    default: bool = False


@dataclass
class Derived:
    """The variables the facts justify, the findings for refused facts, notes on what was not written.

    nodes     the nodes the variables were derived for (healthy nodes minus those left out)
    left_out  {node: why} for healthy nodes dropped because one of their facts was refused
    per_node  {node: {key: value}}: values with no single right value across the nodes (not exported)
    versions  {"nccl": [...], "torch": [...]}: the versions the driver check found on the nodes
    fabric    the cloud fabric every node is on ("efa", "tcpx", "tcpxo", "gib": preflight.derived.cloud), else None
    """

    variables: List[EnvVar] = field(default_factory=list)
    refused: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    nodes: List[str] = field(default_factory=list)
    left_out: Dict[str, str] = field(default_factory=dict)
    per_node: Dict[str, Dict[str, str]] = field(default_factory=dict)
    versions: Dict[str, List[str]] = field(default_factory=dict)
    fabric: Optional[str] = None

    def as_dict(self) -> Dict[str, str]:
        return {v.key: v.value for v in self.variables}


def fold_names(names: Sequence[str]) -> str:
    return fold(names) or "(none)"


def is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4 and text == str(ipaddress.ip_address(text))
    except ValueError:
        return False


def refuse(derived: Derived, check: str, node: Optional[str], key: str, value: Any, what: str, expected: str) -> None:
    where = "%s: " % node if node else ""
    derived.refused.append(
        Finding(
            check,
            node,
            Status.FAIL,
            "%s%s %s is not a safe value for %s; refused, not written to the env file" % (where, what, shown(value), key),
            expected=expected,
            actual=shown(value),
        )
    )


def shown(value: Any) -> str:
    """repr() keeps control characters and quotes visible (and on one line) in the report."""
    return repr(value if isinstance(value, str) else str(value))


def _valid(pattern: "re.Pattern[str]") -> Callable[[Any], bool]:
    return lambda value: isinstance(value, str) and bool(pattern.match(value))


IFNAME_OK = _valid(IFNAME_RE)
HCA_OK = _valid(HCA_PORT_RE)
IFNAME_EXPECTED = "1-15 letters, digits, '.', '_', '-', '@'"


def quote(value: str) -> str:
    """Single-quoted for sh and bash whatever the value holds (values are validated before, too)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"

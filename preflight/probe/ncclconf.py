"""How NCCL reads its settings on a node: which variables count, which conf files a given NCCL version reads,
and the value a job there gets (environment first, then ~/.nccl.conf, then /etc/nccl.conf).

Standard library only (shared by the nccl_env check, whose probe reads the files, and by rules that need one
setting, e.g. preflight.derived.nvls reading NCCL_NVLS_ENABLE). Order and lookups: NCCL src/misc/param.cc
(initEnvFunc/setEnvFile), see preflight.checks.nccl_env's docstring.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: a node does not import typing
    from typing import Any, Dict, Optional, Tuple

CONF_ENV = "NCCL_CONF_FILE"
#: Variables NCCL, torch's NCCL process group and gloo read.
PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")
#: From this NCCL version ~/.nccl.conf is found through $HOME, before through the account's home directory.
HOME_FROM_ENV = (2, 30, 3)


def relevant(key: str) -> bool:
    return key.startswith(PREFIXES)


def read_by_nccl(f: Dict[str, Any], version: Optional[Tuple[int, ...]], home_env: Any = True) -> bool:
    """Whether NCCL `version` reads this conf file: the system file and NCCL_CONF_FILE always; the user file
    found through $HOME from NCCL 2.30.3 on (while HOME is set), through the account's home before."""
    via = f.get("via")
    if f.get("role") != "user" or via is None or CONF_ENV in via:
        return True
    lookup = "HOME" if version is not None and tuple(version) >= HOME_FROM_ENV and home_env else "passwd"
    return lookup in via


def effective(facts: Dict[str, Any], version: Optional[Tuple[int, ...]] = None) -> Dict[str, Tuple[str, str]]:
    """{key: (value, where it is set)} for the relevant variables a job on the node gets, NCCL's order.

    where: "environment" or "/etc/nccl.conf:3". The first setter wins (environment, user file, system file;
    within a file, NCCL's setenv(..., 0) keeps the first line of a key). version: the node's NCCL
    ((2, 30, 3)), which decides which ~/.nccl.conf it reads (None: the account's home directory's).
    """
    out: Dict[str, Tuple[str, str]] = {}
    for key, value in sorted((facts.get("environ") or {}).items()):
        out[key] = (value, "environment")
    for f in [f for f in facts.get("files") or [] if read_by_nccl(f, version, facts.get("home_env", True))]:
        for e in f.get("entries") or []:
            if relevant(e["key"]) and e["key"] not in out:
                out[e["key"]] = (e["value"], "%s:%d" % (f["path"], e["line"]))
    return out

"""Versions read from the driver check's facts that several readers share: the NCCL a torch job on a node loads (the
env file's version-gated variables, the NVLS readiness, the all-reduce's report).
"""

from __future__ import annotations

from typing import Any, Dict, Optional


def nccl_version(facts: Dict[str, Any]) -> Optional[str]:
    """The NCCL a torch job on this node loads: the Python distribution's, else the system library's."""
    if facts.get("nccl_python"):
        return facts["nccl_python"]["version"]
    versions = sorted({lib["version"] for lib in facts.get("nccl_system") or [] if lib.get("version")})
    return " + ".join(versions) if versions else None


def public(version: Optional[str]) -> Optional[str]:
    return None if version is None else version.split("+", 1)[0]

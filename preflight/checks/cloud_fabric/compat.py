"""Whether a node's cloud NCCL plugin is known to work with the NCCL its jobs load: known-incompatible, within
the documented range, or unknown (said, never warned about).

aws-ofi-nccl: every release note states the oldest NCCL it keeps working with (aws/aws-ofi-nccl RELEASENOTES.md
on the release branches, v1.5.0 to v1.21.1): "maintaining backward compatibility with older NCCL versions
(NCCL v2.4.8 and later)" from v1.5.0 (when one build began to serve several NCCL versions) to v1.9.2-aws, and
"(NCCL v2.17.1 and later)" from v1.10.0-aws on. Before v1.5.0 the plugin was built against one NCCL
(--with-nccl): unknown. No release note names a newest NCCL it stops working with, so a newer NCCL than the
one a release was tested with is unknown, not bad.

Google's TCPX/TCPXO and gIB installers ship the NCCL they qualify beside the plugin; Google's release notes
(GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo/README.md, "Compatible NCCL version": "The NCCL
plugin installer includes NCCL core as well and it is recommended to use this NCCL core") list qualified
versions per installer image, whose tag the node does not show, and no incompatible ones. So a job loading
that bundled NCCL is "the installer's own NCCL"; another NCCL is unknown.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

from preflight.common import version_key

#: (first aws-ofi-nccl version, the oldest NCCL it works with), newest first (RELEASENOTES.md, module doc).
OFI_MIN_NCCL = (((1, 10, 0), "2.17.1"), ((1, 5, 0), "2.4.8"))
SOURCE = "aws-ofi-nccl release notes"


def _parts(nccl: Optional[str]) -> Sequence[str]:
    """"2.21.5" -> ["2.21.5"]; "2.18.1 + 2.21.5" (several system libraries) -> both."""
    return [p.strip() for p in (nccl or "").split("+") if p.strip()]


def ofi(plugin: Optional[str], nccl: Optional[str]) -> Tuple[Optional[str], str]:
    """(FAIL text or None, what was seen) for aws-ofi-nccl `plugin` ("1.14.0", "1.7.3-aws") beside `nccl`."""
    if plugin is None:
        return None, "aws-ofi-nccl version not found in the library: compatibility with NCCL not judged"
    key = version_key(plugin.split("-")[0])
    floor = next((nccl_min for first, nccl_min in OFI_MIN_NCCL if key is not None and key >= first), None)
    if floor is None:
        return None, "aws-ofi-nccl %s predates the release notes' NCCL ranges (1.5.0): compatibility unknown" % plugin
    versions = _parts(nccl)
    if not versions:
        return None, "aws-ofi-nccl %s (NCCL %s and later per its %s); NCCL version unknown here" % (plugin, floor, SOURCE)
    below = [v for v in versions if version_key(v) is not None and version_key(v) < version_key(floor)]
    if below and len(below) == len(versions):
        return ("aws-ofi-nccl %s works with NCCL %s and later (%s), this node's jobs load NCCL %s: install the "
                "NCCL the EFA installer or the Deep Learning AMI pairs with it, or an older aws-ofi-nccl"
                % (plugin, floor, SOURCE, ", ".join(versions))), "aws-ofi-nccl %s with NCCL %s" % (plugin, nccl)
    return None, "aws-ofi-nccl %s with NCCL %s: within its %s (NCCL %s and later)" % (plugin, nccl, SOURCE, floor)


def bundled(fabric_name: str, shipped: Sequence[str], nccl: Optional[str]) -> str:
    """What is said of a Google plugin beside the NCCL its jobs load (never a verdict: module doc)."""
    if not shipped:
        return "%s plugin's NCCL compatibility unknown (no NCCL beside it%s)" % (
            fabric_name, "; jobs load NCCL %s" % nccl if nccl else "")
    if not _parts(nccl):
        return "the installer ships NCCL %s; the NCCL jobs load here is unknown" % "/".join(shipped)
    if set(_parts(nccl)) <= set(shipped):
        return "jobs load NCCL %s, the one the installer ships (Google qualifies it)" % nccl
    return ("jobs load NCCL %s, not the installer's %s: Google documents only the NCCL it qualifies, so this "
            "pairing is unknown" % (nccl, "/".join(shipped)))


def nccl_of(view: Any, node: str, reader: Any) -> Optional[str]:
    """The NCCL version the driver check found on the node (reader: preflight.derived.versions.nccl_version)."""
    facts: Mapping[str, Any] = (view.facts.get(node) or {}).get("driver") or {}
    return reader(facts) if isinstance(facts, dict) and "probe_error" not in facts else None

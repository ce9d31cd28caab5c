"""Run history: every report kept as one JSON file, so a later run can be diffed against the last one.

Layout: ``<dir>/<UTC start time>-<inventory sha256 prefix>.json``, e.g.
``20261122T133000Z-3f2a9c1d0b7e.json``. A second run in the same second for the same inventory gets
``-1``, ``-2``, ... before ``.json``; nothing is ever overwritten. Files are written atomically (a
temporary file in the same directory, then a rename), so a cron job killed half-way never leaves a
truncated report behind, and the directory is created when missing.

This module also holds the two small helpers the other file writers share (`atomic_write_text`,
`parse_timestamp`).
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

HASH_PREFIX_LEN = 12
_NO_INVENTORY = "noinventory"
_NAME_RE = re.compile(r"^(\d{8}T\d{6}Z)-([0-9a-z]+)(?:-(\d+))?\.json$")
_STAMP_FMT = "%Y%m%dT%H%M%SZ"
_FRACTION_RE = re.compile(r"(?<=T\d\d:\d\d:\d\d)\.(\d+)")


# --- shared helpers -------------------------------------------------------------------------------


def parse_timestamp(value: Optional[str]) -> Optional[_dt.datetime]:
    """An ISO 8601 time from a report as an aware UTC datetime; None when absent.

    Accepts the trailing ``Z`` that Python < 3.11 `fromisoformat` rejects; a time without zone is UTC.
    Raises ValueError on text that is not ISO 8601.
    """
    if value is None or value == "":
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python < 3.11 takes only 3 or 6 fraction digits: pad or cut to microseconds
    text = _FRACTION_RE.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    parsed = _dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.timezone.utc)
    return parsed.astimezone(_dt.timezone.utc)


def atomic_write_text(path: PathLike, text: str, *, overwrite: bool = True, mode: int = 0o644) -> Path:
    """Write text (UTF-8) to path so readers see the old file or the whole new one, never a part.

    The data goes to a hidden temporary file in the same directory (same filesystem, so the rename is
    atomic; its name does not end in the target's suffix, so a node_exporter textfile collector never
    reads it), is fsynced, then renamed over path. With overwrite=False an existing path raises
    FileExistsError instead of being replaced. An existing target keeps its permission bits; a new one
    gets `mode` (mkstemp's 0600 would hide the file from a collector running as another user).
    """
    target = Path(path)
    directory = target.parent
    try:
        file_mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        file_mode = mode
    fd, tmp_name = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".tmp", dir=str(directory))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, file_mode)
        if overwrite:
            os.replace(tmp_name, target)
        else:
            _rename_no_clobber(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return target


def _rename_no_clobber(src: str, dst: Path) -> None:
    """Rename src to dst, raising FileExistsError when dst exists (a hard link makes it race-free)."""
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:  # filesystems without hard links (some FUSE / SMB mounts)
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if dst.exists():
            raise FileExistsError(errno.EEXIST, "file exists", str(dst)) from None
        os.replace(src, dst)
        return
    os.unlink(src)


# --- history --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One stored run: its file and what its name says about it."""

    path: Path
    started_at: _dt.datetime
    inventory_prefix: str
    seq: int

    @property
    def sort_key(self) -> tuple:
        return (self.started_at, self.seq, self.inventory_prefix)


def _hash_prefix(inventory_sha256: Optional[str]) -> str:
    if not inventory_sha256:
        return _NO_INVENTORY
    prefix = inventory_sha256.strip().lower()[:HASH_PREFIX_LEN]
    if not re.fullmatch(r"[0-9a-z]+", prefix):
        raise ValueError("inventory_sha256 is not a hex digest: %r" % inventory_sha256)
    return prefix


def run_filename(report: Mapping[str, Any], seq: int = 0) -> str:
    """The history file name for a report: ``<YYYYmmddTHHMMSSZ>-<sha256 prefix>[-seq].json``."""
    started = parse_timestamp(report.get("started_at")) or _dt.datetime.now(_dt.timezone.utc)
    stem = "%s-%s" % (started.strftime(_STAMP_FMT), _hash_prefix(report.get("inventory_sha256")))
    return stem + ("-%d" % seq if seq else "") + ".json"


def record(report: Mapping[str, Any], history_dir: PathLike) -> Path:
    """Store a report in history_dir (created if missing) and return the new file's path.

    Never overwrites: a name already taken gets the next ``-N`` suffix.
    """
    directory = Path(history_dir)
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, sort_keys=False) + "\n"
    for seq in range(0, 10000):
        target = directory / run_filename(report, seq)
        try:
            return atomic_write_text(target, text, overwrite=False)
        except FileExistsError:
            continue
    raise FileExistsError("no free history file name for %s in %s" % (run_filename(report), directory))


def parse_run_name(path: PathLike) -> Optional[Run]:
    """The Run a history file name describes, or None for a file that is not a history entry."""
    p = Path(path)
    m = _NAME_RE.match(p.name)
    if not m:
        return None
    started = _dt.datetime.strptime(m.group(1), _STAMP_FMT).replace(tzinfo=_dt.timezone.utc)
    return Run(path=p, started_at=started, inventory_prefix=m.group(2), seq=int(m.group(3) or 0))


def list_runs(history_dir: PathLike, inventory_sha256: Optional[str] = None) -> List[Run]:
    """The stored runs, oldest first; only those of one inventory when inventory_sha256 is given.

    Matching is on the name's hash prefix; `previous` confirms the full hash from the file. A missing
    directory is an empty history. Files not named like history entries are ignored.
    """
    directory = Path(history_dir)
    if not directory.is_dir():
        return []
    wanted = _hash_prefix(inventory_sha256) if inventory_sha256 is not None else None
    runs = []
    for entry in directory.iterdir():
        run = parse_run_name(entry)
        if run is None or not entry.is_file():
            continue
        if wanted is not None and run.inventory_prefix != wanted:
            continue
        runs.append(run)
    runs.sort(key=lambda r: r.sort_key)
    return runs


def load(path: PathLike) -> Dict[str, Any]:
    """A stored report document."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict):
        raise ValueError("%s: not a preflight report (top level is not an object)" % path)
    return doc


def previous(
    history_dir: PathLike, inventory_sha256: Optional[str], before: Optional[PathLike] = None
) -> Optional[Path]:
    """The latest stored run of the same inventory that is older than `before` (any, if None).

    `before` is usually the path `record` just returned, so the current run is never its own
    predecessor. The full inventory hash is confirmed from each candidate's JSON; a file that cannot
    be read or parsed is passed over (a stray, hand-edited file must not wedge a cron job).
    Returns None when there is no such run.
    """
    limit = None
    if before is not None:
        before_run = parse_run_name(before)
        if before_run is None:
            raise ValueError("%s is not a history file name (<UTC time>-<hash>.json)" % before)
        limit = before_run.sort_key
    for run in reversed(list_runs(history_dir, inventory_sha256)):
        if limit is not None and run.sort_key >= limit:
            continue
        try:
            doc = load(run.path)
        except (OSError, ValueError):
            continue
        if (doc.get("inventory_sha256") or None) != (inventory_sha256 or None):
            continue
        return run.path
    return None


def prune(history_dir: PathLike, keep: int) -> List[Path]:
    """Delete all but the newest `keep` runs of each inventory; return the deleted paths."""
    if keep < 1:
        raise ValueError("keep must be at least 1, got %d" % keep)
    by_inventory: Dict[str, List[Run]] = {}
    for run in list_runs(history_dir):
        by_inventory.setdefault(run.inventory_prefix, []).append(run)
    removed = []
    for runs in by_inventory.values():
        for run in runs[:-keep]:
            try:
                run.path.unlink()
            except FileNotFoundError:
                continue
            removed.append(run.path)
    return removed

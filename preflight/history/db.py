"""The history database: one SQLite file, every run's nodes, findings, GPUs, busbw and actions as rows.

Why SQLite: a nightly audit of 1,000 nodes keeps about 20,000 findings a night; a year of them as JSON
files is read whole for any question ("how often did node07 fail?"), as rows it is an index lookup.
gpud keeps its events the same way (leptonai/gpud pkg/sqlite, pkg/eventstore).

Schema (version in ``PRAGMA user_version``, raised by MIGRATIONS in order, each in one transaction)::

    runs(id, started_at, inventory_sha256, inventory, version, duration_s, exit_code, busbw_gbps,
         source, report)              report: the whole JSON document, zlib-compressed (nothing lost);
                                      source: the JSON file a run was imported from (imported once)
    nodes(id, name)  checks(id, name)  messages(id, text)        names and texts kept once
    node_runs(node_id, run_id, status, facts_sha256)            status: 0 pass 1 unavailable 2 warn 3 fail
    findings(run_id, node_id, check_id, status, action, message_id, subject, fault)
                                      status: Status.rank (0 pass 1 skip 2 warn 3 fail 4 error);
                                      subject/fault: preflight.history.subjects, for problems only
    gpus(serial, uuid, node_id, idx, first_run, last_run)       each slot a board was seen in
    gpu_failures(run_id, serial, uuid, node_id, idx)            the gpu check failed that board
    busbw(run_id, node_id, gbps)                                node_id NULL: the run's headline figure
    actions(run_id, node_id, kind, subject, reason, shadow)     drain (Slurm), cordon (Kubernetes), resume,
                                                                escalate, hold, breaker;
                                                                shadow 1: what --shadow would have done

Damage it survives, each said in one line (HistoryError or the `say` callback):
- two controllers writing at once: WAL, a 60 s busy timeout and BEGIN IMMEDIATE serialise them;
- a writer killed mid-run: the transaction never committed, the next open sees the runs before it;
- a full disk (ENOSPC, EFBIG): the transaction rolls back, HistoryError says so, the file stays usable;
- a corrupt file: it is moved aside (``<path>.corrupt-<UTC>``) and a new database started.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sqlite3
import zlib
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from preflight.errors import PreflightError
from preflight.history.subjects import gpu_index, subject_of

STATUS_RANK = {"pass": 0, "skip": 1, "warn": 2, "fail": 3, "error": 4}
STATUS_NAME = {v: k for k, v in STATUS_RANK.items()}
NODE_RANK = {"pass": 0, "unavailable": 1, "warn": 2, "fail": 3}
NODE_NAME = {v: k for k, v in NODE_RANK.items()}
PROBLEM = 3  # a finding of this rank or worse failed or errored
BUSY_TIMEOUT_S = 60.0
FILE_NAME = "history.sqlite"  # the database inside a --history directory

_V1 = """
CREATE TABLE runs(id INTEGER PRIMARY KEY, started_at REAL NOT NULL, inventory_sha256 TEXT, inventory TEXT,
    version TEXT, duration_s REAL, exit_code INTEGER, busbw_gbps REAL, source TEXT UNIQUE, report BLOB);
CREATE INDEX runs_started ON runs(started_at);
CREATE TABLE nodes(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE checks(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE messages(id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
CREATE TABLE node_runs(node_id INTEGER NOT NULL, run_id INTEGER NOT NULL, status INTEGER NOT NULL,
    facts_sha256 TEXT, PRIMARY KEY(node_id, run_id)) WITHOUT ROWID;
CREATE INDEX node_runs_run ON node_runs(run_id);
CREATE TABLE findings(run_id INTEGER NOT NULL, node_id INTEGER, check_id INTEGER NOT NULL,
    status INTEGER NOT NULL, action TEXT, message_id INTEGER NOT NULL, subject TEXT, fault TEXT);
CREATE INDEX findings_node ON findings(node_id, run_id);
CREATE INDEX findings_run ON findings(run_id);
CREATE TABLE gpus(serial TEXT NOT NULL, uuid TEXT NOT NULL, node_id INTEGER NOT NULL, idx INTEGER NOT NULL,
    first_run INTEGER NOT NULL, last_run INTEGER NOT NULL, PRIMARY KEY(serial, uuid, node_id, idx));
CREATE TABLE gpu_failures(run_id INTEGER NOT NULL, serial TEXT, uuid TEXT, node_id INTEGER, idx INTEGER);
CREATE INDEX gpu_failures_run ON gpu_failures(run_id);
CREATE TABLE busbw(run_id INTEGER NOT NULL, node_id INTEGER, gbps REAL NOT NULL);
CREATE INDEX busbw_run ON busbw(run_id);
CREATE TABLE actions(run_id INTEGER NOT NULL, node_id INTEGER, kind TEXT NOT NULL, subject TEXT, reason TEXT);
CREATE INDEX actions_run ON actions(run_id);
"""
# v2: problems looked up by what they are about (escalation counts a fault on a GPU serial across
# nodes), and --shadow's decisions kept apart from the ones carried out
_V2 = """
CREATE INDEX findings_subject ON findings(subject, fault, run_id) WHERE subject IS NOT NULL;
ALTER TABLE actions ADD COLUMN shadow INTEGER NOT NULL DEFAULT 0;
"""
MIGRATIONS: Sequence[Tuple[int, str]] = ((1, _V1), (2, _V2))
SCHEMA_VERSION = MIGRATIONS[-1][0]


class HistoryError(PreflightError):
    """The history database could not be read or written; the message names the file and the fix."""


def _utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def epoch(started_at: Any) -> float:
    """A report's started_at as Unix seconds (now when absent)."""
    from preflight.output.history import parse_timestamp

    parsed = parse_timestamp(started_at) if isinstance(started_at, str) else None
    return (parsed or _dt.datetime.now(_dt.timezone.utc)).timestamp()


def facts_digests(facts: Mapping[str, Any]) -> Dict[str, str]:
    """{node: sha256 of its facts as canonical JSON}: a changed node shows as a changed digest."""
    out = {}
    for node, doc in facts.items():
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
        out[node] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return out


class History:
    """An open history database. Use as a context manager; `say` receives one-line notices."""

    def __init__(self, path: str, say: Callable[[str], None] = lambda line: None) -> None:
        self.path = path
        self.say = say
        self.conn = self._open()
        self._ids: Dict[str, Dict[str, int]] = {"nodes": {}, "checks": {}}

    # --- opening, migrating, damage ------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and not _corruption(exc):
                raise self._error("cannot open", exc) from None
        moved = self._move_aside()
        self.say("history: %s was not a readable SQLite database; moved it to %s and started a new one"
                 % (self.path, moved))
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            raise self._error("cannot create", exc) from None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a power cut may lose the last run, never corrupt
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                conn.close()
                raise HistoryError("history %s has schema version %d, newer than this preflight's %d"
                                   % (self.path, version, SCHEMA_VERSION), "upgrade preflight")
            if version < SCHEMA_VERSION:
                self._migrate(conn, version)
            conn.execute("SELECT count(*) FROM runs").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        """Raise the schema from `version` one step at a time; another process migrating is waited for."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # re-read under the write lock
            for target, script in MIGRATIONS:
                if target > version:
                    for statement in filter(str.strip, script.split(";")):
                        conn.execute(statement)
                    conn.execute("PRAGMA user_version=%d" % target)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _move_aside(self) -> str:
        target = "%s.corrupt-%s" % (self.path, _utc_stamp())
        os.replace(self.path, target)
        for suffix in ("-wal", "-shm"):
            try:
                os.replace(self.path + suffix, target + suffix)
            except FileNotFoundError:
                continue
        return target

    def _error(self, doing: str, exc: BaseException) -> HistoryError:
        text = str(exc)
        if "full" in text or "disk I/O error" in text:
            return HistoryError("history %s: %s: disk full or file size limit (%s); the runs before this one are intact"
                                % (self.path, doing, text), "free space on that filesystem and rerun")
        if "locked" in text or "busy" in text:
            return HistoryError("history %s: %s: still locked by another writer after %.0f s"
                                % (self.path, doing, BUSY_TIMEOUT_S), "rerun when the other preflight has finished")
        return HistoryError("history %s: %s: %s" % (self.path, doing, text), "check the file and its directory")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- writing -------------------------------------------------------------------------------

    def record(self, doc: Mapping[str, Any], facts: Optional[Mapping[str, Any]] = None,
               actions: Iterable[Mapping[str, Any]] = (), source: Optional[str] = None) -> int:
        """Store one report (its document, and the nodes' facts for their digests) in one transaction;
        return the run id. A database found corrupt on the way is moved aside and the run stored anew."""
        try:
            return self._write(doc, facts, actions, source)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) or not _corruption(exc):
                raise self._error("cannot record the run", exc) from None
        except OSError as exc:
            raise self._error("cannot record the run", exc) from None
        self.close()
        moved = self._move_aside()
        self.say("history: %s was damaged; moved it to %s and recorded this run in a new one" % (self.path, moved))
        self.conn, self._ids = self._connect(), {"nodes": {}, "checks": {}}
        return self._write(doc, facts, actions, source)

    def _write(self, doc: Mapping[str, Any], facts: Optional[Mapping[str, Any]],
               actions: Iterable[Mapping[str, Any]], source: Optional[str]) -> int:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            run = self._insert_run(doc, source)
            digests = facts_digests(facts) if facts else {}
            c.executemany("INSERT INTO node_runs VALUES(?,?,?,?)", [
                (self._id("nodes", n["name"]), run, NODE_RANK.get(n.get("status"), NODE_RANK["fail"]), digests.get(n["name"]))
                for n in doc.get("nodes") or []])
            self._insert_findings(run, doc)
            self._insert_gpus(run, doc.get("hardware") or {})
            self.add_actions(run, actions, in_transaction=True)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:  # SQLite may have rolled back already (a full disk does)
                c.execute("ROLLBACK")
            self._ids = {"nodes": {}, "checks": {}}  # ids inserted in the rolled-back transaction are gone
            raise
        return run

    def _insert_run(self, doc: Mapping[str, Any], source: Optional[str]) -> int:
        allreduce = doc.get("allreduce") or {}
        blob = zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 1)
        cur = self.conn.execute(
            "INSERT INTO runs(started_at, inventory_sha256, inventory, version, duration_s, exit_code, busbw_gbps,"
            " source, report) VALUES(?,?,?,?,?,?,?,?,?)",
            (epoch(doc.get("started_at")), doc.get("inventory_sha256"), doc.get("inventory"),
             doc.get("preflight_version"), doc.get("duration_s"), doc.get("exit_code"),
             allreduce.get("busbw_gbps"), source, blob))
        run = int(cur.lastrowid)
        if allreduce.get("busbw_gbps") is not None:
            self.conn.execute("INSERT INTO busbw VALUES(?,?,?)", (run, None, float(allreduce["busbw_gbps"])))
        return run

    def _insert_findings(self, run: int, doc: Mapping[str, Any]) -> None:
        results = doc.get("results") or []
        problems = any(STATUS_RANK[r["status"]] >= PROBLEM for r in results)
        gpus = gpu_index(doc.get("hardware") or {}) if problems else {}
        texts = {r["message"] for r in results}
        self.conn.executemany("INSERT OR IGNORE INTO messages(text) VALUES(?)", [(t,) for t in texts])
        message = {t: self.conn.execute("SELECT id FROM messages WHERE text=?", (t,)).fetchone()[0] for t in texts}
        rows, bw = [], []
        for r in results:
            rank = STATUS_RANK[r["status"]]
            node = self._id("nodes", r["node"]) if r.get("node") else None
            subject, fault = subject_of(r, gpus) if rank >= PROBLEM else (None, None)
            rows.append((run, node, self._id("checks", r["check"]), rank, r.get("action"), message[r["message"]],
                         subject, fault))
            data = r.get("data") if isinstance(r.get("data"), dict) else {}
            if node is not None and r["check"] == "allreduce" and isinstance(data.get("busbw_gbps"), (int, float)):
                bw.append((run, node, float(data["busbw_gbps"])))
        self.conn.executemany("INSERT INTO findings VALUES(?,?,?,?,?,?,?,?)", rows)
        self.conn.executemany("INSERT INTO busbw VALUES(?,?,?)", bw)

    def _insert_gpus(self, run: int, hardware: Mapping[str, Any]) -> None:
        seen, failed = [], []
        for node, entry in hardware.items():
            node_id = self._id("nodes", node)
            for g in (entry or {}).get("gpus") or []:
                row = (g.get("serial") or "", g.get("uuid") or "", node_id, int(g.get("index") or 0))
                seen.append(row + (run, run))
                if g.get("failed"):
                    failed.append((run,) + row)
        self.conn.executemany(
            "INSERT INTO gpus VALUES(?,?,?,?,?,?) ON CONFLICT(serial, uuid, node_id, idx) DO UPDATE SET"
            " last_run=excluded.last_run", seen)
        self.conn.executemany("INSERT INTO gpu_failures VALUES(?,?,?,?,?)", failed)

    def add_actions(self, run: int, actions: Iterable[Mapping[str, Any]], in_transaction: bool = False) -> None:
        """Record actions (kind: drain, cordon, resume, escalate, hold, breaker) taken or, shadow, only decided."""
        rows = [(run, self._id("nodes", a["node"]) if a.get("node") else None, a["kind"], a.get("subject"),
                 a.get("reason"), 1 if a.get("shadow") else 0) for a in actions]
        if not rows:
            return
        if in_transaction:
            self.conn.executemany("INSERT INTO actions VALUES(?,?,?,?,?,?)", rows)
            return
        with self._transaction("cannot record the actions"):
            self.conn.executemany("INSERT INTO actions VALUES(?,?,?,?,?,?)", rows)

    def _transaction(self, doing: str) -> Any:
        return _Transaction(self, doing)

    def _id(self, table: str, name: str) -> int:
        cache = self._ids[table]
        if name not in cache:
            row = self.conn.execute("SELECT id FROM %s WHERE name=?" % table, (name,)).fetchone()
            if row is None:
                row = (self.conn.execute("INSERT INTO %s(name) VALUES(?)" % table, (name,)).lastrowid,)
            cache[name] = int(row[0])
        return cache[name]

    # --- import, retention, reading back ---------------------------------------------------------

    def import_dir(self, directory: str) -> int:
        """Import the JSON reports of a `--history DIR` not imported before (by file name); return how
        many. An unreadable file is named in one line and left for the next run."""
        from preflight.output import history as json_history

        done = {row[0] for row in self.conn.execute("SELECT source FROM runs WHERE source IS NOT NULL")}
        count = 0
        for entry in json_history.list_runs(directory):
            if entry.path.name in done:
                continue
            try:
                doc = json_history.load(entry.path)
            except (OSError, ValueError) as exc:
                self.say("history: %s not imported: %s" % (entry.path, exc))
                continue
            self.record(doc, source=entry.path.name)
            count += 1
        return count

    def prune(self, keep_runs: Optional[int] = None, max_age_days: Optional[float] = None,
              now: Optional[float] = None) -> int:
        """Delete runs beyond the newest `keep_runs` and runs older than `max_age_days`, with their rows;
        return how many runs went."""
        clauses, args = [], []  # type: List[str], List[Any]
        if keep_runs is not None:
            if keep_runs < 1:
                raise ValueError("keep_runs must be at least 1")
            clauses.append("id NOT IN (SELECT id FROM runs ORDER BY started_at DESC, id DESC LIMIT ?)")
            args.append(keep_runs)
        if max_age_days is not None:
            clauses.append("started_at < ?")
            args.append((now if now is not None else _dt.datetime.now(_dt.timezone.utc).timestamp()) - max_age_days * 86400)
        if not clauses:
            return 0
        with self._transaction("cannot prune"):
            gone = [r[0] for r in self.conn.execute("SELECT id FROM runs WHERE " + " OR ".join(clauses), args)]
            for table in ("node_runs", "findings", "gpu_failures", "busbw", "actions"):
                self.conn.executemany("DELETE FROM %s WHERE run_id=?" % table, [(r,) for r in gone])
            self.conn.executemany("DELETE FROM runs WHERE id=?", [(r,) for r in gone])
        return len(gone)

    def report(self, run: int) -> Dict[str, Any]:
        """The whole JSON document of a stored run."""
        blob = self.conn.execute("SELECT report FROM runs WHERE id=?", (run,)).fetchone()
        if blob is None or blob[0] is None:
            raise KeyError(run)
        return json.loads(zlib.decompress(blob[0]).decode("utf-8"))

    def previous(self, inventory_sha256: Optional[str]) -> Optional[Dict[str, Any]]:
        """The latest stored report of this inventory (rules compare against it), or None."""
        row = self.conn.execute("SELECT id FROM runs WHERE inventory_sha256 IS ? ORDER BY started_at DESC, id DESC"
                                " LIMIT 1", (inventory_sha256,)).fetchone()
        return self.report(row[0]) if row else None

    def integrity(self) -> str:
        """SQLite's own verdict on the file ('ok', or what is damaged)."""
        return "; ".join(r[0] for r in self.conn.execute("PRAGMA quick_check"))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error, which becomes one HistoryError line."""

    def __init__(self, history: History, doing: str) -> None:
        self.history, self.doing = history, doing

    def __enter__(self) -> None:
        try:
            self.history.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise self.history._error(self.doing, exc) from None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        conn = self.history.conn
        if kind is None:
            try:
                conn.execute("COMMIT")
                return False
            except sqlite3.DatabaseError as error:
                kind, exc = type(error), error
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, (sqlite3.DatabaseError, OSError)):
            raise self.history._error(self.doing, exc) from None
        return False


def _corruption(exc: BaseException) -> bool:
    text = str(exc)
    return "not a database" in text or "malformed" in text or "encrypted" in text


def location(path: str) -> Tuple[str, Optional[str]]:
    """(database file, JSON directory or None) for a `--history PATH`: a directory (existing, or a new
    path without a .sqlite/.db suffix) keeps its JSON files and holds the database as history.sqlite;
    any other path is the database itself."""
    if os.path.isdir(path) or (not os.path.exists(path) and not path.endswith((".sqlite", ".sqlite3", ".db"))):
        return os.path.join(path, FILE_NAME), path
    return path, None

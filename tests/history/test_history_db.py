"""The history database on a real SQLite file: what a run leaves as rows, the JSON directory imported
once, migrations, retention, and the damage it survives (two writing processes, a SIGKILLed writer, a
full tmpfs, a corrupt file), each with its healthy twin."""

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from preflight.history import recorder
from preflight.history.db import _V1, SCHEMA_VERSION, History, HistoryError, facts_digests, location
from preflight.output import history as json_history
from tests import history_fleet as fleet
from tests.paths import REPO

ROOT = REPO
NODES = fleet.node_names(4)


def _count(h, table, where="1"):
    return h.conn.execute("SELECT count(*) FROM %s WHERE %s" % (table, where)).fetchone()[0]


def _said():
    lines = []
    return lines, lines.append


def test_a_run_is_rows_and_its_document_comes_back_whole(tmp_path):
    doc = fleet.report(0, NODES, [fleet.xid(NODES[1], 3)], failed_gpus={NODES[2]: 5})
    facts = {n: {"gpu": {"count": 8, "node": n}} for n in NODES}
    with History(str(tmp_path / "h.sqlite")) as h:
        run = h.record(doc, facts=facts, actions=[{"node": NODES[1], "kind": "drain", "reason": "xid"}])
        assert h.report(run) == doc
        assert _count(h, "node_runs") == 4 and _count(h, "node_runs", "status=3") == 2
        assert _count(h, "findings") == len(doc["results"])
        assert _count(h, "gpus") == 32 and _count(h, "gpu_failures") == 1
        assert h.conn.execute("SELECT gbps FROM busbw WHERE node_id IS NULL").fetchone()[0] == 182.5
        assert _count(h, "actions", "kind='drain' AND shadow=0") == 1
        digest = h.conn.execute("SELECT facts_sha256 FROM node_runs JOIN nodes ON id=node_id WHERE name=?",
                                (NODES[0],)).fetchone()[0]
        assert digest == facts_digests(facts)[NODES[0]]
        # the Xid on GPU 3 is counted on that board's serial, the failed GPU 5 in gpu_failures by serial
        assert h.conn.execute("SELECT subject, fault FROM findings WHERE subject IS NOT NULL AND fault LIKE 'xid%'"
                              ).fetchone() == ("gpu:" + fleet.serial(NODES[1], 3), "xid:xid79")
        assert h.conn.execute("SELECT serial FROM gpu_failures").fetchone()[0] == fleet.serial(NODES[2], 5)
        assert h.integrity() == "ok"


def test_json_directory_is_imported_once_and_nothing_is_lost(tmp_path):
    directory = tmp_path / "hist"
    docs = [fleet.report(d, NODES, [fleet.xid(NODES[0], 1)] if d == 1 else []) for d in range(3)]
    for doc in docs:
        json_history.record(doc, directory)
    (directory / ("20260105T020000Z-%s.json" % fleet.SHA[:12])).write_text("{ not json")
    lines, say = _said()
    h, where = recorder.open_history(str(directory), say)
    with h:
        assert where == str(directory) and h.path == str(directory / "history.sqlite")
        assert sorted(json.dumps(h.report(r), sort_keys=True) for (r,) in h.conn.execute("SELECT id FROM runs")) == \
            sorted(json.dumps(d, sort_keys=True) for d in docs)
        # a run recorded with a JSON directory writes its file and names it: never imported a second time
        recorder.record(h, where, fleet.report(3, NODES), None, [], {}, say)
    assert [line for line in lines if "not imported" in line] == [
        "history: %s not imported: Expecting property name enclosed in double quotes: line 1 column 3 (char 2)"
        % (directory / ("20260105T020000Z-%s.json" % fleet.SHA[:12]))]
    assert "imported 3 JSON reports" in " ".join(lines)
    lines2, say2 = _said()
    h, _ = recorder.open_history(str(directory), say2)
    with h:
        assert _count(h, "runs") == 4
    assert not any("imported" in line and "not imported" not in line for line in lines2)
    assert len(json_history.list_runs(directory)) == 5  # four reports and the unreadable one, untouched


def test_location_tells_a_database_file_from_a_json_directory(tmp_path):
    assert location(str(tmp_path)) == (str(tmp_path / "history.sqlite"), str(tmp_path))
    assert location(str(tmp_path / "new")) == (str(tmp_path / "new" / "history.sqlite"), str(tmp_path / "new"))
    assert location(str(tmp_path / "audit.sqlite")) == (str(tmp_path / "audit.sqlite"), None)


def test_an_old_schema_is_migrated_and_keeps_its_runs(tmp_path):
    path = str(tmp_path / "old.sqlite")
    conn = sqlite3.connect(path)
    conn.executescript(_V1)
    conn.execute("INSERT INTO runs(started_at, inventory_sha256) VALUES(1, 'x')")
    conn.execute("INSERT INTO actions VALUES(1, NULL, 'drain', NULL, 'old')")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with History(path) as h:
        assert h.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        assert h.conn.execute("SELECT kind, shadow FROM actions").fetchall() == [("drain", 0)]
        assert _count(h, "runs") == 1
        assert h.conn.execute("SELECT name FROM sqlite_master WHERE name='findings_subject'").fetchone()


def test_a_newer_schema_is_one_line_not_a_rewrite(tmp_path):
    path = str(tmp_path / "new.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()
    with pytest.raises(HistoryError, match="schema version 99, newer than this preflight's 2; upgrade preflight"):
        History(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 99


def test_retention_by_run_count_and_by_age_removes_the_rows_too(tmp_path):
    with History(str(tmp_path / "h.sqlite")) as h:
        for day in range(10):
            h.record(fleet.report(day, NODES, [fleet.xid(NODES[0], 0)]))
        assert h.prune(keep_runs=6) == 4
        assert _count(h, "runs") == 6 and _count(h, "node_runs") == 24
        assert _count(h, "findings", "run_id NOT IN (SELECT id FROM runs)") == 0
        last = h.conn.execute("SELECT max(started_at) FROM runs").fetchone()[0]
        assert h.prune(max_age_days=2.5, now=last) == 3  # days 7, 8, 9 stay
        assert [fleet.stamp(d) for d in (7, 8, 9)] == [h.report(r)["started_at"] for (r,) in
                                                       h.conn.execute("SELECT id FROM runs ORDER BY started_at")]
        assert h.prune() == 0


WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from preflight.history.db import History
    from tests import history_fleet as fleet
    nodes = fleet.node_names(50)
    with History({path!r}) as h:
        for day in range({first}, {first} + {count}):
            h.record(fleet.report(day, nodes))
""")


def test_two_controllers_writing_at_once_both_land(tmp_path):
    path = str(tmp_path / "h.sqlite")
    History(path).close()  # created; both writers then open the same file
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(root=ROOT, path=path, first=first, count=15)],
                              stderr=subprocess.PIPE, text=True) for first in (0, 100)]
    try:
        errors = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], errors
    with History(path) as h:
        assert _count(h, "runs") == 30 and _count(h, "node_runs") == 30 * 50
        assert _count(h, "nodes") == 50  # the two writers agreed on one id per node
        assert h.integrity() == "ok"


KILLED = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from preflight.history.db import History
    from tests import history_fleet as fleet

    class Facts(dict):
        def items(self):  # read inside the run's transaction: the writer is stopped here
            print("in transaction", flush=True)
            time.sleep({sleep})
            return super().items()

    nodes = fleet.node_names(20)
    with History({path!r}) as h:
        for day in range(3):
            h.record(fleet.report(day, nodes))
        h.record(fleet.report(3, nodes), facts=Facts({{n: {{}} for n in nodes}}))
    print("done", flush=True)
""")


@pytest.mark.parametrize("killed", [True, False], ids=["sigkilled-mid-run", "finishes"])
def test_a_writer_killed_mid_run_leaves_the_runs_before_it(tmp_path, killed):
    path = str(tmp_path / "h.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(root=ROOT, path=path, sleep=600 if killed else 0)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in transaction"
        if killed:
            proc.kill()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with History(path) as h:
        assert _count(h, "runs") == (3 if killed else 4)
        assert h.integrity() == "ok"
        h.record(fleet.report(9, fleet.node_names(20)))  # the killed writer's lock went with it
        assert _count(h, "runs") == (4 if killed else 5)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): %s" % done.stderr.strip())
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_is_one_line_and_the_database_stays_usable(tiny_tmpfs):
    path = str(tiny_tmpfs / "h.sqlite")
    nodes = fleet.node_names(40)
    stored = 0
    with History(path) as h:
        with pytest.raises(HistoryError) as caught:
            for day in range(200):
                h.record(fleet.report(day, nodes))
                stored += 1
        message = str(caught.value)
        assert "\n" not in message and "disk full" in message and path in message
        assert "free space on that filesystem and rerun" in message
        assert stored > 0 and _count(h, "runs") == stored
    with History(path) as h:  # reopened: the runs before the full disk, intact
        assert _count(h, "runs") == stored
        assert h.integrity() == "ok"
        assert h.prune(keep_runs=1) == stored - 1  # space freed inside the file; writing works again
        h.record(fleet.report(500, nodes[:2]))


def test_a_file_size_limit_is_the_same_one_line(tmp_path):
    script = textwrap.dedent("""
        import resource, signal, sys
        sys.path.insert(0, {root!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300000, 300000))
        from preflight.history.db import History, HistoryError
        from tests import history_fleet as fleet
        with History({path!r}) as h:
            try:
                for day in range(200):
                    h.record(fleet.report(day, fleet.node_names(40)))
            except HistoryError as exc:
                print(exc)
    """).format(root=ROOT, path=str(tmp_path / "h.sqlite"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "disk full or file size limit" in done.stdout and len(done.stdout.strip().splitlines()) == 1
    with History(str(tmp_path / "h.sqlite")) as h:
        assert _count(h, "runs") > 0 and h.integrity() == "ok"


def test_a_file_that_is_not_a_database_is_moved_aside_in_one_line(tmp_path):
    path = tmp_path / "h.sqlite"
    path.write_bytes(b"this is a cron log, not a database\n" * 200)
    lines, say = _said()
    with History(str(path), say) as h:
        h.record(fleet.report(0, NODES))
        assert _count(h, "runs") == 1
    assert len(lines) == 1 and "was not a readable SQLite database; moved it to" in lines[0]
    aside = [p for p in os.listdir(tmp_path) if p.startswith("h.sqlite.corrupt-")]
    assert aside and (tmp_path / aside[0]).read_bytes().startswith(b"this is a cron log")


def test_a_database_damaged_inside_is_moved_aside_and_the_run_recorded(tmp_path):
    path = str(tmp_path / "h.sqlite")
    with History(path) as h:
        for day in range(5):
            h.record(fleet.report(day, fleet.node_names(30)))
        h.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:  # the pages after the schema overwritten: tables and indexes damaged
        fh.seek(4096 * 3)
        fh.write(b"\xa5" * (size - 4096 * 3))
    lines, say = _said()
    with History(path, say) as h:
        h.record(fleet.report(9, NODES))
        assert _count(h, "runs") == 1 and h.integrity() == "ok"
    assert len(lines) == 1 and "moved it to" in lines[0], lines


def test_a_healthy_database_opens_without_a_word(tmp_path):
    path = str(tmp_path / "h.sqlite")
    with History(path) as h:
        for day in range(5):
            h.record(fleet.report(day, fleet.node_names(30)))
    lines, say = _said()
    with History(path, say) as h:
        h.record(fleet.report(9, NODES))
        assert _count(h, "runs") == 6
    assert lines == [] and [p for p in os.listdir(tmp_path) if "corrupt" in p] == []

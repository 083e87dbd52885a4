"""The store while a run floods it, on a real sqlite file: another run's few events are committed
before the flood's queued batches (each run's writes still in order), the WAL is copied into the
database by the checkpointer thread, and a database made before run_events lost its
(run_id, src, src_seq) index opens with every event kept (now in chunks)."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

from cdui.plane.store import BATCH_EVENTS, MIGRATIONS, Store
from cdui.plane.store.database import CHECKPOINT_ROWS, LIGHT_JOB
from cdui.plane.store.event_chunks import event_rows
from test_store import Blocker, ev, new_run, run, writes_queued


def rowids(store: Store, run_id: str) -> list[int]:
    """The order a run's chunks of events were inserted in (rowid grows with each insert)."""
    return store.read_sync(lambda c: [r[0] for r in c.execute(
        "SELECT rowid FROM run_event_chunks WHERE run_id=? ORDER BY first_seq", (run_id,)).fetchall()])


def test_a_runs_few_events_go_before_another_runs_flood(store: Store) -> None:
    """Queued behind a flood's two batches, a quiet run's event is committed in a transaction of
    its own before them: its watchers do not wait for thousands of another run's events."""
    per = BATCH_EVENTS // 2

    async def go() -> None:
        await store.create_run(new_run("flood", status="running"))
        await store.create_run(new_run("quiet", status="running"))
        blocker = Blocker(store)
        block_task = asyncio.create_task(store.write(blocker.fn))
        assert await asyncio.to_thread(blocker.entered.wait, 60)
        first = asyncio.create_task(store.append_events("flood", "worker:w", [ev(s) for s in range(1, per + 1)]))
        await writes_queued(store, 1)
        second = asyncio.create_task(store.append_events("flood", "worker:w",
                                                         [ev(s) for s in range(per + 1, 2 * per + 1)]))
        await writes_queued(store, 2)
        quiet = asyncio.create_task(store.append_events("quiet", "local", [ev(s) for s in range(1, LIGHT_JOB + 1)]))
        await writes_queued(store, 3)
        before = store.commits
        blocker.release.set()
        await block_task
        assert (await first)[1] == per and (await second)[1] == 2 * per
        assert (await quiet)[1] == LIGHT_JOB
        assert store.commits - before == 1 + 2  # the blocker's own, then [quiet], then [flood, flood]
    run(go())
    assert max(rowids(store, "quiet")) < min(rowids(store, "flood"))
    assert rowids(store, "flood") == sorted(rowids(store, "flood"))


def test_a_runs_own_writes_keep_their_order_behind_its_flood(store: Store) -> None:
    """A run's small batch queued behind its own big one, and any run's write behind a job that
    names no run, keep their places: nothing is refused as a gap, nothing passes an unnamed job."""
    async def go() -> None:
        await store.create_run(new_run("a", status="running"))
        await store.create_run(new_run("b", status="running"))
        blocker = Blocker(store)
        block_task = asyncio.create_task(store.write(blocker.fn))
        assert await asyncio.to_thread(blocker.entered.wait, 60)
        big = asyncio.create_task(store.append_events("a", "local", [ev(s) for s in range(1, 1001)]))
        await writes_queued(store, 1)
        small = asyncio.create_task(store.append_events("a", "local", [ev(1001)]))
        await writes_queued(store, 2)
        # A job of no one run: it notes how many of b's events were stored before it ran.
        seen = asyncio.create_task(store.write(lambda c: len(event_rows(c, "b"))))
        await writes_queued(store, 3)
        after = asyncio.create_task(store.append_events("b", "local", [ev(1)]))
        await writes_queued(store, 4)
        blocker.release.set()
        await block_task
        assert (await big)[1] == 1000
        assert (await small)[1] == 1001
        assert await seen == 0
        assert (await after)[1] == 1
    run(go())
    assert rowids(store, "a") == sorted(rowids(store, "a"))  # inserted in the order of the run's appends
    assert [e["seq"] for e in run(store.events("a"))] == list(range(1, 1002))


def test_the_checkpointer_copies_the_wal_into_the_database(store: Store) -> None:
    """The writer's connection never checkpoints on its own (sqlite's automatic checkpoint ran inside
    whichever commit crossed its threshold); the checkpointer thread copies the rows into the
    database file once enough were written."""
    assert store._writer_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    size0 = store.path.stat().st_size

    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        n = 0
        while n < 2 * CHECKPOINT_ROWS:
            batch = [ev(s, message="x" * 100) for s in range(n + 1, n + 1001)]
            assert (await store.append_events("r", "local", batch))[1] == n + 1000
            n += 1000
    run(go())
    deadline = time.monotonic() + 60
    while store.checkpoints < 1 or store.path.stat().st_size <= size0:
        assert time.monotonic() < deadline, "the WAL was not copied into the database within 60 s"
        time.sleep(0.01)  # polling the condition above, bounded by the deadline
    assert len(store.read_sync(lambda c: event_rows(c, "r"))) == 2 * CHECKPOINT_ROWS


def test_a_database_of_the_unique_index_opens_with_its_events(tmp_path: Path) -> None:
    """Made by a cdui whose run_events had UNIQUE (run_id, src, src_seq): every event is kept in its
    order, the index is gone, a worker's final status is still found, and appends go on after it."""
    path = tmp_path / "cdui.sqlite3"
    conn = sqlite3.connect(str(path), isolation_level=None)
    for i, script in enumerate(MIGRATIONS[:7]):
        conn.execute("BEGIN IMMEDIATE")
        for stmt in script.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute(f"PRAGMA user_version={i + 1}")
        conn.execute("COMMIT")
    conn.execute("INSERT INTO runs (id, status, target, options, graph, created_at, last_seq) "
                 "VALUES ('r', 'succeeded', '\"local\"', '{}', '{}', 1.0, 3)")
    rows = [("r", 1, "worker:w", 1, "log", '{"message": "one"}', 1.0),
            ("r", 2, "cp", 1, "run_warning", '{"kind": "x"}', 2.0),
            ("r", 3, "worker:w", 2, "status", '{"status": "succeeded"}', 3.0)]
    conn.executemany("INSERT INTO run_events VALUES (?,?,?,?,?,?,?)", rows)
    conn.execute("INSERT INTO run_sources VALUES ('r', 'worker:w', 2), ('r', 'cp', 1)")
    assert any(r[0].startswith("sqlite_autoindex_run_events") for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE tbl_name='run_events'"))
    conn.close()

    store = Store(path)
    store.open()
    try:
        got = store.read_sync(lambda c: event_rows(c, "r"))
        assert got == [(seq, src, s, kind, json.loads(data), at) for _r, seq, src, s, kind, data, at in rows]
        names = store.read_sync(lambda c: [r[0] for r in c.execute(
            "SELECT name FROM sqlite_master WHERE tbl_name='run_event_chunks' AND type='index'")])
        assert names == ["sqlite_autoindex_run_event_chunks_1", "run_event_chunks_finals"]  # the key, the finals

        async def go() -> None:
            assert await store.has_final_status_from("r", "worker:w")
            assert not await store.has_final_status_from("r", "worker:v")
            # The source's next number is taken, a repeat of a stored one is not stored twice.
            stored, acked = await store.append_events("r", "worker:w", [ev(2), ev(3)])
            assert acked == 3 and [e["seq"] for e in stored] == [4]
            got = [(e["seq"], e["kind"], e["data"]) for e in await store.events("r")]
            assert got == [(1, "log", {"message": "one"}), (2, "run_warning", {"kind": "x"}),
                           (3, "status", {"status": "succeeded"}), (4, "log", {"n": 3})]
        run(go())
    finally:
        store.close()

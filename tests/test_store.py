"""The sqlite store on a real file: pragmas, migrations, event recording, the
single writer with group commit (the store invariants of docs/architecture.md)."""
from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdui.plane.store import MIGRATIONS, Run, Store
from cdui.wire.target import Local


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def new_run(run_id: str, **over: Any) -> Run:
    return replace(Run(id=run_id, name=run_id, status="queued", target=Local(), options={"target": "local"},
                       graph={"nodes": []}, created_at=time.time()), **over)


def ev(src_seq: int, kind: str = "log", **data: Any) -> dict[str, Any]:
    return {"src_seq": src_seq, "kind": kind, "data": data or {"n": src_seq}, "at": time.time()}


class Blocker:
    """A write job that holds the writer thread until released, so the jobs
    queued meanwhile are certain to land in one batch."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.entered = threading.Event()
        self.release = threading.Event()

    def fn(self, conn: sqlite3.Connection) -> None:
        self.entered.set()
        assert self.release.wait(60), "the test never released the writer"


def test_pragmas_and_migrations(store: Store, tmp_path: Path) -> None:
    """WAL on, user_version == number of migrations, foreign keys on
    (checked on a fresh connection of the store and by an actual cascade)."""
    jm = store.read_sync(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
    assert jm.lower() == "wal"
    uv = store.read_sync(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
    assert uv == len(MIGRATIONS) >= 2
    assert store.read_sync(lambda c: c.execute("PRAGMA foreign_keys").fetchone()[0]) == 1
    # The file itself says WAL to any other reader too.
    raw = sqlite3.connect(str(tmp_path / "cdui.sqlite3"))
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        raw.close()
    assert {"runs", "run_event_chunks", "run_sources", "artifacts", "uploads", "workers"} <= tables
    assert "run_events" not in tables  # migration 10 moved its rows into chunks

    async def cascade() -> tuple[int, int]:
        await store.create_run(new_run("r1"))
        await store.append_events("r1", "local", [ev(1), ev(2)])
        await store.add_artifact({"run_id": "r1", "kind": "output", "name": "x", "path": "/x"})
        await store.delete_run("r1")
        n_ev = await store.read(lambda c: c.execute("SELECT count(*) FROM run_event_chunks").fetchone()[0])
        n_art = await store.read(lambda c: c.execute("SELECT count(*) FROM artifacts").fetchone()[0])
        return n_ev, n_art
    assert run(cascade()) == (0, 0), "ON DELETE CASCADE did not apply: foreign keys are off in the writer"


def test_reopen_keeps_data_and_refuses_newer_schema(tmp_path: Path) -> None:
    """Migrations are applied once; a database from a newer cdui is refused."""
    path = tmp_path / "db.sqlite3"
    s = Store(path)
    s.open()
    run(s.create_run(new_run("keep")))
    s.close()
    s2 = Store(path)
    s2.open()
    try:
        assert run(s2.get_run("keep")).id == "keep"
        assert s2.read_sync(lambda c: c.execute("PRAGMA user_version").fetchone()[0]) == len(MIGRATIONS)
    finally:
        s2.close()
    raw = sqlite3.connect(str(path))
    raw.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    raw.commit()
    raw.close()
    with pytest.raises(RuntimeError, match="newer"):
        Store(path).open()


def test_a_database_of_the_schema_before_tags_keeps_its_runs_and_gets_tags(tmp_path: Path) -> None:
    """A database made before runs had tags and notes (schema 8) opens with its runs as they were, each
    with no tags and no note, and takes them afterwards; listing filters read them."""
    from cdui.plane.store import RunFilter, migrations
    path = tmp_path / "db.sqlite3"
    raw = sqlite3.connect(str(path))
    for i, script in enumerate(migrations.MIGRATIONS[:8]):
        for stmt in script.split(";"):
            if stmt.strip():
                raw.execute(stmt)
        raw.execute(f"PRAGMA user_version={i + 1}")
    raw.execute("INSERT INTO runs (id, name, status, target, options, graph, created_at) "
                "VALUES ('old', 'before', 'succeeded', '\"local\"', '{}', '{}', 1.0)")
    raw.commit()
    raw.close()
    s = Store(path)
    s.open()
    try:
        old = run(s.get_run("old"))
        assert (old.name, old.status, old.tags, old.note) == ("before", "succeeded", (), None)
        assert run(s.set_labels("old", ["baseline", "lr:0.1"], "50% of it", True)) is True
        assert run(s.set_labels("gone", ["x"], None, False)) is False
        run(s.create_run(new_run("new")))
        ids = lambda **f: [r.id for r in run(s.list_runs(where=RunFilter(**f)))]  # noqa: E731
        assert ids(tag="baseline") == ["old"] and ids(tag="lr") == []
        assert ids(search="50%") == ["old"] and ids(search="5_%") == [] and ids(search="lr:0.1") == ["old"]
        assert ids() == ["new", "old"] and ids(after="new") == ["old"] and ids(after="old") == []
        assert run(s.get_run("old")).tags == ("baseline", "lr:0.1")
    finally:
        s.close()


def test_append_events_idempotent_and_gapless(store: Store) -> None:
    """(run, src, src_seq) stored once; replays are no-ops; seq is
    gapless from 1 across sources; the returned ack is the highest contiguous src_seq."""
    async def go() -> None:
        await store.create_run(new_run("r"))
        stored, acked = await store.append_events("r", "local", [ev(1), ev(2), ev(3)])
        assert [e["seq"] for e in stored] == [1, 2, 3] and acked == 3
        # Exactly the same batch again: nothing new, same ack.
        stored, acked = await store.append_events("r", "local", [ev(1), ev(2), ev(3)])
        assert stored == [] and acked == 3
        # Overlapping replay: only the new one lands.
        stored, acked = await store.append_events("r", "local", [ev(2), ev(3), ev(4)])
        assert [e["seq"] for e in stored] == [4] and acked == 4
        # Another source has its own src_seq but shares the run's seq.
        stored, acked = await store.append_events("r", "cp", [ev(1, "status", status="queued")])
        assert [e["seq"] for e in stored] == [5] and acked == 1
        stored, _ = await store.append_events("r", "local", [ev(5)])
        assert [e["seq"] for e in stored] == [6]
        evs = await store.events("r")
        assert [e["seq"] for e in evs] == list(range(1, 7))
        assert await store.source_acked("r", "local") == 5
        assert (await store.get_run("r")).last_seq == 6
        assert [e["seq"] for e in await store.events("r", after=4)] == [5, 6]
    run(go())


def test_append_events_refuses_gaps(store: Store) -> None:
    """An event is accepted only as the next src_seq of its source;
    after a gap the rest of the batch is refused until the sender replays."""
    async def go() -> None:
        await store.create_run(new_run("g"))
        stored, acked = await store.append_events("g", "w1", [ev(1), ev(2), ev(4), ev(5)])
        assert [e["seq"] for e in stored] == [1, 2] and acked == 2
        stored, acked = await store.append_events("g", "w1", [ev(4)])
        assert stored == [] and acked == 2
        # Unordered input is sorted by src_seq before checking.
        stored, acked = await store.append_events("g", "w1", [ev(5), ev(3), ev(4)])
        assert [e["data"]["n"] for e in stored] == [3, 4, 5] and acked == 5
        assert [e["seq"] for e in await store.events("g")] == [1, 2, 3, 4, 5]
        with pytest.raises(KeyError):
            await store.append_events("nope", "w1", [ev(1)])
    run(go())


async def writes_queued(store: Store, n: int, timeout: float = 60) -> None:
    """Wait until ``n`` write jobs wait in the writer's queue (behind a blocker)."""
    deadline = time.monotonic() + timeout
    while store._q.qsize() < n:  # the queue's depth is the condition; no public view of it exists
        assert time.monotonic() < deadline, f"only {store._q.qsize()} of {n} writes were queued after {timeout} s"
        await asyncio.sleep(0.005)  # polling the condition above, bounded by the deadline


def test_concurrent_writes_all_land_in_group_commits(store: Store) -> None:
    """Many concurrent writes from asyncio tasks all land, and the
    single writer commits jobs queued together in one transaction."""
    n = 400

    async def go() -> None:
        await store.create_run(new_run("c"))
        blocker = Blocker(store)
        block_task = asyncio.create_task(store.write(blocker.fn))
        assert await asyncio.to_thread(blocker.entered.wait, 60)
        before = store.commits

        async def one(i: int) -> None:
            await store.create_run(new_run(f"run-{i:04d}"))
            await store.append_events("c", f"src{i}", [ev(1, i=i)])
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        await writes_queued(store, n)  # every task's first write waits behind the blocker
        blocker.release.set()
        await asyncio.gather(block_task, *tasks)
        commits = store.commits - before
        runs = await store.list_runs(limit=10000)
        assert len(runs) == n + 1
        evs = await store.events("c")
        assert [e["seq"] for e in evs] == list(range(1, n + 1))
        assert sorted(e["data"]["i"] for e in evs) == list(range(n))
        # 2n write jobs: the first n were queued together behind the blocker.
        assert commits < n, f"{2 * n} jobs took {commits} commits: no group commit"
    run(go())


def test_failing_job_rolls_back_only_itself(store: Store) -> None:
    """A failing write job in a batch is rolled back alone; the
    others in the same transaction commit, and the caller gets its exception."""
    async def go() -> None:
        blocker = Blocker(store)
        block_task = asyncio.create_task(store.write(blocker.fn))
        assert await asyncio.to_thread(blocker.entered.wait, 60)

        def good(rid: str):
            def fn(c: sqlite3.Connection) -> str:
                c.execute("INSERT INTO uploads (folder, name, sha256, size, created_at) VALUES ('files', ?, 'x', 1, 0)",
                          (rid,))
                return rid
            return fn

        def bad(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO uploads (folder, name, sha256, size, created_at) VALUES ('files', 'b', 'x', 1, 0)")
            raise ValueError("this job fails after writing")

        a = asyncio.create_task(store.write(good("a")))
        b = asyncio.create_task(store.write(bad))
        c = asyncio.create_task(store.write(good("c")))
        await writes_queued(store, 3)
        before = store.commits
        blocker.release.set()
        await block_task
        assert await a == "a"
        with pytest.raises(ValueError, match="fails after writing"):
            await b
        assert await c == "c"
        names = await store.read(lambda conn: [r[0] for r in conn.execute("SELECT name FROM uploads ORDER BY name")])
        assert names == ["a", "c"]
        assert store.commits - before <= 2
        # A constraint violation is a failing job too; the store keeps working.
        with pytest.raises(sqlite3.IntegrityError):
            await store.create_run(new_run("dup"))
            await store.create_run(new_run("dup"))
        await store.create_run(new_run("after"))
        assert (await store.get_run("after")).status == "queued"
    run(go())


def test_events_born_here_never_collide(store: Store) -> None:
    """Control-plane events recorded at the same moment for one run each get their own src_seq
    (assigned inside the writer's transaction), so none is mistaken for a replay and dropped."""
    async def go() -> list[dict[str, Any]]:
        await store.create_run(new_run("r1"))
        results = await asyncio.gather(*(store.append_events("r1", "cp", [{"kind": "log", "data": {"i": i}}],
                                                             assign=True) for i in range(20)))
        assert all(len(stored) == 1 for stored, _ in results)
        return await store.events("r1")
    evs = run(go())
    assert [e["seq"] for e in evs] == list(range(1, 21))
    assert sorted(e["data"]["i"] for e in evs) == list(range(20))


def test_a_database_that_refuses_writes_is_a_problem_until_a_write_succeeds(tmp_path: Path) -> None:
    """Commits failing for another reason than a full disk (here sqlite's own read-only mode on the writer's
    connection, as a file system remounted read-only does) make health report database_not_writable, and
    the first write that succeeds again clears it."""
    s = Store(tmp_path / "db.sqlite3")
    s.open()
    try:
        run(s.create_run(new_run("before")))
        assert s.problems() == []
        s._writer_conn.execute("PRAGMA query_only=1")  # the writer thread waits for a job meanwhile
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            run(s.create_run(new_run("refused")))
        (problem,) = s.problems()
        assert problem["code"] == "database_not_writable", problem
        assert "refuses writes (attempt to write a readonly database)" in problem["message"], problem
        assert str(s.path) in problem["hint"]
        s._writer_conn.execute("PRAGMA query_only=0")
        run(s.create_run(new_run("after")))
        assert s.problems() == []
        assert run(s.get_run("refused")) is None and run(s.get_run("after")) is not None
    finally:
        s.close()


def test_a_run_s_own_events_come_back_as_columns_read_as_the_dicts_append_events_gives(store: Store) -> None:
    """append_status_events hands the stored events back as columns (StoredEvents): read, they are the
    dicts append_events gives for the same events (a missing data, a null or zero time, an int time and
    a final status as stored), made once; its endings are the final statuses' places and whether each
    ended the run."""
    odd = [{"src_seq": 1, "kind": "status", "data": {"status": "running"}, "at": 1_700_000_000.5},
           {"src_seq": 2, "kind": "log", "at": None},
           {"src_seq": 3, "kind": "log", "data": None, "at": 0.0},
           {"src_seq": 4, "kind": "metric", "data": {"v": 1.5}, "at": 1_700_000_001},
           {"src_seq": 5, "kind": "status", "data": {"status": "succeeded", "error": None}, "at": 1_700_000_002.0},
           {"src_seq": 6, "kind": "status", "data": {"status": "failed", "error": "late"}, "at": 1_700_000_003.0}]

    async def go() -> None:
        await store.create_run(new_run("cols", status="queued"))
        await store.create_run(new_run("dicts", status="queued"))
        before = time.time()
        stored, acked, endings = await store.append_status_events("cols", "local", [dict(e) for e in odd], 123.0)
        plain, plain_acked = await store.append_events("dicts", "local", [dict(e) for e in odd])
        assert (acked, plain_acked, len(stored)) == (6, 6, 6)
        got = list(stored)
        assert got is not plain and stored[0] is got[0] and list(stored) == got  # made once, read again as such
        for a, b in zip(got, plain, strict=True):
            assert a.keys() == b.keys() == {"seq", "kind", "data", "at"}
            if a["seq"] in (2, 3):  # no data and no time: {} and the time they were stored
                assert a["data"] == b["data"] == {} and a["at"] >= before and b["at"] >= before
            else:
                assert a == b
        assert [e["seq"] for e in got] == [1, 2, 3, 4, 5, 6]
        assert type(got[3]["at"]) is float and got[3]["at"] == 1_700_000_001.0
        assert endings == [(4, True), (5, False)]  # the first ending stored wins
        row = await store.get_run("cols")
        assert row is not None and (row.status, row.error, row.last_seq) == ("succeeded", None, 6)
        assert await store.events("cols") == got  # what was stored reads back as what came back
    run(go())

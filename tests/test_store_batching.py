"""The event writer's batching on a real sqlite file: how much one transaction takes, and
that an event batch is acknowledged only once the transaction holding it has committed."""
from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from cdui.plane.store import BATCH_EVENTS, Store
from cdui.plane.store.event_chunks import event_rows
from test_store import Blocker, ev, new_run, run, writes_queued


def committed_rows(path: Path, run_id: str) -> int:
    """What another connection sees: only committed events."""
    conn = sqlite3.connect(str(path))
    try:
        return len(event_rows(conn, run_id))
    finally:
        conn.close()


def test_a_transaction_stops_taking_event_batches_at_its_event_bound(store: Store) -> None:
    """Four floods of 3/4 of the bound each, queued together, take two transactions of two batches;
    a small write queued behind them gets the third. One transaction of all of them would hold every
    other run's events, and every acknowledgement, until the whole flood was written."""
    per = BATCH_EVENTS * 3 // 4

    async def go() -> None:
        for i in range(4):
            await store.create_run(new_run(f"flood{i}", status="running"))
        await store.create_run(new_run("quiet", status="running"))
        blocker = Blocker(store)
        block_task = asyncio.create_task(store.write(blocker.fn))
        assert await asyncio.to_thread(blocker.entered.wait, 60)
        floods = [asyncio.create_task(store.append_events(f"flood{i}", "local", [ev(s) for s in range(1, per + 1)]))
                  for i in range(4)]
        await writes_queued(store, 4)
        quiet = asyncio.create_task(store.append_events("quiet", "local", [ev(1)]))
        await writes_queued(store, 5)
        before = store.commits
        blocker.release.set()
        await block_task
        acks = [(await f)[1] for f in floods]
        assert acks == [per] * 4
        assert (await quiet)[1] == 1
        assert store.commits - before == 1 + 3  # the blocker's own, then [f0 f1], [f2 f3], [quiet]
    run(go())


def test_events_are_acknowledged_only_after_their_transaction_commits(store: Store) -> None:
    """The batch's write ran, but a later job of the same transaction still holds it open: the caller
    has no acknowledgement yet and another connection sees none of the rows; once it commits, both."""
    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        first, second = Blocker(store), Blocker(store)
        t1 = asyncio.create_task(store.write(first.fn))
        assert await asyncio.to_thread(first.entered.wait, 60)
        append = asyncio.create_task(store.append_events("r", "worker:w", [ev(s) for s in range(1, 101)]))
        await writes_queued(store, 1)
        t2 = asyncio.create_task(store.write(second.fn))
        await writes_queued(store, 2)
        first.release.set()
        assert await asyncio.to_thread(second.entered.wait, 60)  # the events' job ran before it, same transaction
        await t1
        await asyncio.to_thread(lambda: None)  # a thread round trip: a result sent early would have arrived
        assert not append.done(), "acknowledged before the commit"
        assert await asyncio.to_thread(committed_rows, store.path, "r") == 0
        second.release.set()
        stored, acked = await append
        await t2
        assert acked == 100 and [e["seq"] for e in stored] == list(range(1, 101))
        assert await asyncio.to_thread(committed_rows, store.path, "r") == 100
    run(go())

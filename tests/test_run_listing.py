"""GET /api/runs's body (cdui/plane/runs.py: EncodedRows): each run's encoded form is reused only while
its row as read, its queue reason and (for a disconnected run) the time leave it the same; the rows
come from a real store (cdui/plane/store/database.py: ListedRow), as the listing reads them."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from cdui.plane.runs import EncodedRows, api_form
from cdui.plane.store import ListedRow, Run, RunFilter, Store
from cdui.wire.target import AnyWorker, Worker


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def fill(store: Store) -> None:
    """A queued run, a succeeded one with facts and a disconnected one, oldest last."""
    async def go() -> None:
        await store.create_run(Run(id="q1", status="queued", target=AnyWorker(), name="queued run",
                                   options={"target": "any", "device": "cpu"}, created_at=100.0, graph={"nodes": []},
                                   queue_reason="waiting for the scheduler"))
        await store.create_run(Run(id="s1", status="queued", target=Worker("w1"), options={"target": "w1", "note": "é"},
                                   created_at=90.0, graph={"nodes": []}))
        await store.create_run(Run(id="d1", status="queued", target=Worker("w2"), options={"target": "w2"},
                                   created_at=80.0, graph={"nodes": []}))
        await store.claim_queued_graph("s1", "w1", "cpu", 91.0, lambda facts: {**facts, "python": "3.11"})
        await store.finish_run("s1", "succeeded", None, 92.5, "cp", None)
        await store.claim_queued_graph("d1", "w2", "cuda:0", 81.0)
        await store.mark_disconnected("d1", 85.0)
    run(go())


def expected(rows: list[ListedRow], reasons: dict[str, str | None], now: float) -> bytes:
    return json.dumps([api_form(r.run(), reasons.get(r.id), now) for r in rows]).encode()


def test_the_listing_is_byte_for_byte_what_encoding_the_whole_list_gives(store: Store) -> None:
    fill(store)
    rows = EncodedRows()
    listed_rows = store.list_rows_sync()
    assert [r.id for r in listed_rows] == ["q1", "s1", "d1"]
    assert [r.run() for r in listed_rows] == store.list_runs_sync()
    reasons = {"q1": "waiting for a free cpu slot: slots in use on 2 (w1, w2)"}
    body = rows.encode(listed_rows, reasons, 200.0)
    assert body == expected(listed_rows, reasons, 200.0)
    listed = json.loads(body)
    assert [r["queue_reason"] for r in listed] == [reasons["q1"], None, None]
    assert [r["status"] for r in listed] == ["queued", "succeeded", "disconnected"]
    assert listed[1]["execution_facts"] == {"python": "3.11"} and listed[1]["options"]["note"] == "é"
    assert listed[2]["worker_status"]["disconnected_s"] == 115.0
    # Read again (new, equal rows), later: the disconnected run's time moved on, the rest are reused.
    kept = dict(rows._kept)
    again = store.list_rows_sync()
    assert again == listed_rows and again[0] is not listed_rows[0]
    assert rows.encode(again, reasons, 230.0) == expected(again, reasons, 230.0)
    assert set(kept) == {"q1", "s1"} and all(rows._kept[k][2] is kept[k][2] for k in kept)


def test_a_changed_row_or_reason_is_encoded_again(store: Store) -> None:
    fill(store)
    rows = EncodedRows()
    rows.encode(store.list_rows_sync(), {"q1": "first reason"}, 200.0)
    run(store.claim_queued_graph("q1", "w3", "cpu", 201.0))
    changed = store.list_rows_sync()
    body = rows.encode(changed, {}, 202.0)
    assert body == expected(changed, {}, 202.0)
    assert json.loads(body)[0]["status"] == "running" and json.loads(body)[0]["worker_id"] == "w3"
    run(store.requeue("q1", "waiting for the scheduler"))
    back = store.list_rows_sync()
    assert rows.encode(back, {"q1": "second reason"}, 203.0) == expected(back, {"q1": "second reason"}, 203.0)
    assert json.loads(rows.encode(back, {}, 203.0))[0]["queue_reason"] == "waiting for the scheduler"


def test_it_keeps_at_most_its_bound_and_lists_nothing_as_an_empty_array(store: Store) -> None:
    async def many() -> None:
        for i in range(5):
            await store.create_run(Run(id=f"r{i}", status="queued", target=AnyWorker(), options={}, created_at=i))
    run(many())
    rows = EncodedRows(keep=2)
    listed = store.list_rows_sync()
    assert rows.encode(listed, {}, 1.0) == expected(listed, {}, 1.0)
    assert list(rows._kept) == ["r1", "r0"]
    assert rows.encode([], {}, 1.0) == b"[]" == json.dumps([]).encode()


def test_the_one_step_listing_reads_exactly_what_reading_row_by_row_does(store: Store) -> None:
    """The listing is read in one sqlite step (a JSON array of the rows), not a step per row, which under
    a backlog waited for the GIL at every row. What it reads must be what a row-by-row read gives: every
    float to its last bit (sqlite's JSON would write 15 digits), text in any script, nulls, the order of
    runs created at the same time, and every filter."""
    times = [1764780000.1234567, 5e-324, 1.3609679781160653e+303, 1764780000.0, 1764780000.0, 0.1]

    async def go() -> None:
        for i, t in enumerate(times):
            await store.create_run(Run(id=f"r{i}", status="queued", target=AnyWorker(), name=f"run {i} ✓ \"q\" \\",
                                       options={"target": "any", "i": i, "big": 2 ** 62}, created_at=t,
                                       graph={"nodes": ["x" * 1000]}, queue_reason=None if i % 2 else "wait\n"))
        await store.claim_queued_graph("r1", "w1", "cpu", 1764780001.0000002, lambda facts: {**facts, "é": 1})
        await store.finish_run("r1", "failed", "bad ✗ thing", 1764780002.9999999, "cp", None)
        await store.claim_queued_graph("r2", "w2", "cuda:0", 2.5)
        await store.mark_disconnected("r2", 3.25)
        await store.set_labels("r3", ["a-b", "c:d"], "a note ✓", True)
    run(go())
    filters = [None, RunFilter(status="queued"), RunFilter(search="✓"), RunFilter(tag="c:d"),
               RunFilter(after="r3"), RunFilter(worker="w2"), RunFilter(status="running")]
    for f in filters:
        store._one_step = True
        one = store.list_rows_sync(where=f)
        store._one_step = False
        each = store.list_rows_sync(where=f)
        assert [r.values for r in one] == [r.values for r in each], f
        assert [tuple(map(type, r.values)) for r in one] == [tuple(map(type, r.values)) for r in each], f
    store._one_step = None
    assert [r.id for r in store.list_rows_sync()] == ["r2", "r0", "r4", "r3", "r5", "r1"]
    from cdui.plane.store import database
    assert [database._NO_GRAPH_COLUMNS[i] for i in (*database._REAL_AT, database._CREATED_AT)] == [
        "disconnected_at", "adopted_at", "created_at", "started_at", "finished_at", "created_at"]
    assert store._one_step is True  # this sqlite writes every probe real back exactly

"""A run's lifecycle writes on a real store file: what one writer round trip makes, and the order in
which the writer's answers reach the event loop.

A run's usual message from its executor (running, then its ending) is stored with the run row's
changes in one transaction; a claim makes the executor's change of the run's facts with it; and the
callers of a transaction of many jobs are woken a bounded number at a time, in the jobs' order, with
the sockets that became ready meanwhile served in between (as a worker session lets them be served
after a burst of one agent's messages).
"""
from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from dataclasses import replace
from typing import Any

from cdui.plane.store import Run, Store
from cdui.plane.store.database import RESOLVE_PER_TURN
from cdui.plane.worker_session import behind_ready_sockets
from cdui.wire.target import Local


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def new_run(run_id: str, **over: Any) -> Run:
    return replace(Run(id=run_id, name=run_id, status="queued", target=Local(), options={"target": "local"},
                       graph={"nodes": [{"id": "n1"}]}, created_at=time.time()), **over)


def status(src_seq: int, value: str, **more: Any) -> dict[str, Any]:
    return {"src_seq": src_seq, "kind": "status", "data": {"status": value, **more}, "at": 1000.0 + src_seq}


def row(store: Store, run_id: str) -> dict[str, Any]:
    return dict(store.read_sync(lambda c: c.execute("SELECT status, error, finished_at, queue_reason, last_seq "
                                                    "FROM runs WHERE id=?", (run_id,)).fetchone()))


def test_a_runs_message_is_stored_with_its_statuses_changes_of_the_row_in_one_transaction(store: Store) -> None:
    async def go() -> None:
        await store.create_run(new_run("r1", queue_reason="waiting for the scheduler"))
        assert await store.claim_queued_graph("r1", "w1", "cpu", 5.0) == {"nodes": [{"id": "n1"}]}
        before = store.commits
        events = [status(1, "running", pid=1), {"src_seq": 2, "kind": "log", "data": {"message": "hi"}, "at": 2.0},
                  status(3, "succeeded", error=None)]
        stored, acked, endings = await store.append_status_events("r1", "worker:w1", events, at=7.5)
        assert store.commits - before == 1
        # The endings: each final status's place among the stored events, and whether it ended the run.
        assert acked == 3 and [e["seq"] for e in stored] == [1, 2, 3] and endings == [(2, True)]
        assert row(store, "r1") == {"status": "succeeded", "error": None, "finished_at": 7.5, "queue_reason": None,
                                    "last_seq": 3}
        # A replay stores nothing and changes nothing; a later ending does not replace the first one.
        stored, acked, endings = await store.append_status_events("r1", "worker:w1", events, at=9.0)
        assert (list(stored), acked, endings) == ([], 3, [])
        stored, acked, endings = await store.append_status_events("r1", "worker:w1", [status(4, "failed", error="x")],
                                                                  at=9.0)
        assert acked == 4 and [e["data"]["status"] for e in stored] == ["failed"] and endings == [(0, False)]
        assert row(store, "r1")["status"] == "succeeded" and row(store, "r1")["finished_at"] == 7.5
    run(go())


def test_a_status_that_is_not_text_is_stored_and_changes_nothing(store: Store) -> None:
    async def go() -> None:
        await store.create_run(new_run("r2"))
        await store.claim_queued_graph("r2", "w1", "cpu", 5.0)
        stored, acked, endings = await store.append_status_events(
            "r2", "worker:w1", [{"src_seq": 1, "kind": "status", "data": {"status": ["succeeded"]}, "at": 1.0}], at=2.0)
        assert acked == 1 and len(stored) == 1 and endings == []
        assert row(store, "r2")["status"] == "running" and row(store, "r2")["finished_at"] is None
    run(go())


def test_a_claim_makes_the_facts_change_with_it_and_a_refused_claim_makes_none(store: Store) -> None:
    async def go() -> None:
        await store.create_run(new_run("r3"))
        await store.set_execution_facts("r3", {"bucket": "b"})
        graph = await store.claim_queued_graph("r3", "w1", "cpu", 5.0, lambda f: {**f, "fingerprint": "fp"})
        assert graph == {"nodes": [{"id": "n1"}]}
        got = await store.get_run("r3")
        assert got is not None and got.status == "running" and got.worker_id == "w1"
        assert got.execution_facts == {"bucket": "b", "fingerprint": "fp"}

        await store.create_run(new_run("r4"))
        await store.request_stop("r4")
        assert await store.claim_queued_graph("r4", "w1", "cpu", 5.0, lambda f: {**f, "fingerprint": "fp"}) is None
        got = await store.get_run("r4")
        assert got is not None and got.status == "queued" and got.execution_facts == {}
    run(go())


def test_the_callers_of_a_big_transaction_are_woken_in_order_with_a_ready_socket_served_in_between(
        store: Store) -> None:
    """500 jobs committed together: their callers go on in the jobs' order, and a socket that is ready
    once the first of them has gone on is served before more than two turns' worth of them have."""
    n = 500

    async def go() -> None:
        loop = asyncio.get_running_loop()
        entered, release = threading.Event(), threading.Event()

        def blocker(c: sqlite3.Connection) -> None:
            entered.set()
            release.wait(60)
        block_task = asyncio.create_task(store.write(blocker))
        assert await asyncio.to_thread(entered.wait, 60)
        a, b = socket.socketpair()
        b.send(b"x")  # a is readable from now on
        went_on: list[int] = []
        served_after: list[int] = []

        def served() -> None:
            loop.remove_reader(a.fileno())
            served_after.append(len(went_on))

        async def job(i: int) -> None:
            await store.write(lambda c: i)
            if not went_on:
                loop.add_reader(a.fileno(), served)  # the socket is watched from the first caller's turn on
            went_on.append(i)
        tasks = [asyncio.create_task(job(i)) for i in range(n)]
        deadline = time.monotonic() + 60
        while store._q.qsize() < n:  # every job waits behind the blocker (the queue's depth is the condition)
            assert time.monotonic() < deadline, f"only {store._q.qsize()} of {n} writes were queued after 60 s"
            await asyncio.sleep(0.005)  # polling the condition above, bounded by the deadline
        release.set()
        await asyncio.gather(block_task, *tasks)
        a.close()
        b.close()
        assert went_on == list(range(n))
        assert len(served_after) == 1 and 1 <= served_after[0] <= 2 * RESOLVE_PER_TURN < n, served_after
    run(go())


def test_a_session_that_gives_way_goes_on_after_the_sockets_that_were_ready() -> None:
    """What a worker session does after a burst of one agent's messages (cdui/plane/worker_session.py):
    it goes on only after the loop has served a socket that was ready, where ``asyncio.sleep(0)`` goes
    on before it."""
    async def go() -> list[str]:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        b.send(b"x")
        seen: list[str] = []

        def served() -> None:
            loop.remove_reader(a.fileno())
            seen.append("socket")
        try:
            loop.add_reader(a.fileno(), served)
            await asyncio.sleep(0)
            seen.append("sleep(0)")
            loop.add_reader(a.fileno(), served)
            await behind_ready_sockets()
            seen.append("gave way")
        finally:
            a.close()
            b.close()
        return seen
    assert run(go()) == ["sleep(0)", "socket", "gave way"]

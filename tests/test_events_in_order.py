"""A worker connection's events messages are handled one after another, in the order read, by a task that
exists only while some wait (cdui/plane/worker_session.py's InOrder): an idle connection holds none, and
reading waits while EVENTS_AHEAD messages wait their turn."""
from __future__ import annotations

import asyncio

from cdui.plane.worker_session import EVENTS_AHEAD, InOrder
from cdui.wire import protocol


def events(n: int) -> protocol.Events:
    return protocol.Events(f"run-{n}", [])


def test_messages_are_handled_in_order_one_at_a_time_and_no_task_is_left() -> None:
    async def main() -> None:
        handled: list[str] = []
        busy = 0
        gates = {i: asyncio.Event() for i in range(10)}

        async def handle(m: protocol.Events) -> None:
            nonlocal busy
            busy += 1
            assert busy == 1, "two messages of one connection handled at once"
            await gates[int(m.run_id.split("-")[1])].wait()
            handled.append(m.run_id)
            busy -= 1

        inbox = InOrder(handle)
        assert inbox.task is None  # nothing read yet: no task
        for i in range(EVENTS_AHEAD + 1):  # one being handled, EVENTS_AHEAD waiting
            await inbox.put(events(i))
        assert len(inbox.waiting) == EVENTS_AHEAD
        blocked = asyncio.create_task(inbox.put(events(EVENTS_AHEAD + 1)))
        await asyncio.sleep(0.01)
        assert not blocked.done(), "a put went on while EVENTS_AHEAD messages waited"
        gates[0].set()
        await asyncio.wait_for(blocked, 10)  # the first was handled: room for one more
        for g in gates.values():
            g.set()
        await asyncio.wait_for(inbox.drained(), 10)
        assert handled == [f"run-{i}" for i in range(EVENTS_AHEAD + 2)]
        assert inbox.task is None and inbox.waiting == []
        # The next message after a quiet spell starts a task of its own, and is handled as well.
        await inbox.put(events(9))
        assert inbox.task is not None
        await asyncio.wait_for(inbox.drained(), 10)
        assert handled[-1] == "run-9" and inbox.task is None

    asyncio.run(main())


def test_cancel_stops_the_handling() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def handle(m: protocol.Events) -> None:
            started.set()
            await asyncio.Event().wait()

        inbox = InOrder(handle)
        await inbox.put(events(0))
        task = inbox.task
        assert task is not None
        await asyncio.wait_for(started.wait(), 10)
        inbox.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() and inbox.task is None

    asyncio.run(main())

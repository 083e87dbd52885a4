"""A watcher's queue (cdui/plane/subscription.py): bounded, and its waiter wakes one event-loop turn
after an event is queued (the live stream's latency under load is counted in such turns)."""
from __future__ import annotations

import asyncio

from cdui.plane.subscription import Subscription


def test_the_waiter_wakes_in_the_turn_after_the_event_is_queued() -> None:
    async def main() -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        q, other = Subscription(), loop.create_future()
        turns = 0
        woke: list[tuple[str, int]] = []

        async def watcher() -> None:
            woke.append((await q.wait_ready(other, 60), turns))

        def tick() -> None:
            nonlocal turns
            turns += 1
            if turns < 10:
                loop.call_soon(tick)

        task = asyncio.create_task(watcher())
        await asyncio.sleep(0)  # it is waiting now
        q.put_nowait({"seq": 1})
        loop.call_soon(tick)  # counts the turns that pass before the watcher runs
        await task
        return woke[0]

    # With a task of get() and asyncio.wait the watcher ran two turns later.
    assert asyncio.run(main()) == ("ready", 0)


def test_it_says_why_it_woke() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        q, other = Subscription(), loop.create_future()
        out = [await q.wait_ready(other, 0.01)]  # nothing came
        q.put_nowait({"seq": 1})
        out.append(await q.wait_ready(other, 60))  # already queued: at once
        q.get_nowait()
        waiting = asyncio.create_task(q.wait_ready(other, 60))
        await asyncio.sleep(0)
        other.set_result(None)  # the connection closed
        out.append(await waiting)
        out.append(await q.wait_ready(other, 60))  # already closed: at once
        assert q._wake is None and not other._callbacks  # nothing is left behind
        return out

    assert asyncio.run(main()) == ["timeout", "ready", "other", "other"]


def test_a_full_queue_drops_and_still_wakes_the_waiter() -> None:
    async def main() -> tuple[str, bool, int, int]:
        loop = asyncio.get_running_loop()
        q, other = Subscription(maxsize=1), loop.create_future()
        q.put_nowait({"seq": 1})
        q.put_nowait({"seq": 2})  # over the bound: dropped, and the stream reads the store instead
        woke = await q.wait_ready(other, 60)
        return woke, q.overflowed, q.dropped, q.qsize()

    assert asyncio.run(main()) == ("ready", True, 1, 1)

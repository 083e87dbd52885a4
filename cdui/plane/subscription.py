"""A live watcher's queue of one run's events (``/ws/runs/{id}``).

Events are broadcast to every watcher as they are stored. A watcher that
reads slower than a run logs (a slow network, a paused browser tab) must not
make the control plane hold an unbounded backlog for it, so the queue is
bounded: when it is full, further events are dropped for that watcher and
``overflowed`` is set. Nothing is lost for the watcher: every broadcast event
is already committed, so the stream reads what it missed from the store
(cdui/plane/http/api_runs.py ``stream``), in order, exactly once.
"""
from __future__ import annotations

import asyncio
from typing import Any

MAX_QUEUED = 10_000  # events held for one watcher before it reads the rest from the store


class Subscription(asyncio.Queue[dict[str, Any]]):
    def __init__(self, maxsize: int | None = None) -> None:
        super().__init__(MAX_QUEUED if maxsize is None else maxsize)
        self.overflowed = False  # set when an event was dropped; the reader clears it after catching up
        self.dropped = 0  # events dropped over the subscription's life (for tests and diagnostics)
        self._wake: asyncio.Future[str] | None = None  # the waiter of wait_ready, if one waits

    def put_nowait(self, item: dict[str, Any]) -> None:
        if self.full():
            self.overflowed = True
            self.dropped += 1
        else:
            super().put_nowait(item)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result("ready")

    async def wait_ready(self, other: asyncio.Future[Any], timeout: float) -> str:
        """Until an event is queued ("ready"), ``other`` ends ("other", the watcher's connection
        closing) or ``timeout`` seconds pass ("timeout"); at once if one already holds.

        The caller wakes one turn of the event loop after the event is queued. Waiting on a task of
        ``get()`` with ``asyncio.wait`` took three (the task's step, its done callback, the caller's
        wakeup), each behind whatever that turn ran: under a flood of another run's events, most of
        the time a watcher's event took from being stored to being sent."""
        if not self.empty():
            return "ready"
        if other.done():
            return "other"
        wake: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def fire(result: str) -> None:
            if not wake.done():
                wake.set_result(result)

        def ended(_f: asyncio.Future[Any]) -> None:
            fire("other")

        self._wake = wake
        timer = wake.get_loop().call_later(timeout, fire, "timeout")
        other.add_done_callback(ended)
        try:
            return await wake
        finally:
            timer.cancel()
            other.remove_done_callback(ended)
            self._wake = None

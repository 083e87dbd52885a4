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

    def put_nowait(self, item: dict[str, Any]) -> None:
        if self.full():
            self.overflowed = True
            self.dropped += 1
            return
        super().put_nowait(item)

"""Time as a parameter.

Everything with a grace period, a heartbeat, a deadline, a backoff or an
expiry takes its time from a :class:`Clock`, so tests step time instead of
sleeping. Two readings, never mixed:

- ``monotonic()`` for liveness and deadlines (never jumps with NTP or DST);
- ``time()`` for what is shown or stored (Unix seconds, wall time).

:class:`SystemClock` is the real one. :class:`FakeClock` moves only when a
test calls :meth:`FakeClock.advance`, which wakes, in deadline order, every
sleeper that falls due and lets each run before moving on.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time as _time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock for tests: time stands still until :meth:`advance`."""

    def __init__(self, start_wall: float = 1_800_000_000.0) -> None:
        self._mono = 0.0
        self._wall0 = start_wall
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self._wall0 + self._mono

    def monotonic(self) -> float:
        return self._mono

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking due sleepers in order."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        target = self._mono + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, fut = heapq.heappop(self._sleepers)
            self._mono = max(self._mono, due)
            if not fut.done():
                fut.set_result(None)
                await _settle()
        self._mono = target
        await _settle()

    async def wait_for_sleepers(self, n: int = 1, timeout: float = 30.0) -> None:
        """Wait (in real time) until at least ``n`` sleeps are pending."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.sleepers < n:
            if loop.time() > deadline:
                raise TimeoutError(f"expected {n} pending sleep(s), have {self.sleepers}")
            await asyncio.sleep(0.005)


async def wait_event(clock: Clock, event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set or ``seconds`` passed on ``clock``; whether it was set.

    The timeout is a sleep on the clock (not ``asyncio.wait_for``'s real time), so a test
    that steps a :class:`FakeClock` past it ends the wait."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (waiter, timer):
            if not t.done():
                t.cancel()
        # Cancelled here, they must not outlive the wait (nor be reported as never retrieved).
        await asyncio.gather(waiter, timer, return_exceptions=True)
    return event.is_set()


async def _settle() -> None:
    """Let woken tasks run until they block again (a few loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)

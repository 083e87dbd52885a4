"""How late the control plane's event loop runs: the figure ``/api/health`` reports as ``loop_lag_ms``.

Every request, WebSocket message and dispatch pass shares one event loop, so
anything that holds it (a long pass, a big JSON answer, a blocking call) delays
all of them by the same amount. A small task measures that directly: it asks
to wake every ``interval`` seconds and records how much later than asked it
woke. The last ``window`` seconds of those delays are kept; :meth:`LoopLag.p99`
is what health reports (a figure, never a decision: nothing is refused on it).

The clock is a parameter (a test steps a fake one); a sample is the time the
clock says passed beyond the interval asked for, never below 0.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib

from cdui.core.clock import Clock

INTERVAL_S = 0.05  # 20 wake-ups a second: the cost is nothing next to what it measures
WINDOW_S = 10.0


class LoopLag:
    def __init__(self, clock: Clock, interval: float = INTERVAL_S, window: float = WINDOW_S) -> None:
        self.clock = clock
        self.interval = interval
        self.samples: collections.deque[float] = collections.deque(maxlen=max(1, round(window / interval)))
        self._task: asyncio.Task[None] | None = None

    def record(self, late_s: float) -> None:
        self.samples.append(max(0.0, late_s) * 1000)

    def p99(self) -> float:
        """The 99th percentile of the kept delays, in ms (0.0 before the first sample)."""
        return self.percentile(99)

    def max_ms(self) -> float:
        """The longest of the kept delays, in ms (0.0 before the first sample): one stall of the loop (a
        full pass of the garbage collector) is a single sample, which the p99 of 200 does not show."""
        return round(max(self.samples), 3) if self.samples else 0.0

    def percentile(self, q: float) -> float:
        if not self.samples:
            return 0.0
        s = sorted(self.samples)
        return round(s[min(len(s) - 1, int(q / 100 * len(s)))], 3)

    def snapshot(self) -> dict[str, float | int]:
        return {"p50_ms": self.percentile(50), "p99_ms": self.p99(),
                "max_ms": self.max_ms(), "samples": len(self.samples),
                "window_s": round(self.samples.maxlen * self.interval if self.samples.maxlen else 0, 3)}

    async def _measure(self) -> None:
        while True:
            asked = self.clock.monotonic() + self.interval
            await self.clock.sleep(self.interval)
            self.record(self.clock.monotonic() - asked)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._measure(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

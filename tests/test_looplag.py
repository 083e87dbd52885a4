"""The event-loop lag figure (cdui/plane/looplag.py): what it keeps and what it reports."""
from __future__ import annotations

import asyncio

from cdui.core.clock import FakeClock
from cdui.plane.looplag import LoopLag


def test_p99_is_of_the_kept_window_in_ms_and_never_below_zero():
    lag = LoopLag(FakeClock(), interval=0.05, window=5.0)  # 100 samples kept
    assert lag.p99() == 0.0 and lag.max_ms() == 0.0  # before the first sample
    lag.record(-0.001)  # a wake-up the clock saw early counts as on time
    for _ in range(98):
        lag.record(0.001)
    lag.record(0.250)
    assert len(lag.samples) == 100
    assert lag.p99() == 250.0 and lag.percentile(50) == 1.0 and lag.max_ms() == 250.0
    snap = lag.snapshot()
    assert (snap["max_ms"], snap["samples"], snap["window_s"]) == (250.0, 100, 5.0)
    for _ in range(100):  # the window moves on: the late wake-up is forgotten
        lag.record(0.002)
    assert lag.p99() == 2.0


def test_one_stall_in_the_window_shows_in_its_longest_delay_not_in_its_p99():
    lag = LoopLag(FakeClock(), interval=0.05, window=10.0)  # 200 samples kept, as the control plane keeps
    for _ in range(199):
        lag.record(0.001)
    lag.record(0.130)  # a full pass of the garbage collector
    assert lag.p99() == 1.0 and lag.max_ms() == 130.0 and lag.snapshot()["max_ms"] == 130.0


def test_the_measuring_task_samples_each_interval_and_stops():
    async def main() -> None:
        clock = FakeClock()
        lag = LoopLag(clock, interval=0.05)
        lag.start()
        await clock.wait_for_sleepers(1)
        for _ in range(3):
            await clock.advance(0.05)
        assert len(lag.samples) == 3 and lag.p99() == 0.0  # a fake clock's wake-ups are never late
        await lag.stop()
        assert lag._task is None
    asyncio.run(main())

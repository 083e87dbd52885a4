"""The control plane's full garbage-collector passes (cdui/plane/server.py): one a minute, made when the
event loop is quiet, or a bounded while later when it never is."""
from __future__ import annotations

import asyncio

from cdui.core.clock import FakeClock
from cdui.plane import server
from cdui.plane.looplag import LoopLag

BUSY_S = 0.030  # a lag sample of a loop saturated by a dispatch backlog (30 ms late)
QUIET_S = 0.0005


def test_a_due_pass_waits_for_a_quiet_loop_and_at_most_its_bound() -> None:
    async def main() -> None:
        clock = FakeClock()
        lag = LoopLag(clock)  # its samples are recorded here, as its task would
        passes: list[float] = []
        task = asyncio.create_task(server.full_collections(lag, clock, lambda: passes.append(clock.monotonic())))
        try:
            for _ in range(server.QUIET_SAMPLES):
                lag.record(BUSY_S)
            await clock.wait_for_sleepers(1)
            await clock.advance(server.FULL_COLLECTION_EVERY_S)
            await clock.wait_for_sleepers(1)
            assert passes == []  # due, but the loop is busy: it looks again later
            for _ in range(server.QUIET_SAMPLES):
                lag.record(QUIET_S)
            await clock.advance(server.QUIET_CHECK_S)
            await clock.wait_for_sleepers(1)
            first = server.FULL_COLLECTION_EVERY_S + server.QUIET_CHECK_S
            assert passes == [first]

            lag.record(BUSY_S)  # one late wake-up in the latest half second is not quiet
            await clock.advance(server.FULL_COLLECTION_EVERY_S)
            await clock.wait_for_sleepers(1)
            looks = 0
            while not passes[1:]:
                await clock.advance(server.QUIET_CHECK_S)
                await clock.wait_for_sleepers(1)
                looks += 1
            # Never quiet: the pass is made once the bound is reached.
            assert looks == round(server.FULL_COLLECTION_WAIT_S / server.QUIET_CHECK_S)
            assert passes[1] == first + server.FULL_COLLECTION_EVERY_S + server.FULL_COLLECTION_WAIT_S
        finally:
            task.cancel()
    asyncio.run(main())


def test_without_the_lag_figure_a_pass_is_made_when_due() -> None:
    async def main() -> None:
        clock = FakeClock()
        passes: list[float] = []
        task = asyncio.create_task(server.full_collections(None, clock, lambda: passes.append(clock.monotonic())))
        try:
            for n in (1, 2):
                await clock.wait_for_sleepers(1)
                await clock.advance(server.FULL_COLLECTION_EVERY_S)
                await clock.wait_for_sleepers(1)
                assert passes == [server.FULL_COLLECTION_EVERY_S * i for i in range(1, n + 1)]
        finally:
            task.cancel()
    asyncio.run(main())


def test_quiet_means_half_a_second_of_samples_each_under_the_bound() -> None:
    lag = LoopLag(FakeClock())
    for _ in range(server.QUIET_SAMPLES - 1):
        lag.record(QUIET_S)
    assert not server.loop_quiet(lag)  # too few samples to say
    lag.record(QUIET_S)
    assert server.loop_quiet(lag)
    lag.record(server.QUIET_LAG_MS / 1000)
    assert not server.loop_quiet(lag)

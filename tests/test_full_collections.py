"""The control plane's full garbage-collector passes (cdui/plane/server.py): made once memory has grown
(or after a bound whatever it did), when the event loop is quiet, or a bounded while later when it never is."""
from __future__ import annotations

import asyncio

from cdui.core.clock import FakeClock
from cdui.plane import server
from cdui.plane.looplag import LoopLag

BUSY_S = 0.030  # a lag sample of a loop saturated by a dispatch backlog (30 ms late)
QUIET_S = 0.0005
CHECK = server.FULL_COLLECTION_CHECK_S


class Blocks:
    """The allocated blocks the collector's task reads: 1,000 to start with; a pass leaves what it was told."""

    def __init__(self) -> None:
        self.now = 1000

    def grow(self, share: float) -> None:
        self.now = round(self.now * (1 + share))

    def __call__(self) -> int:
        return self.now


def start(clock: FakeClock, lag: LoopLag | None, blocks: Blocks, passes: list[float]) -> asyncio.Task[None]:
    return asyncio.create_task(server.full_collections(lag, clock, lambda: passes.append(clock.monotonic()), blocks))


def test_a_due_pass_waits_for_a_quiet_loop_and_at_most_its_bound() -> None:
    async def main() -> None:
        clock, blocks, passes = FakeClock(), Blocks(), []
        lag = LoopLag(clock)  # its samples are recorded here, as its task would
        task = start(clock, lag, blocks, passes)
        try:
            for _ in range(server.QUIET_SAMPLES):
                lag.record(BUSY_S)
            await clock.wait_for_sleepers(1)
            blocks.grow(server.FULL_COLLECTION_GROWTH)
            await clock.advance(CHECK)
            await clock.wait_for_sleepers(1)
            assert passes == []  # due, but the loop is busy: it looks again later
            for _ in range(server.QUIET_SAMPLES):
                lag.record(QUIET_S)
            await clock.advance(server.QUIET_CHECK_S)
            await clock.wait_for_sleepers(1)
            first = CHECK + server.QUIET_CHECK_S
            assert passes == [first]

            lag.record(BUSY_S)  # one late wake-up in the latest half second is not quiet
            blocks.grow(server.FULL_COLLECTION_GROWTH)
            await clock.advance(CHECK)
            await clock.wait_for_sleepers(1)
            looks = 0
            while not passes[1:]:
                await clock.advance(server.QUIET_CHECK_S)
                await clock.wait_for_sleepers(1)
                looks += 1
            # Never quiet: the pass is made once the bound is reached.
            assert looks == round(server.FULL_COLLECTION_WAIT_S / server.QUIET_CHECK_S)
            assert passes[1] == first + CHECK + server.FULL_COLLECTION_WAIT_S
        finally:
            task.cancel()
    asyncio.run(main())


def test_a_pass_is_made_when_memory_grew_and_otherwise_only_after_the_bound() -> None:
    """Growth under the share since the last pass makes none (5,000 agents heartbeating: their objects
    stay, nothing accumulates); the share makes one at the next look; with no growth at all, one is made
    FULL_COLLECTION_MAX_S after the last, which bounds how long any cyclic garbage can stay."""
    async def main() -> None:
        clock, blocks, passes = FakeClock(), Blocks(), []
        task = start(clock, None, blocks, passes)
        try:
            await clock.wait_for_sleepers(1)
            for _ in range(5):
                blocks.grow(server.FULL_COLLECTION_GROWTH / 10)  # under the share, all five together too
                await clock.advance(CHECK)
                await clock.wait_for_sleepers(1)
            assert passes == []
            blocks.grow(server.FULL_COLLECTION_GROWTH)
            await clock.advance(CHECK)
            await clock.wait_for_sleepers(1)
            assert passes == [6 * CHECK]  # measured against the start, so the small steps count too
            looks = 0
            while not passes[1:]:
                await clock.advance(CHECK)
                await clock.wait_for_sleepers(1)
                looks += 1
            assert looks == round(server.FULL_COLLECTION_MAX_S / CHECK)
            assert passes[1] == 6 * CHECK + server.FULL_COLLECTION_MAX_S
            # What is measured from is what a pass left: growth since the start no longer counts.
            await clock.advance(CHECK)
            await clock.wait_for_sleepers(1)
            assert passes[2:] == []
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

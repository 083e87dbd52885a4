"""The fake clock moves only when told, and wakes sleepers in deadline order."""
from __future__ import annotations

import asyncio

from cdui.core.clock import FakeClock, SystemClock


def test_fake_clock_wakes_sleepers_in_order_only_when_advanced() -> None:
    async def main() -> list[tuple[float, float]]:
        clock = FakeClock()
        woke: list[tuple[float, float]] = []

        async def nap(s: float) -> None:
            await clock.sleep(s)
            woke.append((s, clock.monotonic()))

        tasks = [asyncio.create_task(nap(s)) for s in (3.0, 1.0, 2.0)]
        await clock.wait_for_sleepers(3)
        assert woke == []
        await clock.advance(2.5)
        assert woke == [(1.0, 1.0), (2.0, 2.0)]
        assert clock.sleepers == 1
        await clock.advance(1.0)
        await asyncio.gather(*tasks)
        assert clock.monotonic() == 3.5
        assert clock.time() == 1_800_000_000.0 + 3.5
        return woke

    assert asyncio.run(main())[-1] == (3.0, 3.0)


def test_system_clock_reads_real_time() -> None:
    import time
    c = SystemClock()
    assert abs(c.time() - time.time()) < 5
    assert c.monotonic() <= time.monotonic()

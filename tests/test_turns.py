"""The share of each event-loop turn for the agents' messages (cdui/plane/turns.py): every piece goes
on, in the order it asked, and what the loop had to do meanwhile goes before the pieces that waited."""
from __future__ import annotations

import asyncio

from cdui.plane.turns import Turns


def test_pieces_over_the_share_go_on_later_in_the_order_they_asked() -> None:
    async def main() -> tuple[list[int], list[str]]:
        turns = Turns(budget=0.0)  # every piece after the first of a turn waits
        done: list[int] = []
        seen: list[str] = []

        async def piece(i: int) -> None:
            await turns.take()
            done.append(i)
            seen.append(f"piece {i}")

        tasks = [asyncio.create_task(piece(i)) for i in range(40)]
        # Another piece of the loop's work asked for in the same turn: it must not wait for the 39 others.
        asyncio.get_running_loop().call_later(0, lambda: seen.append("request"))
        await asyncio.gather(*tasks)
        return done, seen

    done, seen = asyncio.run(main())
    assert done == list(range(40))
    assert seen.index("request") < seen.index("piece 39")
    assert seen.index("request") < 10


def test_a_cancelled_wait_is_passed_over() -> None:
    async def main() -> list[int]:
        turns = Turns(budget=0.0)
        done: list[int] = []

        async def piece(i: int) -> None:
            await turns.take()
            done.append(i)

        tasks = [asyncio.create_task(piece(i)) for i in range(6)]
        await asyncio.sleep(0)  # each has asked (the first went on, the rest wait)
        tasks[2].cancel()
        tasks[3].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [isinstance(r, asyncio.CancelledError) for r in results] == [False, False, True, True, False, False]
        return done

    assert asyncio.run(main()) == [0, 1, 4, 5]


def test_a_turn_with_share_left_lets_pieces_go_on_at_once() -> None:
    async def main() -> int:
        turns = Turns(budget=60.0)  # a share no piece here uses up
        waited = 0
        for _ in range(100):
            await turns.take()
            waited += len(turns.waiting)
        return waited

    assert asyncio.run(main()) == 0


def test_after_a_long_piece_the_cheap_ones_behind_it_are_let_go_more_at_a_time() -> None:
    """One message that took five turns' shares leaves the next let go one at a time; as those take
    nothing of their turn, twice as many are let go each time (a clock of the test's own, stepped by
    the pieces), so 200 cheap messages do not take 200 turns."""
    async def main() -> tuple[list[int], int]:
        t = [0.0]
        turns = Turns(budget=1.0, now=lambda: t[0])
        done: list[int] = []
        fits: list[int] = []

        async def piece(i: int) -> None:
            await turns.take()
            t[0] += 5.0 if i == 0 else 0.0
            done.append(i)
            fits.append(turns.fit)

        await asyncio.gather(*(piece(i) for i in range(200)))
        return done, max(fits)

    done, most = asyncio.run(main())
    assert done == list(range(200))
    assert most >= 64

"""A share of each turn of the event loop for work that arrives in bulk (the agents' messages).

asyncio runs, in one turn of its loop, every callback that is ready: with hundreds of agents each
sending a run's events at once, one turn handled hundreds of messages (30-40 ms of the loop on a quiet
2-core machine, measured under ``bench/scale.py``'s backlog), and a request that arrived meanwhile
(``/api/health``, the runs list) waited for all of them. Each piece of such work asks :meth:`Turns.take`
first: the pieces of one turn go on until they have taken BUDGET_S of it together; the rest wait in
the order they asked and are let go a turn's worth at a time in later turns (as many as took about
BUDGET_S last time), each turn after the sockets that became ready by then, so a request waits behind
about BUDGET_S of them. The work itself, and the order of each agent's messages, are unchanged: only
when a piece runs moves, by a turn or a few.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

BUDGET_S = 0.003  # of one turn of the loop, for the pieces that ask (see Turns)
MAX_FIT = 512  # pieces let go in one turn, at most


class Turns:
    """One event loop's budget per turn (a :class:`Turns` is used from that loop only)."""

    __slots__ = ("budget", "now", "until", "ran", "fit", "waiting", "scheduled", "let_go")

    def __init__(self, budget: float = BUDGET_S, now: Callable[[], float] = time.perf_counter) -> None:
        self.budget = budget
        self.now = now  # the clock the share is measured on (a test steps one of its own)
        self.until: float | None = None  # when this turn's share ends; None: no piece has run in this turn yet
        self.ran = 0  # pieces that went on in this turn
        self.fit = 8  # how many waiting pieces are let go in one turn (see _let_go)
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.scheduled = False
        self.let_go = False  # _let_go let pieces go: they run in the turn of the next _let_go, before it

    async def take(self) -> None:
        """Go on now if this turn's share is not used up and nothing waits before; else wait for a
        later turn, in order."""
        if not self.waiting:
            now = self.now()
            if self.until is None:
                self._start_turn(now)
                return
            if now <= self.until:
                self.ran += 1
                return
            self.fit = max(1, self.ran)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self.waiting.append(fut)
        self._schedule(loop)
        await fut  # let go by _let_go (a cancelled wait is passed over)
        # Counted in this turn's share, so that the next _let_go knows how long the pieces it let go took.
        if self.until is None:
            self._start_turn(self.now())
        else:
            self.ran += 1

    def _start_turn(self, now: float) -> None:
        self.until = now + self.budget
        self.ran = 1
        # The next turn starts afresh: this callback runs early in it (it was asked for in this one).
        asyncio.get_running_loop().call_soon(self._turn_over)

    def _turn_over(self) -> None:
        self.until = None

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.scheduled:
            self.scheduled = True
            # A callback due at once runs after the sockets the loop's next look finds ready (a
            # call_soon would run before them): a request that came meanwhile goes first.
            loop.call_at(loop.time(), self._let_go)

    def _let_go(self) -> None:
        """Let the next ``fit`` waiting pieces go on (they run in the loop's next turn, together, before
        the next call of this). ``fit`` follows what the pieces let go last time took of their turn:
        twice as many if they stayed within the share, fewer in proportion if they went over it."""
        self.scheduled = False
        if self.let_go and self.until is not None:
            spent = self.now() - (self.until - self.budget)
            if spent <= self.budget:
                self.fit = min(MAX_FIT, self.fit * 2)
            else:
                self.fit = max(1, int(self.fit * self.budget / spent))
        self.let_go = False
        n = self.fit
        waiting = self.waiting
        while waiting and n:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                self.let_go = True
                n -= 1
        if waiting:
            loop = asyncio.get_running_loop()
            if not loop.is_closed():
                self._schedule(loop)

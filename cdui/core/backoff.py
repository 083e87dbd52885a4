"""Retry delays for every reconnect and retry loop (agent, enrollment, uploads).

1 s doubling to 60 s, each with +-20 % jitter so that many agents cut off at
once do not come back at once; a pure generator, so tests read it with a
fixed ``rand``.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator


def backoff_delays(start: float = 1.0, cap: float = 60.0, jitter: float = 0.2,
                   rand: Callable[[], float] = random.random) -> Iterator[float]:
    """1, 2, 4, ... 60 s with +-jitter; a pure generator so tests can read it."""
    d = start
    while True:
        yield d * (1 - jitter + 2 * jitter * rand())
        d = min(d * 2, cap)

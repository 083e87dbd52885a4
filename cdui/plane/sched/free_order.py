"""The executors with a free slot, in the order ``any`` tries them, kept from one dispatch pass to the next.

A pass tries ``any``'s executors least recently given a run first and stops at
the first that takes the run (:func:`cdui.plane.sched.queue.place`). With
thousands of workers the list of free ones is long, and each change to it
(a run left an executor, a placement moved one to the back, an executor
went) used to cost a pass the whole list: copying it, looking an executor up
in it, taking one out. Here each change costs a binary search: the list is
kept sorted by each executor's key (:meth:`cdui.plane.dispatch.RunQueue.free_key`,
when it was last given a run, then its name), next to the keys themselves.

The one rule: an executor's key must not change while it is in the list
(take it out, then let the queue record that it was given a run, then put
it back, at the end).
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator

Key = tuple[int, str]


class FreeOrder:
    """A sorted collection of executor names; iterating it gives them in ``key`` order."""

    __slots__ = ("_key", "_keys", "_names", "_members")

    def __init__(self, key: Callable[[str], Key]) -> None:
        self._key = key
        self._keys: list[Key] = []
        self._names: list[str] = []
        self._members: set[str] = set()

    def reset(self, names: Iterable[str]) -> None:
        """Exactly ``names`` from now on, sorted."""
        pairs = sorted((self._key(n), n) for n in set(names))
        self._keys = [k for k, _ in pairs]
        self._names = [n for _, n in pairs]
        self._members = set(self._names)

    def add(self, name: str) -> None:
        """``name`` at its place in the order (nothing if it is in already)."""
        if name in self._members:
            return
        key = self._key(name)
        i = bisect.bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._names.insert(i, name)
        self._members.add(name)

    def discard(self, name: str) -> None:
        """``name`` out (nothing if it is not in); its key must be the one it had when added."""
        if name not in self._members:
            return
        i = bisect.bisect_left(self._keys, self._key(name))
        if i >= len(self._names) or self._names[i] != name:
            raise RuntimeError(f"executor {name!r} changed its place in the free order while in it")
        del self._keys[i]
        del self._names[i]
        self._members.discard(name)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"FreeOrder({self._names!r})"

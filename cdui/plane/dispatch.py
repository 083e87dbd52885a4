"""The queued runs in memory, in lanes, for a dispatch pass whose cost does not grow with the backlog.

A *lane* is every queued run with the same (target, wanted device, file
needs). :func:`cdui.plane.sched.queue.place` gives every run of a lane the same answer
for the same slots, and a dispatch pass only ever takes slots, so once a
lane's oldest run cannot be placed, none of the runs behind it can either: a
pass looks at each lane's head, oldest first across lanes (first come, first
served), places heads while they fit, and stops a lane at its first refusal.
The refusal's text is the lane's ``queue_reason``, kept here in memory and
shown for every run of the lane: it is never written to the database per
run per pass. Where saying why means reading every executor (``any`` over
hundreds of workers), the pass leaves a function of its own state instead,
worked out the first time someone reads the reason.

The database stays the truth about each run's status (the claim is an
atomic ``queued -> running`` write); this index is rebuilt from it at start
and follows every change of a run into or out of ``queued`` made through
:class:`cdui.plane.runs.RunService`.

``any`` spreads over free workers: :meth:`RunQueue.free_order` lists the
executors with a free slot least recently given a run first.

:class:`HeldSlots` is the other half of a pass's state: which run holds which
slot, with the count of slots in use per (executor, device) kept as runs come
and go, so a pass copies it rather than counting every running run again
(with 5,000 busy workers that count alone took milliseconds a pass).
"""
from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdui.plane.sched.placement import FilePlan
from cdui.plane.store import Run
from cdui.wire.devicesets import Key, lane_extra, members, take
from cdui.wire.target import target_json


def needs_of(run: Run) -> str:
    """What a run's files need of an executor: "none", "transfer" or "mount" (see :mod:`cdui.plane.sched.placement`)."""
    fp = FilePlan.from_json(run.options.get("files"))
    return "none" if not fp.uses_files else ("transfer" if fp.transfer_ok else "mount")


def reads_of(run: Run) -> list[str]:
    """The absolute paths a run reads: only an executor whose read roots cover them may take it."""
    return FilePlan.from_json(run.options.get("files")).reads


def lane_of(run: Run) -> str:
    # A device set, a memory need or absolute reads are added only where there are some, so a plain
    # run's key is as it was.
    reads = reads_of(run)
    return json.dumps([target_json(run.target), run.options.get("device"), needs_of(run), *lane_extra(run.options),
                       *([{"reads": reads}] if reads else [])], sort_keys=True)


@dataclass
class Lane:
    key: str
    runs: list[tuple[tuple[float, int], Run]] = field(default_factory=list)
    reason: str | Callable[[], str] | None = None  # a function: worked out when first read
    reason_state: Any = None  # what a worked-out-when-read reason was made from (see RunService._place_heads)

    def head(self) -> Run | None:
        return self.runs[0][1] if self.runs else None

    def head_order(self) -> tuple[float, int]:
        return self.runs[0][0]


class RunQueue:
    def __init__(self) -> None:
        self.lanes: dict[str, Lane] = {}
        self._where: dict[str, tuple[str, tuple[float, int]]] = {}  # run id -> (lane, order)
        self._tick = itertools.count()
        self._used_at: dict[str, int] = {}  # executor -> when it was last given a run (a counter)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._where

    def add(self, run: Run) -> None:
        """Queue ``run`` (read without its graph) at its place by ``created_at``."""
        if run.id in self._where:
            return
        key = lane_of(run)
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
        order = (run.created_at, next(self._tick))
        bisect.insort(lane.runs, (order, run), key=lambda item: item[0])
        self._where[run.id] = (key, order)

    def remove(self, run_id: str) -> None:
        where = self._where.pop(run_id, None)
        if where is None:
            return
        key, order = where
        lane = self.lanes.get(key)
        if lane is None:
            return
        i = bisect.bisect_left(lane.runs, order, key=lambda item: item[0])
        if i < len(lane.runs) and lane.runs[i][1].id == run_id:
            del lane.runs[i]
        if not lane.runs:
            del self.lanes[key]

    def reason(self, run_id: str) -> str | None:
        where = self._where.get(run_id)
        if where is None:
            return None
        lane = self.lanes.get(where[0])
        if lane is None:
            return None
        if callable(lane.reason):
            lane.reason = lane.reason()
        return lane.reason

    def lane_reasons(self) -> dict[str, str | None]:
        """Every lane's waiting reason (those left as functions worked out now, on the event loop), by lane
        key: what :meth:`reason` answers for each run of the lane."""
        out: dict[str, str | None] = {}
        for key, lane in self.lanes.items():
            if callable(lane.reason):
                lane.reason = lane.reason()
            out[key] = lane.reason
        return out

    def lane_key(self, run_id: str) -> str | None:
        """The key of ``run_id``'s lane while it is queued, else None. Safe from another thread: one
        lookup in a dict the event loop changes (a listing reads it beside the rows it read)."""
        where = self._where.get(run_id)
        return None if where is None else where[0]

    def used(self, executor: str) -> None:
        """``executor`` was just given a run: it goes to the back of ``any``'s order."""
        self._used_at[executor] = next(self._tick)

    def free_key(self, executor: str) -> tuple[int, str]:
        """Where ``executor`` stands in :meth:`free_order`'s order; only :meth:`used` changes it."""
        return (self._used_at.get(executor, -1), executor)

    def free_order(self, names: list[str]) -> list[str]:
        """``names`` least recently given a run first (never used first, by name)."""
        return sorted(names, key=self.free_key)

    def insert_free(self, free: list[str], name: str) -> None:
        """Put ``name`` into ``free`` (a list in :meth:`free_order`'s order) at its place in that order."""
        bisect.insort(free, name, key=self.free_key)

    def snapshot(self) -> dict[str, Any]:
        return {"queued": len(self), "lanes": len(self.lanes)}


class HeldSlots(dict[str, tuple[str, str]]):
    """run id -> (executor, slot or set) of every run holding a slot, and :attr:`used`: the slots in use
    per (executor, device), always what :func:`cdui.wire.devicesets.slots_used` would count from the
    entries. Only item assignment, ``pop`` and ``del`` change it."""

    def __init__(self) -> None:
        super().__init__()
        self.used: dict[Key, int] = {}

    def __setitem__(self, run_id: str, held: tuple[str, str]) -> None:
        old = self.get(run_id)
        if old is not None:
            self._drop(old)
        super().__setitem__(run_id, held)
        take(self.used, held[0], held[1])

    def __delitem__(self, run_id: str) -> None:
        old = self[run_id]
        super().__delitem__(run_id)
        self._drop(old)

    def pop(self, run_id: str, default: Any = KeyError) -> Any:
        if run_id in self:
            old = super().pop(run_id)
            self._drop(old)
            return old
        if default is KeyError:
            raise KeyError(run_id)
        return default

    def _drop(self, held: tuple[str, str]) -> None:
        executor, slot = held
        for d in members(slot):
            key = (executor, d)
            n = self.used.get(key, 0) - 1
            if n > 0:
                self.used[key] = n
            else:
                self.used.pop(key, None)

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("HeldSlots changes only by item assignment, pop and del (so its counts stay true)")

    update = setdefault = popitem = clear = _refuse  # type: ignore[assignment]

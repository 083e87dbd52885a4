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
from cdui.wire.devicesets import lane_extra
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

    def used(self, executor: str) -> None:
        """``executor`` was just given a run: it goes to the back of ``any``'s order."""
        self._used_at[executor] = next(self._tick)

    def free_order(self, names: list[str]) -> list[str]:
        """``names`` least recently given a run first (never used first, by name)."""
        return sorted(names, key=lambda n: (self._used_at.get(n, -1), n))

    def snapshot(self) -> dict[str, Any]:
        return {"queued": len(self), "lanes": len(self.lanes)}

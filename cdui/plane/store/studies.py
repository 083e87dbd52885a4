"""What a study (a sweep of kind ``study``, cdui/plane/studies.py) keeps beyond a sweep's rows: each trial
is a ``sweep_variants`` row, added when the study's sampler asks for it (its index is the trial's number),
and released into a run as any variant is, in the transaction that stores the run
(:func:`~cdui.plane.store.sweeps.claim_variant`). ``mark`` says ``pruned`` for a trial its pruner stopped.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from cdui.plane.store.base import Db, every, one

_LIVE = ("queued", "running", "disconnected")


class StudyRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def add_trial(self, sweep_id: str, params: dict[str, Any], limit: int) -> int | None:
        """A new waiting variant with ``params`` at the next index; its index, or None (nothing stored) when
        the study is no longer active or already has ``limit`` trials."""
        text = json.dumps(params)

        def fn(c: sqlite3.Connection) -> int | None:
            if one(c, "SELECT 1 AS x FROM sweeps WHERE id=? AND kind='study' AND state='active'", (sweep_id,)) is None:
                return None
            n = int(c.execute("SELECT COUNT(*) FROM sweep_variants WHERE sweep_id=?", (sweep_id,)).fetchone()[0])
            if n >= limit:
                return None
            idx = int(c.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM sweep_variants WHERE sweep_id=?",
                                (sweep_id,)).fetchone()[0])
            c.execute("INSERT INTO sweep_variants (sweep_id, idx, params, status) VALUES (?,?,?,'waiting')",
                      (sweep_id, idx, text))
            return idx
        return await self.db.write(fn)

    async def mark(self, sweep_id: str, idx: int, mark: str) -> None:
        """Mark the trial (``pruned``), and say so in its run's ``sweep`` block (``"pruned": true``), in one write:
        the run keeps the statuses every run has, and its own record still says why it ended early."""
        def fn(c: sqlite3.Connection) -> None:
            c.execute("UPDATE sweep_variants SET mark=? WHERE sweep_id=? AND idx=?", (mark, sweep_id, idx))
            c.execute("UPDATE runs SET options=json_set(options, '$.sweep.' || ?, json('true')) WHERE id=("
                      "SELECT run_id FROM sweep_variants WHERE sweep_id=? AND idx=?) "
                      "AND json_type(options, '$.sweep') = 'object'", (mark, sweep_id, idx))
        await self.db.write(fn)

    async def marks(self, sweep_id: str) -> dict[int, str]:
        rows = await self.db.read(lambda c: every(
            c, "SELECT idx, mark FROM sweep_variants WHERE sweep_id=? AND mark IS NOT NULL", (sweep_id,)))
        return {int(r["idx"]): str(r["mark"]) for r in rows}

    async def trial_of_run(self, run_id: str) -> tuple[str, int] | None:
        """(study id, trial index) of a run that is a study's trial; None for any other run."""
        row = await self.db.read(lambda c: one(
            c, "SELECT v.sweep_id, v.idx FROM sweep_variants v JOIN sweeps s ON s.id = v.sweep_id "
               "WHERE v.run_id=? AND s.kind='study'", (run_id,)))
        return (str(row["sweep_id"]), int(row["idx"])) if row is not None else None

    async def trial_runs(self, sweep_id: str) -> list[tuple[int, str, str]]:
        """(index, run id, run status) of the study's trials that have a run."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT v.idx, v.run_id, r.status FROM sweep_variants v JOIN runs r ON r.id = v.run_id "
               "WHERE v.sweep_id=? ORDER BY v.idx", (sweep_id,)))
        return [(int(r["idx"]), str(r["run_id"]), str(r["status"])) for r in rows]

    async def pending(self, sweep_id: str) -> tuple[int, int]:
        """(trials so far, trials waiting or with a run not ended): what the next asks are counted against."""
        def fn(c: sqlite3.Connection) -> tuple[int, int]:
            total = int(c.execute("SELECT COUNT(*) FROM sweep_variants WHERE sweep_id=?", (sweep_id,)).fetchone()[0])
            busy = int(c.execute(
                "SELECT COUNT(*) FROM sweep_variants v LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=? "
                "AND (v.status='waiting' OR r.status IN (?,?,?))", (sweep_id, *_LIVE)).fetchone()[0])
            return total, busy
        return await self.db.read(fn)

    async def active_ids(self) -> list[str]:
        """The studies not stopped (those a start loads and asks the next trials of)."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT id FROM sweeps WHERE kind='study' AND state='active' ORDER BY created_at"))
        return [str(r["id"]) for r in rows]

    async def listing(self, limit: int) -> list[str]:
        """The ids of the newest studies."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT id FROM sweeps WHERE kind='study' ORDER BY created_at DESC LIMIT ?", (limit,)))
        return [str(r["id"]) for r in rows]

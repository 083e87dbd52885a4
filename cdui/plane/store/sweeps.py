"""The ``sweeps`` and ``sweep_variants`` tables: a sweep's request and each of its variants (its
params, the run it became, that run's last known status and final metrics).

A variant is released (becomes a run) in the same transaction that stores its run
(:func:`claim_variant`, called by :meth:`~cdui.plane.store.database.Store.create_run`): a control
plane killed at any moment leaves each variant either waiting, with no run, or with its one run,
so a restart neither loses a variant nor queues one twice. A variant's live status is its run's
(``runs.status``, read through a join); ``sweep_variants.status`` keeps the last one known, for a
variant that is still waiting, was cancelled or refused before it had a run, or whose run was deleted.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from cdui.plane.store.base import Db, every, one

# A run's statuses in which it still counts against its sweep's max_running.
_LIVE = ("queued", "running", "disconnected")
RETRYABLE = ("failed", "interrupted", "cancelled")
# A variant's status as the sweep shows it (the CASE in the listing's and the variants' SELECT): its run's while it
# has one, except that a run which has ended shows as running until the sweep service has recorded its ending (its
# final metrics) on the variant, so a sweep is never read as finished with its last results still missing.


def claim_variant(c: sqlite3.Connection, sweep_id: str, idx: int, run_id: str) -> bool:
    """Mark a waiting variant of an active sweep as run ``run_id``; False (nothing changed) if it is no
    longer waiting or its sweep was stopped or deleted."""
    return c.execute(
        "UPDATE sweep_variants SET run_id=?, status='queued', error=NULL WHERE sweep_id=? AND idx=? "
        "AND status='waiting' AND EXISTS (SELECT 1 FROM sweeps WHERE id=? AND state='active')",
        (run_id, sweep_id, idx, sweep_id)).rowcount == 1


def _sweep(row: dict[str, Any]) -> dict[str, Any]:
    row["spec"] = json.loads(row["spec"])
    row["options"] = json.loads(row["options"])
    if "graph" in row:
        row["graph"] = json.loads(row["graph"])
    return row


def _variant(row: dict[str, Any]) -> dict[str, Any]:
    row["params"] = json.loads(row["params"])
    row["metrics"] = json.loads(row["metrics"]) if row["metrics"] else None
    row["previous_runs"] = json.loads(row["previous_runs"])
    return row


class SweepRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def create(self, sweep_id: str, kind: str, name: str | None, spec: dict[str, Any], options: dict[str, Any],
                     graph: dict[str, Any], max_running: int, variants: list[dict[str, Any]], now: float) -> None:
        """The sweep and every variant, waiting, in one transaction."""
        rows = [(sweep_id, i, json.dumps(v)) for i, v in enumerate(variants)]

        def fn(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO sweeps (id, kind, name, state, spec, options, graph, max_running, created_at) "
                      "VALUES (?,?,?,'active',?,?,?,?,?)",
                      (sweep_id, kind, name, json.dumps(spec), json.dumps(options), json.dumps(graph), max_running,
                       now))
            c.executemany("INSERT INTO sweep_variants (sweep_id, idx, params, status) VALUES (?,?,?,'waiting')", rows)
        await self.db.write(fn, weight=len(rows) + 1)

    async def get(self, sweep_id: str, with_graph: bool = False) -> dict[str, Any] | None:
        def fn(c: sqlite3.Connection) -> dict[str, Any] | None:
            if with_graph:
                row = one(c, "SELECT * FROM sweeps WHERE id=?", (sweep_id,))
            else:
                row = one(c, "SELECT id, kind, name, state, spec, options, max_running, created_at, stopped_at "
                             "FROM sweeps WHERE id=?", (sweep_id,))
            return _sweep(row) if row is not None else None
        return await self.db.read(fn)

    async def listing(self, limit: int) -> list[dict[str, Any]]:
        """The newest sweeps (no graph), each with ``counts``: its variants by status (a run's own status
        where the variant has one)."""
        def fn(c: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = [_sweep(r) for r in every(
                c, "SELECT id, kind, name, state, spec, options, max_running, created_at, stopped_at FROM sweeps "
                   "ORDER BY created_at DESC LIMIT ?", (limit,))]
            for r in rows:
                r["counts"] = {x["status"]: x["n"] for x in every(
                    c, "SELECT CASE WHEN r.status IN ('succeeded','failed','cancelled','interrupted') "
                       "AND v.status NOT IN ('succeeded','failed','cancelled','interrupted') THEN 'running' "
                       "ELSE COALESCE(r.status, v.status) END AS status, COUNT(*) AS n FROM sweep_variants v "
                       "LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=? GROUP BY 1", (r["id"],))}
            return rows
        return await self.db.read(fn)

    async def variants(self, sweep_id: str) -> list[dict[str, Any]]:
        """Every variant in order, with its run's status, worker and times where it has a run."""
        def fn(c: sqlite3.Connection) -> list[dict[str, Any]]:
            return [_variant(r) for r in every(
                c, "SELECT v.idx, v.params, v.run_id, CASE WHEN r.status IN "
                   "('succeeded','failed','cancelled','interrupted') AND v.status NOT IN "
                   "('succeeded','failed','cancelled','interrupted') THEN 'running' "
                   "ELSE COALESCE(r.status, v.status) END AS status, v.error AS "
                   "variant_error, r.error AS run_error, v.metrics, v.previous_runs, r.worker_id, r.slot_device, "
                   "r.started_at, r.finished_at, (r.id IS NOT NULL) AS has_run FROM sweep_variants v "
                   "LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=? ORDER BY v.idx", (sweep_id,))]
        return await self.db.read(fn)

    async def live_count(self, sweep_id: str) -> int:
        """How many of the sweep's runs are queued or running now (what max_running bounds)."""
        return await self.db.read(lambda c: int(c.execute(
            "SELECT COUNT(*) FROM sweep_variants v JOIN runs r ON r.id = v.run_id "
            "WHERE v.sweep_id=? AND r.status IN (?,?,?)", (sweep_id, *_LIVE)).fetchone()[0]))

    async def waiting(self, sweep_id: str, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """The first ``limit`` waiting variants, in order: (index, params)."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT idx, params FROM sweep_variants WHERE sweep_id=? AND status='waiting' ORDER BY idx LIMIT ?",
            (sweep_id, limit)))
        return [(r["idx"], json.loads(r["params"])) for r in rows]

    async def active_ids(self) -> list[str]:
        """The sweeps not stopped that have a variant waiting: those a start releases variants of."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT id FROM sweeps s WHERE state='active' AND EXISTS (SELECT 1 FROM sweep_variants v "
               "WHERE v.sweep_id = s.id AND v.status='waiting') ORDER BY created_at"))
        return [r["id"] for r in rows]

    async def live_runs(self) -> list[tuple[str, str]]:
        """(run id, sweep id) of every variant whose run has not ended as far as the variant knows."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT run_id, sweep_id FROM sweep_variants WHERE run_id IS NOT NULL AND status IN (?,?,?)", _LIVE))
        return [(r["run_id"], r["sweep_id"]) for r in rows]

    async def run_status(self, run_id: str) -> str | None:
        """The run's status in ``runs`` (None: no such run)."""
        row = await self.db.read(lambda c: one(c, "SELECT status FROM runs WHERE id=?", (run_id,)))
        return str(row["status"]) if row is not None else None

    async def ended(self, run_id: str, status: str, metrics: dict[str, Any] | None) -> None:
        """The variant whose run this is keeps the run's final status and metrics."""
        text = json.dumps(metrics) if metrics is not None else None
        await self.db.write(lambda c: c.execute(
            "UPDATE sweep_variants SET status=?, metrics=? WHERE run_id=?", (status, text, run_id)))

    async def refuse(self, sweep_id: str, idx: int, error: str) -> None:
        """A waiting variant that could not become a run (its graph no longer passes the submit's checks)."""
        await self.db.write(lambda c: c.execute(
            "UPDATE sweep_variants SET status='failed', error=? WHERE sweep_id=? AND idx=? AND status='waiting'",
            (error, sweep_id, idx)))

    async def stop(self, sweep_id: str, now: float) -> list[str]:
        """Stop releasing: the waiting variants end cancelled; the runs still live, to be stopped."""
        def fn(c: sqlite3.Connection) -> list[str]:
            c.execute("UPDATE sweeps SET state='stopped', stopped_at=? WHERE id=?", (now, sweep_id))
            c.execute("UPDATE sweep_variants SET status='cancelled', error='the sweep was stopped before it started' "
                      "WHERE sweep_id=? AND status='waiting'", (sweep_id,))
            return [r["run_id"] for r in every(
                c, "SELECT v.run_id FROM sweep_variants v JOIN runs r ON r.id = v.run_id "
                   "WHERE v.sweep_id=? AND r.status IN (?,?,?)", (sweep_id, *_LIVE))]
        return await self.db.write(fn)

    async def retry(self, sweep_id: str) -> int:
        """The failed, interrupted and cancelled variants wait again (their old runs are remembered in
        ``previous_runs``) and the sweep is active again; how many."""
        def fn(c: sqlite3.Connection) -> int:
            rows = every(c, "SELECT v.idx, v.run_id, v.previous_runs FROM sweep_variants v "
                            "LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=? "
                            "AND COALESCE(r.status, v.status) IN (?,?,?)", (sweep_id, *RETRYABLE))
            for r in rows:
                previous = json.loads(r["previous_runs"]) + ([r["run_id"]] if r["run_id"] else [])
                c.execute("UPDATE sweep_variants SET status='waiting', run_id=NULL, error=NULL, metrics=NULL, "
                          "previous_runs=? WHERE sweep_id=? AND idx=?", (json.dumps(previous), sweep_id, r["idx"]))
            if rows:
                c.execute("UPDATE sweeps SET state='active', stopped_at=NULL WHERE id=?", (sweep_id,))
            return len(rows)
        return await self.db.write(fn)

    async def delete(self, sweep_id: str) -> list[str] | None:
        """Remove the sweep and its variants; the ids of every run its variants had (None: no such
        sweep). Refuses nothing: the caller checks that none of them is live."""
        def fn(c: sqlite3.Connection) -> list[str] | None:
            rows = every(c, "SELECT run_id, previous_runs FROM sweep_variants WHERE sweep_id=?", (sweep_id,))
            if c.execute("DELETE FROM sweeps WHERE id=?", (sweep_id,)).rowcount != 1:
                return None
            c.execute("DELETE FROM sweep_variants WHERE sweep_id=?", (sweep_id,))
            out: list[str] = []
            for r in rows:
                out += json.loads(r["previous_runs"]) + ([r["run_id"]] if r["run_id"] else [])
            return out
        return await self.db.write(fn)

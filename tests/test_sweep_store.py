"""The sweep tables on a real sqlite file (cdui/plane/store/sweeps.py): a variant becomes a run in the one
transaction that stores the run, so it can never be released twice, nor after its sweep was stopped."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cdui.plane.store import Run, Store
from cdui.wire.target import AnyWorker


def new_run(run_id: str) -> Run:
    return replace(Run(id=run_id, name=run_id, status="queued", target=AnyWorker(), options={"target": "any"},
                       graph={"nodes": []}, created_at=time.time()))


def test_a_variant_is_claimed_once_with_its_run_and_never_after_a_stop(tmp_path: Path) -> None:
    async def body() -> None:
        store = Store(tmp_path / "db.sqlite3")
        store.open()
        try:
            rows = store.sweeps
            await rows.create("s1", "sweep", "lr", {"mode": "grid"}, {"target": "any"}, {"nodes": []}, 2,
                              [{"t.lr": 0.1}, {"t.lr": 0.01}, {"t.lr": 0.001}], time.time())
            assert await rows.waiting("s1", 10) == [(0, {"t.lr": 0.1}), (1, {"t.lr": 0.01}), (2, {"t.lr": 0.001})]
            assert await store.create_run(new_run("r0"), ("s1", 0)) is True
            # The same variant again (a second release racing the first, or one after a restart): refused,
            # and its run is not stored.
            assert await store.create_run(new_run("r0-again"), ("s1", 0)) is False
            assert await store.get_run("r0-again") is None
            assert await rows.live_count("s1") == 1
            assert [(r, s) for r, s in await rows.live_runs()] == [("r0", "s1")]
            # Its run ends: the variant keeps the status and metrics; a slot is free again.
            await store.finish_run("r0", "failed", "boom", time.time(), "cp", None)
            await rows.ended("r0", "failed", {"val_loss": 0.5})
            assert await rows.live_count("s1") == 0
            # Stopped: the waiting variants end cancelled and none is released any more.
            assert await store.create_run(new_run("r1"), ("s1", 1)) is True
            assert await rows.stop("s1", time.time()) == ["r1"]
            assert await store.create_run(new_run("r2"), ("s1", 2)) is False
            assert [(v["idx"], v["status"]) for v in await rows.variants("s1")] == \
                [(0, "failed"), (1, "queued"), (2, "cancelled")]
            # Retry: failed, interrupted and cancelled variants wait again, their old runs remembered.
            await store.finish_run("r1", "cancelled", None, time.time(), "cp", None)
            assert await rows.retry("s1") == 3
            got: list[dict[str, Any]] = await rows.variants("s1")
            assert [(v["status"], v["run_id"], v["previous_runs"]) for v in got] == \
                [("waiting", None, ["r0"]), ("waiting", None, ["r1"]), ("waiting", None, [])]
            assert await rows.active_ids() == ["s1"]
            assert await store.create_run(new_run("r2"), ("s1", 2)) is True
            # Deleting the sweep names every run its variants had.
            assert sorted(await rows.delete("s1") or []) == ["r0", "r1", "r2"]
            assert await rows.get("s1") is None and await rows.variants("s1") == []
        finally:
            store.close()
    asyncio.run(body())


def test_a_variant_whose_run_ended_shows_running_until_its_ending_is_recorded(tmp_path: Path) -> None:
    """Between a run's end and the sweep service recording it (its final metrics) on the variant, the variant
    reads as running: a sweep (or study) read then is not finished with its last result missing."""
    async def body() -> None:
        store = Store(tmp_path / "db.sqlite3")
        store.open()
        try:
            rows = store.sweeps
            await rows.create("s1", "sweep", "lr", {"mode": "grid"}, {"target": "any"}, {"nodes": []}, 1,
                              [{"t.lr": 0.1}], time.time())
            assert await store.create_run(new_run("r0"), ("s1", 0)) is True
            await store.finish_run("r0", "succeeded", None, time.time(), "cp", None)
            got = await rows.variants("s1")
            assert [(v["status"], v["metrics"]) for v in got] == [("running", None)]
            assert (await rows.listing(10))[0]["counts"] == {"running": 1}
            await rows.ended("r0", "succeeded", {"loss": 0.25})
            got = await rows.variants("s1")
            assert [(v["status"], v["metrics"]) for v in got] == [("succeeded", {"loss": 0.25})]
            assert (await rows.listing(10))[0]["counts"] == {"succeeded": 1}
        finally:
            store.close()
    asyncio.run(body())

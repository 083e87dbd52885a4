"""Benchmark 6: the store at 1 M events.

The control plane's own :class:`cdui.plane.store.Store` on a fresh sqlite file:
``--runs`` runs, then ``--events`` log events appended through the one writer
in batches of 1,000, the way a run's events are stored (``append_status_events``,
which ``RunService.record_wire`` calls for every run's own events; each event's
data encoded by the store). Measured: append rate (time
spent in the store's appends, not in making up the events; goal: 300,000/s,
what sqlite's WAL batch inserts allow on this disk), the process's CPU time
per event meanwhile (steadier than the rate on a busy machine), the latency
of reading a page of events after an early and a late position (the
``GET /api/runs/{id}/events?after=`` query) and of the runs listing, at the
start and at the end, and the database's growth per event.

    .venv/bin/python bench/store_growth.py [--events 1000000]
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from common import CDUI_ROOT, REPO, Figure, parser, report, say

sys.path.insert(0, str(CDUI_ROOT))  # the store of the checkout measured (CDUI_BENCH_ROOT: an older one)
from cdui.plane.store import Run, Store  # noqa: E402


async def timed(coro_fn, n: int = 20) -> float:
    """Median milliseconds of ``n`` calls."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await coro_fn()
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)[len(out) // 2]


async def main_async(n_runs: int, n_events: int) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="cdui-bench-store-") as tmp:
        store = Store(Path(tmp) / "cdui.sqlite3")
        store.open()
        try:
            ids = [f"r{i:06d}" for i in range(n_runs)]
            for rid in ids:
                await store.create_run(Run(id=rid, status="succeeded", target="local", options={},
                                           created_at=time.time(),
                                           graph={"nodes": [], "edges": []}))
            target = ids[0]

            async def page_early() -> None:
                await store.events(target, after=10, limit=1000)

            async def page_late() -> None:
                await store.events(target, after=max(0, per_run - 1000), limit=1000)

            async def listing() -> None:
                await store.list_runs(limit=200)
            per_run = n_events // n_runs
            await store.append_events(target, "local", [{"src_seq": i + 1, "kind": "log",
                                                         "data": {"message": f"event {i}"}, "at": time.time()}
                                                        for i in range(min(2000, per_run))])
            early0, list0 = await timed(page_early), await timed(listing)
            size0 = store.path.stat().st_size + Path(str(store.path) + "-wal").stat().st_size
            say(f"appending {n_events:,} events")
            # The path a run's events take (RunService.record_wire): stored with what their statuses change,
            # handed back as columns. Its data encoded by the store, as for a line whose text is not kept.
            # An older checkout (CDUI_BENCH_ROOT) without it appends as its runs did.
            status_path = getattr(store, "append_status_events", None)

            async def append(rid: str, src: str, evs: list, now: float) -> None:
                if status_path is not None:
                    await status_path(rid, src, evs, now)
                else:
                    await store.append_events(rid, src, evs)
            batch = 1000
            spent = 0.0  # in the store's appends only, not in making up the events
            cpu = 0.0  # this process's CPU meanwhile (the writer thread's and the loop's)
            for rid in ids:
                start = 2000 if rid == target else 0
                for lo in range(start, per_run, batch):
                    now = time.time()
                    evs = [{"src_seq": i + 1, "kind": "log", "data": {"message": f"event {i}", "level": "info"},
                            "at": now} for i in range(lo, min(per_run, lo + batch))]
                    t0, c0 = time.perf_counter(), time.process_time()
                    await append(rid, "local", evs, now)
                    spent += time.perf_counter() - t0
                    cpu += time.process_time() - c0
            appended = n_events - min(2000, per_run)
            rate = appended / spent
            early1, late1, list1 = await timed(page_early), await timed(page_late), await timed(listing)
            size1 = store.path.stat().st_size + Path(str(store.path) + "-wal").stat().st_size
        finally:
            store.close()
    B = "store"
    return [Figure(B, f"append rate into the store ({n_events:,} events)", rate, "events/s", 300000, better="higher",
                   note=f"{where()}, batches of {batch}, stored as a run's events are"),
            Figure(B, "CPU per event appended (the writer's and the loop's)", cpu / appended * 1e6, "µs",
                   note="what a loaded machine changes least"),
            Figure(B, "events?after= page, early position, small table", early0, "ms"),
            Figure(B, f"events?after= page, early position, {n_events:,} events", early1, "ms", max(5.0, early0 * 2)),
            Figure(B, f"events?after= page, late position, {n_events:,} events", late1, "ms", max(5.0, early0 * 2)),
            Figure(B, "runs listing (200), small table", list0, "ms"),
            Figure(B, f"runs listing (200) with {n_events:,} events stored", list1, "ms", max(5.0, list0 * 2)),
            Figure(B, "database growth per event", (size1 - size0) / max(1, n_events), "bytes")]


def where() -> str:
    return "before (CDUI_BENCH_ROOT)" if CDUI_ROOT != REPO else "this checkout"


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--events", type=int, default=1_000_000)
    a = p.parse_args()
    if a.smoke:
        a.runs, a.events = 5, 5000
    report(asyncio.run(main_async(a.runs, a.events)), a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

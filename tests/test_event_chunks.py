"""A run's events stored many to a row (cdui/plane/store/event_chunks.py), on a real sqlite file:
every page of ``events(after, limit)`` is what a row per event gave, across the chunks' edges; data
comes back exactly; a source's final status is found; a run's deletion takes its chunks; and a
database whose events are one row each (migration 8, as the previous cdui wrote them) is converted
with every event kept."""
from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cdui.plane.store import MIGRATIONS, Store
from cdui.plane.store.event_chunks import CHUNK_BYTES, CHUNK_EVENTS, event_rows
from cdui.wire.event import event_json
from test_store import ev, new_run, run


def chunks(store: Store, run_id: str) -> list[tuple[int, int, str, int, int]]:
    """(first_seq, last_seq, src, src_seq, finals) of a run's chunks, in order."""
    return store.read_sync(lambda c: [tuple(r) for r in c.execute(
        "SELECT first_seq, last_seq, src, src_seq, finals FROM run_event_chunks WHERE run_id=? ORDER BY first_seq",
        (run_id,)).fetchall()])


def cut(first: int, last: int) -> list[tuple[int, int]]:
    """The (first_seq, last_seq) of the chunks one append of events first..last makes (small data)."""
    return [(a, min(last, a + CHUNK_EVENTS - 1)) for a in range(first, last + 1, CHUNK_EVENTS)]


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN equal to NaN (what event_json writes for both is the same)."""
    return event_json(a) == event_json(b)


def test_pages_across_chunk_edges_are_what_a_row_per_event_gave(store: Store) -> None:
    """Three appends of 1,000 and one of a single event are cut into chunks; every (after, limit) reads
    the same slice of the log as a list of the events in order would, wherever the chunks begin."""
    sizes = [1000, 1000, 1000, 1]
    expected: list[tuple[int, str, dict[str, Any], float]] = []

    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        n = 0
        for size in sizes:
            batch = [ev(s, message=f"event {s}") for s in range(n + 1, n + size + 1)]
            stored, acked = await store.append_events("r", "local", batch)
            assert acked == n + size and [e["seq"] for e in stored] == list(range(n + 1, n + size + 1))
            expected.extend((e["src_seq"], e["kind"], e["data"], e["at"]) for e in batch)
            n += size
        assert [c[:2] for c in chunks(store, "r")] == cut(1, 1000) + cut(1001, 2000) + cut(2001, 3000) + [(3001, 3001)]
        assert all(c[2:] == ("local", c[0], 0) for c in chunks(store, "r"))
        assert 1000 % CHUNK_EVENTS != 0  # so that chunks of one append end inside the pages below
        for after in (0, 1, 2, 999, 1000, 1001, 1500, 1999, 2000, 2001, 2999, 3000, 3001, 3002, 10 ** 6,
                      2 ** 63 - 1):
            for limit in (1, 2, 999, 1000, 1001, 2000, 10000, -1):
                got = await store.events("r", after, limit)
                want = expected[after:] if limit < 0 else expected[after:after + limit]
                assert [(e["seq"], e["kind"], e["data"], e["at"]) for e in got] == want, (after, limit)
        assert await store.events("r", 0, 0) == []
        assert await store.events("other", 0, 10) == []
    run(go())


def test_a_big_batch_is_cut_into_chunks_and_read_back_whole(store: Store) -> None:
    """A batch of more than CHUNK_EVENTS events, or of more than CHUNK_BYTES of data, is several
    chunks, each numbered on from the last; an event larger than CHUNK_BYTES is a chunk of its own."""
    big = "x" * (CHUNK_BYTES // 3)

    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        many = [ev(s) for s in range(1, 2 * CHUNK_EVENTS + 11)]
        await store.append_events("r", "worker:w", many)
        n = len(many)
        heavy = [ev(n + 1, message=big), ev(n + 2, message=big), ev(n + 3, message=big),
                 ev(n + 4, message="y" * (CHUNK_BYTES + 1)), ev(n + 5)]
        stored, acked = await store.append_events("r", "worker:w", heavy)
        assert acked == n + 5 and [e["seq"] for e in stored] == list(range(n + 1, n + 6))
        c = chunks(store, "r")
        assert [(a, b) for a, b, *_ in c] == [
            (1, CHUNK_EVENTS), (CHUNK_EVENTS + 1, 2 * CHUNK_EVENTS), (2 * CHUNK_EVENTS + 1, n),
            (n + 1, n + 2), (n + 3, n + 3), (n + 4, n + 4), (n + 5, n + 5)]
        assert [s for _a, _b, _src, s, _f in c] == [a for a, *_ in c]  # src_seq follows seq: one source
        got = await store.events("r", 0, -1)
        assert [(e["seq"], e["data"]) for e in got] == [(e["src_seq"], e["data"]) for e in many + heavy]
    run(go())


def test_data_comes_back_exactly(store: Store) -> None:
    """What a row per event stored and read (event_json, then json.loads) comes back from a chunk:
    text in any script, nested values, big integers, non-finite numbers, empty data, times."""
    datas: list[Any] = [{"message": "héllo ✓ 日本\n\"quoted\" \\ back"}, {"a": {"b": [1, 2.5, None, True]}},
                        {"big": 2 ** 70, "neg": -0.0, "tiny": 5e-324}, {"nan": math.nan, "inf": -math.inf},
                        {}, {"nested": {"deep": {"list": [[], {}]}}}]
    ats = [1.0, 1700000000.123456, 0.1 + 0.2, 2.5, 1e-3, 1733140000.0]

    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        batch = [{"src_seq": i + 1, "kind": k, "data": d, "at": a}
                 for i, (k, d, a) in enumerate(zip(["log", "metric", "log", "log", "progress", "wéird kind"],
                                                   datas, ats, strict=True))]
        await store.append_events("r", "local", batch)
        got = await store.events("r")
        assert [e["kind"] for e in got] == [e["kind"] for e in batch]
        assert all(same(g["data"], json.loads(event_json(e["data"]))) for g, e in zip(got, batch, strict=True))
        assert [e["at"] for e in got] == ats
    run(go())


def test_a_sources_final_status_is_found_in_a_flood_chunk(store: Store) -> None:
    """The final status is the last of a 1,000-event batch: found for its source only; a status that
    is not final, or whose data is not an object, is not taken for one."""
    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        batch = [ev(s) for s in range(1, 1000)] + [ev(1000, "status", status="failed", error="x")]
        await store.append_events("r", "worker:w", batch)
        await store.append_events("r", "worker:v", [ev(1, "status", status="running"),
                                                    {"src_seq": 2, "kind": "status", "data": {"status": ["failed"]},
                                                     "at": 1.0}])
        c = chunks(store, "r")
        assert [x[:2] for x in c] == cut(1, 1000) + [(1001, 1002)]
        assert [x[2:] for x in c[-2:]] == [("worker:w", 1 + 1000 // CHUNK_EVENTS * CHUNK_EVENTS, 1), ("worker:v", 1, 0)]
        assert sum(x[4] for x in c) == 1  # the one final status, in the flood's last chunk
        assert await store.has_final_status_from("r", "worker:w")
        assert not await store.has_final_status_from("r", "worker:v")
        assert not await store.has_final_status_from("r", "local")
        await store.delete_run("r")
        assert await store.read(lambda c: c.execute("SELECT count(*) FROM run_event_chunks").fetchone()[0]) == 0
        assert await store.events("r") == []
    run(go())


# What the previous cdui (migration 8) wrote for each event: one row, its data encoded with event_json.
V8_INSERT = "INSERT INTO run_events (run_id, seq, src, src_seq, kind, data, at) VALUES (?,?,?,?,?,?,?)"


def v8_database(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """A database at migration 8 with three runs' events as rows; the rows of each run, by seq."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    for i, script in enumerate(MIGRATIONS[:8]):
        assert isinstance(script, str)
        conn.execute("BEGIN IMMEDIATE")
        for stmt in script.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute(f"PRAGMA user_version={i + 1}")
        conn.execute("COMMIT")
    rows: dict[str, list[tuple[Any, ...]]] = {"long": [], "mixed": [], "big": []}
    # long: 2,500 events of one source, a final status at the end
    for s in range(1, 2501):
        kind, data = ("status", {"status": "succeeded"}) if s == 2500 else ("log", {"message": f"line {s}"})
        rows["long"].append(("long", s, "worker:w", s, kind, event_json(data), 1000.0 + s / 1000))
    # mixed: sources interleaved, as a worker's run with the control plane's own events between
    seqs = {"cp": 0, "worker:w": 0, "local": 0}
    for s, src in enumerate(["cp", "worker:w", "worker:w", "cp", "worker:w", "local", "local", "cp"], start=1):
        seqs[src] += 1
        rows["mixed"].append(("mixed", s, src, seqs[src], "log", event_json({"n": s, "nan": math.nan}), float(s)))
    # big: events whose data make more than a chunk's bytes
    for s in range(1, 8):
        rows["big"].append(("big", s, "local", s, "log", event_json({"message": "z" * (CHUNK_BYTES // 4)}), float(s)))
    conn.execute("BEGIN IMMEDIATE")
    for run_id, evs in rows.items():
        conn.execute("INSERT INTO runs (id, status, target, options, graph, created_at, last_seq) "
                     "VALUES (?, 'succeeded', '\"local\"', '{}', '{}', 1.0, ?)", (run_id, len(evs)))
        last: dict[str, int] = {}
        for r in evs:
            last[r[2]] = r[3]
        conn.executemany("INSERT INTO run_sources (run_id, src, acked) VALUES (?,?,?)",
                         [(run_id, src, n) for src, n in last.items()])
        conn.executemany(V8_INSERT, evs)
    conn.execute("COMMIT")
    conn.close()
    return rows


def test_a_database_of_one_row_per_event_is_converted_with_every_event(tmp_path: Path) -> None:
    path = tmp_path / "cdui.sqlite3"
    rows = v8_database(path)
    store = Store(path)
    store.open()
    try:
        assert store.read_sync(lambda c: c.execute("PRAGMA user_version").fetchone()[0]) == len(MIGRATIONS)
        assert store.read_sync(lambda c: c.execute(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'run_events%'").fetchone()[0]) == 0

        async def go() -> None:
            for run_id, evs in rows.items():
                got = await store.events(run_id, 0, -1)
                want = [(r[1], r[4], json.loads(r[5]), r[6]) for r in evs]
                assert [e["seq"] for e in got] == [w[0] for w in want]
                assert all(same((e["seq"], e["kind"], e["data"], e["at"]), w) for e, w in zip(got, want, strict=True))
                for after in (0, 1, len(evs) // 2, len(evs) - 1):
                    page = await store.events(run_id, after, 3)
                    assert [e["seq"] for e in page] == [w[0] for w in want[after:after + 3]]
            # long: one source, cut every CHUNK_EVENTS; mixed: a chunk per stretch of one source; big: by bytes
            assert [(a, b) for a, b, *_ in chunks(store, "long")] == cut(1, 2500)
            assert chunks(store, "long")[-1][4] == 1
            assert [(a, b, src, s) for a, b, src, s, _f in chunks(store, "mixed")] == [
                (1, 1, "cp", 1), (2, 3, "worker:w", 1), (4, 4, "cp", 2), (5, 5, "worker:w", 3), (6, 7, "local", 1),
                (8, 8, "cp", 3)]
            assert [(a, b) for a, b, *_ in chunks(store, "big")] == [(1, 3), (4, 6), (7, 7)]
            assert await store.has_final_status_from("long", "worker:w")
            assert not await store.has_final_status_from("mixed", "worker:w")
            # Each event keeps its source and its number there.
            for run_id, evs in rows.items():
                got_rows = await store.read(lambda c, r=run_id: event_rows(c, r))
                assert [g[:4] for g in got_rows] == [(r[1], r[2], r[3], r[4]) for r in evs]
            # Appends go on after the converted events: the source's next number only.
            stored, acked = await store.append_events("long", "worker:w", [ev(2500), ev(2501)])
            assert acked == 2501 and [e["seq"] for e in stored] == [2501]
            assert [e["seq"] for e in await store.events("long", 2499)] == [2500, 2501]
            await store.delete_run("long")
            assert chunks(store, "long") == []
        run(go())
    finally:
        store.close()


@pytest.mark.parametrize("limit", [CHUNK_EVENTS - 1, CHUNK_EVENTS, CHUNK_EVENTS + 1])
def test_paging_through_a_flood_returns_each_event_once(store: Store, limit: int) -> None:
    """Reading as the streams do (the next page after the last seq received) yields every event once."""
    async def go() -> None:
        await store.create_run(new_run("r", status="running"))
        n = 0
        for size in (700, 1500, 1, 1, 2048):
            await store.append_events("r", "local", [ev(s) for s in range(n + 1, n + size + 1)])
            n += size
        seen: list[int] = []
        last = 0
        while page := await store.events("r", last, limit):
            seen += [e["seq"] for e in page]
            last = page[-1]["seq"]
        assert seen == list(range(1, n + 1))
    run(go())


def bodies(store: Store, run_id: str) -> list[str]:
    return store.read_sync(lambda c: [r[0] for r in c.execute(
        "SELECT body FROM run_event_chunks WHERE run_id=? ORDER BY first_seq", (run_id,)).fetchall()])


def test_events_stored_as_their_own_texts_read_back_as_encoded_ones(store: Store) -> None:
    """A batch given with each event's own text (a run's line, a worker's message as received) is
    stored as those texts joined, not encoded again; every page reads what the same events encoded
    read, across the chunks' edges and beside encoded chunks; a part with an event that has no text,
    or whose texts pass the bound on one event, is encoded as before (and cut to the bound)."""
    n = 2 * CHUNK_EVENTS + 40

    def line(e: dict[str, Any]) -> str:
        return json.dumps({"kind": e["kind"], "data": e["data"], "at": e["at"]})  # as a run writes it

    async def go() -> None:
        await store.create_run(new_run("t", status="running"))
        await store.create_run(new_run("e", status="running"))
        batch = [ev(s, message=f"event {s}", loss=s / 7, ok=s % 2 == 0, none=None) for s in range(1, n + 1)]
        batch[5]["data"] = {"loss": math.nan, "inf": math.inf}  # a run's line may hold them: read back as they were
        texts: list[str | None] = [line(e) for e in batch]
        texts[CHUNK_EVENTS + 3] = None  # its part (the second chunk) is encoded
        await store.append_events("t", "local", batch, texts=texts)
        await store.append_events("e", "local", batch)
        kinds = [b[:6] for b in bodies(store, "t")]
        assert kinds == ['{"e":[', '{"k":[', '{"e":['], kinds
        assert all(b.startswith('{"k":') for b in bodies(store, "e"))
        assert chunks(store, "t") == chunks(store, "e")
        for after in (0, 1, CHUNK_EVENTS - 1, CHUNK_EVENTS, CHUNK_EVENTS + 1, 2 * CHUNK_EVENTS, n - 1, n):
            for limit in (1, 3, CHUNK_EVENTS + 1, -1):
                got, want = await store.events("t", after, limit), await store.events("e", after, limit)
                assert len(got) == len(want) and same(got, want), (after, limit)
        assert same([r[1:] for r in store.read_sync(lambda c: event_rows(c, "t"))],
                    [r[1:] for r in store.read_sync(lambda c: event_rows(c, "e"))])
        # Over the bound on one event (the texts are measured as a whole): encoded, and cut, as before.
        big = [ev(n + 1, message="z" * 5000), ev(n + 2)]
        stored, acked = await store.append_events("t", "local", big, max_bytes=2000, texts=[line(e) for e in big])
        assert acked == n + 2 and bodies(store, "t")[-1].startswith('{"k":')
        assert len(event_json(stored[0]["data"])) <= 2000 and stored[1]["data"] == big[1]["data"]
        # A replay given with texts: what is stored already is skipped, the rest encoded (taken one by one).
        again = [ev(n + 2), ev(n + 3)]
        stored, acked = await store.append_events("t", "local", again, texts=[line(e) for e in again])
        assert acked == n + 3 and [e["seq"] for e in stored] == [n + 3]
        assert (await store.events("t", n + 2, 5))[0]["data"] == again[1]["data"]
    run(go())

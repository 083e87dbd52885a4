"""A run's events as stored: in chunks, one row for many events of one source.

A row per event capped the store at sqlite's own insert rate (about 250,000 rows a second on the
2-core machine of docs/performance.md, a B-tree insert for the row and one for its key each), while a
run logging flat out asks for more. An append of a source's events is one row of ``run_event_chunks``
per ``CHUNK_EVENTS`` events (fewer where their data pass ``CHUNK_BYTES``):

- ``first_seq`` and ``last_seq``: the run's gapless numbers of its first and last event (the events
  between follow without gaps); ``(run_id, first_seq)`` is the key;
- ``src`` and ``src_seq``: the source of all its events and the source's number of the first (the
  rest follow without gaps: the store accepts a source's next ``src_seq`` only);
- ``finals``: how many of its events are a final status (``succeeded``, ``failed``, ``cancelled``,
  ``interrupted``), so that "is a source's final status stored" reads no body;
- ``body``: ``{"k": [kinds], "a": [times], "d": [data]}`` as JSON, each event's data encoded as it
  was before (:func:`cdui.wire.event.event_json`) and decoded the same way: a page of events reads
  exactly what it read when each event was a row. Or ``{"e": [events]}``: each event's own JSON text
  as its recorder wrote it and the store received it, an object with at least ``kind``, ``data`` and
  ``at`` (its ``src_seq`` too where the text has it; the row's numbers are the record), joined
  without being decoded and encoded again (:func:`insert`'s ``texts``). Readers read both.

Readers see the same events in the same order: :func:`read_events` (``GET
/api/runs/{id}/events?after=`` and the streams page through it) cuts the chunk that holds
``after + 1`` and stops at ``limit``. (There is no view of one row per event: sqlite's JSON functions
refuse the ``NaN`` and ``Infinity`` an event's data may hold, e.g. a diverging loss.)
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from cdui.core.event_size import bound_event
from cdui.wire.event import event_json

# One chunk holds at most this many events, and takes no more once its data reach CHUNK_BYTES: a page
# of events decodes whole the chunk its first event is in, so a chunk stays small enough to read for
# one event (about 0.4 ms; a single event larger than this is a chunk of its own). Each chunk is still
# one row for 256 events, so sqlite's per-row work is no longer what bounds a flood.
CHUNK_EVENTS = 256
CHUNK_BYTES = 64 * 1024

FINAL = ("succeeded", "failed", "cancelled", "interrupted")

# sqlite's integers are 64-bit: ``after + 1`` of the largest ``?after=`` must stay one.
_MAX_SEQ = 2 ** 63 - 2

INSERT = ("INSERT INTO run_event_chunks (run_id, first_seq, last_seq, src, src_seq, finals, body) "
          "VALUES (?,?,?,?,?,?,?)")

# Migration 10 creates these (cdui/plane/store/migrations.py); kept here beside the code that fills them.
SCHEMA = [
    """CREATE TABLE run_event_chunks (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        src TEXT NOT NULL,
        src_seq INTEGER NOT NULL,
        finals INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_id, first_seq)
    )""",
    # The one lookup by source: whether a source's final status is stored.
    "CREATE INDEX run_event_chunks_finals ON run_event_chunks(run_id, src) WHERE finals > 0",
]

_encode = event_json


def is_final(kind: str, data: Any) -> bool:
    """A final status event (what ``json_extract(data, '$.status') IN (...)`` found in a row)."""
    return kind == "status" and isinstance(data, dict) and data.get("status") in FINAL


def body(kinds: list[str], ats: list[float], texts: list[str]) -> str:
    """A chunk's body from its events' kinds, times and data already encoded."""
    return '{"k":' + _encode(kinds) + ',"a":' + _encode(ats) + ',"d":[' + ",".join(texts) + "]}"


def spans(texts: list[str]) -> list[tuple[int, int]]:
    """[start, end) of each chunk the events of ``texts`` (their data, encoded) make, in order."""
    n = len(texts)
    if n <= CHUNK_EVENTS and sum(map(len, texts)) <= CHUNK_BYTES:
        return [(0, n)]
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, t in enumerate(texts):
        if i > start and (i - start >= CHUNK_EVENTS or size + len(t) > CHUNK_BYTES):
            out.append((start, i))
            start, size = i, 0
        size += len(t)
    out.append((start, n))
    return out


def text_body(texts: list[str]) -> str:
    """A chunk's body from its events' own texts (each a JSON object with ``kind``, ``data`` and ``at``)."""
    return '{"e":[' + ",".join(texts) + "]}"


def _columns(b: dict[str, Any]) -> tuple[list[str], list[float], list[Any]]:
    """(kinds, times, data) of a decoded body, of either form."""
    if "e" in b:
        evs = b["e"]
        return [e["kind"] for e in evs], [e["at"] for e in evs], [e["data"] for e in evs]
    return b["k"], b["a"], b["d"]


def _finals(kinds: list[str], datas: list[Any]) -> int:
    if "status" not in kinds:
        return 0
    return sum(1 for k, d in zip(kinds, datas, strict=True) if is_final(k, d))


def insert(c: sqlite3.Connection, run_id: str, src: str, first_seq: int, first_src_seq: int, kinds: list[str],
           datas: list[Any], ats: list[float], max_bytes: int = 0,
           texts: list[str | None] | None = None) -> list[Any]:
    """Store events of one run and source numbered on from ``first_seq`` (the run's) and
    ``first_src_seq`` (the source's), as one chunk or a few. No event's data is stored over
    ``max_bytes`` (cut by :func:`cdui.core.event_size.bound_event`); returns the data as stored.

    ``texts``: each event's own JSON text where its recorder's line is kept (None where not), ASCII
    and decoding to exactly the event's kind, data and time (the launcher and the protocol only keep
    a text so): a part whose events all have one is stored as those texts joined, not encoded again
    (about 0.75 µs an event of a flood); the bound holds on the whole part, as for encoded data."""
    out: list[Any] = []
    for a in range(0, len(kinds), CHUNK_EVENTS):
        b = min(len(kinds), a + CHUNK_EVENTS)
        part = datas[a:b]
        if texts is not None:
            own = texts[a:b]
            if None not in own:
                size = sum(map(len, own))  # type: ignore[arg-type]  # no None in it
                if size <= CHUNK_BYTES and (max_bytes <= 0 or size <= max_bytes):
                    c.execute(INSERT, (run_id, first_seq + a, first_seq + b - 1, src, first_src_seq + a,
                                       _finals(kinds[a:b], part), text_body(own)))  # type: ignore[arg-type]
                    out += part
                    continue
        # The usual case: the part's data encoded in one call, one chunk. ASCII JSON is at least as
        # long as the same data as UTF-8: within the bound as a whole, each event is within it.
        whole = _encode(part)
        if len(whole) <= CHUNK_BYTES and (max_bytes <= 0 or len(whole) <= max_bytes):
            c.execute(INSERT, (run_id, first_seq + a, first_seq + b - 1, src, first_src_seq + a,
                               _finals(kinds[a:b], part),
                               '{"k":' + _encode(kinds[a:b]) + ',"a":' + _encode(ats[a:b]) + ',"d":' + whole + "}"))
        else:
            part = _insert_each(c, run_id, src, first_seq + a, first_src_seq + a, kinds[a:b], part, ats[a:b],
                                max_bytes)
        out += part
    return out


def _insert_each(c: sqlite3.Connection, run_id: str, src: str, first_seq: int, first_src_seq: int,
                 kinds: list[str], datas: list[Any], ats: list[float], max_bytes: int) -> list[Any]:
    """:func:`insert` of events whose data are large: each measured (and cut) on its own, the
    chunks cut at CHUNK_BYTES."""
    texts = [_encode(d) for d in datas]
    if max_bytes > 0 and max(map(len, texts)) > max_bytes:
        datas = list(datas)
        for i, t in enumerate(texts):
            if len(t) > max_bytes:
                datas[i] = bound_event(kinds[i], datas[i], max_bytes)
                texts[i] = _encode(datas[i])
    for a, b in spans(texts):
        c.execute(INSERT, (run_id, first_seq + a, first_seq + b - 1, src, first_src_seq + a,
                           _finals(kinds[a:b], datas[a:b]), body(kinds[a:b], ats[a:b], texts[a:b])))
    return datas


def read_events(c: sqlite3.Connection, run_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    """The run's events after ``after``, in order, at most ``limit`` (below 0: all, as sqlite's LIMIT)."""
    out: list[dict[str, Any]] = []
    if limit == 0:
        return out
    start = min(max(after, 0), _MAX_SEQ) + 1  # the first seq wanted
    cur = c.execute("SELECT first_seq, body FROM run_event_chunks WHERE run_id=? AND first_seq >= "
                    "COALESCE((SELECT MAX(first_seq) FROM run_event_chunks WHERE run_id=? AND first_seq<=?), 0) "
                    "ORDER BY first_seq", (run_id, run_id, start))
    try:
        while True:
            row = cur.fetchone()
            if row is None:
                break
            first, b = row[0], json.loads(row[1])
            skip = max(0, start - first)
            if "e" in b:  # the events' own texts: each already an object, read as it is
                out += [{"seq": seq, "kind": e["kind"], "data": e["data"], "at": e["at"]}
                        for seq, e in enumerate(b["e"][skip:], first + skip)]
            else:
                kinds, ats, datas = b["k"], b["a"], b["d"]
                for i in range(skip, len(kinds)):
                    out.append({"seq": first + i, "kind": kinds[i], "data": datas[i], "at": ats[i]})
            if 0 < limit <= len(out):
                del out[limit:]
                break
    finally:
        cur.close()  # a statement left open would hold its snapshot, and with it the checkpointer
    return out


def event_rows(c: sqlite3.Connection, run_id: str) -> list[tuple[int, str, int, str, Any, float]]:
    """Every event of a run as (seq, src, src_seq, kind, data, at), in order: the row each event had
    before chunks, for reading a database by hand (``cdui``'s own reads are :func:`read_events`)."""
    out: list[tuple[int, str, int, str, Any, float]] = []
    for first, src, src_seq, text in c.execute("SELECT first_seq, src, src_seq, body FROM run_event_chunks "
                                               "WHERE run_id=? ORDER BY first_seq", (run_id,)).fetchall():
        kinds, ats, datas = _columns(json.loads(text))
        events = zip(kinds, datas, ats, strict=True)
        out += [(first + i, src, src_seq + i, k, d, a) for i, (k, d, a) in enumerate(events)]
    return out


def has_final(c: sqlite3.Connection, run_id: str, src: str) -> bool:
    return c.execute("SELECT 1 FROM run_event_chunks WHERE run_id=? AND src=? AND finals>0 LIMIT 1",
                     (run_id, src)).fetchone() is not None


def convert(c: sqlite3.Connection) -> None:
    """Migration 10: ``run_events``' rows into chunks, every event kept with its numbers, kind, time
    and data (the data's JSON text joined as it was stored); then the table is dropped."""
    for stmt in SCHEMA:
        c.execute(stmt)
    old = c.execute("SELECT run_id, seq, src, src_seq, kind, data, at FROM run_events ORDER BY run_id, seq")
    group: list[tuple[Any, ...]] = []
    size = 0

    def flush() -> None:
        run_id, src = group[0][0], group[0][2]
        finals = sum(1 for r in group if r[4] == "status" and is_final(r[4], json.loads(r[5])))
        c.execute(INSERT, (run_id, group[0][1], group[-1][1], src, group[0][3], finals,
                           body([r[4] for r in group], [r[6] for r in group], [r[5] for r in group])))

    while True:
        rows = old.fetchmany(4096)
        if not rows:
            break
        for r in rows:
            r = tuple(r)
            if group:
                last = group[-1]
                if (r[0] != last[0] or r[2] != last[2] or r[1] != last[1] + 1 or r[3] != last[3] + 1
                        or len(group) >= CHUNK_EVENTS or size + len(r[5]) > CHUNK_BYTES):
                    flush()
                    group, size = [], 0
            group.append(r)
            size += len(r[5])
    if group:
        flush()
    old.close()
    c.execute("DROP TABLE run_events")

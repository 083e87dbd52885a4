"""The machine's limits: what the goals of the other benchmarks are set against, measured in the same run.

- fork of a process that has already imported torch: ``os.fork()``, the child's ``os._exit(0)``, the
  parent's ``waitpid`` (what a zygote pays per run at the least), p50 and p95;
- sqlite in WAL mode with the store's pragmas (cdui/plane/store/database.py): rows inserted per second with
  ``executemany`` in transactions of 1,000 rows, into a table of one row per event (how events were stored
  until migration 10); and events per second written as the store now writes them, many to a row of
  ``run_event_chunks`` (cdui/plane/store/event_chunks.py), the rows' bodies made beforehand;
- sha256 on one core (hashlib, 1 MiB pieces), in GB/s (10^9 bytes) per second of the thread's CPU time, so
  that a busy machine does not make the core look slower than it is;
- writing a new file into the page cache (256 KiB pieces, not synced), in GB/s per second of the thread's
  CPU time: with sha256, what a file received over the network costs the receiver (an agent's download,
  the control plane's upload) beside reading the socket;
- a loopback TCP round trip (one byte each way, Nagle off, the echo in another process), p50;
- Nomad's published 3,750 placements/s, the peer scheduler's figure: a constant, not measured.

    .venv/bin/python bench/limits.py [--forks 200] [--rows 1000000] [--sha-mib 1024] [--round-trips 5000]
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from common import Figure, parser, pct, report, say

B = "limits"
BATCH = 1000
CHUNKS_PER_TXN = 4  # rows of the store's chunks in one transaction: 1,024 events, about BATCH
# HashiCorp's million-container challenge: the figure issue #24 compares dispatch against.
NOMAD_PLACEMENTS_PER_S = 3750.0

# One row per event: the events table as it was until migration 10 (run_events, as migration 8 left it),
# without the foreign key to runs. The store now keeps many events to a row (run_event_chunks, below), but a
# row per event is what issue #24 sets the limit of sqlite's batch inserts with.
ROW_TABLE = """
    CREATE TABLE run_events (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        src TEXT NOT NULL,
        src_seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_id, seq)
    )"""


def fork_ms(n: int, with_torch: bool) -> list[float]:
    if with_torch:
        say("importing torch")
        import torch  # noqa: F401  (what the zygote holds when it forks)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        took.append((time.perf_counter() - t0) * 1000)
    return took


def sqlite_rows_per_s(rows: int) -> float:
    from cdui.plane.store.database import _connect  # the store's own pragmas: WAL, synchronous=NORMAL

    data = json.dumps({"node": "f", "message": "event 123456"})
    with tempfile.TemporaryDirectory(prefix="cdui-bench-limits-", dir=os.environ.get("CDUI_BENCH_TMP")) as tmp:
        conn = _connect(Path(tmp) / "limits.db")
        try:
            conn.execute(ROW_TABLE)
            sql = "INSERT INTO run_events (run_id, seq, src, src_seq, kind, data, at) VALUES (?,?,?,?,?,?,?)"
            now = time.time()
            t0 = time.perf_counter()
            for start in range(0, rows, BATCH):
                batch = [("r1", i, "run", i, "log", data, now) for i in range(start, min(rows, start + BATCH))]
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, batch)
                conn.execute("COMMIT")
            took = time.perf_counter() - t0
        finally:
            conn.close()
    return rows / took


def sqlite_chunk_events_per_s(events: int) -> float:
    """Events per second written as the store writes them: rows of ``run_event_chunks`` (its own schema,
    the foreign key to a run included) of CHUNK_EVENTS events each, CHUNKS_PER_TXN rows a transaction; the
    rows' bodies are made beforehand, so this is sqlite's part of an append alone."""
    from cdui.plane.store import event_chunks
    from cdui.plane.store.database import _connect

    per = event_chunks.CHUNK_EVENTS
    now = time.time()
    body = event_chunks.body(["log"] * per, [now] * per,
                             [json.dumps({"node": "f", "message": f"event {i}", "level": "info"}) for i in range(per)])
    with tempfile.TemporaryDirectory(prefix="cdui-bench-limits-", dir=os.environ.get("CDUI_BENCH_TMP")) as tmp:
        conn = _connect(Path(tmp) / "limits.db")
        try:
            conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY)")
            conn.execute("INSERT INTO runs (id) VALUES ('r1')")
            for stmt in event_chunks.SCHEMA:
                conn.execute(stmt)
            firsts = range(1, events + 1, per)
            t0 = time.perf_counter()
            for i in range(0, len(firsts), CHUNKS_PER_TXN):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(event_chunks.INSERT, [("r1", f, f + per - 1, "local", f, 0, body)
                                                       for f in firsts[i:i + CHUNKS_PER_TXN]])
                conn.execute("COMMIT")
            took = time.perf_counter() - t0
        finally:
            conn.close()
    return len(firsts) * per / took


def sha256_gb_per_s(mib: int) -> float:
    """Per second of this thread's CPU time: what one core does, however busy the machine is."""
    block = os.urandom(1 << 20)
    h = hashlib.sha256()
    t0 = time.thread_time()
    for _ in range(mib):
        h.update(block)
    return (mib << 20) / (time.thread_time() - t0) / 1e9


def page_cache_write_gb_per_s(mib: int, folder: str | None = None) -> float:
    """Per second of this thread's CPU time (kernel time included: the copy and the pages' allocation)."""
    import tempfile
    block = os.urandom(256 << 10)
    with tempfile.NamedTemporaryFile(dir=folder, prefix="cdui-bench-write-") as fh:
        raw = fh.fileno()
        t0 = time.thread_time()
        for _ in range(mib * 4):
            os.write(raw, block)
        took = time.thread_time() - t0
    return (mib << 20) / took / 1e9


def round_trip_ms(n: int) -> list[float]:
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        pid = os.fork()
        if pid == 0:  # the echo: another process, as the other side of a connection is
            try:
                conn, _ = lsock.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while b := conn.recv(1):
                    conn.sendall(b)
            finally:
                os._exit(0)
        try:
            with socket.create_connection(lsock.getsockname()) as c:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                took = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    c.sendall(b"x")
                    c.recv(1)
                    took.append((time.perf_counter() - t0) * 1000)
        finally:
            os.waitpid(pid, 0)
    return took


def measure(forks: int, rows: int, sha_mib: int, trips: int, with_torch: bool) -> list[Figure]:
    # The round trip first, while this process is small (its fork copies little).
    say(f"{trips} loopback round trips")
    rtt = round_trip_ms(trips)
    say(f"sha256 of {sha_mib} MiB")
    sha = sha256_gb_per_s(sha_mib)
    say(f"writing {sha_mib} MiB into the page cache")
    wr = page_cache_write_gb_per_s(sha_mib)
    say(f"{rows:,} sqlite rows")
    ins = sqlite_rows_per_s(rows)
    say(f"{rows:,} events in sqlite rows of the store's chunks")
    chunked = sqlite_chunk_events_per_s(rows)
    from cdui.plane.store.event_chunks import CHUNK_EVENTS
    say(f"{forks} forks")
    fk = fork_ms(forks, with_torch)
    what = "that has imported torch" if with_torch else "(smoke: torch not imported)"
    return [
        Figure(B, f"fork + exit + waitpid of a process {what}: p50", pct(fk, 50), "ms",
               note="issue #24: about 10-30 ms"),
        Figure(B, f"fork + exit + waitpid of a process {what}: p95", pct(fk, 95), "ms"),
        Figure(B, f"sqlite WAL inserts, {BATCH:,}-row transactions, a row per event as events were stored until "
                  f"migration 10 ({rows:,} rows)", ins, "rows/s", note="issue #24: > 300,000"),
        Figure(B, f"sqlite WAL inserts of the store's event chunks ({CHUNK_EVENTS} events a row, bodies made "
                  f"beforehand), {CHUNKS_PER_TXN}-row transactions ({rows:,} events)", chunked, "events/s",
               note="the most the store's append could reach: sqlite's part of it alone"),
        Figure(B, "sha256 on one core (per second of its CPU time)", sha, "GB/s", note="issue #24: about 1-2"),
        Figure(B, "writing a new file into the page cache, 256 KiB pieces (per second of its CPU time)", wr, "GB/s",
               note="with sha256, what a received file costs beside the socket"),
        Figure(B, "loopback TCP round trip, 1 byte each way: p50", pct(rtt, 50), "ms", note="issue #24: about 0.1"),
        Figure(B, "Nomad's published placements per second (peer scheduler; a constant, not measured)",
               NOMAD_PLACEMENTS_PER_S, "placements/s"),
    ]


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--forks", type=int, default=200)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--sha-mib", type=int, default=1024)
    p.add_argument("--round-trips", type=int, default=5000)
    a = p.parse_args()
    if a.smoke:
        report(measure(5, 5000, 16, 50, with_torch=False), a.json)
    else:
        report(measure(a.forks, a.rows, a.sha_mib, a.round_trips, with_torch=True), a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

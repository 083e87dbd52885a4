"""The control plane's database: sqlite3 in WAL mode, one writer.

Invariants (see docs/architecture.md):

- **One writer.** Every write goes through :meth:`Store.write`, which hands a
  function to the single writer thread. The writer takes every job waiting in
  its queue (``BATCH_JOBS`` at most), runs each in its own SAVEPOINT inside a
  ``BEGIN IMMEDIATE`` transaction (group commit), commits, then resolves the
  callers' futures: an event batch is acknowledged only after the commit that
  holds it. A transaction stops taking jobs once they carry ``BATCH_EVENTS``
  events, and a run's few events (``LIGHT_JOB``) that wait only behind other
  runs' big batches get a transaction before them, so a run logging flat out
  delays other runs' events by the one transaction in progress at most; each
  run's writes, and every job that names no run, keep their order. A failing
  job rolls back only itself. The event loop never blocks on sqlite; request
  handlers never write directly.
- **Checkpoints** (copying the WAL into the database) are a thread's of their
  own, with their own connection, every ``CHECKPOINT_ROWS`` rows written: never
  inside a commit, unless the WAL outgrew ``WAL_CAP_BYTES``.
- **Reads** run on worker threads, each with its own connection.
- **Events** are stored with a gapless per-run ``seq`` assigned here, and the
  pair ``(src, src_seq)`` given by the recorder that produced them. An event
  is accepted only as the next ``src_seq`` of its source; a repeat is a no-op
  and a gap is refused. :meth:`append_events` returns the highest contiguous
  ``src_seq`` stored, which is what gets acknowledged (after the commit). An
  append's accepted events are one row of ``run_event_chunks`` (or a few, see
  :mod:`~cdui.plane.store.event_chunks`), not a row each.
- Schema changes are numbered migrations applied in order; ``PRAGMA
  user_version`` holds the number applied.
- **A full disk** (see :mod:`cdui.core.diskfull`) fails the batch's jobs with
  :class:`~cdui.core.diskfull.DiskFull`, never silently. While it lasts only
  *essential* jobs (a run's final status) are tried, with the reserve file
  given up to make room for them; the rest are refused at once. The writer
  probes every ``probe_s`` seconds and resumes by itself once there is room.
  Listeners (``on_disk_state``) hear of both changes, from the writer thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar, overload

from cdui.core.diskfull import DiskFull, Reserve, free_bytes, is_disk_full
from cdui.core.private import make_private, private_dir
from cdui.plane.store import event_chunks
from cdui.plane.store.apps import AppRows
from cdui.plane.store.migrations import migrate
from cdui.plane.store.ssh import SshWorkerRows
from cdui.plane.store.studies import StudyRows
from cdui.plane.store.sweeps import SweepRows, claim_variant
from cdui.plane.store.tokens import TokenRows
from cdui.plane.store.workers import WorkerRows
from cdui.wire.event import event_json
from cdui.wire.target import Target, parse_target, target_json

log = logging.getLogger(__name__)
T = TypeVar("T")

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
ACTIVE = {"running", "disconnected"}


@dataclass(frozen=True)
class Run:
    """One row of ``runs``, as read: a snapshot, never written back (changes go
    through :meth:`Store.update_run` and friends). JSON columns are decoded;
    ``graph`` is None unless the read asked for it (it can be large)."""

    id: str
    status: str
    target: Target                  # stored as target_json gives it
    options: dict[str, Any]
    created_at: float
    name: str | None = None
    graph: dict[str, Any] | None = None
    worker_id: str | None = None
    slot_device: str | None = None
    queue_reason: str | None = None
    error: str | None = None
    late_result: dict[str, Any] | None = None
    execution_facts: dict[str, Any] = field(default_factory=dict)
    stop_requested: bool = False
    last_seq: int = 0
    disconnected_at: float | None = None
    adopted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    tags: tuple[str, ...] = ()
    note: str | None = None

    def without_graph(self) -> Run:
        return replace(self, graph=None)


# A read of runs without their graphs (they can be large): every column but ``graph``.
_SELECT_NO_GRAPH = ("SELECT id, name, status, target, options, worker_id, slot_device, queue_reason, error, "
                    "late_result, execution_facts, stop_requested, last_seq, disconnected_at, adopted_at, "
                    "created_at, started_at, finished_at, tags, note FROM runs")
_JSON_COLUMNS = ("target", "options", "graph", "late_result", "execution_facts", "tags")
# Its columns' names, in its order (what a ListedRow's values are).
_NO_GRAPH_COLUMNS = tuple(c.strip() for c in _SELECT_NO_GRAPH[len("SELECT "):-len(" FROM runs")].split(","))


# The runs listing in one sqlite step (see Store.list_rows_sync): its rows as one JSON array of arrays, each
# the columns of _SELECT_NO_GRAPH in their order, then the rowid. A REAL column is written as text with 21
# significant digits (what sqlite's own quote() writes when 15 do not give the number back), read back
# exactly by float(); sqlite's JSON writes reals with 15. The statement's WHERE and its end follow, as for
# _SELECT_NO_GRAPH.
_SELECT_ONE_STEP = (
    "SELECT json_group_array(json_array(id, name, status, target, options, worker_id, slot_device, queue_reason, "
    "error, late_result, execution_facts, stop_requested, last_seq, "
    "CASE WHEN disconnected_at IS NULL THEN NULL ELSE printf('%!.20e', disconnected_at) END, "
    "CASE WHEN adopted_at IS NULL THEN NULL ELSE printf('%!.20e', adopted_at) END, "
    "CASE WHEN created_at IS NULL THEN NULL ELSE printf('%!.20e', created_at) END, "
    "CASE WHEN started_at IS NULL THEN NULL ELSE printf('%!.20e', started_at) END, "
    "CASE WHEN finished_at IS NULL THEN NULL ELSE printf('%!.20e', finished_at) END, "
    "tags, note, rowid)) FROM (SELECT rowid, id, name, status, target, options, worker_id, slot_device, "
    "queue_reason, error, late_result, execution_facts, stop_requested, last_seq, disconnected_at, adopted_at, "
    "created_at, started_at, finished_at, tags, note FROM runs")
_REAL_AT = (13, 14, 15, 16, 17)  # disconnected_at, adopted_at, created_at, started_at, finished_at
_CREATED_AT = 15
# Reals that a printf short of exact would give back otherwise (the extremes and a timestamp's microseconds).
_REAL_PROBES = (5e-324, 2.2250738585072014e-308, 1.3609679781160653e+303, 1.7976931348623157e+308,
                1764780000.1234567, 1764780000.0, 0.1, -1.5e-7)


def _one_step_listing_works(conn: sqlite3.Connection) -> bool:
    """Whether this sqlite has the JSON functions and writes every probe real back exactly (newer
    sqlite formats floats exactly; an older one on a platform without an extended long double may not)."""
    try:
        text = conn.execute("SELECT json_group_array(printf('%!.20e', value)) FROM "
                            "(SELECT ? AS value UNION ALL SELECT ? UNION ALL SELECT ? UNION ALL SELECT ? "
                            "UNION ALL SELECT ? UNION ALL SELECT ? UNION ALL SELECT ? UNION ALL SELECT ?)",
                            _REAL_PROBES).fetchone()[0]
        return sorted(float(x) for x in json.loads(text)) == sorted(_REAL_PROBES)
    except (sqlite3.Error, ValueError, TypeError):
        return False


class ListedRow:
    """One row of a runs listing as read, not decoded (``values``: the columns of ``_SELECT_NO_GRAPH`` in
    their order). Two reads of an unchanged row are equal, so a listing can reuse what it made of a row
    the last time without decoding its JSON columns again (GET /api/runs: decoding 200 rows was most of
    a listing's time, every time, though under a backlog hardly any of them changes)."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    @property
    def id(self) -> str:
        return str(self.values[0])

    @property
    def status(self) -> str:
        return str(self.values[2])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ListedRow) and self.values == other.values

    __hash__ = None  # type: ignore[assignment]  # compared, never a key

    def run(self) -> Run:
        """The row decoded (without its graph), as :meth:`Store.list_runs` gives it."""
        return Store._run_from_row(dict(zip(_NO_GRAPH_COLUMNS, self.values, strict=True)), with_graph=False)


@dataclass(frozen=True)
class RunFilter:
    """What a runs listing keeps (every field optional; all given ones must hold).

    ``target`` is the stored target text (``target_json``'s JSON), ``search`` a piece of text found
    in the run's id, name, error, note or tags (case-insensitive for ASCII letters), ``after`` a run id:
    only runs listed after it (older), for the next page."""
    status: str | None = None
    target: str | None = None
    worker: str | None = None
    tag: str | None = None
    search: str | None = None
    after: str | None = None


def _like(text: str) -> str:
    """``text`` as a LIKE pattern that matches it anywhere, its own % and _ taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"



def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _row(r: sqlite3.Row | None) -> dict[str, Any] | None:
    return dict(r) if r is not None else None


# The WAL is copied into the database by a thread of its own, with its own connection, once the
# writer has committed about this many rows since the last copy: sqlite's own automatic checkpoint
# ran inside whichever commit crossed its threshold, and that commit's writer then spent tens of
# milliseconds copying and syncing megabytes while every run's events waited behind it.
CHECKPOINT_ROWS = 4000
# ... unless the WAL has grown past this (the copier cannot keep up, or a long read holds it back):
# then the writer copies what it can itself, between two transactions, as sqlite would have.
WAL_CAP_BYTES = 64 * 1024 * 1024

# One transaction takes at most this many jobs, and stops taking more once its jobs carry this many
# events: a run logging flat out queues batches of up to a thousand events, and a transaction of many
# such batches would hold back every other run's events (and everyone's acknowledgements) behind it.
BATCH_JOBS = 500
BATCH_EVENTS = 4000


# A job of at most this many rows that waits behind bigger jobs of other runs only (a run's event or
# two while another floods) is committed in a transaction of its own before them: its run's watchers
# see it without waiting for thousands of another run's events to be stored first.
LIGHT_JOB = 16


class _Job:
    __slots__ = ("fn", "future", "loop", "essential", "weight", "run_id")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], future: asyncio.Future[Any] | None,
                 loop: asyncio.AbstractEventLoop | None, essential: bool = False, weight: int = 1,
                 run_id: str | None = None) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop
        self.essential = essential
        self.weight = weight  # rows it writes, roughly: what bounds a transaction (BATCH_EVENTS)
        self.run_id = run_id  # the one run whose rows it writes; None: any (it keeps its place)


def _light_first(jobs: list[_Job]) -> tuple[list[_Job], list[_Job]]:
    """(the light jobs to commit first, the rest in their order): a light job goes first when only
    big jobs of other runs are before it, so each run's writes keep their order; a job of no one
    run (``run_id`` None) may concern any, so it and every job after it keep their places."""
    first: list[_Job] = []
    rest: list[_Job] = []
    held: set[str] = set()  # the runs of the jobs that stay behind
    for i, j in enumerate(jobs):
        if j.run_id is None:
            return first, rest + jobs[i:]
        if j.weight <= LIGHT_JOB and j.run_id not in held:
            first.append(j)
        else:
            held.add(j.run_id)
            rest.append(j)
    return first, rest


def _by_weight(jobs: list[_Job]) -> list[list[_Job]]:
    """Consecutive transactions of ``jobs``, each taking no more jobs once it carries BATCH_EVENTS rows."""
    out: list[list[_Job]] = []
    weight = BATCH_EVENTS
    for j in jobs:
        if weight >= BATCH_EVENTS:
            out.append([])
            weight = 0
        out[-1].append(j)
        weight += j.weight
    return out


class Store:
    def __init__(self, path: Path, probe_s: float = 2.0) -> None:
        self.path = Path(path)
        self._q: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        # Set while commits fail for another reason than a full disk (a read-only file or file system, a
        # broken disk): health reports it, until a commit succeeds again.
        self.unwritable: dict[str, Any] | None = None
        self._local = threading.local()
        self._one_step: bool | None = None  # whether the runs listing is read in one sqlite step (list_rows_sync)
        self.commits = 0
        self.reserve = Reserve(self.path.with_name(self.path.name + ".reserve"))
        self.probe_s = probe_s
        # Set while the disk is full: {"since": epoch seconds, "detail": sqlite's or the OS's words}.
        self.full: dict[str, Any] | None = None
        self.on_disk_state: list[Callable[[dict[str, Any] | None], object]] = []  # results are ignored
        self._last_probe = 0.0
        self._checkpoint_wanted = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self._closing = False
        self._rows_since_checkpoint = 0
        # Each waiting event loop's resolver of finished jobs (only the writer thread reads or adds to it).
        self._resolvers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Resolver] = weakref.WeakKeyDictionary()
        self.checkpoints = 0  # copies of the WAL into the database, by the checkpointer or (capped) the writer
        # The tables whose statements live in their own modules; runs, events, artifacts and
        # uploads are this class's own methods below.
        self.workers = WorkerRows(self)
        self.tokens = TokenRows(self)
        self.ssh = SshWorkerRows(self)
        self.sweeps = SweepRows(self)
        self.studies = StudyRows(self)
        self.apps = AppRows(self)

    # -- lifecycle -------------------------------------------------------
    def open(self) -> None:
        if not self.path.parent.exists():
            private_dir(self.path.parent)
        # sqlite creates the WAL and SHM with the database's own mode, so a
        # private database (created 0600 here, whatever the umask) keeps all
        # three private; older files with wider bits are tightened.
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if suffix == "" or p.exists():
                make_private(p)
        conn = _connect(self.path)
        migrate(conn)
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread does it (CHECKPOINT_ROWS)
        # A WAL that a flood made large is cut back to this when it starts over, so that its size
        # says how much is waiting to be copied (WAL_CAP_BYTES).
        conn.execute("PRAGMA journal_size_limit=16777216")  # 16 MiB, a quarter of WAL_CAP_BYTES
        self._writer_conn = conn
        self._closing = False
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="sqlite-checkpoint", daemon=True)
        self._checkpointer.start()
        if not self.reserve.make():
            log.warning("could not set aside %d bytes next to %s: the disk is (nearly) full", self.reserve.size,
                        self.path)
        self._thread = threading.Thread(target=self._writer, name="sqlite-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread:
            self._q.put(None)
            self._thread.join(timeout=10)
            self._thread = None
        if self._checkpointer:
            self._closing = True
            self._checkpoint_wanted.set()
            self._checkpointer.join(timeout=10)
            self._checkpointer = None

    # -- the checkpointer ----------------------------------------------------
    def _checkpoint_loop(self) -> None:
        """Copy the WAL into the database whenever the writer asks (PASSIVE: never waits for the
        writer or for readers, and the writer never waits for it; the WAL starts over at the next
        transaction after a copy that caught up)."""
        conn = _connect(self.path)
        try:
            while True:
                self._checkpoint_wanted.wait()
                self._checkpoint_wanted.clear()
                if self._closing:
                    return
                self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as exc:  # a full disk, a busy lock: the next one tries again
            log.warning("copying the WAL into %s failed: %s", self.path, exc)

    def _after_commit(self, conn: sqlite3.Connection, rows: int) -> None:
        """Ask for a checkpoint every CHECKPOINT_ROWS rows; past WAL_CAP_BYTES, make one here."""
        self._rows_since_checkpoint += rows
        if self._rows_since_checkpoint < CHECKPOINT_ROWS:
            return
        self._rows_since_checkpoint = 0
        try:
            wal = Path(str(self.path) + "-wal").stat().st_size
        except OSError:
            wal = 0
        if wal > WAL_CAP_BYTES:
            self._checkpoint(conn)
        else:
            self._checkpoint_wanted.set()

    # -- the writer --------------------------------------------------------
    def _writer(self) -> None:
        conn = self._writer_conn
        while True:
            try:
                job = self._q.get(timeout=self.probe_s if self.full else None)
            except queue.Empty:
                self._probe()
                continue
            if job is None:
                conn.close()
                return
            jobs = [job]
            stop = False
            while len(jobs) < BATCH_JOBS:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
            # What waits is written in transactions of up to BATCH_EVENTS rows, in order, except that
            # a run's few events go first when only other runs' big batches are ahead of them.
            first, rest = _light_first(jobs)
            for part in (first, rest):
                for txn in _by_weight(part):
                    self._run_jobs(conn, txn)
            if stop:
                conn.close()
                return

    def _run_jobs(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        if self.full:
            self._probe()
        refused: list[_Job] = []
        if self.full:
            # Keep what room there is for the writes that end runs.
            refused = [j for j in jobs if not j.essential]
            jobs = [j for j in jobs if j.essential]
        results, exc = self._batch(conn, jobs) if jobs else ([], None)
        if exc is not None and is_disk_full(exc, free_bytes(self.path.parent)):
            self._set_full(exc)
            essential = [j for j in jobs if j.essential]
            refused += [j for j in jobs if not j.essential]
            results, exc = [], None
            if essential:
                results, exc = self._batch(conn, essential)
                if exc is not None and self.reserve.release():
                    log.warning("disk full: gave up the reserve %s to store %d final status(es)",
                                self.reserve.path, len(essential))
                    results, exc = self._batch(conn, essential)
                if exc is not None:
                    log.error("disk full: even a run's final status could not be stored: %s", exc)
                    results = [(j, None, self.disk_full_error()) for j in essential]
                    exc = None
        elif exc is not None:
            log.error("sqlite commit failed: %s", exc, exc_info=exc)
            results = [(j, None, exc) for j in jobs]
            if self.unwritable is None:
                self.unwritable = {"since": time.time(), "detail": str(exc)[:300]}
        elif jobs and self.unwritable is not None:
            log.warning("the database %s takes writes again", self.path)
            self.unwritable = None
        err = self.disk_full_error() if refused else None
        results += [(j, None, err) for j in refused]
        # One wake-up of each waiting loop per transaction, not one per job: under load a transaction
        # holds hundreds of jobs, and each call_soon_threadsafe writes to the loop's wake-up pipe.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for j, res, e in results:
            if j.future is not None and j.loop is not None:
                by_loop.setdefault(j.loop, []).append((j.future, res, e))
        for loop, done in by_loop.items():
            resolver = self._resolvers.get(loop)
            if resolver is None:
                resolver = self._resolvers[loop] = _Resolver(loop)
            loop.call_soon_threadsafe(resolver.add, done)

    def _batch(self, conn: sqlite3.Connection, jobs: list[_Job]
               ) -> tuple[list[tuple[_Job, Any, BaseException | None]], BaseException | None]:
        """One transaction, a savepoint per job; (results, None) or ([], why the batch failed)."""
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for j in jobs:
                conn.execute("SAVEPOINT job")
                try:
                    res = j.fn(conn)
                    conn.execute("RELEASE job")
                    results.append((j, res, None))
                except BaseException as exc:  # rolled back alone; reported to its caller
                    if is_disk_full(exc, free_bytes(self.path.parent)):
                        raise  # the transaction itself cannot go on
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    results.append((j, None, exc))
            conn.execute("COMMIT")
            self.commits += 1
            self._after_commit(conn, sum(j.weight for j in jobs))
            return results, None
        except BaseException as exc:  # the commit failed (sqlite rolled back, or we do): every job failed
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            return [], exc

    def disk_full_error(self) -> DiskFull:
        """The error for writes refused while the disk is full."""
        return DiskFull(self.path.parent, (self.full or {}).get("detail", "no space left"))

    def _set_full(self, exc: BaseException) -> None:
        if self.full is None:
            self.full = {"since": time.time(), "detail": str(exc)}
            self._last_probe = time.monotonic()
            log.error("disk full under %s (%s): refusing writes except runs' final statuses until there is "
                      "room again", self.path.parent, exc)
            self._tell(self.full)

    def _probe(self) -> None:
        """Is there room again? The reserve can be allocated and as much again stays free."""
        now = time.monotonic()
        if now - self._last_probe < self.probe_s:
            return
        self._last_probe = now
        if not self.reserve.make() or free_bytes(self.path.parent) < self.reserve.size:
            return
        log.warning("disk space is back under %s: writes resume", self.path.parent)
        self.full = None
        self._tell(None)

    def _tell(self, state: dict[str, Any] | None) -> None:
        for cb in list(self.on_disk_state):
            try:
                cb(state)
            except Exception:  # a listener must not stop the writer
                log.exception("disk state listener failed")

    def problems(self) -> list[dict[str, Any]]:
        """What keeps this store from working normally, as health reports it."""
        out: list[dict[str, Any]] = []
        if self.full:
            err = self.disk_full_error()
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.full["since"]))
            out.append({"code": "disk_full", "message": f"{err.message}, since {since}; new runs are refused and "
                                                        f"runs whose events could not be stored ended failed",
                        "hint": err.hint})
        bad = self.unwritable
        if bad is not None:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(bad["since"]))
            out.append({"code": "database_not_writable",
                        "message": f"the database {self.path} refuses writes ({bad['detail']}), since {since}",
                        "hint": f"check that {self.path} and its folder are writable by this user and its disk is "
                                "healthy (the server log has the error); writes resume by themselves once one "
                                "succeeds"})
        elif self._thread is not None and not self._thread.is_alive():
            out.append({"code": "database_not_writable", "message": f"the database writer of {self.path} stopped",
                        "hint": "restart the server; the server log says why it stopped"})
        return out

    async def write(self, fn: Callable[[sqlite3.Connection], T], essential: bool = False, weight: int = 1,
                    run_id: str | None = None) -> T:
        """Run ``fn`` in the writer's next transaction. ``essential``: tried even while the
        disk is full, with the reserve given up if needed (for a run's final status).
        ``weight``: about how many rows it writes (a batch of events: their number).
        ``run_id``: it writes rows of that run only (a light job of it may then be committed
        before big jobs of other runs queued ahead of it, see LIGHT_JOB)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._q.put(_Job(fn, fut, loop, essential, max(1, weight), run_id))
        return await fut

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            self._local.conn = conn
        return conn

    def read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._reader())

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(lambda: fn(self._reader()))

    # -- runs ---------------------------------------------------------------
    # Each change of a run is its own statement: which columns a write touches is
    # read here, never assembled from a caller's keyword names.
    async def create_run(self, run: Run, variant: tuple[str, int] | None = None) -> bool:
        """Store a new run. ``variant``: (sweep id, index) of the sweep variant it is, marked as this run in
        the same transaction; False (nothing stored) if that variant is no longer waiting."""
        vals = (run.id, run.name, run.status, json.dumps(target_json(run.target)), json.dumps(run.options),
                json.dumps(run.graph), run.queue_reason, run.created_at)

        def fn(c: sqlite3.Connection) -> bool:
            if variant is not None and not claim_variant(c, variant[0], variant[1], run.id):
                return False
            c.execute("INSERT INTO runs (id, name, status, target, options, graph, queue_reason, created_at) "
                      "VALUES (?,?,?,?,?,?,?,?)", vals)
            return True
        return await self.write(fn)

    async def set_execution_facts(self, run_id: str, facts: dict[str, Any]) -> None:
        text = json.dumps(facts)
        await self.write(lambda c: c.execute("UPDATE runs SET execution_facts=? WHERE id=?", (text, run_id)))

    async def change_execution_facts(self, run_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Read a run's facts, ``change`` them and store the result, in one writer job: no read
        round trip first, and no other write can come between the read and the write."""
        def fn(c: sqlite3.Connection) -> None:
            r = c.execute("SELECT execution_facts FROM runs WHERE id=?", (run_id,)).fetchone()
            if r is None:
                return
            facts = json.loads(r[0]) if r[0] else {}
            c.execute("UPDATE runs SET execution_facts=? WHERE id=?", (json.dumps(change(facts)), run_id))
        await self.write(fn)

    async def set_late_result(self, run_id: str, late: dict[str, Any], facts: dict[str, Any]) -> None:
        """How a run that had already ended here really ended on its worker (and its facts saying so)."""
        vals = (json.dumps(late), json.dumps(facts), run_id)
        await self.write(lambda c: c.execute("UPDATE runs SET late_result=?, execution_facts=? WHERE id=?", vals))

    async def mark_running(self, run_id: str) -> None:
        """Its executor reported it running: no longer waiting for anything."""
        await self.write(lambda c: c.execute(_MARK_RUNNING, (run_id,)))

    async def mark_disconnected(self, run_id: str, at: float, adopted: bool = False) -> None:
        """Its worker is away (``adopted``: this server restarted while the run was on it)."""
        if adopted:
            await self.write(lambda c: c.execute("UPDATE runs SET status='disconnected', disconnected_at=?, "
                                                 "adopted_at=? WHERE id=?", (at, at, run_id)))
        else:
            await self.write(lambda c: c.execute("UPDATE runs SET status='disconnected', disconnected_at=? "
                                                 "WHERE id=?", (at, run_id)))

    async def mark_reconnected(self, run_id: str) -> None:
        """Its worker came back holding it."""
        await self.write(lambda c: c.execute("UPDATE runs SET status='running', disconnected_at=NULL WHERE id=?",
                                             (run_id,)))

    async def request_stop(self, run_id: str) -> None:
        await self.write(lambda c: c.execute("UPDATE runs SET stop_requested=1 WHERE id=?", (run_id,)))

    async def claim_queued_graph(self, run_id: str, worker_id: str, slot_device: str, started_at: float,
                                 facts: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                                 ) -> dict[str, Any] | None:
        """queued -> running on ``worker_id``'s ``slot_device``, unless a stop was asked for
        meanwhile, and the run's graph read in the same transaction (the graph is read once,
        when the run starts); None if the claim failed. ``facts``: a change of the run's facts
        (as :meth:`change_execution_facts` makes) made in the same transaction if the claim succeeds."""
        def fn(c: sqlite3.Connection) -> str | None:
            cur = c.execute("UPDATE runs SET status='running', queue_reason=NULL, worker_id=?, slot_device=?, "
                            "started_at=? WHERE id=? AND status='queued' AND stop_requested=0",
                            (worker_id, slot_device, started_at, run_id))
            if cur.rowcount != 1:
                return None
            graph, old = c.execute("SELECT graph, execution_facts FROM runs WHERE id=?", (run_id,)).fetchone()
            if facts is not None:
                changed = json.dumps(facts(json.loads(old) if old else {}))
                c.execute("UPDATE runs SET execution_facts=? WHERE id=?", (changed, run_id))
            return str(graph)
        text = await self.write(fn)
        return None if text is None else dict(json.loads(text))

    async def requeue(self, run_id: str, reason: str) -> bool:
        """running/disconnected -> queued, placement cleared; ``created_at`` is kept,
        so first come first served puts it back at its old place."""
        def fn(c: sqlite3.Connection) -> bool:
            return c.execute("UPDATE runs SET status='queued', worker_id=NULL, slot_device=NULL, started_at=NULL, "
                             "disconnected_at=NULL, adopted_at=NULL, queue_reason=? "
                             "WHERE id=? AND status IN ('running', 'disconnected')", (reason, run_id)).rowcount == 1
        return await self.write(fn)

    async def cancel_queued(self, run_id: str) -> bool:
        """queued -> cancelled in one statement; False if the dispatcher claimed it first."""
        def fn(c: sqlite3.Connection) -> bool:
            return c.execute("UPDATE runs SET status='cancelled' WHERE id=? AND status='queued'",
                             (run_id,)).rowcount == 1
        return await self.write(fn)

    @staticmethod
    def _run_from_row(r: sqlite3.Row | dict[str, Any], with_graph: bool = True) -> Run:
        d = dict(r)
        if not with_graph:
            d.pop("graph", None)  # never decoded only to be dropped
        for k in _JSON_COLUMNS:
            if d.get(k) is not None:
                d[k] = json.loads(d[k])
        if not with_graph:
            d["graph"] = None
        d["target"] = parse_target(d["target"])
        d["stop_requested"] = bool(d.get("stop_requested"))
        d["execution_facts"] = d.get("execution_facts") or {}
        d["tags"] = tuple(d.get("tags") or ())
        return Run(**d)

    async def get_run(self, run_id: str, with_graph: bool = False) -> Run | None:
        def fn(c: sqlite3.Connection) -> Run | None:
            if with_graph:
                r = c.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
            else:
                r = c.execute(_SELECT_NO_GRAPH + " WHERE id=?", (run_id,)).fetchone()
            return None if r is None else self._run_from_row(r, with_graph)
        return await self.read(fn)

    async def list_runs(self, status: str | None = None, limit: int = 200,
                        where: RunFilter | None = None) -> list[Run]:
        return await asyncio.to_thread(self.list_runs_sync, status, limit, where)

    def list_runs_sync(self, status: str | None = None, limit: int = 200,
                       where: RunFilter | None = None) -> list[Run]:
        """The newest ``limit`` runs (newest first) that ``where`` keeps (``status`` alone: that status),
        without their graphs; in the calling thread (never the event loop's: :meth:`list_runs` is that)."""
        return [row.run() for row in self.list_rows_sync(status, limit, where)]

    def list_rows_sync(self, status: str | None = None, limit: int = 200,
                       where: RunFilter | None = None) -> list[ListedRow]:
        """:meth:`list_runs_sync`'s runs as read, not decoded (see :class:`ListedRow`)."""
        f = where or RunFilter(status=status)
        if status and not f.status:
            f = replace(f, status=status)
        conds: list[str] = []
        args: list[Any] = []
        if f.status:
            conds.append("status=?")
            args.append(f.status)
        if f.target is not None:
            conds.append("target=?")
            args.append(f.target)
        if f.worker is not None:
            conds.append("worker_id=?")
            args.append(f.worker)
        if f.tag is not None:
            conds.append("tags IS NOT NULL AND EXISTS (SELECT 1 FROM json_each(runs.tags) WHERE value=?)")
            args.append(f.tag)
        if f.search:
            pattern = _like(f.search)
            conds.append("(id LIKE ? ESCAPE '\\' OR name LIKE ? ESCAPE '\\' OR error LIKE ? ESCAPE '\\' "
                         "OR note LIKE ? ESCAPE '\\' OR tags LIKE ? ESCAPE '\\')")
            args += [pattern] * 5
        if f.after is not None:
            # Keyset paging: the runs listed after that one (older, or as old and inserted earlier).
            conds.append("(created_at, rowid) < (SELECT created_at, rowid FROM runs WHERE id=?)")
            args.append(f.after)
        where_sql = " WHERE " + " AND ".join(conds) if conds else ""
        conn = self._reader()
        if self._one_step is None:
            self._one_step = _one_step_listing_works(conn)
        if self._one_step:
            # One sqlite step for the whole listing. A row read is a step, and sqlite lets go of the GIL
            # for each: with the event loop and the writer busy (a dispatch backlog), taking it back
            # waited up to the switch interval every time, 200 times a listing. The rows' order is the
            # query's (rowid and created_at come along, sorted here: an aggregate's input order is not
            # promised).
            q = _SELECT_ONE_STEP + where_sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?)"
            rows = json.loads(conn.execute(q, (*args, limit)).fetchone()[0])
            for r in rows:
                for i in _REAL_AT:
                    if r[i] is not None:
                        r[i] = float(r[i])
            rows.sort(key=lambda r: (r[_CREATED_AT], r[-1]), reverse=True)
            return [ListedRow(tuple(r[:-1])) for r in rows]
        q = _SELECT_NO_GRAPH + where_sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        cur = conn.cursor()
        cur.row_factory = None  # plain tuples: compared as they are, decoded only where they changed
        return [ListedRow(values) for values in cur.execute(q, (*args, limit)).fetchall()]

    async def set_labels(self, run_id: str, tags: list[str] | None, note: str | None,
                         set_note: bool) -> bool:
        """Replace a run's tags (unless None) and its note (when ``set_note``); False if no such run."""
        def fn(c: sqlite3.Connection) -> bool:
            n = 0
            if tags is not None:
                n = c.execute("UPDATE runs SET tags=? WHERE id=?", (json.dumps(tags), run_id)).rowcount
            if set_note:
                n = c.execute("UPDATE runs SET note=? WHERE id=?", (note, run_id)).rowcount
            if tags is None and not set_note:
                n = c.execute("SELECT COUNT(*) FROM runs WHERE id=?", (run_id,)).fetchone()[0]
            return n > 0
        return bool(await self.write(fn))

    async def count_runs(self) -> dict[str, int]:
        """How many runs are in each status (every run, not a page of them)."""
        def fn(c: sqlite3.Connection) -> dict[str, int]:
            return {str(s): int(n) for s, n in c.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")}
        return await self.read(fn)

    def run_counts_sync(self) -> list[tuple[str, str, int]]:
        """How many runs there are of each (status, stored target text): what GET /metrics reports.
        One pass over the runs' status index and target column, never their graphs."""
        q = "SELECT status, target, COUNT(*) FROM runs GROUP BY status, target"
        return [(r[0], r[1], r[2]) for r in self._reader().execute(q).fetchall()]

    def runs_in_status_sync(self, statuses: set[str], with_graph: bool = False) -> list[Run]:
        """Runs in ``statuses``, oldest first; without their graphs unless asked (they can be large)."""
        where = f" WHERE status IN ({','.join('?' * len(statuses))}) ORDER BY created_at, rowid"
        q = ("SELECT * FROM runs" if with_graph else _SELECT_NO_GRAPH) + where
        return [self._run_from_row(r, with_graph) for r in self._reader().execute(q, tuple(statuses)).fetchall()]

    def active_runs_of_sync(self, worker_id: str) -> list[Run]:
        """The runs that worker holds (running or disconnected), oldest first, without their graphs:
        what a worker's welcome settles, read without building every other worker's runs (in a
        reconnect storm of thousands of busy agents that was quadratic)."""
        q = (_SELECT_NO_GRAPH + f" WHERE status IN ({','.join('?' * len(ACTIVE))}) AND worker_id=? "
             "ORDER BY created_at, rowid")
        return [self._run_from_row(r, False) for r in self._reader().execute(q, (*ACTIVE, worker_id)).fetchall()]

    async def delete_run(self, run_id: str) -> None:
        def fn(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM runs WHERE id=?", (run_id,))
        await self.write(fn)

    # -- events -----------------------------------------------------------
    async def append_events(self, run_id: str, src: str, events: list[dict[str, Any]],
                            assign: bool = False, essential: bool = False,
                            max_bytes: int = 0,
                            texts: list[str | None] | None = None) -> tuple[list[dict[str, Any]], int]:
        """Store events in ``src_seq`` order; return (newly stored events, acked src_seq).

        ``assign``: the events are born here; number them after what is stored.
        ``max_bytes``: no event's data is stored whole past it (:func:`cdui.core.event_size.bound_event`);
        the events returned are as stored. ``texts``: each event's own JSON text where kept, stored as it
        is (:func:`event_chunks.insert`)."""
        return await self.write(lambda c: _append(c, run_id, src, events, assign, max_bytes, texts), essential,
                                len(events), run_id)

    async def append_status_events(self, run_id: str, src: str, events: list[dict[str, Any]], at: float,
                                   max_bytes: int = 0, texts: list[str | None] | None = None
                                   ) -> tuple[StoredEvents, int, list[tuple[int, bool]]]:
        """:meth:`append_events` of a run's own events (not the control plane's), and in the same
        transaction what each stored ``status`` event changes in the run's row, in the events' order:
        ``running`` what :meth:`mark_running` changes, a final status what :meth:`finish_run` changes
        (finished at ``at``; the first ending stored wins). One writer round trip where a run's usual
        message (running, then its ending) took three. Returns (stored events, acked src_seq, and for
        each stored final status its index among them and whether it ended the run now).

        The stored events come back as :class:`StoredEvents`, whose dicts are made only when someone
        reads them: a flood nobody watches costs the writer no dict per event."""
        def fn(c: sqlite3.Connection) -> tuple[StoredEvents, int, list[tuple[int, bool]]]:
            stored, acked = _append_columns(c, run_id, src, events, False, max_bytes, texts)
            endings: list[tuple[int, bool]] = []
            kinds, datas = stored.kinds, stored.datas
            if "status" in kinds:
                for i, kind in enumerate(kinds):
                    data = datas[i]
                    status = data.get("status") if kind == "status" and isinstance(data, dict) else None
                    if not isinstance(status, str):
                        continue  # not a status a run's row follows (a worker may send anything)
                    if status == "running":
                        c.execute(_MARK_RUNNING, (run_id,))
                    elif status in TERMINAL:
                        endings.append((i, c.execute(_FINISH, (status, data.get("error"), at, run_id)).rowcount == 1))
            return stored, acked, endings
        return await self.write(fn, weight=len(events), run_id=run_id)

    async def finish_run(self, run_id: str, status: str, error: str | None, at: float, src: str,
                         event: dict[str, Any] | None) -> tuple[bool, list[dict[str, Any]]]:
        """End a run once: status, error and finished_at, plus (if given) its final status
        event from ``src``, in one essential transaction. Returns (ended now, stored events);
        a run that had already ended keeps its ending and gets no second final event."""
        def fn(c: sqlite3.Connection) -> tuple[bool, list[dict[str, Any]]]:
            cur = c.execute(_FINISH, (status, error, at, run_id))
            if cur.rowcount != 1:
                return False, []
            return True, (_append(c, run_id, src, [event], True)[0] if event is not None else [])
        return await self.write(fn, essential=True, run_id=run_id)

    async def source_acked(self, run_id: str, src: str) -> int:
        def fn(c: sqlite3.Connection) -> int:
            a = c.execute("SELECT acked FROM run_sources WHERE run_id=? AND src=?", (run_id, src)).fetchone()
            return a[0] if a else 0
        return await self.read(fn)

    async def has_final_status_from(self, run_id: str, src: str) -> bool:
        """Whether the stored log holds a final status of the run from ``src``."""
        return await self.read(lambda c: event_chunks.has_final(c, run_id, src))

    async def events(self, run_id: str, after: int = 0, limit: int = 10000) -> list[dict[str, Any]]:
        """The run's events after ``after`` in ``seq`` order, at most ``limit``: each as
        ``{"seq", "kind", "data", "at"}``."""
        return await self.read(lambda c: event_chunks.read_events(c, run_id, after, limit))

    # -- artifacts ----------------------------------------------------------
    async def add_artifact(self, a: dict[str, Any]) -> int:
        def fn(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "INSERT INTO artifacts (run_id, kind, name, backend, path, relative_path, label, size, sha256,"
                " created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (a["run_id"], a["kind"], a["name"], a.get("backend", "local"), a.get("path"), a.get("relative_path"),
                 a.get("label"), a.get("size"), a.get("sha256"), time.time()))
            return int(cur.lastrowid or 0)
        return await self.write(fn)

    async def artifacts(self, run_id: str) -> list[dict[str, Any]]:
        def fn(c: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = c.execute("SELECT * FROM artifacts WHERE run_id=? ORDER BY id", (run_id,)).fetchall()
            return [dict(r) for r in rows]
        return await self.read(fn)

    async def artifact(self, run_id: str, artifact_id: int) -> dict[str, Any] | None:
        def fn(c: sqlite3.Connection) -> dict[str, Any] | None:
            return _row(c.execute("SELECT * FROM artifacts WHERE run_id=? AND id=?", (run_id, artifact_id)).fetchone())
        return await self.read(fn)

    async def shas_in_use(self, shas: set[str], backends: tuple[str, ...]) -> set[str]:
        """Which of ``shas`` some artifact row of ``backends`` still names (their kept bytes stay)."""
        wanted = sorted(shas)

        def fn(c: sqlite3.Connection) -> set[str]:
            found: set[str] = set()
            for i in range(0, len(wanted), 500):  # sqlite's limit on bound parameters
                part = wanted[i:i + 500]
                q = (f"SELECT DISTINCT sha256 FROM artifacts WHERE sha256 IN ({','.join('?' * len(part))}) "
                     f"AND backend IN ({','.join('?' * len(backends))})")
                found.update(r[0] for r in c.execute(q, (*part, *backends)).fetchall())
            return found
        return await self.read(fn)

    async def artifact_replaced_by(self, path: str, sha: str, after_id: int) -> dict[str, Any] | None:
        """The first later row of the same path with other bytes: the run that replaced the file there."""
        def fn(c: sqlite3.Connection) -> dict[str, Any] | None:
            return _row(c.execute("SELECT * FROM artifacts WHERE path=? AND id>? AND (sha256 IS NULL OR sha256!=?) "
                                  "ORDER BY id LIMIT 1", (path, after_id, sha)).fetchone())
        return await self.read(fn)

    # -- uploads ----------------------------------------------------------
    async def record_upload(self, folder: str, name: str, sha256: str, size: int) -> None:
        def fn(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO uploads (folder, name, sha256, size, created_at) VALUES (?,?,?,?,?) "
                      "ON CONFLICT(folder, name) DO UPDATE SET sha256=excluded.sha256, size=excluded.size, "
                      "created_at=excluded.created_at", (folder, name, sha256, size, time.time()))
        await self.write(fn)

    async def upload(self, folder: str, name: str) -> dict[str, Any] | None:
        def fn(c: sqlite3.Connection) -> dict[str, Any] | None:
            return _row(c.execute("SELECT * FROM uploads WHERE folder=? AND name=?", (folder, name)).fetchone())
        return await self.read(fn)


_encode = event_json
# A run's row as its executor reported it running, and as it ends (once: the first ending stored wins).
_MARK_RUNNING = "UPDATE runs SET status='running', queue_reason=NULL WHERE id=?"
_FINISH = "UPDATE runs SET status=?, error=?, finished_at=?, queue_reason=NULL WHERE id=? AND finished_at IS NULL"


def _append(c: sqlite3.Connection, run_id: str, src: str, events: list[dict[str, Any]],
            assign: bool, max_bytes: int = 0,
            texts: list[str | None] | None = None) -> tuple[list[dict[str, Any]], int]:
    """The events part of a write job: accept each source's next ``src_seq`` only,
    give each accepted event the run's next ``seq``; no event's data stored over ``max_bytes``.
    ``texts``: each event's own JSON text where kept (see :func:`event_chunks.insert`), used when the
    batch is exactly the source's next numbers in turn (a replay or disorder is taken event by event).
    Returns the stored events as ``{"seq", "kind", "data", "at"}`` dicts, and the acked ``src_seq``."""
    stored, acked = _append_columns(c, run_id, src, events, assign, max_bytes, texts)
    return stored.dicts(), acked


_SRC_SEQ, _KIND = itemgetter("src_seq"), itemgetter("kind")
_get = dict.get


def _append_columns(c: sqlite3.Connection, run_id: str, src: str, events: list[dict[str, Any]],
                    assign: bool, max_bytes: int = 0,
                    texts: list[str | None] | None = None) -> tuple[StoredEvents, int]:
    """:func:`_append`, the stored events handed back as columns (:class:`StoredEvents`)."""
    r = c.execute("SELECT last_seq FROM runs WHERE id=?", (run_id,)).fetchone()
    if r is None:
        raise KeyError(run_id)
    last = r[0]
    a = c.execute("SELECT acked FROM run_sources WHERE run_id=? AND src=?", (run_id, src)).fetchone()
    acked = a[0] if a else 0
    batch = [dict(e, src_seq=acked + i + 1) for i, e in enumerate(events)] if assign else events
    now = time.time()
    # The usual batch is exactly the source's next numbers, in turn: taken a column at a time, each
    # column in one call where its values are already what is stored (a flood's hundreds of thousands
    # of events a second; anything else is converted value by value, as it always was).
    expected = list(range(acked + 1, acked + len(batch) + 1))
    seqs = list(map(_SRC_SEQ, batch))
    if seqs == expected or [int(s) for s in seqs] == expected:
        kinds = list(map(_KIND, batch))
        if not _all_of(kinds, str):
            kinds = [str(k) for k in kinds]
        datas = list(map(_get, batch, repeat("data")))
        if not all(datas):  # a missing, null or empty data is stored as {}
            datas = [d or {} for d in datas]
        ats: list[Any] = list(map(_get, batch, repeat("at")))
        if not (_all_of(ats, float) and all(ats)):  # a missing, null or zero time is the time it is stored
            ats = [float(t or now) for t in ats]
    else:  # a replay, a gap or disorder in it: in src_seq order, as a sender's order is not trusted
        kinds, datas, ats = _accepted(sorted(batch, key=lambda e: int(e["src_seq"])), acked, now)
        texts = None
    first = last + 1
    if kinds:
        datas = event_chunks.insert(c, run_id, src, first, acked + 1, kinds, datas, ats, max_bytes,
                                    None if assign else texts)
        c.execute("UPDATE runs SET last_seq=? WHERE id=?", (last + len(kinds), run_id))
        acked += len(kinds)
    c.execute("INSERT INTO run_sources (run_id, src, acked) VALUES (?,?,?) "
              "ON CONFLICT(run_id, src) DO UPDATE SET acked=excluded.acked", (run_id, src, acked))
    return StoredEvents(first, kinds, datas, ats), acked


def _all_of(values: list[Any], typ: type) -> bool:
    """Whether every value is exactly of type ``typ`` (one pass in C: a set of their types)."""
    return not values or set(map(type, values)) == {typ}


class StoredEvents(Sequence[dict[str, Any]]):
    """Events as the store stored them, kept as columns (their kinds, data and times; the first one's
    run ``seq``, the rest following), each read as ``{"seq", "kind", "data", "at"}``.

    The dicts are made on the first read, once, in order; every later read gets the same dicts. A run
    logging flat out that nobody watches has its events stored and acknowledged without them."""

    __slots__ = ("first", "kinds", "datas", "ats", "_dicts")

    def __init__(self, first: int, kinds: list[str], datas: list[Any], ats: list[float]) -> None:
        self.first = first
        self.kinds = kinds
        self.datas = datas
        self.ats = ats
        self._dicts: list[dict[str, Any]] | None = None

    def dicts(self) -> list[dict[str, Any]]:
        if self._dicts is None:
            first = self.first
            self._dicts = [{"seq": first + i, "kind": k, "data": d, "at": t}
                           for i, (k, d, t) in enumerate(zip(self.kinds, self.datas, self.ats, strict=True))]
        return self._dicts

    def __len__(self) -> int:
        return len(self.kinds)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dicts())

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self.dicts()[i]


def _accepted(batch: list[dict[str, Any]], acked: int, now: float) -> tuple[list[str], list[Any], list[float]]:
    """(kinds, data, times) of the events that come next after ``acked``, from a batch in
    ``src_seq`` order: repeats of stored ones are skipped, a gap refuses the rest (the sender
    replays from ``acked + 1``)."""
    kinds: list[str] = []
    datas: list[Any] = []
    ats: list[float] = []
    for ev in batch:
        s = int(ev["src_seq"])
        if s <= acked:
            continue  # a replay of something already stored
        if s != acked + 1:
            break  # a gap
        acked = s
        kinds.append(str(ev["kind"]))
        datas.append(ev.get("data") or {})
        ats.append(float(ev.get("at") or now))
    return kinds, datas, ats


# How many finished jobs' callers are woken in one turn of the event loop. Each then goes on with its
# own work (a run's claim builds and sends its job; its events' writer acknowledges them), all in the
# loop's next iteration: a transaction of 500 jobs woke 500 callers at once, and a request that arrived
# meanwhile waited behind all of them. The rest are woken in later turns, behind the sockets that are
# ready by then (see _Resolver). Eight, not 32: under a 10,000-run backlog the 32 starts of one turn
# (each builds and sends a job, about 0.15 ms) were 5 ms of it, in front of every request.
RESOLVE_PER_TURN = 8

_Done = tuple[asyncio.Future[Any], Any, BaseException | None]


class _Resolver:
    """Resolves one event loop's futures of finished jobs in the order their jobs ran, at most
    RESOLVE_PER_TURN in one turn of the loop; what is left is resolved by a callback due at once, which
    the loop runs only after the callbacks of the sockets it found ready (a timer's callback follows
    those; a ``call_soon`` would come before them). Used on that loop only (the writer thread hands
    each transaction's results over with ``call_soon_threadsafe(add, ...)``)."""

    __slots__ = ("loop", "pending", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: deque[_Done] = deque()
        self.scheduled = False

    def add(self, done: list[_Done]) -> None:
        self.pending.extend(done)
        if not self.scheduled:
            self.resolve()

    def resolve(self) -> None:
        self.scheduled = False
        pending, n = self.pending, RESOLVE_PER_TURN
        while pending and n:
            fut, res, exc = pending.popleft()
            if fut.done():
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(res)
            n -= 1
        if pending and not self.loop.is_closed():
            self.scheduled = True
            self.loop.call_at(self.loop.time(), self.resolve)

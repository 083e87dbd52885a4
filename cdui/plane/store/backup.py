"""A consistent copy of the live database, and the checks a copy must pass before it is restored.

Copying ``cdui.sqlite3`` with ``cp`` while the server writes is not a backup: the
newest transactions sit in ``cdui.sqlite3-wal``, and a copy of the two files taken
at different moments can be torn. :func:`copy_database` uses sqlite's online backup
API instead, a few hundred pages per step, inside **one read transaction** held from
the first step to the last:

- In WAL mode a reader never blocks the writer, so the server keeps committing
  events while the copy is made, and the copy is the snapshot of the moment the
  read transaction began: every event acknowledged before the backup started is in
  it (an event is acknowledged only after its commit).
- Without that transaction each step takes a new snapshot, and sqlite restarts the
  backup from the first page whenever another connection wrote in between; under a
  steady stream of events (a run logging flat out) it restarts again and again and
  never finishes. (Measured: 48,709 steps and a copy only once the writer stopped,
  against 89 steps for the same 5,700 pages with the transaction held.)
- ``VACUUM INTO`` would give the same snapshot, but as one statement with no
  progress to show, and it rebuilds every table and index, which costs more than
  copying pages.

The price of the held snapshot: the checkpointer cannot move the WAL past it, so the
WAL grows by what is written during the copy and shrinks again at the next
checkpoint after it.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from cdui.plane.store.migrations import MIGRATIONS

STEP_PAGES = 256


def schema_version_known() -> int:
    """The newest schema this cdui knows (the number of migrations)."""
    return len(MIGRATIONS)


def copy_database(src: Path, dest: Path, progress: Callable[[int, int], None] | None = None,
                  step_pages: int = STEP_PAGES) -> int:
    """Copy the database at ``src`` (in use or not) into the new file ``dest``; returns its schema version.

    ``progress(done_pages, total_pages)`` is called after each step."""
    source = sqlite3.connect(str(src), isolation_level=None, timeout=30)
    try:
        source.execute("PRAGMA busy_timeout=30000")
        source.execute("BEGIN")
        # The first read fixes the snapshot every step below copies from.
        version = int(source.execute("PRAGMA user_version").fetchone()[0])
        target = sqlite3.connect(str(dest), isolation_level=None)
        try:
            def step(status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)
            source.backup(target, pages=step_pages, progress=step)
            # A restored file is opened by one server; a rollback journal keeps it one file until then.
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()
        source.execute("COMMIT")
    finally:
        source.close()
    return version


def _read_only(path: Path) -> str:
    return path.absolute().as_uri() + "?mode=ro&immutable=1"


def check_database(path: Path) -> tuple[str, int]:
    """``PRAGMA integrity_check``'s first answer (``"ok"`` for a sound file) and the schema version of ``path``.

    Opened read-only and immutable: a file that is only being checked is never changed."""
    conn = sqlite3.connect(_read_only(path), uri=True, isolation_level=None)
    try:
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            return f"not a readable database: {exc}", -1
        first = str(rows[0][0]) if rows else "no answer"
        if first != "ok" and len(rows) > 1:
            first += f" (and {len(rows) - 1} more problems)"
        return first, version
    finally:
        conn.close()


def count_events(path: Path, run_id: str) -> int:
    """How many events of ``run_id`` the database at ``path`` holds (the highest gapless ``seq``)."""
    conn = sqlite3.connect(_read_only(path), uri=True, isolation_level=None)
    try:
        row = conn.execute("SELECT MAX(last_seq) FROM run_event_chunks WHERE run_id=?", (run_id,)).fetchone()
        return int(row[0] or 0)
    finally:
        conn.close()

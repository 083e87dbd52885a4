"""The control plane's database: every SQL statement of cdui is in this package.

- :mod:`~cdui.plane.store.database`: :class:`Store`, the connection, the one
  writer thread with group commit and a savepoint per job, reads on their own
  connections, a full disk; and the ``runs``, ``artifacts`` and ``uploads`` tables
  and the run's events (:meth:`Store.get_run`, :meth:`Store.append_events`, ...).
- :mod:`~cdui.plane.store.event_chunks`: how a run's events are stored, many to a
  row of ``run_event_chunks``, and read back one by one.
- :mod:`~cdui.plane.store.migrations`: the schema, as numbered migrations.
- One module per other table group, each a row class the store holds:
  ``store.workers`` (:mod:`~cdui.plane.store.workers`), ``store.tokens``
  (:mod:`~cdui.plane.store.tokens`), ``store.ssh`` (:mod:`~cdui.plane.store.ssh`).

Callers use the typed methods; none of them sees a cursor or SQL text, and a
statement is written out for each use, never assembled from names
(``tests/test_store_sql_only.py`` checks both).
"""
from __future__ import annotations

from cdui.plane.store.database import ACTIVE, BATCH_EVENTS, BATCH_JOBS, TERMINAL, ListedRow, Run, RunFilter, Store
from cdui.plane.store.migrations import MIGRATIONS, migrate
from cdui.plane.store.ssh import SshCleanupRow, SshWorkerRow, SshWorkerRows
from cdui.plane.store.tokens import TokenListing, TokenRow, TokenRows
from cdui.plane.store.workers import OldCredential, WorkerRow, WorkerRows

__all__ = ["ACTIVE", "BATCH_EVENTS", "BATCH_JOBS", "MIGRATIONS", "TERMINAL", "ListedRow", "OldCredential", "Run",
           "RunFilter", "SshCleanupRow", "SshWorkerRow", "SshWorkerRows", "Store", "TokenListing", "TokenRow",
           "TokenRows", "WorkerRow", "WorkerRows", "migrate"]

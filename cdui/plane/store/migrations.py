"""The schema of the control plane's database, as numbered migrations.

Each entry of :data:`MIGRATIONS` is applied once, in order, in its own
``BEGIN IMMEDIATE`` transaction; ``PRAGMA user_version`` holds how many are
applied. An entry is never changed once released (a database made by an older
cdui must open unchanged): a schema change is a new entry at the end. An entry
is SQL statements, or a function of the connection where rows are converted.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable

from cdui.plane.store import event_chunks

MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # 1: runs, events, artifacts, uploads
    """
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        name TEXT,
        status TEXT NOT NULL,
        target TEXT NOT NULL,
        options TEXT NOT NULL,
        graph TEXT NOT NULL,
        worker_id TEXT,
        slot_device TEXT,
        queue_reason TEXT,
        error TEXT,
        late_result TEXT,
        execution_facts TEXT NOT NULL DEFAULT '{}',
        stop_requested INTEGER NOT NULL DEFAULT 0,
        last_seq INTEGER NOT NULL DEFAULT 0,
        disconnected_at REAL,
        adopted_at REAL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL
    );
    CREATE INDEX runs_status ON runs(status);
    CREATE TABLE run_events (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        src TEXT NOT NULL,
        src_seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_id, seq),
        UNIQUE (run_id, src, src_seq)
    );
    CREATE TABLE run_sources (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        src TEXT NOT NULL,
        acked INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, src)
    );
    CREATE TABLE artifacts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        backend TEXT NOT NULL,
        path TEXT,
        relative_path TEXT,
        label TEXT,
        size INTEGER,
        sha256 TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX artifacts_run ON artifacts(run_id);
    CREATE TABLE uploads (
        folder TEXT NOT NULL,
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (folder, name)
    );
    """,
    # 2: workers, enrollment tokens, credentials
    """
    CREATE TABLE workers (
        name TEXT PRIMARY KEY,
        credential_hash TEXT,
        devices TEXT NOT NULL DEFAULT '[]',
        version TEXT,
        drained INTEGER NOT NULL DEFAULT 0,
        disabled INTEGER NOT NULL DEFAULT 0,
        machine_id TEXT,
        labels TEXT NOT NULL DEFAULT '{}',
        last_seen REAL,
        address TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE enroll_tokens (
        id TEXT PRIMARY KEY,
        secret_hash TEXT NOT NULL,
        uses_left INTEGER NOT NULL,
        uses_total INTEGER NOT NULL,
        expires_at REAL NOT NULL,
        worker TEXT,
        revoked INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE TABLE old_credentials (
        credential_hash TEXT PRIMARY KEY,
        worker TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 3: whether a worker's own last agent was one-shot (so after a restart runs naming it keep the
    # one-shot queue timeout at once), and the run that agent took (NULL: none yet or none at all).
    """
    ALTER TABLE workers ADD COLUMN one_shot INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE workers ADD COLUMN one_shot_run TEXT
    """,
    # 4: an index for every listing's sort and every lookup a connection makes
    # (GET /api/runs sorted a full scan; a worker's credential was found by scanning workers)
    """
    CREATE INDEX runs_created ON runs(created_at);
    CREATE INDEX runs_status_created ON runs(status, created_at);
    CREATE INDEX workers_credential ON workers(credential_hash);
    """,
    # 5: SSH workers (cdui/plane/ssh/ssh_workers.py): what to connect to, the slot, the tunnel line
    """
    CREATE TABLE ssh_workers (
        name TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        port INTEGER NOT NULL DEFAULT 22,
        identity TEXT,
        remote_cdui TEXT NOT NULL,
        slot INTEGER NOT NULL UNIQUE,
        enabled INTEGER NOT NULL DEFAULT 1,
        forgot INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'connecting',
        reason TEXT,
        recent_output TEXT NOT NULL DEFAULT '[]',
        remote_pid INTEGER,
        token_id TEXT,
        created_at REAL NOT NULL
    );
    """,
    # 6: "Share by memory" (cdui/plane/http/share_memory.py): the devices of a worker that admit runs by
    # memory instead of slot count, a JSON list ("*": all); NULL: off
    """
    ALTER TABLE workers ADD COLUMN share_by_memory TEXT
    """,
    # 7: the remote cleanups of deleted SSH workers that have not ended (cdui/plane/ssh/ssh_workers.py): kept
    # across a restart so the cleanup resumes and its slot stays out of use until it ends
    """
    CREATE TABLE ssh_cleanups (
        slot INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        target TEXT NOT NULL,
        port INTEGER NOT NULL,
        identity TEXT,
        remote_cdui TEXT NOT NULL,
        started_at REAL NOT NULL
    );
    """,
    # 8: run_events without its UNIQUE (run_id, src, src_seq) index: every event row paid a third B-tree
    # insert for it (about a third of sqlite's own work per row), yet no write relies on it: the store
    # accepts only each source's next src_seq (run_sources.acked, checked in the same transaction), so a
    # source's number is never stored twice. The one read that looked a source's events up (whether a
    # worker's final status is stored) gets a partial index of the status rows alone instead.
    """
    CREATE TABLE run_events_8 (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        src TEXT NOT NULL,
        src_seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    INSERT INTO run_events_8 (run_id, seq, src, src_seq, kind, data, at)
        SELECT run_id, seq, src, src_seq, kind, data, at FROM run_events ORDER BY run_id, seq;
    DROP TABLE run_events;
    ALTER TABLE run_events_8 RENAME TO run_events;
    CREATE INDEX run_events_status ON run_events(run_id, src) WHERE kind = 'status';
    """,
    # 9: a run's tags (a JSON list of short words, set by its owner, searched by the runs listing) and
    # its note (free text). Two columns added: no table is copied.
    """
    ALTER TABLE runs ADD COLUMN tags TEXT;
    ALTER TABLE runs ADD COLUMN note TEXT;
    """,
    # 10: a run's events in chunks (run_event_chunks: one row per append of a source's events, see
    # cdui/plane/store/event_chunks.py) instead of a row each: a row per event capped a flood at
    # sqlite's own insert rate. Every stored event is converted, with its numbers, kind, time and data,
    # and run_events is dropped.
    event_chunks.convert,
    # 11: sweeps (cdui/plane/sweeps.py): a sweep's request and graph, and each variant with its params, the
    # run it became and that run's last known status and final metrics. ``kind`` leaves room for studies
    # (a sweep whose next variants a search chooses). A run names its sweep in its options, not a column.
    """
    CREATE TABLE sweeps (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL DEFAULT 'sweep',
        name TEXT,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        options TEXT NOT NULL,
        graph TEXT NOT NULL,
        max_running INTEGER NOT NULL,
        created_at REAL NOT NULL,
        stopped_at REAL
    );
    CREATE INDEX sweeps_created ON sweeps(created_at);
    CREATE TABLE sweep_variants (
        sweep_id TEXT NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        params TEXT NOT NULL,
        run_id TEXT,
        status TEXT NOT NULL,
        error TEXT,
        metrics TEXT,
        previous_runs TEXT NOT NULL DEFAULT '[]',
        PRIMARY KEY (sweep_id, idx)
    );
    CREATE INDEX sweep_variants_run ON sweep_variants(run_id);
    CREATE INDEX sweep_variants_status ON sweep_variants(sweep_id, status);
    """,
    # studies (cdui/plane/studies.py): a trial's mark beside its run's status: 'pruned' when
    # the study's pruner stopped it, so the run keeps the contract's statuses and the trial still says why.
    """
    ALTER TABLE sweep_variants ADD COLUMN mark TEXT;
    """,
    # GET /metrics counts the runs per status and target at every scrape: from this index alone,
    # not a pass over every run's row (a row holds its graph: 100,000 runs took about a second a scrape).
    """
    CREATE INDEX runs_status_target ON runs(status, target)
    """,
    # apps: published apps (cdui/plane/apps.py, cdui/plane/store/apps.py): each slug with its active
    # version (NULL while unpublished), every publish's immutable snapshot, the API keys (a prefix and the hash
    # of the key, never the key; a revoked key's row stays) and one record per invoke.
    """
    CREATE TABLE apps (
        slug TEXT PRIMARY KEY,
        graph_name TEXT NOT NULL,
        active_version INTEGER,
        record_io INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE app_versions (
        slug TEXT NOT NULL REFERENCES apps(slug) ON DELETE CASCADE,
        version INTEGER NOT NULL,
        graph TEXT NOT NULL,
        contract TEXT NOT NULL,
        source_graph TEXT NOT NULL,
        note TEXT,
        git_commit TEXT,
        git_dirty INTEGER,
        created_at REAL NOT NULL,
        PRIMARY KEY (slug, version)
    );
    CREATE TABLE api_keys (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL,
        last_used_at REAL,
        revoked_at REAL
    );
    CREATE TABLE app_invokes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        slug TEXT NOT NULL REFERENCES apps(slug) ON DELETE CASCADE,
        version INTEGER,
        key_id INTEGER,
        status TEXT NOT NULL,
        error TEXT,
        duration_ms REAL NOT NULL,
        inputs TEXT,
        outputs TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX app_invokes_slug ON app_invokes(slug, id);
    """,
    # apps.serve_on: where an app's invokes run: 'local' (this server), 'any' (a connected worker) or a worker's
    # name; serve_device: the device there (NULL: a card if it has one). See cdui/plane/sched/app_placement.py.
    """
    ALTER TABLE apps ADD COLUMN serve_on TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE apps ADD COLUMN serve_device TEXT;
    """,
    # workers.auto_update: the owner let this worker's agent follow `cdui update` from the Workers panel
    # (docs/updating.md "Workers"); 0: only an agent with CODEFYUI_AGENT_AUTO_UPDATE=1 follows.
    """
    ALTER TABLE workers ADD COLUMN auto_update INTEGER NOT NULL DEFAULT 0;
    """,
]


def migrate(conn: sqlite3.Connection) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise RuntimeError(f"database schema version {version} is newer than this cdui knows "
                           f"({len(MIGRATIONS)}); upgrade cdui or use another CODEFYUI_USER_DATA_DIR")
    for i in range(version, len(MIGRATIONS)):
        conn.execute("BEGIN IMMEDIATE")
        step = MIGRATIONS[i]
        if callable(step):
            step(conn)
        else:
            for stmt in step.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
        conn.execute(f"PRAGMA user_version={i + 1}")
        conn.execute("COMMIT")
    return len(MIGRATIONS)

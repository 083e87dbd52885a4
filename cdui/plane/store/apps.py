"""The published apps' tables (cdui/plane/apps.py, docs/apps.md): ``apps`` (one row per slug, its
active version or none while unpublished), ``app_versions`` (each publish's immutable snapshot:
the graph, its contract, its note and git provenance), ``api_keys`` (a key's public prefix and the
hash of the whole key, never the key) and ``app_invokes`` (every invoke: its app, version, key,
status, duration, and its inputs and outputs where the app records them).

Deleting an app deletes its versions and its invoke records (foreign keys cascade); a revoked key's
row stays, so the invokes that name it keep meaning something.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from cdui.plane.store.base import Db, every, one

PRUNE_EVERY = 100  # records between two prunings of an app's oldest invoke records


def _version(row: dict[str, Any], with_graph: bool) -> dict[str, Any]:
    row["contract"] = json.loads(row["contract"])
    row["git_dirty"] = None if row["git_dirty"] is None else bool(row["git_dirty"])
    if with_graph:
        row["graph"] = json.loads(row["graph"])
    return row


class AppRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    # -- apps and versions ---------------------------------------------------------
    async def publish(self, slug: str, create: bool, source: str, graph: dict[str, Any], contract: dict[str, Any],
                      note: str | None, record_io: bool | None, git_commit: str | None, git_dirty: bool | None,
                      now: float, serving: tuple[str, str | None] | None = None) -> tuple[int, bool] | None:
        """Store the next version of ``slug`` and make it the active one, in one transaction; (version,
        whether the app was created), or None when the app does not exist and ``create`` is false."""
        def fn(c: sqlite3.Connection) -> tuple[int, bool] | None:
            row = c.execute("SELECT slug FROM apps WHERE slug=?", (slug,)).fetchone()
            created = row is None
            if created:
                if not create:
                    return None
                c.execute("INSERT INTO apps (slug, graph_name, active_version, record_io, created_at, updated_at) "
                          "VALUES (?,?,NULL,?,?,?)", (slug, source, 1 if record_io in (None, True) else 0, now, now))
            version = int(c.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM app_versions WHERE slug=?",
                                    (slug,)).fetchone()[0])
            c.execute("INSERT INTO app_versions (slug, version, graph, contract, source_graph, note, git_commit, "
                      "git_dirty, created_at) VALUES (?,?,?,?,?,?,?,?,?)",
                      (slug, version, json.dumps(graph), json.dumps(contract), source, note, git_commit,
                       None if git_dirty is None else int(git_dirty), now))
            c.execute("UPDATE apps SET active_version=?, graph_name=?, updated_at=? WHERE slug=?",
                      (version, source, now, slug))
            if record_io is not None:
                c.execute("UPDATE apps SET record_io=? WHERE slug=?", (int(record_io), slug))
            if serving is not None:
                c.execute("UPDATE apps SET serve_on=?, serve_device=? WHERE slug=?", (*serving, slug))
            return version, created
        return await self.db.write(fn)

    async def all(self) -> list[dict[str, Any]]:
        rows = await self.db.read(lambda c: every(
            c, "SELECT a.slug, a.graph_name, a.active_version, a.record_io, a.serve_on, a.serve_device, "
               "a.created_at, a.updated_at, "
               "(SELECT COUNT(*) FROM app_versions v WHERE v.slug=a.slug) AS versions_count, "
               "(SELECT COUNT(*) FROM app_invokes i WHERE i.slug=a.slug) AS invokes_count "
               "FROM apps a ORDER BY a.slug"))
        for r in rows:
            r["record_io"] = bool(r["record_io"])
        return rows

    async def get(self, slug: str) -> dict[str, Any] | None:
        row = await self.db.read(lambda c: one(
            c, "SELECT slug, graph_name, active_version, record_io, serve_on, serve_device, created_at, updated_at "
               "FROM apps WHERE slug=?",
            (slug,)))
        if row is not None:
            row["record_io"] = bool(row["record_io"])
        return row

    async def versions(self, slug: str) -> list[dict[str, Any]]:
        """Newest first, without their graphs."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT version, source_graph, contract, note, git_commit, git_dirty, created_at FROM app_versions "
               "WHERE slug=? ORDER BY version DESC", (slug,)))
        return [_version(r, False) for r in rows]

    async def version(self, slug: str, version: int) -> dict[str, Any] | None:
        """One version with its graph."""
        row = await self.db.read(lambda c: one(
            c, "SELECT version, source_graph, graph, contract, note, git_commit, git_dirty, created_at "
               "FROM app_versions WHERE slug=? AND version=?", (slug, version)))
        return _version(row, True) if row is not None else None

    async def activate(self, slug: str, version: int | None, now: float) -> str | None:
        """Make ``version`` the active one (None: unpublish). None when done, else what is missing:
        ``"app"`` or ``"version"``."""
        def fn(c: sqlite3.Connection) -> str | None:
            if c.execute("SELECT 1 FROM apps WHERE slug=?", (slug,)).fetchone() is None:
                return "app"
            if version is not None and c.execute("SELECT 1 FROM app_versions WHERE slug=? AND version=?",
                                                 (slug, version)).fetchone() is None:
                return "version"
            c.execute("UPDATE apps SET active_version=?, updated_at=? WHERE slug=?", (version, now, slug))
            return None
        return await self.db.write(fn)

    async def set_record_io(self, slug: str, record_io: bool, now: float) -> bool:
        return await self.db.write(lambda c: c.execute(
            "UPDATE apps SET record_io=?, updated_at=? WHERE slug=?", (int(record_io), now, slug)).rowcount == 1)

    async def set_serving(self, slug: str, serve_on: str, device: str | None, now: float) -> bool:
        return await self.db.write(lambda c: c.execute(
            "UPDATE apps SET serve_on=?, serve_device=?, updated_at=? WHERE slug=?",
            (serve_on, device, now, slug)).rowcount == 1)

    async def delete(self, slug: str) -> bool:
        """The app, its versions and its invoke records."""
        return await self.db.write(lambda c: c.execute("DELETE FROM apps WHERE slug=?", (slug,)).rowcount == 1)

    # -- API keys ------------------------------------------------------------------
    async def add_key(self, name: str, prefix: str, key_hash: str, now: float) -> int:
        def fn(c: sqlite3.Connection) -> int:
            cur = c.execute("INSERT INTO api_keys (name, prefix, key_hash, created_at) VALUES (?,?,?,?)",
                            (name, prefix, key_hash, now))
            return int(cur.lastrowid or 0)
        return await self.db.write(fn)

    async def keys(self) -> list[dict[str, Any]]:
        """Every key, revoked ones included, newest first; never a hash."""
        return await self.db.read(lambda c: every(
            c, "SELECT id, name, prefix, created_at, last_used_at, revoked_at FROM api_keys ORDER BY id DESC"))

    async def key_by_hash(self, key_hash: str) -> dict[str, Any] | None:
        return await self.db.read(lambda c: one(
            c, "SELECT id, name, prefix, revoked_at FROM api_keys WHERE key_hash=?", (key_hash,)))

    async def revoke_key(self, key_id: int, now: float) -> dict[str, Any] | None:
        """Revoked from now (a key revoked before keeps its first time); the row, or None: no such key."""
        def fn(c: sqlite3.Connection) -> dict[str, Any] | None:
            c.execute("UPDATE api_keys SET revoked_at=? WHERE id=? AND revoked_at IS NULL", (now, key_id))
            return one(c, "SELECT id, name, prefix, created_at, last_used_at, revoked_at FROM api_keys WHERE id=?",
                       (key_id,))
        return await self.db.write(fn)

    # -- invokes -------------------------------------------------------------------
    async def record_invoke(self, slug: str, version: int | None, key_id: int | None, status: str,
                            error: str | None, duration_ms: float, inputs: str | None, outputs: str | None,
                            now: float, kept: int) -> int | None:
        """One invoke's record, and its key's last use, in one transaction; its id (None: the app was
        deleted meanwhile, nothing is recorded). Every PRUNE_EVERY records, the app's records beyond its
        newest ``kept`` are deleted, so that callers cannot grow the table without bound."""
        def fn(c: sqlite3.Connection) -> int | None:
            cur = c.execute(
                "INSERT INTO app_invokes (slug, version, key_id, status, error, duration_ms, inputs, outputs, "
                "created_at) SELECT ?,?,?,?,?,?,?,?,? WHERE EXISTS (SELECT 1 FROM apps WHERE slug=?)",
                (slug, version, key_id, status, error, duration_ms, inputs, outputs, now, slug))
            if key_id is not None:
                c.execute("UPDATE api_keys SET last_used_at=? WHERE id=?", (now, key_id))
            got = int(cur.lastrowid) if cur.rowcount == 1 and cur.lastrowid else None
            if got is not None and got % PRUNE_EVERY == 0:
                c.execute("DELETE FROM app_invokes WHERE slug=? AND id <= (SELECT id FROM app_invokes WHERE slug=? "
                          "ORDER BY id DESC LIMIT 1 OFFSET ?)", (slug, slug, kept))
            return got
        return await self.db.write(fn)

    async def invokes(self, slug: str, limit: int) -> list[dict[str, Any]]:
        """The app's last ``limit`` invokes, newest first."""
        rows = await self.db.read(lambda c: every(
            c, "SELECT id, version, key_id, status, error, duration_ms, inputs, outputs, created_at "
               "FROM app_invokes WHERE slug=? ORDER BY id DESC LIMIT ?", (slug, limit)))
        for r in rows:
            for k in ("inputs", "outputs"):
                r[k] = json.loads(r[k]) if r[k] is not None else None
        return rows

"""The ``ssh_workers`` table (migration 5: what to connect to, the remote slot,
the tunnel's last state) and ``ssh_cleanups`` (migration 7: the remote cleanups
of deleted SSH workers that have not ended, keyed by slot).

A slot is in use while either table names it: :meth:`SshWorkerRows.add` picks
among the others, and :meth:`SshWorkerRows.delete` hands a worker's row to a
pending cleanup in one transaction, so the slot is never free while the remote
host may still hold its folder.
"""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TypedDict, cast

from cdui.plane.store.base import Db, every, one
from cdui.plane.store.tokens import insert as insert_token
from cdui.plane.store.tokens import revoke as revoke_token
from cdui.plane.store.workers import exists as worker_exists


class SshWorkerRow(TypedDict):
    name: str
    target: str                     # user@host
    port: int
    identity: str | None
    remote_cdui: str
    slot: int
    enabled: int
    forgot: int                     # the remote agent was told to forget its credential
    state: str                      # the tunnel's last state
    reason: str | None
    recent_output: str              # JSON list: the last attempt's output lines
    remote_pid: int | None
    token_id: str | None            # the launch token of its last start
    created_at: float


class SshCleanupRow(TypedDict):
    slot: int
    name: str
    target: str
    port: int
    identity: str | None
    remote_cdui: str
    started_at: float


class SshWorkerRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def all(self) -> list[SshWorkerRow]:
        return cast(list[SshWorkerRow], await self.db.read(
            lambda c: every(c, "SELECT * FROM ssh_workers ORDER BY name")))

    async def get(self, name: str) -> SshWorkerRow | None:
        return cast("SshWorkerRow | None", await self.db.read(
            lambda c: one(c, "SELECT * FROM ssh_workers WHERE name=?", (name,))))

    async def cleanups(self) -> list[SshCleanupRow]:
        return cast(list[SshCleanupRow], await self.db.read(
            lambda c: every(c, "SELECT * FROM ssh_cleanups ORDER BY slot")))

    async def add(self, name: str, target: str, port: int, identity: str | None, remote_cdui: str,
                  pick_slot: Callable[[set[int]], int], now: float) -> int | None:
        """A new SSH worker on the slot ``pick_slot`` chooses among those no worker or pending cleanup
        holds; None (nothing stored) if an enrolled or SSH worker has the name already."""
        def fn(c: sqlite3.Connection) -> int | None:
            if worker_exists(c, name) or c.execute("SELECT 1 FROM ssh_workers WHERE name=?", (name,)).fetchone():
                return None
            taken = {int(x[0]) for x in c.execute("SELECT slot FROM ssh_workers UNION SELECT slot FROM ssh_cleanups")}
            slot = pick_slot(taken)
            c.execute("INSERT INTO ssh_workers (name, target, port, identity, remote_cdui, slot, enabled, state, "
                      "created_at) VALUES (?,?,?,?,?,?,1,'connecting',?)",
                      (name, target, port, identity, remote_cdui, slot, now))
            return slot
        return await self.db.write(fn)

    async def set_enabled(self, name: str, enabled: bool) -> None:
        await self.db.write(lambda c: c.execute("UPDATE ssh_workers SET enabled=? WHERE name=?",
                                                (int(enabled), name)))

    async def set_forgot(self, name: str, forgot: bool) -> None:
        await self.db.write(lambda c: c.execute("UPDATE ssh_workers SET forgot=? WHERE name=?", (int(forgot), name)))

    async def set_state(self, name: str, state: str, reason: str | None) -> None:
        await self.db.write(lambda c: c.execute("UPDATE ssh_workers SET state=?, reason=? WHERE name=?",
                                                (state, reason, name)))

    async def set_tunnel(self, name: str, state: str, reason: str | None, remote_pid: int | None,
                         recent_output: list[str]) -> None:
        """The tunnel's state as it changed, with the last lines of its attempt's output."""
        vals = (state, reason, remote_pid, json.dumps(recent_output), name)
        await self.db.write(lambda c: c.execute(
            "UPDATE ssh_workers SET state=?, reason=?, remote_pid=?, recent_output=? WHERE name=?", vals))

    async def new_launch_token(self, name: str, token_id: str, secret_hash: str, expires_at: float,
                               now: float) -> str | None:
        """Store a one-use launch token for the worker's next start, revoking the previous start's (only
        one is ever outstanding); bound to the worker once it has enrolled. Returns the worker it is
        bound to (None: not enrolled yet)."""
        def fn(c: sqlite3.Connection) -> str | None:
            old = c.execute("SELECT token_id FROM ssh_workers WHERE name=?", (name,)).fetchone()
            if old is not None and old[0]:
                revoke_token(c, old[0])
            bound = name if worker_exists(c, name) else None
            insert_token(c, token_id, secret_hash, 1, expires_at, bound, now)
            c.execute("UPDATE ssh_workers SET token_id=? WHERE name=?", (token_id, name))
            return bound
        return await self.db.write(fn)

    async def delete(self, name: str, cleanup: SshCleanupRow) -> None:
        """In one transaction: the worker's launch token revoked, its row gone, ``cleanup`` pending
        on its slot."""
        def fn(c: sqlite3.Connection) -> None:
            old = c.execute("SELECT token_id FROM ssh_workers WHERE name=?", (name,)).fetchone()
            if old is not None and old[0]:
                revoke_token(c, old[0])
            c.execute("DELETE FROM ssh_workers WHERE name=?", (name,))
            c.execute("INSERT INTO ssh_cleanups (slot, name, target, port, identity, remote_cdui, started_at) "
                      "VALUES (:slot, :name, :target, :port, :identity, :remote_cdui, :started_at)", dict(cleanup))
        await self.db.write(fn)

    async def cleanup_done(self, slot: int) -> None:
        """The remote cleanup of ``slot`` ended (cleaned, or what was left logged): the slot is free."""
        await self.db.write(lambda c: c.execute("DELETE FROM ssh_cleanups WHERE slot=?", (slot,)))

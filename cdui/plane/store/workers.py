"""The ``workers`` table (one row per enrolled worker credential) and
``old_credentials`` (the hashes of superseded and removed credentials, kept so
that an agent holding one is told why it cannot connect).

Every statement on them is here, one method per use; callers get typed rows.
JSON columns (``devices``, ``labels``, ``share_by_memory``) are read as the text
stored, and written from Python values.
"""
from __future__ import annotations

import json
import sqlite3
from typing import TypedDict, cast

from cdui.plane.store.base import Db, every, one


class WorkerRow(TypedDict):
    name: str
    credential_hash: str | None
    devices: str                    # JSON list: the devices its last agent offered
    version: str | None
    drained: int
    disabled: int
    machine_id: str | None
    labels: str                     # JSON object: its last agent's labels
    last_seen: float | None
    address: str | None
    created_at: float
    one_shot: int                   # its own last agent was one-shot
    one_shot_run: str | None        # the run that agent took (None: none yet, or none at all)
    share_by_memory: str | None     # JSON list of the devices that admit runs by memory ("*": all); None: off
    auto_update: int                # the owner lets its agent follow `cdui update` (the Workers panel)


class OldCredential(TypedDict):
    credential_hash: str
    worker: str
    reason: str                     # "superseded" (by a reissue) or "removed"
    at: float


def exists(c: sqlite3.Connection, name: str) -> bool:
    return c.execute("SELECT 1 FROM workers WHERE name=?", (name,)).fetchone() is not None


def enrolled(c: sqlite3.Connection, name: str, credential_hash: str, devices: list[str], machine_id: str,
             now: float) -> None:
    """Part of an enrollment's transaction: a new worker's row, or a new credential for an enrolled
    one (its old credential kept as superseded)."""
    old = c.execute("SELECT credential_hash FROM workers WHERE name=?", (name,)).fetchone()
    if old is not None:
        if old[0]:
            c.execute("INSERT OR REPLACE INTO old_credentials (credential_hash, worker, reason, at) VALUES (?,?,?,?)",
                      (old[0], name, "superseded", now))
        c.execute("UPDATE workers SET credential_hash=?, devices=?, machine_id=? WHERE name=?",
                  (credential_hash, json.dumps(devices), machine_id, name))
    else:
        c.execute("INSERT INTO workers (name, credential_hash, devices, machine_id, created_at) VALUES (?,?,?,?,?)",
                  (name, credential_hash, json.dumps(devices), machine_id, now))


class WorkerRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    # -- reads -----------------------------------------------------------------------
    async def all(self) -> list[WorkerRow]:
        return cast(list[WorkerRow], await self.db.read(lambda c: every(c, "SELECT * FROM workers ORDER BY name")))

    async def get(self, name: str) -> WorkerRow | None:
        return cast("WorkerRow | None", await self.db.read(
            lambda c: one(c, "SELECT * FROM workers WHERE name=?", (name,))))

    async def exists(self, name: str) -> bool:
        return await self.db.read(lambda c: exists(c, name))

    async def by_credential(self, credential_hash: str) -> WorkerRow | None:
        """The worker whose current credential hashes to ``credential_hash``."""
        return cast("WorkerRow | None", await self.db.read(
            lambda c: one(c, "SELECT * FROM workers WHERE credential_hash=?", (credential_hash,))))

    async def old_credential(self, credential_hash: str) -> OldCredential | None:
        """Whose superseded or removed credential hashes to ``credential_hash``, and why."""
        return cast("OldCredential | None", await self.db.read(
            lambda c: one(c, "SELECT * FROM old_credentials WHERE credential_hash=?", (credential_hash,))))

    async def names_instance(self, name: str, credential: str) -> bool:
        """Whether ``name`` is not enrolled itself while ``credential`` is (``name`` then names
        one of its instances), read in one go."""
        return await self.db.read(lambda c: not exists(c, name) and exists(c, credential))

    async def one_shot_names(self) -> list[str]:
        """The workers whose own last agent was one-shot."""
        return await self.db.read(lambda c: [str(r[0]) for r in c.execute("SELECT name FROM workers "
                                                                         "WHERE one_shot=1")])

    async def share_settings(self) -> dict[str, str]:
        """Each worker's "Share by memory" setting (JSON text), for the workers that have one."""
        return await self.db.read(lambda c: {str(r[0]): str(r[1]) for r in c.execute(
            "SELECT name, share_by_memory FROM workers WHERE share_by_memory IS NOT NULL")})

    async def offered_devices(self) -> dict[str, list[str]]:
        """The devices each worker's last agent offered (a row that cannot be read offers none)."""
        def fn(c: sqlite3.Connection) -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for name, text in c.execute("SELECT name, devices FROM workers"):
                try:
                    devices = json.loads(text or "[]")
                except ValueError:
                    devices = []
                out[str(name)] = [d for d in devices if isinstance(d, str)] if isinstance(devices, list) else []
            return out
        return await self.db.read(fn)

    # -- writes ----------------------------------------------------------------------
    async def connected(self, name: str, version: str, devices: list[str], labels: dict[str, str], at: float,
                        address: str, machine_id: str | None) -> None:
        """An agent was admitted under the name: what its hello said."""
        vals = (version, json.dumps(devices), json.dumps(labels), at, address, machine_id, name)
        await self.db.write(lambda c: c.execute(
            "UPDATE workers SET version=?, devices=?, labels=?, last_seen=?, address=?, machine_id=? WHERE name=?",
            vals))

    async def seen(self, name: str, at: float, labels: dict[str, str]) -> None:
        """A heartbeat: when it was last heard from, and its labels now."""
        vals = (at, json.dumps(labels), name)
        await self.db.write(lambda c: c.execute("UPDATE workers SET last_seen=?, labels=? WHERE name=?", vals))

    async def seen_many(self, last_seen: dict[str, float]) -> None:
        """Heartbeats gathered in memory: each worker's last contact, written in one statement
        (one write per heartbeat cost more than the rest of the heartbeat with thousands of agents)."""
        if not last_seen:
            return
        vals = [(at, name) for name, at in last_seen.items()]
        await self.db.write(lambda c: c.executemany("UPDATE workers SET last_seen=? WHERE name=?", vals),
                            weight=len(vals))

    async def set_drained(self, name: str, drained: bool) -> bool:
        """False: no such worker."""
        return await self.db.write(lambda c: c.execute("UPDATE workers SET drained=? WHERE name=?",
                                                       (int(drained), name)).rowcount == 1)

    async def set_disabled(self, name: str, disabled: bool) -> bool:
        """Disable, or enable (which also cancels a drain). False: no such worker."""
        if disabled:
            return await self.db.write(lambda c: c.execute("UPDATE workers SET disabled=1 WHERE name=?",
                                                           (name,)).rowcount == 1)
        return await self.db.write(lambda c: c.execute("UPDATE workers SET disabled=0, drained=0 WHERE name=?",
                                                       (name,)).rowcount == 1)

    async def set_auto_update(self, name: str, enabled: bool) -> bool:
        """The owner's choice from the Workers panel; False when no such worker."""
        def fn(c: sqlite3.Connection) -> bool:
            return c.execute("UPDATE workers SET auto_update=? WHERE name=?", (int(enabled), name)).rowcount > 0
        return bool(await self.db.write(fn))

    async def set_share_by_memory(self, name: str, devices: list[str] | None) -> None:
        """``devices``: those that admit runs by memory (``["*"]``: all); None: off."""
        text = json.dumps(devices) if devices is not None else None
        await self.db.write(lambda c: c.execute("UPDATE workers SET share_by_memory=? WHERE name=?", (text, name)))

    async def set_one_shot(self, name: str, run_id: str | None) -> None:
        """Its own agent now is one-shot, and took ``run_id`` (None: none yet)."""
        await self.db.write(lambda c: c.execute("UPDATE workers SET one_shot=1, one_shot_run=? WHERE name=?",
                                                (run_id, name)))

    async def clear_one_shot(self, name: str) -> None:
        """Its own agent now is a long-running one."""
        await self.db.write(lambda c: c.execute("UPDATE workers SET one_shot=0 WHERE name=?", (name,)))

    async def set_one_shot_run(self, name: str, run_id: str) -> None:
        """Its one-shot agent was given ``run_id``."""
        await self.db.write(lambda c: c.execute("UPDATE workers SET one_shot_run=? WHERE name=?", (run_id, name)))

    async def remove(self, name: str, at: float) -> None:
        """Forget the worker in one transaction: its credential kept as removed (so its agent is told
        so), its row gone, every enrollment token bound to it revoked."""
        def fn(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT credential_hash FROM workers WHERE name=?", (name,)).fetchone()
            if row is not None and row[0]:
                c.execute("INSERT OR REPLACE INTO old_credentials (credential_hash, worker, reason, at) "
                          "VALUES (?,?,?,?)", (row[0], name, "removed", at))
            c.execute("DELETE FROM workers WHERE name=?", (name,))
            c.execute("UPDATE enroll_tokens SET revoked=1 WHERE worker=?", (name,))
        await self.db.write(fn)

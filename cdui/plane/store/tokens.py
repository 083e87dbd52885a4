"""The ``enroll_tokens`` table: enrollment tokens, stored as their public id and
the hash of their secret (the policy, what a token may do, is
:mod:`cdui.plane.enroll`'s).

An enrollment is one transaction here: the token's row is read, the policy
given by the caller decides on it (refusing by raising), a use is taken, and the
worker's row is added or given its new credential (:func:`~cdui.plane.store.workers.enrolled`).
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypedDict, cast

from cdui.plane.store.base import Db, every, one
from cdui.plane.store.workers import enrolled, exists


class TokenRow(TypedDict):
    id: str
    secret_hash: str
    uses_left: int
    uses_total: int
    expires_at: float
    worker: str | None              # a reissue token enrolls only this worker
    revoked: int
    created_at: float


class TokenListing(TypedDict):
    """A token as the tokens list shows it (no secret hash)."""

    id: str
    uses_left: int
    uses_total: int
    expires_at: float
    worker: str | None
    revoked: int
    created_at: float


# Decides on a token (None: no such id) and a wanted name, given a way to ask whether a name is
# enrolled: returns (the worker to enroll, the worker the token is bound to or None), or raises.
Check = Callable[[TokenRow | None, Callable[[str], bool]], tuple[str, str | None]]


def insert(c: sqlite3.Connection, token_id: str, secret_hash: str, uses: int, expires_at: float,
           worker: str | None, now: float) -> None:
    c.execute("INSERT INTO enroll_tokens (id, secret_hash, uses_left, uses_total, expires_at, worker, created_at)"
              " VALUES (?,?,?,?,?,?,?)", (token_id, secret_hash, uses, uses, expires_at, worker, now))


def revoke(c: sqlite3.Connection, token_id: str) -> bool:
    return c.execute("UPDATE enroll_tokens SET revoked=1 WHERE id=?", (token_id,)).rowcount == 1


class TokenRows:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def add(self, token_id: str, secret_hash: str, uses: int, expires_at: float, worker: str | None,
                  now: float) -> None:
        await self.db.write(lambda c: insert(c, token_id, secret_hash, uses, expires_at, worker, now))

    async def active(self) -> list[TokenListing]:
        """The tokens not revoked (expired and used-up ones included), oldest first."""
        return cast(list[TokenListing], await self.db.read(lambda c: every(
            c, "SELECT id, uses_left, uses_total, expires_at, worker, revoked, created_at FROM enroll_tokens "
               "WHERE revoked=0 ORDER BY created_at")))

    async def revoke(self, token_id: str) -> bool:
        """False: no such token."""
        return await self.db.write(lambda c: revoke(c, token_id))

    async def enroll(self, token_id: str, check: Check, credential_hash: str, devices: list[str],
                     machine_id: str, now: float) -> str:
        """Use token ``token_id`` once, if ``check`` accepts it, to enroll a worker with this credential;
        returns the worker's name. A reissue token (bound to its worker) cannot be used again once
        its worker has enrolled."""
        def fn(c: sqlite3.Connection) -> str:
            row = cast("TokenRow | None", one(c, "SELECT * FROM enroll_tokens WHERE id=?", (token_id,)))
            worker, bound = check(row, lambda name: exists(c, name))
            c.execute("UPDATE enroll_tokens SET uses_left=uses_left-1 WHERE id=?", (token_id,))
            enrolled(c, worker, credential_hash, devices, machine_id, now)
            if bound:
                c.execute("UPDATE enroll_tokens SET uses_left=0 WHERE worker=? AND uses_left>0", (worker,))
            return worker
        return await self.db.write(fn)

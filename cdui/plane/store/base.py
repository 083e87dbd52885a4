"""What a table's row class needs of the database: a read and a write.

:class:`~cdui.plane.store.database.Store` is the one implementation; the row
classes (:mod:`~cdui.plane.store.workers`, :mod:`~cdui.plane.store.tokens`,
:mod:`~cdui.plane.store.ssh`) depend on this shape only, so the database module
can hold them without an import circle.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Db(Protocol):
    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on a reader's own connection, off the event loop."""
        ...

    async def write(self, fn: Callable[[sqlite3.Connection], T], essential: bool = False, weight: int = 1) -> T:
        """Run ``fn`` in the one writer's next transaction, in a savepoint of its own."""
        ...


def one(c: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
    """The first row of a query as a dict, or None."""
    r = c.execute(sql, args).fetchone()
    return dict(r) if r is not None else None


def every(c: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    return [dict(r) for r in c.execute(sql, args).fetchall()]

"""Running out of disk space under the database, and coming back from it.

When the disk holding the database fills, sqlite's commit fails with
``SQLITE_FULL`` and rolls the whole transaction back. Nothing stored is lost,
but nothing new can be stored either, and that includes the final status that
would tell the owner why a run stopped. So:

- :class:`Reserve` keeps a preallocated file next to the database. Deleting it
  is the one way to make room that always works on a full disk; the store
  does so only to commit *essential* writes (a run's final status). While the
  disk is full every other write is refused at once with :class:`DiskFull`, so
  the room freed for final statuses is not eaten by more events.
- The store probes: once it can allocate the reserve again *and* as much
  again stays free, the condition is over and writes resume, with no restart.
- :func:`is_disk_full` tells a full disk from other database errors.
"""
from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from cdui.core.errors import CduiError

SQLITE_FULL = 13
SQLITE_IOERR = 10
RESERVE_BYTES = 2 * 1024 * 1024


class DiskFull(CduiError):
    """Nothing can be stored: the disk under the database is full."""

    def __init__(self, folder: Path | str, detail: str) -> None:
        super().__init__("disk_full", f"the disk holding {folder} is full ({detail}); nothing new can be stored",
                         hint=f"free space on that disk (see `df -h {folder}`); cdui notices within a few seconds "
                              f"and resumes by itself, no restart needed", status=507)


def is_disk_full(exc: BaseException, free_bytes: int | None = None) -> bool:
    """True for sqlite's "database or disk is full" and for ENOSPC.

    sqlite reports some failed writes (the WAL index, a spilled page) as a
    generic I/O error; those count only when the disk really has no room left
    (``free_bytes`` below the reserve), so a broken disk is not called full."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == SQLITE_FULL:
        return True
    if "database or disk is full" in str(exc):
        return True
    is_ioerr = (code is not None and code & 0xFF == SQLITE_IOERR) or "disk I/O error" in str(exc)
    return bool(is_ioerr and free_bytes is not None and free_bytes < RESERVE_BYTES)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer can still use on ``folder``'s disk."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class Reserve:
    """A preallocated file whose space is given back to sqlite when the disk is full."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = Path(path)
        self.size = size

    @property
    def held(self) -> bool:
        try:
            return self.path.stat().st_size >= self.size
        except OSError:
            return False

    def make(self) -> bool:
        """Allocate the reserve (really allocate: not a sparse file); False if there is no room."""
        if self.held:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                block = b"\0" * 65536  # a file system without fallocate: write real blocks
                for _ in range(self.size // len(block)):
                    os.write(fd, block)
            os.fsync(fd)
            return True
        except OSError:
            self.release()
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Delete the reserve to make room; True if there was one to delete."""
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return False

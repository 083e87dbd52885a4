"""Files and folders only this OS user may read.

The user data folder holds the session token, worker credentials, the
database and the logs (which name files, hosts and run errors). On a shared
machine another local user must not read any of it, so:

- the folder is created ``0700``, and tightened to ``0700`` when it already
  exists with wider bits and belongs to us;
- files in it are created with an explicit ``0600`` mode (``O_CREAT`` with the
  mode, then ``fchmod``, so neither the caller's umask nor an older file with
  wider bits decides);
- the server and agent processes set a ``0077`` umask early, so files that
  libraries create behind our back (sqlite's WAL and SHM follow the database's
  mode too) are private as well. Run subprocesses get the user's own umask
  back: what they write into the data folders is the user's ordinary files.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import IO

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


_user_umask: int | None = None


def restrict_umask() -> int:
    """Make every file this process creates private from here on; returns the old umask."""
    global _user_umask
    old = os.umask(PRIVATE_UMASK)
    if _user_umask is None:
        _user_umask = old
    return old


def user_umask() -> int:
    """The umask this process was started with, before :func:`restrict_umask`.

    Run subprocesses get it back: what a run writes into the data folders
    (models, outputs, checkpoints) is the user's ordinary files, as uploads
    are, not cdui's private state."""
    if _user_umask is not None:
        return _user_umask
    current = os.umask(PRIVATE_UMASK)
    os.umask(current)
    return current


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) with mode 0700; tighten it if it is ours and wider."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = p.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(p, DIR_MODE)
    return p


def make_private(path: str | os.PathLike[str]) -> None:
    """Create ``path`` empty if missing, and set it to 0600 either way."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def open_private_append(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open a log file for appending (binary); it is 0600 whatever existed before."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")

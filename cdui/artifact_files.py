"""Looking at a file an ``artifact`` event names, without trusting the event.

An artifact event may come from a hostile worker, so the path it names is
treated like any other outside input before the control plane opens, walks,
hashes or later serves it:

- the path must lie inside one of the given roots (this server's data
  folders) once every symbolic link is resolved, and never inside a folder
  this server keeps to itself (its user data: credentials, database, token);
- it must be a regular file, or a folder whose every entry is a regular file
  or a folder (no symbolic links, FIFOs, sockets or devices), with at most
  :data:`MAX_FOLDER_FILES` files;
- files are opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
  ``fstat`` to be regular before a byte is read, so a FIFO or a device
  swapped in after the check cannot block the reading thread;
- only files up to ``max_hash_bytes`` are hashed (bigger ones are recorded
  with their size and no sha256).

These functions block (they touch the disk); callers run them with
``asyncio.to_thread``. Every refusal is an :class:`ArtifactRefused` whose
text says which path and why.
"""
from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_FOLDER_FILES = 10000
# Bigger files are recorded with their size but not hashed: reading many GiB
# on every artifact event would keep a disk and a thread busy for minutes.
MAX_HASH_BYTES = 4 * 1024 ** 3
MAX_FOLDER_DEPTH = 32


class ArtifactRefused(ValueError):
    """An artifact path that is not recorded; the text says which path and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"artifact path {path!r} refused: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class FileFacts:
    path: Path
    is_dir: bool
    size: int
    sha256: str | None


def _inside(p: Path, root: Path) -> bool:
    return p == root or root in p.parents


def confine(path: str | Path, roots: Iterable[Path], private: Iterable[Path] = ()) -> Path:
    """The resolved ``path`` if it lies under one of ``roots`` and under none of ``private``."""
    raw = str(path)
    if not raw or "\x00" in raw or len(raw) > 4096:
        raise ArtifactRefused(raw[:200], "empty, too long or with a NUL character")
    p = Path(raw)
    if not p.is_absolute():
        raise ArtifactRefused(raw, "not an absolute path")
    resolved = p.resolve()
    for priv in private:
        if _inside(resolved, Path(priv).resolve()):
            raise ArtifactRefused(raw, "it is inside this server's private user data folder")
    if not any(_inside(resolved, Path(r).resolve()) for r in roots):
        raise ArtifactRefused(raw, "it is outside this server's data folders")
    return resolved


def _hash_regular(path: Path, max_hash_bytes: int) -> tuple[int, str | None]:
    """(size, sha256 or None past the cap) of a regular file, never following a link or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ArtifactRefused(str(path), f"it cannot be opened as a plain file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactRefused(str(path), "it is not a regular file")
        if st.st_size > max_hash_bytes:
            return st.st_size, None
        h = hashlib.sha256()
        size = 0
        while size <= max_hash_bytes and (chunk := os.read(fd, 1 << 20)):
            h.update(chunk)
            size += len(chunk)
        if size > max_hash_bytes:
            return size, None  # it grew while being read: too big to hash after all
        return size, h.hexdigest()
    finally:
        os.close(fd)


def _walk_folder(folder: Path) -> int:
    """Total size of a folder of regular files; refuse anything else in it, and huge trees."""
    total = 0
    files = 0
    stack: list[tuple[Path, int]] = [(folder, 0)]
    while stack:
        d, depth = stack.pop()
        if depth > MAX_FOLDER_DEPTH:
            raise ArtifactRefused(str(folder), f"its folders nest deeper than {MAX_FOLDER_DEPTH} levels")
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((Path(e.path), depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    files += 1
                    if files > MAX_FOLDER_FILES:
                        raise ArtifactRefused(str(folder), f"it holds more than {MAX_FOLDER_FILES} files")
                    total += st.st_size
                else:
                    raise ArtifactRefused(str(folder), f"{e.path} is not a regular file or folder "
                                                       f"(links, FIFOs, sockets and devices are refused)")
    return total


def inspect(path: Path, max_hash_bytes: int) -> FileFacts | None:
    """Facts of an already confined path: None if nothing is there, else a regular
    file (hashed up to the cap) or a folder of regular files (sized, not hashed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArtifactRefused(str(path), f"it cannot be examined ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        return FileFacts(path, True, _walk_folder(path), None)
    if stat.S_ISREG(st.st_mode):
        size, digest = _hash_regular(path, max_hash_bytes)
        return FileFacts(path, False, size, digest)
    raise ArtifactRefused(str(path), "it is not a regular file or a folder (links, FIFOs, sockets and "
                                     "devices are refused)")

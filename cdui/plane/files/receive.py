"""The one streaming file receiver, for user uploads and workers' artifact uploads.

A multipart part streams into a temporary file (``.upload-*``) in the folder
it is going to, hashed on the way, and is refused past the size limit before
anything stored is touched. Only a completed file is renamed over its target,
with ordinary file permissions; anything else removes the temporary file.
Temporary files a crash left behind are removed when the server starts
(:func:`sweep_stale`): no upload is in flight before it serves.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdui.core.errors import CduiError, PathRefused

log = logging.getLogger("cdui.plane.files.receive")

TEMP_PREFIX = ".upload-"
CHUNK = 1 << 20


def refuse_temporary_name(rel: str) -> None:
    """A stored file may not be named like a temporary one: the listing would hide it and the
    next start's sweep would delete it, leaving its artifact row or upload record pointing at nothing."""
    if any(part.startswith(TEMP_PREFIX) for part in rel.replace("\\", "/").split("/")):
        raise PathRefused(rel, f"names starting with {TEMP_PREFIX!r} are reserved for uploads in progress")


@dataclass
class Received:
    tmp: Path
    size: int
    sha256: str
    done: bool = False

    def commit(self, target: Path, mode: int = 0o644) -> Path:
        """Rename the file over ``target``: mkstemp made it private; uploads are ordinary files of the user."""
        os.chmod(self.tmp, mode)
        os.replace(self.tmp, target)
        self.done = True
        return target

    def discard(self) -> None:
        """Remove the temporary file unless it was committed (safe to call twice)."""
        if not self.done:
            self.tmp.unlink(missing_ok=True)
            self.done = True


async def receive(part: Any, folder: Path, limit: int, too_large: Callable[[int], CduiError]) -> Received:
    """Stream ``part`` into a temporary file in ``folder``; ``too_large(size)`` is raised past ``limit``."""
    folder.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            while chunk := await part.read_chunk(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise too_large(size)
                h.update(chunk)
                fh.write(chunk)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Received(Path(tmp), size, h.hexdigest())


def sweep_stale(folders: Iterable[Path]) -> int:
    """Remove temporary upload files under ``folders`` (left by a crash); returns how many."""
    n = 0
    for folder in folders:
        if not folder.is_dir():
            continue
        for p in folder.rglob(TEMP_PREFIX + "*"):
            if p.is_file() and not p.is_symlink():
                try:
                    p.unlink()
                    n += 1
                except OSError as exc:
                    log.warning("could not remove the stale upload file %s: %s", p, exc)
    if n:
        log.info("removed %d temporary upload file(s) left by an earlier run", n)
    return n

"""The one streaming file receiver, for user uploads and workers' artifact uploads.

A multipart part streams into a temporary file (``.upload-*``) in the folder
it is going to, hashed on the way, and is refused past the size limit before
anything stored is touched. Only a completed file is renamed over its target,
with ordinary file permissions; anything else removes the temporary file.
Temporary files a crash left behind are removed when the server starts
(:func:`sweep_stale`): no upload is in flight before it serves.
"""
from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdui.core.errors import CduiError, PathRefused
from cdui.core.hashed_write import HashedWriter

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


def _temporary(folder: Path) -> tuple[int, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)


async def receive(part: Any, folder: Path, limit: int, too_large: Callable[[int], CduiError]) -> Received:
    """Stream ``part`` into a temporary file in ``folder``; ``too_large(size)`` is raised past ``limit``.
    The disk work runs in threads (``HashedWriter``), so a slow disk stalls this upload only."""
    fd, tmp = await asyncio.to_thread(_temporary, folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            async with HashedWriter(fh) as out:  # its last write ends before the file is closed
                while chunk := await _piece(part):
                    if out.size + len(chunk) > limit:
                        raise too_large(out.size + len(chunk))
                    await out.write(chunk)
                sha = await out.finish()
    except BaseException:
        # In a thread as well; it runs to its end even if this task is cancelled again meanwhile.
        await asyncio.to_thread(Path(tmp).unlink, missing_ok=True)
        raise
    return Received(Path(tmp), out.size, sha)


async def _piece(part: Any) -> bytes:
    """The part's next piece; a body that ends or goes on where the part said it would not (a part's
    Content-Length past the body's end or short of the part's, a body cut short) is the sender's error."""
    try:
        chunk: bytes = await part.read_chunk(CHUNK)
        return chunk
    except ValueError as exc:
        raise CduiError("bad_upload", f"the multipart body is malformed: {exc}",
                        hint="send each part whole; a Content-Length on a part must be its exact size") from None


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

"""Writing a file so that readers see the old content or the new, never a part of it.

Every whole-file write of state (tokens, pidfile-like status, spool marks,
checkpoints) goes through here: the content is written to a temporary name of
this process's own beside the target, then renamed over it. The temporary name
carries the pid because two processes may share a folder (two agents with one
user data folder), and one must not rename the other's half-written file away.
A failed write removes its temporary file and leaves the target as it was.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cdui.core.private import private_dir


def temp_name(path: Path) -> Path:
    """The hidden temporary name beside ``path`` that this process writes first."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write (by any means: ``torch.save``); on success it replaces ``path``."""
    target = Path(path)
    tmp = temp_name(target)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int | None = None) -> Path:
    """Replace ``path`` with ``data``; ``mode`` (e.g. 0o600) is set before the file appears under its name."""
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    with replacing(target) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        if mode is not None:
            os.chmod(tmp, mode)  # the umask may have taken bits away; the mode is what was asked
    return target


def write_private(path: Path, text: str) -> None:
    """Write a file readable by this OS user only (0600), atomically; its folder is made private if new."""
    if not path.parent.exists():
        private_dir(path.parent)
    atomic_write(path, text, mode=0o600)

"""The one safe-join function every outside path goes through (NOTES.md).

``safe_join(base, rel)`` returns a path inside ``base`` or raises
:class:`PathRefused`: no absolute paths, no ``..`` segments, no NUL or control
characters, bounded length, and no symlink that leads out of ``base``.

:func:`protected_folder` names what a node may never read even inside an
allowed folder: a ``.git`` (remote credentials, hooks), a ``.venv`` (code the
server imports), and any cdui user data folder (credentials, the database, the
session token), whichever agent or server it belongs to and whatever its name.
A user data folder is told by the files cdui keeps in it, so a second agent's
``CODEFYUI_USER_DATA_DIR=~/CodefyUI/ud2`` is found as surely as ``.codefyui_dev``.
"""
from __future__ import annotations

import hashlib
import os
import unicodedata
from pathlib import Path

from cdui.core.errors import PathRefused

MAX_NAME = 255
MAX_PATH = 4096

# Folder names no node may read into, wherever they sit below an allowed folder.
# A project's .env holds its secrets (cdui/core/project.py): no graph reads it as a file.
PROTECTED_NAMES = (".git", ".venv", ".codefyui_dev", ".env")
# Files and folders only a cdui user data folder holds (a server's or an agent's, see cdui/agent/agent.py and
# cdui/cli/daemon.py): one of them, or an agent credential agent/<host>-<port>.token, is enough to call the folder
# a user data folder. Names a dataset might use too (server.json, agent.json) are left out.
USER_DATA_MARKERS = ("cdui.sqlite3", "session-token", "cdui.pid", "agent.pid", "agent-status.json", "agent-runs",
                     "agent-instances", "agent-cache")


def check_name(name: str) -> str:
    """A single file name (no folders) as given by a user or a worker."""
    if not isinstance(name, str) or not name:
        raise PathRefused(repr(name), "empty file name")
    if len(name) > MAX_NAME:
        raise PathRefused(name[:40] + "...", f"file name longer than {MAX_NAME} characters")
    if "/" in name or "\\" in name:
        raise PathRefused(name, "a file name may not contain '/' or '\\'")
    if name in (".", ".."):
        raise PathRefused(name, "not a file name")
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise PathRefused(name.encode("unicode_escape").decode(), "control characters in file name")
    for c in name:
        what = _deceptive(c)
        if what is not None:
            raise PathRefused(name.encode("unicode_escape").decode(),
                              f"it contains U+{ord(c):04X} ({unicodedata.name(c, 'unnamed')}), {what}",
                              hint="rename the file without it")
    return name


# Characters that look like a folder separator without being one: in a listing, "a\u2215b.csv" reads as
# the file b.csv in a folder a. NFKC already maps the full-width and small forms to '/' and '\'.
# Letters of a script that look like one (katakana NO) stay allowed: they are someone's words.
SEPARATOR_LOOKALIKES = frozenset("\u2044\u2215\u2216\u29f5\u29f8\u29f9\u2571\u2572\u27cb\u27cd\u1735\u2cfa")


def _deceptive(c: str) -> str | None:
    """Why ``c`` makes a file name read as something it is not, or None.

    Format characters (category Cf: the bidi controls U+202A-U+202E and U+2066-U+2069, which reorder
    what is shown, "invoice\u202egpj.exe" showing as "invoiceexe.jpg"; zero-width characters) and
    line or paragraph separators are invisible; separator look-alikes fake a folder."""
    cat = unicodedata.category(c)
    if cat == "Cf":
        return "an invisible formatting character (bidi controls reorder how the name is shown)"
    if cat in ("Zl", "Zp", "Cs", "Co"):
        return "a character that is no part of a file name"
    if c in SEPARATOR_LOOKALIKES or unicodedata.normalize("NFKC", c) in ("/", "\\"):
        return "which looks like a folder separator"
    return None


def safe_join(base: str | os.PathLike[str], rel: str, *, allow_empty: bool = False) -> Path:
    """Join ``rel`` under ``base``; refuse anything that would leave ``base``."""
    if not isinstance(rel, str):
        raise PathRefused(repr(rel), "not a string")
    if len(rel) > MAX_PATH:
        raise PathRefused(rel[:40] + "...", f"path longer than {MAX_PATH} characters")
    if "\x00" in rel or any(ord(c) < 32 for c in rel):
        raise PathRefused(rel.encode("unicode_escape").decode(), "control characters in path")
    rel_norm = rel.replace("\\", "/")
    if rel_norm.startswith("/") or (len(rel_norm) > 1 and rel_norm[1] == ":"):
        raise PathRefused(rel, "absolute paths are not allowed here")
    parts = [p for p in rel_norm.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise PathRefused(rel, "'..' is not allowed")
    for p in parts:
        if len(p) > MAX_NAME:
            raise PathRefused(rel[:60], f"a path segment is longer than {MAX_NAME} characters")
    if not parts and not allow_empty:
        raise PathRefused(rel, "empty path")
    base_path = Path(base).resolve()
    target = base_path.joinpath(*parts)
    # Symlinks: whatever exists of the path must resolve inside base.
    resolved = target.resolve()
    if resolved != base_path and base_path not in resolved.parents:
        raise PathRefused(rel, "it leads outside its folder through a symbolic link")
    return target


def is_user_data_folder(folder: Path) -> bool:
    """Whether ``folder`` is a cdui user data folder (of this process or any other)."""
    try:
        if any((folder / m).exists() for m in USER_DATA_MARKERS):
            return True
        creds = folder / "agent"  # an agent's credentials: agent/<host>-<port>.token
        return creds.is_dir() and any(p.suffix == ".token" for p in creds.iterdir())
    except OSError:
        return False


def protected_folder(path: Path, base: Path) -> Path | None:
    """The first folder below ``base`` on the way to ``path`` (both resolved, ``path`` inside ``base``)
    that no node may read: one named in :data:`PROTECTED_NAMES` or a user data folder. None: nothing is.

    ``base`` itself is not looked at: the caller passes the deepest folder it allows (a run's own data
    folder may sit inside an agent's user data folder, and what is under it is the run's)."""
    cur = base
    for part in path.relative_to(base).parts:
        cur = cur / part
        if part in PROTECTED_NAMES or is_user_data_folder(cur):
            return cur
    return None


def sha256_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in 1 MiB chunks: files are named and
    checked by content wherever they move (NOTES.md)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()

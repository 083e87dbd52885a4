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

A recorded artifact is immutable (docs/api.md#artifacts-keep-their-bytes):
:class:`KeptFiles` keeps the bytes of every recorded regular file under their
sha256, in ``<data>/artifacts/<sha[:2]>/<sha256>``, as a hard link to the file
the run wrote (a copy only where a link cannot be made: another file system,
or a file of another OS user). The named path (``data/models/iris/model.pt``)
stays "the latest"; a later run that writes there gets a new file (the run
context unlinks a linked file before a node writes it, and cdui's own writers
replace files by rename), so the kept link still holds the first run's bytes.
Identical bytes are kept once. A kept file is checked against its name before
it is served (hashed again whenever its inode, size, mtime or ctime changed
since the last check), so bytes that differ from a row's sha256 are never
served, whatever changed them.

These functions block (they touch the disk); callers run them with
``asyncio.to_thread``. Every refusal is an :class:`ArtifactRefused` whose
text says which path and why.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

MAX_FOLDER_FILES = 10000
# Bigger files are recorded with their size but not hashed: reading many GiB
# on every artifact event would keep a disk and a thread busy for minutes.
MAX_HASH_BYTES = 4 * 1024 ** 3
MAX_FOLDER_DEPTH = 32
KEPT_FOLDER = "artifacts"  # under the data folder: <data>/artifacts/<sha[:2]>/<sha256>
# The backends whose files this server holds (and keeps); s3 rows live in the bucket,
# left_on_worker rows on the worker.
KEPT_BACKENDS = ("local", "mount", "transfer")
KEEP_TEMP_PREFIX = ".keep-"
STALE_KEEP_TEMP_S = 3600.0
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_VERIFIED = 100_000  # stamps of checked kept files remembered (then forgotten, and hashed again when served)

log = logging.getLogger(__name__)


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


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    """(descriptor, stat) of a regular file, opened without following a link or blocking on a FIFO;
    the caller closes the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ArtifactRefused(str(path), f"it cannot be opened as a plain file ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ArtifactRefused(str(path), "it is not a regular file")
    return fd, st


def _hash_regular(path: Path, max_hash_bytes: int) -> tuple[int, str | None]:
    """(size, sha256 or None past the cap) of a regular file, never following a link or blocking on a FIFO."""
    fd, st = _open_regular(path)
    try:
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


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _copy_hashing(src: Path, dest: Path, max_hash_bytes: int) -> tuple[int, str | None]:
    """Copy the regular file ``src`` to the new file ``dest`` while hashing it: (size, sha256).
    A file over the cap is not copied (size, None): it cannot be named by its sha256."""
    fd, st = _open_regular(src)
    try:
        if st.st_size > max_hash_bytes:
            return st.st_size, None
        h = hashlib.sha256()
        size = 0
        with open(dest, "xb") as out:
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > max_hash_bytes:
                    return size, None
                h.update(chunk)
                out.write(chunk)
        return size, h.hexdigest()
    finally:
        os.close(fd)


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes whenever a file's bytes may have: its inode, size, mtime and ctime (which no
    unprivileged writer can set back)."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class KeptFiles:
    """The recorded artifacts' bytes, named by their sha256 (see the module docstring).

    One per control plane, on its data folder. :meth:`keep` is called when a row is recorded,
    :meth:`open_verified` when one is downloaded, :meth:`release` when the last row naming
    some bytes is deleted."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # sha256 -> the stamp of the kept file when its bytes were last hashed and matched
        self._verified: dict[str, tuple[int, int, int, int]] = {}

    def path_of(self, sha: str) -> Path:
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise ValueError(f"not a sha256: {str(sha)[:80]!r}")
        return self.root / sha[:2] / sha

    def keep(self, path: Path, max_hash_bytes: int, expect: str | None = None,
             only_expected: bool = False) -> FileFacts | None:
        """Facts of the already confined ``path`` (as :func:`inspect`), and a regular file's bytes kept
        under their sha256. ``expect``: keep them only if they have this sha256 (a worker said so);
        ``only_expected``: keep nothing when ``expect`` is None (no row would name the bytes).
        Files over ``max_hash_bytes`` have no sha256 and are not kept."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArtifactRefused(str(path), f"it cannot be examined ({exc.strerror})") from None
        if not stat.S_ISREG(st.st_mode) or (only_expected and expect is None):
            return inspect(path, max_hash_bytes)
        if st.st_size > max_hash_bytes:
            return FileFacts(path, False, st.st_size, None)
        tmp = self._temp()
        try:
            self._own_folder(self.root)
            try:
                # The link is to whatever the name holds now; a symlink swapped in is refused below.
                os.link(path, tmp, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as exc:
                # Another file system (EXDEV), or a file of another OS user (protected_hardlinks): a copy.
                log.info("recorded artifact %s is copied, not linked, into %s (%s)", path, self.root, exc.strerror)
                size, sha = _copy_hashing(path, tmp, max_hash_bytes)
            else:
                if not stat.S_ISREG(os.lstat(tmp).st_mode):
                    raise ArtifactRefused(str(path), "it is not a regular file")
                size, sha = _hash_regular(tmp, max_hash_bytes)
            if sha is not None and (expect is None or sha == expect):
                self._install(tmp, sha)
            return FileFacts(path, False, size, sha)
        except OSError as exc:
            # The store cannot take it (a full disk, a read-only folder): the row is still recorded, and
            # its download works while the file at its path keeps these bytes.
            log.warning("recorded artifact %s could not be kept in %s: %s", path, self.root, exc)
            size, sha = _hash_regular(path, max_hash_bytes)
            return FileFacts(path, False, size, sha)
        finally:
            tmp.unlink(missing_ok=True)

    def _temp(self) -> Path:
        """A fresh name in the store for a file being kept (swept when a crash leaves it)."""
        return self.root / f"{KEEP_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"

    def keep_received(self, path: Path, sha: str) -> None:
        """Keep a file this server has just received and hashed itself (a worker's upload)."""
        tmp = self._temp()
        try:
            self._own_folder(self.root)
            try:
                os.link(path, tmp, follow_symlinks=False)
            except OSError:
                _size, got = _copy_hashing(path, tmp, MAX_HASH_BYTES)
                if got != sha:
                    return  # it changed since it arrived: nothing is kept under a wrong name
            self._install(tmp, sha)
        except OSError as exc:
            log.warning("uploaded artifact %s could not be kept in %s: %s", path, self.root, exc)
        finally:
            tmp.unlink(missing_ok=True)

    def _install(self, tmp: Path, sha: str) -> None:
        """``tmp`` (bytes just hashed to ``sha``) becomes the kept file: fresh bytes replace whatever
        was kept under that name, so a kept file changed in place is mended by the next run that
        records the same bytes."""
        dest = self.path_of(sha)
        self._own_folder(dest.parent)
        os.replace(tmp, dest)  # a link to the same inode is left as it is (and tmp removed by the caller)
        self._remember(sha, _stamp(os.stat(dest, follow_symlinks=False)))

    def _remember(self, sha: str, stamp: tuple[int, int, int, int]) -> None:
        if len(self._verified) >= MAX_VERIFIED:
            self._verified.clear()
        self._verified[sha] = stamp

    @staticmethod
    def _own_folder(folder: Path) -> None:
        """Make ``folder`` if needed; refuse one that is not a plain folder: a link put there (by a
        mounted worker, which shares the data folder) must not lead kept files anywhere else."""
        folder.mkdir(parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise NotADirectoryError(f"{folder} is a link, not a folder; remove it")

    def open_verified(self, sha: str) -> int | None:
        """An open descriptor (at offset 0) of the kept file with exactly these bytes, or None when
        none is kept. A kept file whose bytes no longer match is removed (it was changed in place)."""
        try:
            path = self.path_of(sha)
        except ValueError:
            return None
        try:
            fd, st = _open_regular(path)
        except ArtifactRefused:
            return None
        try:
            if self._verified.get(sha) != _stamp(st):
                if _hash_fd(fd) != sha:
                    os.close(fd)
                    log.warning("the kept artifact file %s was changed in place; it is removed", path)
                    self._verified.pop(sha, None)
                    self._unlink_if(path, st.st_ino)
                    return None
                os.lseek(fd, 0, os.SEEK_SET)
                self._remember(sha, _stamp(st))
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def open_matching(path: Path, sha: str) -> int | None:
        """An open descriptor (at offset 0) of the regular file ``path`` if it holds exactly the bytes
        named ``sha`` (hashed through that descriptor, so what is served is what was checked)."""
        try:
            fd, _st = _open_regular(path)
        except ArtifactRefused:
            return None
        try:
            if _hash_fd(fd) == sha:
                os.lseek(fd, 0, os.SEEK_SET)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    @staticmethod
    def _unlink_if(path: Path, ino: int) -> None:
        try:
            if os.lstat(path).st_ino == ino:
                path.unlink()
        except OSError:
            pass

    def release(self, shas: Iterable[str]) -> int:
        """Forget the kept files of ``shas`` (no row names them any more); how many were removed.
        A named path linked to the same bytes keeps them."""
        n = 0
        for sha in shas:
            self._verified.pop(sha, None)
            try:
                self.path_of(sha).unlink()
                n += 1
            except (OSError, ValueError):
                pass
        return n

    def sweep_temporary(self, now: float | None = None) -> int:
        """Remove what a crash left in the middle of :meth:`keep` (links and copies under temporary
        names); only old ones, by ctime, which linking sets: a keep in progress is never removed."""
        now = time.time() if now is None else now
        n = 0
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return 0
        for e in entries:
            if not e.name.startswith(KEEP_TEMP_PREFIX):
                continue
            try:
                old = now - e.stat(follow_symlinks=False).st_ctime > STALE_KEEP_TEMP_S
                if e.is_file(follow_symlinks=False) and old:
                    os.unlink(e.path)
                    n += 1
            except OSError:
                pass
        return n


class KeepGate:
    """Keeps run side by side (hashing a big file holds up no other run); a release waits until none
    is in progress and holds new ones back meanwhile, so it never removes bytes that a keep has just
    installed but not yet named in a row."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._keeping = 0
        self._releases = 0  # waiting or in progress: new keeps wait for them (no starved release)

    @asynccontextmanager
    async def keeping(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: self._releases == 0)
            self._keeping += 1
        try:
            yield
        finally:
            async with self._cond:
                self._keeping -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def releasing(self) -> AsyncIterator[None]:
        async with self._cond:
            self._releases += 1
            await self._cond.wait_for(lambda: self._keeping == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._releases -= 1
                self._cond.notify_all()

"""Release bundles: what `cdui release bundle` writes and every updater checks before it installs anything.

A bundle is a folder, or a ``.tar`` of one, holding ``manifest.json`` and wheels::

    {"format": "cdui-bundle", "format_version": 1, "version": "0.2.0", "created": "2026-12-03T08:00:00Z",
     "cdui_wheel": "cdui-0.2.0-py3-none-any.whl",
     "files": [{"name": "cdui-0.2.0-py3-none-any.whl", "sha256": "…", "size": 123456}, …]}

Invariants, whoever hands the bundle over (a USB stick, another local user, a worker's peer):

- Only files the manifest lists are ever read, each by a plain wheel file name (no ``/``, no ``..``, no
  leading dot, ending ``.whl``); a tar's other members, links and folders are skipped, never extracted.
- Every count and size is bounded before the work it would cost (:data:`MAX_FILES`, :data:`MAX_FILE_BYTES`,
  :data:`MAX_TOTAL_BYTES`, :data:`MAX_MANIFEST_BYTES`).
- :func:`stage` copies each listed file into a private folder of the caller's, hashing what it writes, and
  refuses the whole bundle on the first size or sha256 that differs from the manifest: an installer reads
  only the staged copies, which nobody else can change after they were checked.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cdui.core.errors import CduiError

FORMAT = "cdui-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 1000
MAX_FILE_BYTES = 8 << 30  # a CUDA build of torch is a few GB
MAX_TOTAL_BYTES = 64 << 30
MAX_TAR_MEMBERS = 4 * MAX_FILES  # members looked at in a .tar before it is refused (a tar of junk)
# Where `cdui update` keeps the bundle it installed, checked, in the control plane's user data folder: what
# the control plane offers to agents that update themselves (only while its version is the bundle's).
OFFERED = ("update", "bundle")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,250}\.whl")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOCK = 1 << 20


class BundleRefused(CduiError):
    """The bundle is not installed: what is wrong with it, and that nothing was changed."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__("bundle_refused", message, hint=hint or None)


@dataclass(frozen=True)
class BundleFile:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    version: str
    created: str
    cdui_wheel: str
    files: tuple[BundleFile, ...]

    @property
    def dependency_wheels(self) -> tuple[BundleFile, ...]:
        return tuple(f for f in self.files if f.name != self.cdui_wheel)

    def entry(self, name: str) -> BundleFile | None:
        return next((f for f in self.files if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "version": self.version,
                "created": self.created, "cdui_wheel": self.cdui_wheel,
                "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in self.files]}


def offered_dir(user_data: Path) -> Path:
    return user_data.joinpath(*OFFERED)


def offered(user_data: Path, version: str) -> Manifest | None:
    """The manifest of the bundle kept for agents, when there is one of ``version``; else None. Its files were
    checked when `cdui update` staged them into this private folder."""
    try:
        m = _read_manifest_file(offered_dir(user_data) / MANIFEST)
    except BundleRefused:
        return None
    return m if m.version == version else None


def check_name(name: object) -> str:
    """``name`` if it is a plain wheel file name a bundle may hold; else :class:`BundleRefused`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise BundleRefused(f"the manifest names {name!r}, which is not a plain wheel file name "
                            f"(letters, digits and ._+!- only, ending .whl, no folder)")
    return name


def parse_manifest(raw: bytes, where: str = MANIFEST) -> Manifest:
    """The manifest in ``raw``, every field checked; else :class:`BundleRefused` naming what is wrong."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleRefused(f"{where} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise BundleRefused(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleRefused(f"{where} is not the manifest of a cdui release bundle (its format is not {FORMAT!r})",
                            "make the bundle with `cdui release bundle OUT` on a connected machine")
    if doc.get("format_version") != FORMAT_VERSION:
        raise BundleRefused(f"{where} has format version {doc.get('format_version')!r}; this cdui reads "
                            f"{FORMAT_VERSION}")
    version = doc.get("version")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise BundleRefused(f"{where} gives the version {version!r}, which is not a version number")
    entries = doc.get("files")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_FILES:
        raise BundleRefused(f"{where} must list 1 to {MAX_FILES} files")
    files: list[BundleFile] = []
    seen: set[str] = set()
    total = 0
    for e in entries:
        if not isinstance(e, dict):
            raise BundleRefused(f"{where} lists {e!r}, not a file entry")
        name = check_name(e.get("name"))
        sha, size = e.get("sha256"), e.get("size")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise BundleRefused(f"{where} gives {name} the sha256 {sha!r}, which is not 64 lowercase hex digits")
        if type(size) is not int or not 0 < size <= MAX_FILE_BYTES:
            raise BundleRefused(f"{where} gives {name} the size {size!r}; a bundle file holds 1 to "
                                f"{MAX_FILE_BYTES} bytes")
        if name in seen:
            raise BundleRefused(f"{where} lists {name} twice")
        seen.add(name)
        total += size
        files.append(BundleFile(name, sha, size))
    if total > MAX_TOTAL_BYTES:
        raise BundleRefused(f"{where} lists {total} bytes in all, more than the {MAX_TOTAL_BYTES} a bundle may hold")
    wheel = doc.get("cdui_wheel")
    if wheel not in seen or not isinstance(wheel, str) or not wheel.startswith(f"cdui-{version}-"):
        raise BundleRefused(f"{where} names {wheel!r} as cdui's wheel: it must be a listed file named "
                            f"cdui-{version}-….whl")
    created = doc.get("created")
    return Manifest(version, created if isinstance(created, str) else "", wheel, tuple(files))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def make_manifest(folder: Path, version: str, cdui_wheel: str, names: Iterable[str]) -> Manifest:
    files = tuple(BundleFile(check_name(n), sha256_file(folder / n), (folder / n).stat().st_size)
                  for n in sorted(set(names)))
    return Manifest(version, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cdui_wheel, files)


class CheckedWriter:
    """Writes one listed file to ``dest`` (new, 0600) while hashing it: more bytes than the manifest gives
    it, or at :meth:`finish` another size or sha256, refuse the bundle (``where`` names the file)."""

    def __init__(self, entry: BundleFile, dest: Path, where: str) -> None:
        self.entry, self.where, self.n = entry, where, 0
        self.h = hashlib.sha256()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self.out = os.fdopen(fd, "wb")

    def write(self, block: bytes) -> None:
        self.n += len(block)
        if self.n > self.entry.size:
            self.out.close()
            self._refuse()
        self.h.update(block)
        self.out.write(block)

    def finish(self) -> None:
        self.out.close()
        if self.n != self.entry.size or self.h.hexdigest() != self.entry.sha256:
            self._refuse()

    def _refuse(self) -> None:
        got = f"{self.n} bytes" if self.n != self.entry.size else f"sha256 {self.h.hexdigest()}"
        if self.n > self.entry.size:
            got = f"more than {self.entry.size} bytes"
        raise BundleRefused(f"{self.where} does not match the manifest: it has {got}, the manifest says "
                            f"{self.entry.size} bytes with sha256 {self.entry.sha256}; the bundle was changed or "
                            f"damaged after it was made", "make the bundle again, or copy it again from where it "
                            "was made")


def _copy_checked(src: IO[bytes], entry: BundleFile, dest: Path, where: str) -> None:
    """Copy ``src`` to ``dest`` through a :class:`CheckedWriter` (at most one byte more than listed is read)."""
    w = CheckedWriter(entry, dest, where)
    while w.n <= entry.size:
        block = src.read(min(_BLOCK, entry.size + 1 - w.n))
        if not block:
            break
        w.write(block)
    w.finish()


def _read_manifest_file(path: Path) -> Manifest:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise BundleRefused(f"cannot read {path}: {exc.strerror or exc}",
                            "give a folder or .tar made by `cdui release bundle`") from None
    return parse_manifest(raw, str(path))


def read_manifest(bundle: Path) -> Manifest:
    """The manifest of the bundle folder or ``.tar`` at ``bundle`` (its files are not checked here)."""
    if bundle.is_dir():
        return _read_manifest_file(bundle / MANIFEST)
    with _open_tar(bundle) as tar:
        return _tar_manifest(tar, bundle)


def _open_tar(bundle: Path) -> tarfile.TarFile:
    if not bundle.is_file():
        raise BundleRefused(f"{bundle} is neither a bundle folder nor a .tar file",
                            "give the folder or .tar that `cdui release bundle OUT` made")
    try:
        return tarfile.open(bundle, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise BundleRefused(f"{bundle} is not a readable tar file: {exc}") from None


def _members(tar: tarfile.TarFile, bundle: Path) -> dict[str, tarfile.TarInfo]:
    """The tar's regular files at its top level (or under one folder), by name; nothing else."""
    out: dict[str, tarfile.TarInfo] = {}
    for i, m in enumerate(tar):
        if i >= MAX_TAR_MEMBERS:
            raise BundleRefused(f"{bundle} has more than {MAX_TAR_MEMBERS} members; a bundle has at most "
                                f"{MAX_FILES} files")
        parts = m.name.split("/")
        if m.isreg() and 1 <= len(parts) <= 2 and ".." not in parts:
            out.setdefault(parts[-1], m)
    return out


def _tar_manifest(tar: tarfile.TarFile, bundle: Path) -> Manifest:
    m = _members(tar, bundle).get(MANIFEST)
    if m is None:
        raise BundleRefused(f"{bundle} holds no {MANIFEST}", "give a .tar made by `cdui release bundle OUT.tar`")
    f = tar.extractfile(m)
    if f is None:
        raise BundleRefused(f"cannot read {MANIFEST} in {bundle}")
    return parse_manifest(f.read(MAX_MANIFEST_BYTES + 1), f"{bundle}:{MANIFEST}")


def stage(bundle: Path, dest: Path) -> Manifest:
    """Check the bundle at ``bundle`` (folder or ``.tar``) into the new private folder ``dest``: the manifest
    and each file it lists, copied and hashed. On any refusal ``dest`` is removed and nothing else changed."""
    dest.mkdir(mode=0o700, parents=False, exist_ok=False)
    try:
        if bundle.is_dir():
            manifest = _read_manifest_file(bundle / MANIFEST)
            for e in manifest.files:
                src = bundle / e.name
                if src.is_symlink() or not src.is_file():
                    raise BundleRefused(f"{src} is missing from the bundle or not a plain file (the manifest "
                                        f"lists it)")
                with open(src, "rb") as f:
                    _copy_checked(f, e, dest / e.name, str(src))
        else:
            with _open_tar(bundle) as tar:
                manifest = _tar_manifest(tar, bundle)
                members = _members(tar, bundle)
                for e in manifest.files:
                    m = members.get(e.name)
                    member = tar.extractfile(m) if m is not None else None
                    if member is None:
                        raise BundleRefused(f"{bundle} does not hold {e.name} (the manifest lists it)")
                    _copy_checked(member, e, dest / e.name, f"{bundle}:{e.name}")
        (dest / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return manifest

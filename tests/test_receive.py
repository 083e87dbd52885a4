"""The one streaming file receiver: hash and size on the way, a limit, no leftovers."""
from __future__ import annotations

import asyncio
import hashlib
import stat
from pathlib import Path

import pytest

from cdui.core.errors import CduiError
from cdui.plane.files.receive import TEMP_PREFIX, receive, sweep_stale


class Part:
    """A multipart part as aiohttp gives it: chunks, then b''."""

    def __init__(self, data: bytes, chunk: int = 3) -> None:
        self.chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)]

    async def read_chunk(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def too_large(size: int) -> CduiError:
    return CduiError("too_large", f"{size} bytes", status=413)


def test_receive_then_commit(tmp_path: Path) -> None:
    got = asyncio.run(receive(Part(b"a,b\n1,2\n"), tmp_path, 100, too_large))
    assert (got.size, got.sha256) == (8, hashlib.sha256(b"a,b\n1,2\n").hexdigest())
    got.commit(tmp_path / "t.csv")
    got.discard()  # after a commit: nothing to remove
    assert (tmp_path / "t.csv").read_bytes() == b"a,b\n1,2\n"
    assert stat.S_IMODE((tmp_path / "t.csv").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_over_the_limit_leaves_nothing_and_keeps_the_stored_file(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_bytes(b"old")
    with pytest.raises(CduiError) as exc:
        asyncio.run(receive(Part(b"x" * 20), tmp_path, 10, too_large))
    assert exc.value.code == "too_large"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
    assert (tmp_path / "t.csv").read_bytes() == b"old"


def test_discard_removes_an_uncommitted_file(tmp_path: Path) -> None:
    got = asyncio.run(receive(Part(b"abc"), tmp_path, 10, too_large))
    got.discard()
    assert list(tmp_path.iterdir()) == []


def test_sweep_stale_removes_only_temporary_upload_files(tmp_path: Path) -> None:
    (tmp_path / "files" / "sub").mkdir(parents=True)
    (tmp_path / "files" / f"{TEMP_PREFIX}abc").write_bytes(b"half")
    (tmp_path / "files" / "sub" / f"{TEMP_PREFIX}def").write_bytes(b"half")
    (tmp_path / "files" / "keep.csv").write_bytes(b"ok")
    assert sweep_stale([tmp_path / "files", tmp_path / "missing"]) == 2
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == ["files/keep.csv"]

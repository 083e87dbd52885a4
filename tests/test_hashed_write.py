"""HashedWriter: network pieces written and hashed in threads, gathered before each trip."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from cdui.core.hashed_write import HashedWriter


@pytest.mark.parametrize("gather", [1, 5, 64, 1 << 20])
def test_every_piece_is_written_and_hashed_whatever_the_gathering(tmp_path: Path, gather: int) -> None:
    data = bytes(range(256)) * 3
    pieces = [data[i:i + 7] for i in range(0, len(data), 7)]

    async def write() -> tuple[str, int]:
        with open(tmp_path / "f", "wb") as fh:
            out = HashedWriter(fh, gather=gather)
            for piece in pieces:
                await out.write(piece)
            return await out.finish(), out.size

    sha, size = asyncio.run(write())
    assert (tmp_path / "f").read_bytes() == data
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))


def test_nothing_is_written_before_a_gather_fills_and_the_rest_at_finish(tmp_path: Path) -> None:
    async def write() -> list[int]:
        sizes = []
        with open(tmp_path / "f", "wb", buffering=0) as fh:
            out = HashedWriter(fh, gather=10)
            for piece in (b"abcd", b"efgh", b"ijkl", b"mn"):
                await out.write(piece)
                sizes.append((tmp_path / "f").stat().st_size)
            await out.finish()
            sizes.append((tmp_path / "f").stat().st_size)
        return sizes

    assert asyncio.run(write()) == [0, 0, 12, 12, 14]


def test_an_empty_stream_is_the_empty_file(tmp_path: Path) -> None:
    async def write() -> str:
        with open(tmp_path / "f", "wb") as fh:
            return await HashedWriter(fh).finish()

    assert asyncio.run(write()) == hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "f").read_bytes() == b""

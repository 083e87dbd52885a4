"""HashedWriter: network pieces hashed and written in a thread (of a small shared pool) while the caller reads on."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from cdui.core import hashed_write
from cdui.core.hashed_write import HashedWriter


@pytest.fixture(autouse=True, params=["inline", "overlapped"])
def batch_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test both ways: a batch hashed and written by one thread (small batches), and a batch
    written by a thread of the second pool while the first hashes it (batches of 64 KiB and more)."""
    monkeypatch.setattr(hashed_write, "OVERLAP_FROM", 1 << 62 if request.param == "inline" else 1)
    return str(request.param)


@pytest.mark.parametrize(("gather", "depth"), [(1, 1), (5, 2), (64, 8), (1 << 20, 8)])
def test_every_piece_is_written_and_hashed_in_order_whatever_the_gathering(
        tmp_path: Path, gather: int, depth: int) -> None:
    data = bytes(range(256)) * 3
    pieces: list[Any] = [data[i:i + 7] for i in range(0, len(data), 7)]
    pieces[1] = bytearray(pieces[1])  # any buffer is taken
    pieces[2] = memoryview(pieces[2])

    async def write() -> tuple[str, int]:
        with open(tmp_path / "f", "wb") as fh:
            async with HashedWriter(fh, gather=gather, depth=depth) as out:
                for piece in pieces:
                    await out.write(piece)
                return await out.finish(), out.size

    sha, size = asyncio.run(write())
    assert (tmp_path / "f").read_bytes() == data
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_buffer_the_caller_reuses_after_handing_it_over_is_written_as_it_was(tmp_path: Path) -> None:
    async def write() -> str:
        buf = bytearray(b"a" * 10)
        with open(tmp_path / "f", "wb") as fh:
            async with HashedWriter(fh, gather=1 << 20) as out:
                await out.write(buf)
                buf[:] = b"b" * 10
                await out.write(buf)
                return await out.finish()

    assert asyncio.run(write()) == hashlib.sha256(b"a" * 10 + b"b" * 10).hexdigest()
    assert (tmp_path / "f").read_bytes() == b"a" * 10 + b"b" * 10


def test_an_empty_stream_is_the_empty_file(tmp_path: Path) -> None:
    async def write() -> str:
        with open(tmp_path / "f", "wb") as fh:
            async with HashedWriter(fh) as out:
                return await out.finish()

    assert asyncio.run(write()) == hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "f").read_bytes() == b""


def test_a_disk_error_in_the_thread_reaches_the_caller() -> None:
    """/dev/full answers every write with ENOSPC, as a full disk does: the error is the caller's, by the
    next write or by finish, and nothing is hashed as if it had been written."""
    async def write() -> None:
        with open("/dev/full", "wb", buffering=0) as fh:
            async with HashedWriter(fh, gather=4, depth=1) as out:
                for _ in range(100):
                    await out.write(b"abcd")
                await out.finish()

    with pytest.raises(OSError) as err:
        asyncio.run(write())
    assert err.value.errno == errno.ENOSPC


class SlowFile:
    """A file whose writes wait until the test lets them through (a slow disk), counting what it took."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.written = bytearray()

    def write(self, data: bytes) -> int:
        self.entered.set()
        self.open.wait(60)
        self.written += data
        return len(data)


def test_a_slow_disk_holds_the_caller_back_at_the_bounded_depth() -> None:
    """With the disk stuck, the caller's writes stop being taken once ``depth`` batches wait: memory
    stays bounded whatever the file's size."""
    gather, depth = 100, 3
    disk = SlowFile()

    async def main() -> tuple[int, bool, str, int]:
        async with HashedWriter(disk, gather=gather, depth=depth) as out:  # type: ignore[arg-type]
            async def feed() -> str:
                for _ in range(1000):
                    await out.write(b"x" * gather)
                return await out.finish()

            task = asyncio.create_task(feed())
            await asyncio.to_thread(disk.entered.wait, 60)
            for _ in range(200):
                await asyncio.sleep(0)
            taken, done = out.size, task.done()
            disk.open.set()
            return taken, done, await task, len(disk.written)

    taken, done, sha, written = asyncio.run(main())
    assert not done
    assert taken <= gather * (depth + 2), "one batch in the thread, depth waiting, one being gathered"
    assert written == 1000 * gather and sha == hashlib.sha256(b"x" * gather * 1000).hexdigest()


def test_a_caller_that_gives_up_stops_the_thread_before_it_closes_the_file(tmp_path: Path) -> None:
    disk = SlowFile()

    async def main() -> None:
        async with HashedWriter(disk, gather=10, depth=8) as out:  # type: ignore[arg-type]
            for _ in range(5):
                await out.write(b"y" * 10)
            await asyncio.to_thread(disk.entered.wait, 60)
            asyncio.get_running_loop().call_soon(disk.open.set)
            raise KeyError("the caller gives up")

    with pytest.raises(KeyError):
        asyncio.run(main())
    assert len(disk.written) == 10, "the batch being written when the caller left, and nothing after it"


def test_a_closed_writer_takes_nothing_more(tmp_path: Path) -> None:
    async def main() -> None:
        with open(tmp_path / "f", "wb") as fh:
            out = HashedWriter(fh)
            await out.aclose()
            await out.write(b"late")

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(main())
    assert (tmp_path / "f").read_bytes() == b""


def test_many_writers_at_once_share_a_few_threads_and_each_stays_in_order(tmp_path: Path) -> None:
    """A hostile worker may open hundreds of uploads at once: they queue batches, not threads."""
    data = [bytes([i % 251]) * 5 + bytes(range(i % 7, 40)) for i in range(200)]

    async def one(i: int) -> str:
        with open(tmp_path / f"f{i}", "wb") as fh:
            async with HashedWriter(fh, gather=8, depth=2) as out:
                for k in range(0, len(data[i]), 3):
                    await out.write(data[i][k:k + 3])
                    await asyncio.sleep(0)
                return await out.finish()

    async def main() -> tuple[list[str], int]:
        peak = 0
        task = asyncio.ensure_future(asyncio.gather(*(one(i) for i in range(200))))
        while not task.done():
            peak = max(peak, sum(t.name.startswith("cdui-hashed-write") for t in threading.enumerate()))
            await asyncio.sleep(0)
        return await task, peak

    shas, peak = asyncio.run(main())
    assert shas == [hashlib.sha256(d).hexdigest() for d in data]
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(200)] == data
    assert 1 <= peak <= 2 * hashed_write.THREADS, peak  # the hashing pool and the writes' pool


def test_a_big_batch_is_written_while_it_is_hashed(tmp_path: Path, batch_path: str) -> None:
    """Batches of a MiB (an upload's or a download's), many at once: every file whole and in order, and
    its hash that of its bytes, whichever thread wrote them."""
    data = [hashlib.sha256(bytes([i])).digest() * (3 << 15) for i in range(6)]  # 3 MiB each

    async def one(i: int) -> str:
        with open(tmp_path / f"f{i}", "wb") as fh:
            async with HashedWriter(fh) as out:
                for k in range(0, len(data[i]), 100_000):
                    await out.write(data[i][k:k + 100_000])
                return await out.finish()

    async def main() -> list[str]:
        return list(await asyncio.gather(*(one(i) for i in range(6))))

    assert asyncio.run(main()) == [hashlib.sha256(d).hexdigest() for d in data]
    assert [(tmp_path / f"f{i}").read_bytes() for i in range(6)] == data

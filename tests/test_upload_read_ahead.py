"""The agent's upload body: a file arrives whole and in order, by sendfile (SentFile) or read ahead (ReadAheadFile).

A real aiohttp server on a loopback port receives the agent's own upload body (multipart/mixed, each part
with its Content-Length, so the receiver reads the file by its length) with the control plane's own
receiver (cdui.plane.files.receive), which hashes what it stores; sizes around the read-ahead piece and the
sendfile slice, and two uploads one after the other on one session, as the agent sends a run's outputs.
Over TLS the bytes cannot go to the socket as they are: the same upload is read ahead instead. A server
that answers before it has read the body (a refusal) is seen by the sender as its answer, and the
connection goes back to the session clean.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cdui.agent.transfer_agent import SEND_PIECE, SENDFILE_SLICE, ReadAheadFile, SentFile, upload_body
from cdui.core.errors import CduiError
from cdui.plane.files.receive import receive

OCTETS = "application/octet-stream"


async def serve(folder: Path, tls: ssl.SSLContext | None = None,
                refuse_first: bool = False) -> tuple[web.AppRunner, str, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    refused: list[int] = []

    async def upload(request: web.Request) -> web.Response:
        if refuse_first and not refused:
            refused.append(1)  # answered before a byte of the body is read, as a refusal by its meta is
            return web.Response(status=413, text="refused")
        reader = await request.multipart()
        part = await reader.next()
        assert part is not None and part.name == "meta"  # type: ignore[union-attr]
        meta = await part.text()  # type: ignore[union-attr]
        part = await reader.next()
        assert part is not None and part.name == "file"  # type: ignore[union-attr]
        r = await receive(part, folder, 1 << 30, lambda n: CduiError("too_large", f"{n} bytes"))
        got.append({"meta": meta, "filename": part.filename, "size": r.size, "sha256": r.sha256,  # type: ignore[union-attr]
                    "content_type": part.headers.get("Content-Type"),  # type: ignore[union-attr]
                    # Read by its length, not by searching for the boundary: what the body is shaped for.
                    "body": request.content_type, "length": part.headers.get("Content-Length"),  # type: ignore[union-attr]
                    "by_length": part._length is not None})  # type: ignore[union-attr]
        r.discard()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/upload", upload)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"{'https' if tls else 'http'}://127.0.0.1:{port}/upload", got


async def post(session: aiohttp.ClientSession, url: str, src: Path, kind: type[ReadAheadFile],
               ssl_ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
    with open(src, "rb") as fh:
        form = upload_body({"name": "out.bin"}, fh, "out.bin", kind)  # the agent's own body
        async with session.post(url, data=form, ssl=ssl_ctx if ssl_ctx is not None else True) as resp:
            return resp.status, await resp.text()


def upload_twice(tmp_path: Path, size: int, kind: type[ReadAheadFile], tls: bool = False) -> None:
    src = tmp_path / "out.bin"
    data = os.urandom(size)
    src.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    server_ctx = client_ctx = None
    if tls:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", "k.pem", "-out", "c.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], cwd=tmp_path, check=True, capture_output=True,
                       timeout=120)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
        client_ctx = ssl.create_default_context(cafile=str(tmp_path / "c.pem"))

    async def go() -> list[dict[str, Any]]:
        runner, url, got = await serve(tmp_path / "recv", server_ctx)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    assert await post(session, url, src, kind, client_ctx) == (200, "ok")
        finally:
            await runner.cleanup()
        return got

    got = asyncio.run(go())
    assert got == [{"meta": '{"name": "out.bin"}', "filename": "out.bin", "size": size, "sha256": want,
                    "content_type": OCTETS, "body": "multipart/mixed", "length": str(size), "by_length": True}] * 2


@pytest.mark.parametrize("size", [0, 1, SEND_PIECE - 1, SEND_PIECE, 3 * SEND_PIECE + 12345])
def test_a_file_read_ahead_arrives_whole_and_in_order(tmp_path: Path, size: int) -> None:
    upload_twice(tmp_path, size, ReadAheadFile)


@pytest.mark.parametrize("size", [0, 1, SEND_PIECE, SENDFILE_SLICE - 1, SENDFILE_SLICE + 3 * SEND_PIECE + 12345])
def test_a_file_sent_by_the_kernel_arrives_whole_and_in_order(tmp_path: Path, size: int) -> None:
    upload_twice(tmp_path, size, SentFile)


def test_over_tls_the_file_is_read_ahead_and_arrives_whole(tmp_path: Path, need_command: Any) -> None:
    need_command("openssl")
    upload_twice(tmp_path, 3 * SEND_PIECE + 12345, SentFile, tls=True)


def test_an_answer_before_the_body_is_read_is_the_senders_answer_and_the_next_upload_arrives(tmp_path: Path) -> None:
    """The server refuses the first upload without reading it: the sender gets that 413 (not a connection
    error, which the agent would retry as an outage), and the next upload on the session arrives whole."""
    size = 2 * SENDFILE_SLICE + 777
    src = tmp_path / "out.bin"
    data = os.urandom(size)
    src.write_bytes(data)

    async def go() -> tuple[tuple[int, str], tuple[int, str], list[dict[str, Any]]]:
        runner, url, got = await serve(tmp_path / "recv", refuse_first=True)
        try:
            async with aiohttp.ClientSession() as session:
                first = await post(session, url, src, SentFile)
                second = await post(session, url, src, SentFile)
        finally:
            await runner.cleanup()
        return first, second, got

    first, second, got = asyncio.run(go())
    assert first == (413, "refused")
    assert second == (200, "ok")
    assert [(g["size"], g["sha256"]) for g in got] == [(size, hashlib.sha256(data).hexdigest())]

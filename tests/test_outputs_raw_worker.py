"""A worker run's recorded raw tensor, downloaded with ``GET /api/runs/{id}/outputs/{node}/{port}/raw``:
the control plane asks the worker over its connection for one chunk at a time (``raw_request``), checks
each chunk's length and the whole file's sha256, and streams it to the client.

The first tests run a real control plane app (in process, a real sqlite file, a loopback port) with a
worker that speaks the real protocol and answers as a hostile or broken worker would; the last runs a
real agent process and a real run on it (e2e tier).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "inproc"))
from harness import FakeAgent, Plane  # noqa: E402

from cdui.run import outputs  # noqa: E402
from cdui.wire import protocol  # noqa: E402

CHUNK = protocol.RAW_CHUNK_BYTES
GRAPH = {"format_version": 1, "name": "one tensor", "edges": [
    {"id": "t0", "source": "start", "sourceHandle": "trigger", "target": "seq", "targetHandle": None,
     "type": "trigger"}],
    "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "seq", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "5", "fill": "arange"}}}]}


async def _worker_run(plane: Plane) -> tuple[FakeAgent, str]:
    agent = await FakeAgent(plane).enroll()
    await agent.connect()
    status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "w1"}, "record_outputs": True}})
    assert status == 201, run
    await agent.assignment()
    await agent.status(run["id"], "running")
    return agent, run["id"]


def _answer(req: dict[str, Any], data: bytes = b"", size: int | None = None, sha256: str = "",
            **more: Any) -> str:
    return protocol.RawAnswer(req["request_id"], req["chunk"], len(data) if size is None else size, sha256,
                              base64.b64encode(data).decode(), **more).to_json()


class Download:
    """The client's GET of the raw tensor, going on while the worker answers."""

    def __init__(self, plane: Plane, run_id: str, port: str = "tensor") -> None:
        assert plane.session is not None
        url = f"{plane.url}/api/runs/{run_id}/outputs/seq/{port}/raw"
        self.task = asyncio.ensure_future(self._get(plane.session, url))

    @staticmethod
    async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], bytes, str | None]:
        async with session.get(url) as r:
            body = bytearray()
            try:
                async for block in r.content.iter_any():
                    body += block
            except aiohttp.ClientPayloadError as exc:
                return r.status, dict(r.headers), bytes(body), type(exc).__name__
            return r.status, dict(r.headers), bytes(body), None

    async def result(self) -> tuple[int, dict[str, str], bytes, str | None]:
        return await asyncio.wait_for(self.task, 60)


def test_a_good_worker_file_in_chunks_arrives_whole(tmp_path):
    asyncio.run(_good_file(tmp_path))


async def _good_file(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 1234)
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        agent, rid = await _worker_run(plane)
        dl = Download(plane, rid)
        assert agent.ws is not None
        for k in range(3):
            req = await agent.message("raw_request", k + 1)
            # Asked by run, node and port, one chunk at a time: never a path.
            assert {key: req[key] for key in ("run_id", "node_id", "port", "chunk")} == {
                "run_id": rid, "node_id": "seq", "port": "tensor", "chunk": k}
            assert set(req) == {"type", "request_id", "run_id", "node_id", "port", "chunk"}
            await agent.ws.send_str(_answer(req, data[k * CHUNK:(k + 1) * CHUNK], size=len(data),
                                            sha256=hashlib.sha256(data).hexdigest() if k == 0 else ""))
        status, headers, body, cut = await dl.result()
        assert (status, cut) == (200, None)
        assert body == data
        assert headers["Content-Length"] == str(len(data))
        assert headers["Content-Disposition"] == f'attachment; filename="{rid}-seq-tensor.pt"'
        assert headers["Content-Type"] == "application/octet-stream"
        await agent.close()


def test_a_hostile_or_broken_worker_gets_a_clear_refusal(tmp_path):
    asyncio.run(_hostile(tmp_path))


async def _hostile(tmp_path: Path) -> None:
    # A fetch timeout well inside the heartbeat window, so advancing the clock past it leaves the worker on.
    async with Plane(tmp_path / "ud", tmp_path / "data", CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S="5") as plane:
        agent, rid = await _worker_run(plane)
        assert agent.ws is not None
        n = 0

        async def one(answer: Any, port: str = "tensor") -> tuple[int, Any]:
            nonlocal n
            dl = Download(plane, rid, port)
            n += 1
            req = await agent.message("raw_request", n)
            await agent.ws.send_str(answer(req))  # type: ignore[union-attr]
            status, _, body, _ = await dl.result()
            return status, json.loads(body)["error"]

        # A file it says is over the bound: refused before a second chunk is asked for.
        big = outputs.RAW_SERVE_MAX_BYTES + 1
        status, err = await one(lambda r: _answer(r, b"x" * CHUNK, size=big, sha256="0" * 64))
        assert (status, err["code"]) == (413, "raw_too_large"), err
        assert err["message"] == (f"worker w1: the raw tensor of output 'tensor' of node 'seq' is 65.0 MiB ({big} "
                                  f"bytes), over the download bound of 65 MiB")
        # The worker's own refusals, named.
        status, err = await one(lambda r: protocol.RawAnswer(r["request_id"], 0, big, error="too big here",
                                                             code="too_large").to_json())
        assert (status, err["code"], err["message"]) == (413, "raw_too_large", "worker w1: too big here")
        missing = "node 'seq' has no output 'nope'; its outputs are tensor"
        status, err = await one(lambda r: protocol.RawAnswer(r["request_id"], 0, error=missing,
                                                             code="not_kept").to_json(), port="nope")
        assert (status, err["code"]) == (404, "raw_not_kept"), err
        assert err["message"] == "worker w1: node 'seq' has no output 'nope'; its outputs are tensor"
        # More bytes than the size it gave, a chunk for another chunk, data that is not base64, a wrong sha256.
        data = b"0123456789"
        sha = hashlib.sha256(data).hexdigest()
        for answer, why in [
            (lambda r: _answer(r, data + data, size=10, sha256=sha), "chunk 0 has 20 bytes, a 10-byte file's has 10"),
            (lambda r: protocol.RawAnswer(r["request_id"], 3, 10, sha, base64.b64encode(data).decode()).to_json(),
             "chunk 3 came for chunk 0"),
            (lambda r: protocol.RawAnswer(r["request_id"], 0, 10, sha, "%%%%").to_json(), "its data is not base64"),
        ]:
            status, err = await one(answer)
            assert (status, err["code"]) == (502, "worker_bad_answer"), err
            assert err["message"] == f"worker w1 sent a raw tensor chunk that does not fit: {why}"
        status, err = await one(lambda r: _answer(r, data, sha256="1" * 64))
        assert (status, err["code"]) == (502, "worker_bad_answer"), err
        assert err["message"] == "worker w1 sent a raw tensor whose sha256 is not the one it gave"
        # A malformed answer (a chunk's text over the bound) is refused at the connection's edge; the
        # request then times out on the app's clock.
        dl = Download(plane, rid)
        n += 1
        req = await agent.message("raw_request", n)
        await agent.ws.send_str(_answer(req, b"x" * (CHUNK + 3), sha256=sha))
        await agent.message("error", 1)
        await plane.clock.advance(float(plane.config["CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S"]) + 1)
        status, _, body, _ = await dl.result()
        assert (status, json.loads(body)["error"]["code"]) == (504, "worker_output_timeout")
        assert json.loads(body)["error"]["message"] == ("worker w1 did not send the raw tensor within 5 s "
                                                        "(CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S)")
        # A multi-chunk file whose whole does not match its sha256: the body is cut before its last
        # chunk, so the client never holds a complete wrong file.
        data = os.urandom(CHUNK + 5)
        dl = Download(plane, rid)
        n += 1
        req = await agent.message("raw_request", n)
        await agent.ws.send_str(_answer(req, data[:CHUNK], size=len(data), sha256="2" * 64))
        req = await agent.message("raw_request", n + 1)
        n += 1
        await agent.ws.send_str(_answer(req, data[CHUNK:], size=len(data)))
        status, headers, body, cut = await dl.result()
        assert (status, headers["Content-Length"]) == (200, str(len(data)))
        assert body == data[:CHUNK] and cut == "ClientPayloadError"
        # A worker that goes away: 504 worker_offline.
        await agent.close()
        status, body = await plane.api("GET", f"/api/runs/{rid}/outputs/seq/tensor/raw")
        assert (status, body["error"]["code"]) == (504, "worker_offline"), body
        assert body["error"]["message"] == ("worker w1 is not connected: a worker run's recorded outputs stay on that "
                                            "worker and can be read only while it is connected")


def test_read_raw_chunk_reads_only_the_stores_own_file(tmp_path):
    import torch

    root = tmp_path / "outputs"
    warnings: list[str] = []
    rec = outputs.Recorder(root, "r1", 1 << 30, warnings.append)
    rec.node("n", "T", {"a": torch.arange(3.0), "note": "text"})
    rec.close(60)
    assert warnings == []
    whole = outputs.find_raw(root, "r1", "n", "a").read_bytes()
    got = outputs.read_raw_chunk(root, "r1", "n", "a", 0, 100)
    assert (got.size, got.sha256, got.data) == (len(whole), hashlib.sha256(whole).hexdigest(), whole[:100])
    got = outputs.read_raw_chunk(root, "r1", "n", "a", 1, 100)
    assert (got.sha256, got.data) == ("", whole[100:200])
    with pytest.raises(outputs.RawChunkOutOfRange):
        outputs.read_raw_chunk(root, "r1", "n", "a", 99, 100)
    with pytest.raises(outputs.RawNotKept, match="it is not a tensor"):
        outputs.read_raw_chunk(root, "r1", "n", "note", 0, 100)
    with pytest.raises(outputs.RawNotKept):
        outputs.read_raw_chunk(root, "../r1", "n", "a", 0, 100)
    os.truncate(outputs.find_raw(root, "r1", "n", "a"), outputs.RAW_SERVE_MAX_BYTES + 1)
    with pytest.raises(outputs.RawTooLarge):
        outputs.read_raw_chunk(root, "r1", "n", "a", 0, 100)


# --- a real agent process ---------------------------------------------------------------------------

BIG = {"format_version": 1, "name": "two tensors", "edges": [
    {"id": f"t-{n}", "source": "start", "sourceHandle": "trigger", "target": n, "targetHandle": None, "type": "trigger"}
    for n in ("big", "seq")],
    "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "big", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "1000,700", "fill": "rand"}}},
        {"id": "seq", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "5", "fill": "arange"}}}]}


@pytest.mark.e2e  # a real control plane, a real agent process and its run subprocess
def test_a_real_agents_raw_tensors_download_from_the_control_plane(tmp_path):
    import torch

    from procs import Proc, ServerProc, env_for, wait_for, wait_run

    server = ServerProc(tmp_path / "cp", name="raw-worker-server").start()
    agent = None
    try:
        token = server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        agent_ud = tmp_path / "agent-ud"
        agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--token", token,
                      "--name", "lab", "--devices", "cpu", "--foreground"],
                     env_for(agent_ud, tmp_path / "agent-data"), tmp_path / "agent.log", name="agent-lab")
        agent.spawn()
        wait_for(lambda: any(w["name"] == "lab" and w["online"] for w in server.call("GET", "/api/workers")["workers"]),
                 120, 0.2, "worker lab online")
        run = server.call("POST", "/api/runs", {"graph": BIG, "options": {
            "target": {"worker": "lab"}, "device": "cpu", "record_outputs": True}}, expect=201)
        rid = run["id"]
        done = wait_run(server, rid, timeout=300)
        assert done["status"] == "succeeded", done
        store = agent_ud / "outputs"
        # A file of three chunks and one of one: each exactly the worker's bytes.
        for node_id in ("big", "seq"):
            res = server.raw("GET", f"/api/runs/{rid}/outputs/{node_id}/tensor/raw")
            assert res.status == 200, res.body[:400]
            assert res.body == outputs.find_raw(store, rid, node_id, "tensor").read_bytes()
            assert res.headers["Content-Disposition"] == f'attachment; filename="{rid}-{node_id}-tensor.pt"'
        big = outputs.find_raw(store, rid, "big", "tensor")
        assert big.stat().st_size > 2 * CHUNK
        assert torch.load(io.BytesIO(server.raw("GET", f"/api/runs/{rid}/outputs/big/tensor/raw").body)).shape == \
            (1000, 700)
        assert torch.equal(torch.load(io.BytesIO(server.raw("GET", f"/api/runs/{rid}/outputs/seq/tensor/raw").body)),
                           torch.arange(5, dtype=torch.float32))
        # The Inspector of a worker run offers the download, and it gives the worker's bytes.
        _inspector_download(server, done, rid, tmp_path / "seq.pt")
        assert (tmp_path / "seq.pt").read_bytes() == outputs.find_raw(store, rid, "seq", "tensor").read_bytes()
        # What the worker says of a missing output, and of a file over the bound (grown in place, sparse).
        res = server.raw("GET", f"/api/runs/{rid}/outputs/seq/nope/raw")
        assert (res.status, res.json()["error"]["code"]) == (404, "raw_not_kept")
        assert res.json()["error"]["message"] == "worker lab: node 'seq' has no output 'nope'; its outputs are tensor"
        os.truncate(big, outputs.RAW_SERVE_MAX_BYTES + 1)
        res = server.raw("GET", f"/api/runs/{rid}/outputs/big/tensor/raw")
        assert (res.status, res.json()["error"]["code"]) == (413, "raw_too_large")
        assert res.json()["error"]["message"] == (
            f"worker lab: the raw tensor of output 'tensor' of node 'big' is 65.0 MiB "
            f"({outputs.RAW_SERVE_MAX_BYTES + 1} bytes), over the download bound of 65 MiB")
        # A tensor gone from the worker's store.
        outputs.find_raw(store, rid, "seq", "tensor").unlink()
        res = server.raw("GET", f"/api/runs/{rid}/outputs/seq/tensor/raw")
        assert (res.status, res.json()["error"]["code"]) == (404, "raw_not_kept")
        assert res.json()["error"]["message"].startswith("worker lab: output 'tensor' of node 'seq' has no raw tensor")
        # The worker offline.
        agent.stop()
        res = server.raw("GET", f"/api/runs/{rid}/outputs/big/tensor/raw")
        assert (res.status, res.json()["error"]["code"]) == (504, "worker_offline")
    finally:
        if agent is not None:
            agent.stop()
        server.stop()


def _inspector_download(server: Any, run: dict[str, Any], rid: str, to: Path) -> None:
    """Chromium on the canvas page: the Inspector of node seq of the worker run, its Download .pt."""
    from canvas_page import CanvasPage, chromium

    gen = chromium()
    browser = next(gen)
    try:
        cp = CanvasPage(browser, server)
        assert run["worker_id"] == "lab", run
        cp.js("""async (rid) => {
            const { inspect } = await import('/web/canvas/inspector.js');
            const el = document.createElement('div');
            el.id = 'test-inspector';
            document.body.append(el);
            await inspect(el, { id: rid, graph: null, record_outputs: true, local: false }, 'seq', undefined);
        }""", rid)
        button = "#test-inspector .ins-outputs .ins-port[data-port='tensor'] button:has-text('Download .pt')"
        cp.page.wait_for_selector(button)
        with cp.page.expect_download() as dl:
            cp.page.click(button)
        dl.value.save_as(to)
        cp.close()
    finally:
        gen.close()


@pytest.mark.parametrize(("raw", "why"), [
    ({"request_id": "q", "chunk": 0, "data": "A" * (protocol.MAX_RAW_DATA + 1)},
     f"raw_answer.data has {protocol.MAX_RAW_DATA + 1} characters, over the {protocol.MAX_RAW_DATA} of one chunk"),
    ({"request_id": "q", "chunk": 0, "sha256": "ABC"}, "raw_answer.sha256='ABC' is not 64 lowercase hex digits"),
    ({"request_id": "q", "chunk": 0, "error": "no"},
     "raw_answer: an error needs a code, one of not_kept, too_large, bad_chunk, failed (got 'None')"),
    ({"request_id": "q", "chunk": 0, "error": "no", "code": "whatever"},
     "raw_answer: an error needs a code, one of not_kept, too_large, bad_chunk, failed (got 'whatever')"),
    ({"request_id": "q", "chunk": -1}, "raw_answer.chunk=-1 is out of range (0..9007199254740992)"),
    ({"request_id": "q", "chunk": 0, "size": 2 ** 60}, "raw_answer.size=1152921504606846976 is out of range "
                                                       "(0..9007199254740992)"),
    ({"chunk": 0}, "raw_answer: missing field 'request_id'"),
])
def test_a_malformed_raw_answer_is_refused_at_the_edge(raw, why):
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.parse_agent_message(json.dumps({"type": "raw_answer", **raw}))
    assert str(err.value) == why


def test_raw_request_and_answer_round_trip():
    req = protocol.RawRequest("q1", "r1", "n", "tensor", 2)
    assert protocol.parse_server_message(req.to_json()) == req
    ans = protocol.RawAnswer("q1", 2, 10, "a" * 64, base64.b64encode(b"0123456789").decode())
    assert protocol.parse_agent_message(ans.to_json()) == ans
    with pytest.raises(protocol.ProtocolError, match=r"raw_request.chunk=1048577 is out of range"):
        protocol.parse_server_message(json.dumps({"type": "raw_request", "request_id": "q", "run_id": "r",
                                                  "node_id": "n", "port": "p", "chunk": (1 << 20) + 1}))

"""Reading a run's recorded node outputs (``GET /api/runs/{id}/outputs[/{node_id}]``) and its drawing.

A local run's captures are in this control plane's own store
(:mod:`cdui.run.outputs`). A worker run's stay on the worker: the control plane
asks the worker over its connection (``outputs_request``) and waits up to
``CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S`` on the app's clock for its
``outputs_answer``; a worker that is not connected, goes away or is slow
answers ``504`` with what happened. The answer was rebuilt field by field
and bounded when it was parsed (:func:`cdui.wire.node_outputs.clean_summary`), and no
path from it is ever opened here.

A recorded output's raw tensor (``.../outputs/{node_id}/{port}/raw``): a local run's (canvas runs
included) from this control plane's own store, the file's path built from our own names
(:func:`cdui.run.outputs.find_raw`) and its size checked against the bound before a byte is sent.
A worker run's is read from the worker over its connection, one ``raw_request`` per chunk of
``RAW_CHUNK_BYTES`` (so its other messages never wait behind a large file), each chunk checked for
its exact length, the whole against the sha256 the worker gave, and streamed to the client as it
comes (see :func:`_raw_from_worker`). The worker finds the file from the run id, node id and port
itself; nothing it sends is written anywhere but the response.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.core.units import size_text
from cdui.plane.appkeys import CLOCK, CONFIG, STORE
from cdui.plane.drawing import drawing
from cdui.plane.workers import WORKERS
from cdui.run import outputs
from cdui.wire import protocol
from cdui.wire.node_outputs import MAX_NODE_ID, clean_summary

MAX_PENDING = 64  # requests waiting on one worker's answers at once
log = logging.getLogger(__name__)


def _offline(worker: str) -> CduiError:
    return CduiError("worker_offline",
                     f"worker {worker} is not connected: a worker run's recorded outputs stay on that worker and "
                     "can be read only while it is connected", hint="start its agent again, then retry", status=504)


async def _ask(app: web.Application, worker: str, make: Callable[[str], protocol.ServerMessage], what: str) -> Any:
    """Sends the message ``make(request_id)`` to the worker and waits for the answer with that request id,
    up to CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S on the app's clock."""
    conn = app[WORKERS].conns.get(worker)
    if conn is None or conn.ws.closed:
        raise _offline(worker)
    pending = conn.outputs
    if len(pending.waiting) >= MAX_PENDING:
        raise CduiError("worker_busy", f"{MAX_PENDING} requests for recorded outputs already wait on worker "
                                       f"{worker}", hint="retry when they are answered", status=503)
    request_id = secrets.token_hex(8)
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    pending.waiting[request_id] = fut
    timeout = float(app[CONFIG]["CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S"])
    timer: asyncio.Future[Any] = asyncio.ensure_future(app[CLOCK].sleep(timeout))
    try:
        if not await conn.send(make(request_id)):
            raise _offline(worker)
        waits: list[asyncio.Future[Any]] = [fut, timer]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if fut.cancelled():
            raise CduiError("worker_offline", f"worker {worker} disconnected before it answered",
                            hint="retry once it is connected again", status=504)
        if not fut.done():
            raise CduiError("worker_output_timeout",
                            f"worker {worker} did not send {what} within {timeout:g} s "
                            "(CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S)",
                            hint="the worker may be busy or its link slow; retry, or raise the setting", status=504)
        return fut.result()
    finally:
        timer.cancel()
        pending.waiting.pop(request_id, None)


async def ask(app: web.Application, worker: str, run_id: str, node_id: str | None) -> protocol.OutputsAnswer:
    answer = await _ask(app, worker, lambda rid: protocol.OutputsRequest(rid, run_id, node_id),
                        "the recorded outputs")
    if not isinstance(answer, protocol.OutputsAnswer) or answer.run_id != run_id or answer.node_id != node_id:
        raise CduiError("worker_bad_answer", f"worker {worker} answered for another run or node", status=502)
    return answer


async def _run(request: web.Request) -> Any:
    run_id = request.match_info["run_id"]
    run = await request.app[STORE].get_run(run_id)
    if run is None:
        raise NotFound("run", run_id, hint="list runs with GET /api/runs")
    return run


def _where(run: Any) -> str | None:
    """The worker whose store holds the run's captures, None for this control plane's, or "" when not run yet."""
    if run.worker_id in (None, ""):
        return ""
    return None if run.worker_id == "local" else str(run.worker_id)


async def list_outputs(request: web.Request) -> web.Response:
    run = await _run(request)
    body: dict[str, Any] = {"run_id": run.id, "record_outputs": bool(run.options.get("record_outputs")),
                            "worker": None, "nodes": []}
    where = _where(run)
    if not body["record_outputs"] or where == "":
        return web.json_response(body)
    if where is None:
        nodes = await asyncio.to_thread(outputs.list_nodes, outputs.store_dir(request.app[CONFIG].user_data), run.id)
        body["nodes"] = nodes or []
        return web.json_response(body)
    body["worker"] = where
    answer = await ask(request.app, where, run.id, None)
    if answer.error is not None:
        raise CduiError("outputs_not_on_worker", f"worker {where}: {answer.error}", status=404)
    body["nodes"] = answer.nodes or []
    return web.json_response(body)


async def node_outputs(request: web.Request) -> web.Response:
    run = await _run(request)
    node_id = request.match_info["node_id"]
    if len(node_id) > MAX_NODE_ID:
        raise CduiError("bad_node_id", f"a node id of {len(node_id)} characters is over the limit of "
                                       f"{MAX_NODE_ID}")
    missing = NotFound("recorded outputs of node", node_id,
                       hint=f"GET /api/runs/{run.id}/outputs lists the nodes with recorded outputs")
    if not run.options.get("record_outputs"):
        raise CduiError("outputs_not_recorded", f"run {run.id} was submitted without record_outputs",
                        hint='submit with "options": {"record_outputs": true}', status=404)
    where = _where(run)
    if where == "":
        raise missing
    if where is None:
        summary = await asyncio.to_thread(outputs.read_node, outputs.store_dir(request.app[CONFIG].user_data),
                                          run.id, node_id)
        if summary is None:
            raise missing
        return web.json_response({"run_id": run.id, "worker": None, **clean_summary(summary, node_id)})
    answer = await ask(request.app, where, run.id, node_id)
    if answer.error is not None:
        raise CduiError("outputs_not_on_worker", f"worker {where}: {answer.error}", status=404)
    if answer.summary is None:
        raise missing
    return web.json_response({"run_id": run.id, "worker": where, **answer.summary})


async def run_drawing(request: web.Request) -> web.Response:
    """The run's graph as the run view draws it: ids, types, places and edges (never a param)."""
    run_id = request.match_info["run_id"]
    run = await request.app[STORE].get_run(run_id, with_graph=True)
    if run is None:
        raise NotFound("run", run_id, hint="list runs with GET /api/runs")
    return web.json_response({"run_id": run.id, **drawing(run.graph or {})})


SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


async def raw_tensor(request: web.Request) -> web.StreamResponse:
    """A recorded output's raw tensor as ``torch.save`` wrote it (``torch.load(path)`` reads it back)."""
    run = await _run(request)
    node_id, port = request.match_info["node_id"], request.match_info["port"]
    if len(node_id) > MAX_NODE_ID or len(port) > 128:
        raise CduiError("bad_node_id", f"a node id of {len(node_id)} characters or a port of {len(port)} is over "
                                       f"the limit of {MAX_NODE_ID} and 128")
    if not run.options.get("record_outputs"):
        raise CduiError("outputs_not_recorded", f"run {run.id} was submitted without record_outputs",
                        hint='submit with "options": {"record_outputs": true}', status=404)
    where = _where(run)
    name = SAFE_NAME.sub("_", f"{run.id}-{node_id}-{port}")[:200] + ".pt"
    if where:
        return await _raw_from_worker(request, where, run.id, node_id, port, name)
    root = outputs.store_dir(request.app[CONFIG].user_data)
    try:
        path = await asyncio.to_thread(outputs.find_raw, root, run.id, node_id, port)
        size = (await asyncio.to_thread(path.stat)).st_size
    except (outputs.RawNotKept, OSError) as exc:
        raise CduiError("raw_not_kept", str(exc) if isinstance(exc, outputs.RawNotKept)
                        else f"the raw tensor of output {port!r} of node {node_id!r} is gone: {exc.strerror}",
                        hint=f"GET /api/runs/{run.id}/outputs/{node_id} lists the node's outputs", status=404) from None
    if size > outputs.RAW_SERVE_MAX_BYTES:
        raise CduiError("raw_too_large", f"the raw tensor of output {port!r} of node {node_id!r} is {size_text(size)}, "
                                         f"over the download bound of {size_text(outputs.RAW_SERVE_MAX_BYTES)}",
                        hint="read its summary instead", status=413)
    return web.FileResponse(path, headers={"Content-Type": "application/octet-stream",
                                           "Content-Disposition": f'attachment; filename="{name}"',
                                           "Cache-Control": "no-store"})


def _raw_headers(name: str, size: int) -> dict[str, str]:
    return {"Content-Type": "application/octet-stream", "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store", "Content-Length": str(size)}


def _chunk_of(worker: str, answer: Any, chunk: int, size: int | None) -> bytes:
    """The bytes of one chunk of a worker's answer, checked against what chunk ``chunk`` of a file of
    ``size`` bytes must be (None: chunk 0, which says the size). Raises CduiError for what does not fit."""
    def bad(why: str) -> CduiError:
        return CduiError("worker_bad_answer", f"worker {worker} sent a raw tensor chunk that does not fit: {why}",
                         hint="retry; if it happens again, the worker's store or agent is broken", status=502)

    if not isinstance(answer, protocol.RawAnswer):
        raise bad("the answer is of another kind")
    if answer.chunk != chunk:
        raise bad(f"chunk {answer.chunk} came for chunk {chunk}")
    if size is not None and answer.size != size:
        raise bad(f"the file's size changed from {size} to {answer.size} bytes")
    try:
        data = base64.b64decode(answer.data, validate=True)
    except (binascii.Error, ValueError):
        raise bad("its data is not base64") from None
    total = answer.size if size is None else size
    want = min(protocol.RAW_CHUNK_BYTES, max(0, total - chunk * protocol.RAW_CHUNK_BYTES))
    if len(data) != want:
        raise bad(f"chunk {chunk} has {len(data)} bytes, a {total}-byte file's has {want}")
    return data


async def _raw_from_worker(request: web.Request, worker: str, run_id: str, node_id: str, port: str,
                           name: str) -> web.StreamResponse:
    """A worker run's raw tensor, read chunk by chunk over the worker's connection and streamed to the
    client as it comes: at most two chunks are held here, nothing is written to disk, and the last
    chunk is sent only once the whole file's sha256 matches the one the worker gave, so a client never
    gets a complete file that differs from the worker's (the connection is cut instead)."""
    app = request.app

    def asking(chunk: int) -> Callable[[str], protocol.ServerMessage]:
        return lambda rid: protocol.RawRequest(rid, run_id, node_id, port, chunk)

    first = await _ask(app, worker, asking(0), "the raw tensor")
    if isinstance(first, protocol.RawAnswer) and first.error is not None:
        if first.code == "too_large":
            raise CduiError("raw_too_large", f"worker {worker}: {first.error}", hint="read its summary instead",
                            status=413)
        if first.code == "not_kept":
            raise CduiError("raw_not_kept", f"worker {worker}: {first.error}",
                            hint=f"GET /api/runs/{run_id}/outputs/{node_id} lists the node's outputs", status=404)
        raise CduiError("worker_raw_failed", f"worker {worker}: {first.error}", status=502)
    # Bounded before anything is sent: what the worker says of the file, whatever it is.
    if isinstance(first, protocol.RawAnswer) and first.size > outputs.RAW_SERVE_MAX_BYTES:
        raise CduiError("raw_too_large", f"worker {worker}: the raw tensor of output {port!r} of node {node_id!r} is "
                                         f"{size_text(first.size)}, over the download bound of "
                                         f"{size_text(outputs.RAW_SERVE_MAX_BYTES)}", hint="read its summary instead",
                        status=413)
    held = _chunk_of(worker, first, 0, None)
    size, digest = first.size, first.sha256
    if not digest:
        raise CduiError("worker_bad_answer", f"worker {worker} sent no sha256 for the raw tensor", status=502)
    chunks = max(1, -(-size // protocol.RAW_CHUNK_BYTES))  # at most RAW_SERVE_MAX_BYTES / RAW_CHUNK_BYTES + 1
    h = hashlib.sha256()
    resp: web.StreamResponse | None = None
    try:
        for k in range(1, chunks):
            got = _chunk_of(worker, await _ask(app, worker, asking(k), "the raw tensor"), k, size)
            if resp is None:
                resp = web.StreamResponse(headers=_raw_headers(name, size))
                await resp.prepare(request)
            h.update(held)
            await resp.write(held)
            held = got
        h.update(held)
        if h.hexdigest() != digest:
            raise CduiError("worker_bad_answer", f"worker {worker} sent a raw tensor whose sha256 is not the one "
                                                 "it gave", hint="retry; the file may have changed on the worker",
                            status=502)
    except CduiError as exc:
        if resp is None:
            raise
        # The headers are gone: the only way left to say it failed is to end the body short.
        log.warning("raw tensor %s/%s/%s from worker %s cut short: %s", run_id, node_id, port, worker, exc.message)
        if request.transport is not None:
            request.transport.close()
        return resp
    if resp is None:
        resp = web.StreamResponse(headers=_raw_headers(name, size))
        await resp.prepare(request)
    await resp.write(held)
    await resp.write_eof()
    return resp


def setup(app: web.Application) -> None:
    app.router.add_get("/api/runs/{run_id}/drawing", run_drawing)
    app.router.add_get("/api/runs/{run_id}/outputs", list_outputs)
    app.router.add_get("/api/runs/{run_id}/outputs/{node_id}", node_outputs)
    app.router.add_get("/api/runs/{run_id}/outputs/{node_id}/{port}/raw", raw_tensor)

"""Reading a run's recorded node outputs (``GET /api/runs/{id}/outputs[/{node_id}]``) and its drawing.

A local run's captures are in this control plane's own store
(:mod:`cdui.run.outputs`). A worker run's stay on the worker: the control plane
asks the worker over its connection (``outputs_request``) and waits up to
``CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S`` on the app's clock for its
``outputs_answer``; a worker that is not connected, goes away or is slow
answers ``504`` with what happened. The answer was rebuilt field by field
and bounded when it was parsed (:func:`cdui.wire.node_outputs.clean_summary`), and no
path from it is ever opened here.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.plane.appkeys import CLOCK, CONFIG, STORE
from cdui.plane.drawing import drawing
from cdui.plane.workers import WORKERS
from cdui.run import outputs
from cdui.wire import protocol
from cdui.wire.node_outputs import MAX_NODE_ID, clean_summary

MAX_PENDING = 64  # requests waiting on one worker's answers at once


def _offline(worker: str) -> CduiError:
    return CduiError("worker_offline",
                     f"worker {worker} is not connected: a worker run's recorded outputs stay on that worker and "
                     "can be read only while it is connected", hint="start its agent again, then retry", status=504)


async def ask(app: web.Application, worker: str, run_id: str, node_id: str | None) -> protocol.OutputsAnswer:
    conn = app[WORKERS].conns.get(worker)
    if conn is None or conn.ws.closed:
        raise _offline(worker)
    pending = conn.outputs
    if len(pending.waiting) >= MAX_PENDING:
        raise CduiError("worker_busy", f"{MAX_PENDING} requests for recorded outputs already wait on worker "
                                       f"{worker}", hint="retry when they are answered", status=503)
    request_id = secrets.token_hex(8)
    fut: asyncio.Future[protocol.OutputsAnswer] = asyncio.get_running_loop().create_future()
    pending.waiting[request_id] = fut
    timeout = float(app[CONFIG]["CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S"])
    timer: asyncio.Future[Any] = asyncio.ensure_future(app[CLOCK].sleep(timeout))
    try:
        if not await conn.send(protocol.OutputsRequest(request_id, run_id, node_id)):
            raise _offline(worker)
        waits: list[asyncio.Future[Any]] = [fut, timer]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if fut.cancelled():
            raise CduiError("worker_offline", f"worker {worker} disconnected before it answered",
                            hint="retry once it is connected again", status=504)
        if not fut.done():
            raise CduiError("worker_output_timeout",
                            f"worker {worker} did not send the recorded outputs within {timeout:g} s "
                            "(CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S)",
                            hint="the worker may be busy or its link slow; retry, or raise the setting", status=504)
        answer = fut.result()
    finally:
        timer.cancel()
        pending.waiting.pop(request_id, None)
    if answer.run_id != run_id or answer.node_id != node_id:
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


def setup(app: web.Application) -> None:
    app.router.add_get("/api/runs/{run_id}/drawing", run_drawing)
    app.router.add_get("/api/runs/{run_id}/outputs", list_outputs)
    app.router.add_get("/api/runs/{run_id}/outputs/{node_id}", node_outputs)

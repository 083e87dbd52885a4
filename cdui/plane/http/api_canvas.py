"""HTTP routes of the canvas's per-tab processes (docs/canvas.md); owner-authenticated like every /api route.

- ``POST /api/canvas/run`` ``{tab, graph, persist_weights, record_outputs, device?}`` -> 202 ``{run_id, tab}``
  (the graph is checked as ``POST /api/runs`` checks it, with the same 400 ``invalid_graph``; 409
  ``canvas_busy`` while the tab's previous Run is going);
- ``POST /api/canvas/{tab}/stop`` -> ``{run_id}`` (404 when the tab has no Run going);
- ``POST /api/canvas/{tab}/reset-weights`` -> ``{tab, reset}`` (the kept models dropped);
- ``DELETE /api/canvas/{tab}`` -> ``{tab, ended}`` (the process ends; its stored runs stay);
- ``GET /api/canvas`` -> ``{tabs: [...]}``.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.plane.canvas import CANVAS, CanvasManager
from cdui.plane.http.httpjson import read_json
from cdui.plane.runs import RUNS

RUN_FIELDS = {"tab", "graph", "persist_weights", "record_outputs", "device"}


def _canvas(request: web.Request) -> CanvasManager:
    return request.app[CANVAS]


async def run(request: web.Request) -> web.Response:
    limit = request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"]
    body: Any = await read_json(request, limit, "CODEFYUI_MAX_GRAPH_BYTES")
    if not isinstance(body, dict) or "graph" not in body or "tab" not in body:
        raise CduiError("bad_request", "the body must be an object with 'tab' and 'graph' (and 'persist_weights', "
                        "'record_outputs', optional 'device')",
                        hint='POST {"tab": "tab-1", "graph": {...}, "persist_weights": false, "record_outputs": false}')
    unknown = sorted(set(body) - RUN_FIELDS)
    if unknown:
        raise CduiError("bad_request", f"unknown field(s) {', '.join(unknown)} in the canvas Run request",
                        hint=f"the fields are {', '.join(sorted(RUN_FIELDS))}")
    out = await _canvas(request).run(body["tab"], body["graph"], body.get("persist_weights", False),
                                     body.get("record_outputs", False), body.get("device"))
    return web.json_response(out, status=202)


async def stop(request: web.Request) -> web.Response:
    return web.json_response(await _canvas(request).stop(request.match_info["tab"]))


async def reset_weights(request: web.Request) -> web.Response:
    return web.json_response(await _canvas(request).reset_weights(request.match_info["tab"]))


async def delete(request: web.Request) -> web.Response:
    return web.json_response(await _canvas(request).delete(request.match_info["tab"]))


async def listing(request: web.Request) -> web.Response:
    return web.json_response(_canvas(request).describe())


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/canvas", listing)
    r.add_post("/api/canvas/run", run)
    r.add_post("/api/canvas/{tab}/stop", stop)
    r.add_post("/api/canvas/{tab}/reset-weights", reset_weights)
    r.add_delete("/api/canvas/{tab}", delete)

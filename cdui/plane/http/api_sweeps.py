"""HTTP routes of sweeps (docs/sweeps.md); owner-authenticated like every /api route.

- ``POST /api/sweeps`` ``{graph, axes | variants, mode, count, seed, options, max_running, objective, name}``
  -> 201 the sweep (400 ``invalid_sweep`` listing every variant's errors, nothing stored);
- ``GET /api/sweeps`` -> ``{sweeps: [...]}`` (newest first, ``?limit=``);
- ``GET /api/sweeps/{id}`` -> the sweep with its variants (params, run id, status, worker, metrics,
  objective) and the best one marked;
- ``POST /api/sweeps/{id}/stop``, ``POST /api/sweeps/{id}/retry``;
- ``DELETE /api/sweeps/{id}`` (``?keep_runs=1`` keeps its runs) -> 409 ``sweep_active`` while it has runs
  queued or running or variants waiting.
"""
from __future__ import annotations

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.plane.http.httpjson import query_limit, read_json
from cdui.plane.runs import RUNS
from cdui.plane.sweeps import MAX_LISTED, SWEEPS, SweepService


def _sweeps(request: web.Request) -> SweepService:
    return request.app[SWEEPS]


async def create(request: web.Request) -> web.Response:
    limit = request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"]
    body = await read_json(request, limit, "CODEFYUI_MAX_GRAPH_BYTES")
    return web.json_response(await _sweeps(request).create(body), status=201)


async def listing(request: web.Request) -> web.Response:
    return web.json_response(await _sweeps(request).list(query_limit(request, 100, MAX_LISTED)))


async def get(request: web.Request) -> web.Response:
    return web.json_response(await _sweeps(request).get(request.match_info["sweep_id"]))


async def stop(request: web.Request) -> web.Response:
    return web.json_response(await _sweeps(request).stop(request.match_info["sweep_id"]))


async def retry(request: web.Request) -> web.Response:
    return web.json_response(await _sweeps(request).retry(request.match_info["sweep_id"]))


async def delete(request: web.Request) -> web.Response:
    keep = request.query.get("keep_runs", "0")
    if keep not in ("0", "1", "true", "false"):
        raise CduiError("bad_query", f"keep_runs={keep!r} is not 1 or 0", hint="?keep_runs=1 keeps the sweep's runs")
    out = await _sweeps(request).delete(request.match_info["sweep_id"], keep in ("1", "true"))
    return web.json_response(out)


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/sweeps", create)
    r.add_get("/api/sweeps", listing)
    r.add_get("/api/sweeps/{sweep_id}", get)
    r.add_post("/api/sweeps/{sweep_id}/stop", stop)
    r.add_post("/api/sweeps/{sweep_id}/retry", retry)
    r.add_delete("/api/sweeps/{sweep_id}", delete)

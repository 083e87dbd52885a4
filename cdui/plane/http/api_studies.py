"""Studies (cdui/plane/studies.py, docs/sweeps.md "Studies"), owner routes like the sweeps':

- ``POST /api/studies`` ``{graph, axes, objective, sampler, pruner, n_trials, parallelism, seed, options, name}``
  -> 201 with the study; 400 ``bad_study``/``invalid_study`` naming what is wrong; 501 ``studies_unavailable``
  (with the install command) where Optuna is not installed;
- ``GET /api/studies[?limit=N]``, ``GET /api/studies/{id}`` (trials, best, history, importances);
- ``POST /api/studies/{id}/stop``;
- ``POST /api/studies/{id}/best/save`` ``{"name": ...}``: the graph with the best trial's params, saved as
  ``PUT /api/graphs/{name}`` saves one.
"""
from __future__ import annotations

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.plane.http.api_graphs import check_name, save_graph
from cdui.plane.http.httpjson import query_limit, read_json
from cdui.plane.runs import RUNS
from cdui.plane.studies import MAX_LISTED, STUDIES, StudyService

MAX_SAVE_BODY = 4096


def _studies(request: web.Request) -> StudyService:
    return request.app[STUDIES]


async def create(request: web.Request) -> web.Response:
    limit = request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"]
    body = await read_json(request, limit, "CODEFYUI_MAX_GRAPH_BYTES")
    return web.json_response(await _studies(request).create(body), status=201)


async def listing(request: web.Request) -> web.Response:
    return web.json_response(await _studies(request).list(query_limit(request, 100, MAX_LISTED)))


async def get(request: web.Request) -> web.Response:
    return web.json_response(await _studies(request).get(request.match_info["study_id"]))


async def stop(request: web.Request) -> web.Response:
    return web.json_response(await _studies(request).stop(request.match_info["study_id"]))


async def save_best(request: web.Request) -> web.Response:
    body = await read_json(request, MAX_SAVE_BODY, "a best/save body")
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise CduiError("bad_request", "the body must be {\"name\": ...}: the name to save the best graph as",
                        hint='e.g. {"name": "iris-best"}')
    check_name(name)
    graph, best = await _studies(request).best_graph(request.match_info["study_id"])
    out, created = await save_graph(request, name, graph)
    return web.json_response({**out, "trial": best}, status=201 if created else 200)


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/studies", create)
    r.add_get("/api/studies", listing)
    r.add_get("/api/studies/{study_id}", get)
    r.add_post("/api/studies/{study_id}/stop", stop)
    r.add_post("/api/studies/{study_id}/best/save", save_best)

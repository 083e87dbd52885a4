"""Published apps and API keys over HTTP (docs/apps.md; the service is :mod:`cdui.plane.apps`).

Owner routes (the session token): ``POST /api/apps/{slug}/publish`` ``{graph, note, create,
record_io, git_commit, git_dirty}`` (``graph``: a saved graph's name, or the graph itself),
``GET /api/apps``, ``GET /api/apps/{slug}/versions``, ``POST /api/apps/{slug}/activate``
``{version}``, ``POST /api/apps/{slug}/unpublish``, ``PATCH /api/apps/{slug}`` ``{record_io}``,
``DELETE /api/apps/{slug}``, ``GET /api/apps/{slug}/invokes``; ``POST /api/keys`` ``{name}``,
``GET /api/keys``, ``POST /api/keys/{id}/revoke``.

An API key (``Authorization: Bearer cdui_...``) opens only :data:`KEY_ROUTES`: the invoke and the
app's OpenAPI description (the session token opens them too). The auth middleware
(cdui/plane/server.py) refuses a key anywhere else.
"""
from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.plane.apps import API_KEY_ID, APPS, INVOKES_LISTED_MAX, KEY_PREFIX, AppService, check_slug
from cdui.plane.http import api_graphs
from cdui.plane.http.httpjson import query_limit, read_json
from cdui.plane.runs import RUNS

# What an API key may call: "METHOD path".
KEY_ROUTES = re.compile(r"^(POST /api/apps/[^/]+/invoke|GET /api/apps/[^/]+/openapi\.json)$")
SMALL_BODY = 64 * 1024
__all__ = ["API_KEY_ID", "APPS", "KEY_PREFIX", "KEY_ROUTES", "setup"]
# A GraphInput's type as a JSON schema.
_SCHEMA: dict[str, dict[str, Any]] = {
    "string": {"type": "string"}, "number": {"type": "number"}, "integer": {"type": "integer"},
    "boolean": {"type": "boolean"}, "json": {},
    "image": {"type": "string", "description": "an image as a data: URL or base64 (PNG or JPEG)"}}


def _svc(request: web.Request) -> AppService:
    return request.app[APPS]


def _slug(request: web.Request) -> str:
    return check_slug(request.match_info["slug"])


async def _body(request: web.Request, limit: int = SMALL_BODY) -> dict[str, Any]:
    body = await read_json(request, limit, default={})
    if not isinstance(body, dict):
        raise CduiError("bad_request", "the body must be a JSON object")
    return body


async def publish(request: web.Request) -> web.Response:
    slug = _slug(request)
    limit = request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"]
    body = await _body(request, limit)
    given = body.get("graph")
    if isinstance(given, str):
        if not api_graphs.GRAPH_NAME.match(given) or given in api_graphs.RESERVED:
            raise CduiError("graph_not_found", f"graph {given[:100]!r} not found",
                            hint="name a saved graph (GET /api/graphs lists them)", status=404)
        try:
            graph = api_graphs.load_saved(request, given)
        except CduiError as exc:
            if exc.status == 404:
                raise CduiError("graph_not_found", f"graph {given!r} not found",
                                hint="save it first (PUT /api/graphs/{name}); GET /api/graphs lists them",
                                status=404) from None
            raise
        source = given
    elif isinstance(given, dict) and isinstance(given.get("nodes"), list):
        graph, source = given, str(given.get("name") or slug)[:100]
    else:
        raise CduiError("bad_request", "graph must be a saved graph's name or a graph object",
                        hint='give "graph": "NAME" (a graph saved with PUT /api/graphs/NAME)')
    return web.json_response(await _svc(request).publish(slug, body, source, graph), status=201)


async def list_apps(request: web.Request) -> web.Response:
    svc = _svc(request)
    return web.json_response({"apps": await svc.store.apps.all(), "serving": svc.describe()})


async def versions(request: web.Request) -> web.Response:
    svc = _svc(request)
    app = await svc.app(_slug(request))
    rows = await svc.store.apps.versions(app["slug"])
    for r in rows:
        r["active"] = r["version"] == app["active_version"]
    return web.json_response({"slug": app["slug"], "active_version": app["active_version"], "versions": rows})


async def activate(request: web.Request) -> web.Response:
    body = await _body(request)
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CduiError("bad_request", f"version={version!r} is not a version number",
                        hint='give "version": N (GET /api/apps/{slug}/versions lists them)')
    return web.json_response(await _svc(request).activate(_slug(request), version))


async def unpublish(request: web.Request) -> web.Response:
    return web.json_response(await _svc(request).activate(_slug(request), None))


async def patch(request: web.Request) -> web.Response:
    slug = _slug(request)
    body = await _body(request)
    unknown = sorted(set(body) - {"record_io", "serve_on", "serve_device"})
    if unknown or not body:
        raise CduiError("bad_request", f"PATCH /api/apps/{slug} changes record_io, serve_on and serve_device; got "
                        f"{unknown[:5] or 'nothing'}", hint='give e.g. {"record_io": false} or {"serve_on": "w2"}')
    out: dict[str, Any] = {"slug": slug}
    if "record_io" in body:
        record = body["record_io"]
        if not isinstance(record, bool):
            raise CduiError("bad_request", f"record_io={record!r} is not true or false",
                            hint='give {"record_io": true} or {"record_io": false}')
        await _svc(request).set_record_io(slug, record)
        out["record_io"] = record
    if "serve_on" in body or "serve_device" in body:
        svc = _svc(request)
        serve_on = body.get("serve_on", (await svc.app(slug))["serve_on"])
        out.update(await svc.set_serving(slug, serve_on, body.get("serve_device")))
    return web.json_response(out)


async def delete(request: web.Request) -> web.Response:
    return web.json_response(await _svc(request).delete(_slug(request)))


async def invokes(request: web.Request) -> web.Response:
    svc = _svc(request)
    app = await svc.app(_slug(request))
    limit = query_limit(request, 50, INVOKES_LISTED_MAX)
    return web.json_response({"slug": app["slug"], "invokes": await svc.store.apps.invokes(app["slug"], limit)})


async def invoke(request: web.Request) -> web.Response:
    slug = _slug(request)
    body = await read_json(request, request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"],
                           "CODEFYUI_MAX_GRAPH_BYTES", default={})
    status, envelope = await _svc(request).invoke(slug, body, request.get(API_KEY_ID))
    return web.json_response(envelope, status=status)


async def openapi(request: web.Request) -> web.Response:
    svc = _svc(request)
    app = await svc.app(_slug(request))
    slug, version = app["slug"], app["active_version"]
    if version is None:
        raise CduiError("app_unpublished", f"app {slug!r} is unpublished: no version is active",
                        hint=f"activate one: POST /api/apps/{slug}/activate", status=409)
    row = next((v for v in await svc.store.apps.versions(slug) if v["version"] == version), None)
    if row is None:
        raise CduiError("version_not_found", f"app {slug!r} has no version {version}", status=404)
    return web.json_response(openapi_document(slug, app["graph_name"], row))


def openapi_document(slug: str, graph_name: str, version: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 description of one app version's invoke, from its GraphInput/GraphOutput contract."""
    contract = version["contract"]
    props: dict[str, Any] = {}
    required = []
    for i in contract["inputs"]:
        props[i["name"]] = {**_SCHEMA.get(i["type"], {}), "x-cdui-type": i["type"]}
        if i.get("description"):
            props[i["name"]]["description"] = i["description"]
        if i.get("required"):
            required.append(i["name"])
    outputs = {o["name"]: ({"description": o["description"]} if o.get("description") else {})
               for o in contract["outputs"]}
    envelope = {"type": "object", "properties": {
        "status": {"type": "string", "enum": ["succeeded", "failed", "cancelled", "timeout"]},
        "app": {"type": "string"}, "version": {"type": "integer"}, "invoke_id": {"type": ["integer", "null"]},
        "device": {"type": ["string", "null"]},
        "outputs": {"type": "object", "properties": outputs},
        "error": {"type": ["object", "null"]}, "timing": {"type": "object"}}}
    info: dict[str, Any] = {"title": f"{slug} (cdui app)", "version": str(version["version"]),
                            "x-cdui-graph": version.get("source_graph") or graph_name,
                            "x-cdui-published-at": version["created_at"],
                            "x-cdui-git-commit": version.get("git_commit"),
                            "x-cdui-git-dirty": version.get("git_dirty")}
    if version.get("note"):
        info["description"] = version["note"]
    return {"openapi": "3.1.0", "info": info,
            "components": {"securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                                          "description": "an API key, cdui_..."}}},
            "security": [{"apiKey": []}],
            "paths": {f"/api/apps/{slug}/invoke": {"post": {
                "summary": f"invoke {slug}", "operationId": f"invoke_{slug.replace('-', '_')}",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "properties": {
                        "inputs": {"type": "object", "properties": props, "required": required,
                                   "additionalProperties": False},
                        "timeout_s": {"type": "number", "exclusiveMinimum": 0},
                        "device": {"type": "string"}}}}}},
                "responses": {"200": {"description": "the invoke ended (see status)",
                                      "content": {"application/json": {"schema": envelope}}},
                              "401": {"description": "no API key, or an unknown or revoked one"},
                              "409": {"description": "the app is unpublished (app_unpublished)"},
                              "429": {"description": "too many invokes waiting (app_busy)"},
                              "503": {"description": "the serving process ended during the invoke"},
                              "504": {"description": "the invoke outlived timeout_s"}}}}}}


# -- keys ---------------------------------------------------------------------------
async def create_key(request: web.Request) -> web.Response:
    body = await _body(request)
    return web.json_response(await _svc(request).create_key(body.get("name")), status=201)


async def list_keys(request: web.Request) -> web.Response:
    return web.json_response({"keys": await _svc(request).store.apps.keys()})


async def revoke_key(request: web.Request) -> web.Response:
    raw = request.match_info["key_id"]
    if not raw.isdigit() or len(raw) > 18:
        raise CduiError("key_not_found", f"API key {raw[:30]!r} not found", hint="list them: GET /api/keys",
                        status=404)
    svc = _svc(request)
    row = await svc.revoke_key(int(raw))
    if row is None:
        raise CduiError("key_not_found", f"API key {raw} not found", hint="list them: GET /api/keys", status=404)
    return web.json_response(row)


def setup(app: web.Application) -> None:
    service = AppService(app[RUNS])
    app[APPS] = service
    app.cleanup_ctx.append(_apps_ctx)
    r = app.router
    r.add_get("/api/apps", list_apps)
    r.add_post("/api/apps/{slug}/publish", publish)
    r.add_get("/api/apps/{slug}/versions", versions)
    r.add_post("/api/apps/{slug}/activate", activate)
    r.add_post("/api/apps/{slug}/unpublish", unpublish)
    r.add_patch("/api/apps/{slug}", patch)
    r.add_delete("/api/apps/{slug}", delete)
    r.add_get("/api/apps/{slug}/invokes", invokes)
    r.add_post("/api/apps/{slug}/invoke", invoke)
    r.add_get("/api/apps/{slug}/openapi.json", openapi)
    r.add_post("/api/keys", create_key)
    r.add_get("/api/keys", list_keys)
    r.add_post("/api/keys/{key_id}/revoke", revoke_key)


async def _apps_ctx(app: web.Application) -> AsyncIterator[None]:
    app[APPS].start()
    yield
    await app[APPS].close()

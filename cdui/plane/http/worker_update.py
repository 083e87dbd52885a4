"""The bundle an agent updates itself from: ``GET /api/worker-update/manifest`` and
``GET /api/worker-update/files/{name}`` (docs/updating.md, "Workers").

Only an enrolled worker's credential opens them (the auth middleware's worker routes), whatever version its
agent runs: the one it is refused for is the reason it asks. What is served is the bundle ``cdui update``
kept, checked, in this control plane's user data folder (:func:`cdui.core.bundle.offered`), and only while
its version is the control plane's own (after a rollback there is nothing to offer). A file is named by a
manifest entry, never by a path: the name is checked as a plain wheel name, looked up in the manifest, and
the file served is the entry's. The agent checks every sha256 against the manifest again as it writes.
"""
from __future__ import annotations

import asyncio

from aiohttp import web

from cdui import __version__
from cdui.core import bundle
from cdui.core.errors import CduiError
from cdui.plane.appkeys import CLOCK, CONFIG
from cdui.plane.runs import iso
from cdui.plane.workers import WORKERS

NO_UPDATE_HINT = ("run `cdui update --from BUNDLE` on the control plane (it keeps the bundle for its agents), or "
                  "update this worker on its machine")


async def _offered(request: web.Request) -> bundle.Manifest:
    if request.get("auth") != "worker":
        raise CduiError("forbidden", "the update bundle is served to workers, with their worker credential",
                        hint="send Authorization: Bearer <worker credential>", status=403)
    manifest = await asyncio.to_thread(bundle.offered, request.app[CONFIG].user_data, __version__)
    if manifest is None:
        raise CduiError("no_update", f"this control plane (cdui {__version__}) has no update bundle of its "
                                     f"version to offer", hint=NO_UPDATE_HINT, status=404)
    return manifest


async def manifest(request: web.Request) -> web.Response:
    m = await _offered(request)
    # Shown beside the worker's version until it connects on this one (GET /api/workers "update").
    request.app[WORKERS].updating[str(request["worker"])] = {"to": m.version,
                                                             "since": iso(request.app[CLOCK].time())}
    return web.json_response(m.to_json())


async def file(request: web.Request) -> web.StreamResponse:
    m = await _offered(request)
    raw = request.match_info["name"]
    try:
        entry = m.entry(bundle.check_name(raw))
    except bundle.BundleRefused:
        entry = None
    if entry is None:
        raise CduiError("not_found", f"the update bundle of cdui {m.version} lists no file {raw[:80]!r}",
                        hint="ask for a name the manifest (GET /api/worker-update/manifest) lists", status=404)
    return web.FileResponse(bundle.offered_dir(request.app[CONFIG].user_data) / entry.name)


def setup(app: web.Application) -> None:
    app.router.add_get("/api/worker-update/manifest", manifest)
    app.router.add_get("/api/worker-update/files/{name}", file)

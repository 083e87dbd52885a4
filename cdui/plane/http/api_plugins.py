"""``/api/plugins``: the installed plugin packs, and reloading them into the running control plane.

``cdui plugin install`` writes the packs and the lockfile (cdui/nodes/packs.py) without a server;
a run's process reads the lockfile itself, so a new run sees a pack at once. The control plane
validates graphs against its own registry, built at start: ``POST /api/plugins/reload`` builds it
again from the same folders, and the worker catalogs are compared with the new one from then on.
Agents read their catalog at start: a pack installed on a worker counts after its agent restarts.
"""
from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from cdui.core.errors import NotFound
from cdui.nodes import packs
from cdui.nodes.registry import build_registry
from cdui.plane.runs import RUNS
from cdui.plane.workers import WORKERS
from cdui.run import catalog


def _listing(app: web.Application) -> list[dict[str, Any]]:
    runs = app[RUNS]
    store = runs.config.plugin_store
    loaded = runs.registry.packs
    out = []
    for entry, folder in packs.installed(store):
        d = packs.describe(entry, folder)
        d["loaded"] = entry.get("id") in loaded
        out.append(d)
    return out


async def list_plugins(request: web.Request) -> web.Response:
    items = await asyncio.to_thread(_listing, request.app)
    reg = request.app[RUNS].registry
    return web.json_response({"plugins": items, "load_errors": [e for e in reg.load_errors if "file" in e][:50]})


async def get_plugin(request: web.Request) -> web.Response:
    pid = request.match_info["id"]
    for item in await asyncio.to_thread(_listing, request.app):
        if item.get("id") == pid:
            return web.json_response(item)
    raise NotFound("plugin pack", pid, hint="list the installed packs with `cdui plugin list`")


async def reload_plugins(request: web.Request) -> web.Response:
    app = request.app
    runs = app[RUNS]
    cfg = runs.config
    before = set(runs.registry.nodes)
    reg = await asyncio.to_thread(build_registry, cfg.custom_nodes_dir, cfg.plugins_dir, cfg.plugin_store)
    runs.registry = reg
    manager = app.get(WORKERS)
    if manager is not None:
        manager.own_catalog = catalog.node_catalog(reg)
        manager._verdicts.clear()
    after = set(reg.nodes)
    return web.json_response({
        "added": sorted(after - before), "removed": sorted(before - after), "packs": sorted(reg.packs),
        "load_errors": [f"{e.get('file')}: {e.get('error')}" for e in reg.load_errors][:20],
        "workers": "each agent reads its node catalog at start: restart the agents of workers whose packs "
                   "changed (`cdui agent stop`, then `cdui agent start`)"})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/plugins", list_plugins)
    r.add_post("/api/plugins/reload", reload_plugins)
    r.add_get("/api/plugins/{id}", get_plugin)

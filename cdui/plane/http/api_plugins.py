"""``/api/plugins``: the installed plugin packs, and reloading them into the running control plane.

``cdui plugin install`` writes the packs and the lockfile (cdui/nodes/packs.py) without a server;
a run's process reads the lockfile itself, so a new run sees a pack at once. The control plane
validates graphs against its own registry, built at start: ``POST /api/plugins/reload`` builds it
again from the same folders, and the worker catalogs are compared with the new one from then on.
Agents read their catalog at start: a pack installed on a worker counts after its agent restarts.
"""
from __future__ import annotations

import asyncio
import base64
import io
import secrets
import tarfile
from pathlib import Path
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.nodes import packs
from cdui.nodes.registry import build_registry
from cdui.plane.http.httpjson import DEFAULT_LIMIT, read_object
from cdui.plane.runs import RUNS
from cdui.plane.ssh import ssh_workers
from cdui.plane.workers import WORKERS
from cdui.run import catalog
from cdui.wire import protocol

PUSH_TIMEOUT_S = 120.0  # an agent unpacks, checks and installs a pack, then answers


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


def _pack_archive(folder: Path) -> tuple[bytes, str]:
    """A pack folder as .tar.gz bytes (plain files only, caches left out) and the sha256 of its files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder)
            if "__pycache__" in rel.parts or any(x.startswith(".") for x in rel.parts) or p.is_symlink():
                continue
            if p.is_file():
                tf.add(p, arcname=str(Path(folder.name) / rel), recursive=False)
    return buf.getvalue(), packs.tree_sha256(folder)


async def _push_one(app: web.Application, worker: str, msg_for: Any) -> dict[str, Any]:
    conn = app[WORKERS].conns.get(worker)
    if conn is None or conn.ws.closed:
        return {"worker": worker, "ok": False, "message": "not connected: start its agent, then push again"}
    request_id = secrets.token_hex(8)
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    conn.outputs.waiting[request_id] = fut
    try:
        if not await conn.send(msg_for(request_id)):
            return {"worker": worker, "ok": False, "message": "the connection closed before the pack was sent"}
        try:
            answer = await asyncio.wait_for(fut, PUSH_TIMEOUT_S)
        except (TimeoutError, asyncio.CancelledError):
            return {"worker": worker, "ok": False, "message": f"no answer within {PUSH_TIMEOUT_S:g} s"}
    finally:
        conn.outputs.waiting.pop(request_id, None)
    if not isinstance(answer, protocol.PluginPushAnswer):
        return {"worker": worker, "ok": False, "message": "answered something else"}
    return {"worker": worker, "ok": answer.ok, "message": answer.message}


async def push_plugin(request: web.Request) -> web.Response:
    """Send an installed pack to one worker or all of them. An SSH worker gets it over its own ssh (any size; the
    remote cdui installs it), any other connected worker over its connection (one message); either side installs
    it only if it accepts pushed packs (CODEFYUI_AGENT_ACCEPT_PLUGINS=1 there), checks that its files hash to this
    copy's, records this lockfile's sha256 and reports its new catalog."""
    pid = request.match_info["id"]
    body = await read_object(request, DEFAULT_LIMIT)
    to = body.get("to")
    if not isinstance(to, str) or not to:
        raise CduiError("bad_request", f"'to' must be a worker's name or \"all\", got {to!r}",
                        hint='e.g. {"to": "w1"}', status=400)
    store = request.app[RUNS].config.plugin_store
    entry = packs.read_lock(store).get(pid)
    if entry is None:
        raise NotFound("plugin pack", pid, hint="install it here first: `cdui plugin install`")
    folder = packs.pack_folder(store, {**entry, "id": pid})
    data, tree = await asyncio.to_thread(_pack_archive, folder)
    pin, version = str(entry.get("sha256")), str(entry.get("version", ""))
    if entry.get("source_kind") == "folder" and tree != pin:
        # Installed from a folder, the lockfile's sha256 is that of its files: the copy here was changed since.
        raise CduiError("pack_changed", f"the installed files of pack {pid!r} hash to {tree[:12]}, not the "
                        f"lockfile's {pin[:12]}: they were changed after the install",
                        hint="install it again (`cdui plugin install --force ...`), then push", status=409)
    manager = request.app[WORKERS]
    sshw = request.app.get(ssh_workers.SSH_WORKERS)
    by_ssh = {r["name"] for r in await sshw.rows()} if sshw is not None else set()
    encoded = base64.b64encode(data).decode()
    too_large = len(encoded) > protocol.MAX_PUSH_DATA
    if to == "all":
        names = sorted({n for n, c in manager.conns.items() if not c.ws.closed} | by_ssh)
    else:
        names = [to]
        if to not in by_ssh and not await manager.store.workers.exists(to):
            raise NotFound("worker", to, hint="list them with `cdui workers list`")
        if to not in by_ssh and too_large:
            raise CduiError("pack_too_large", f"pack {pid!r} is {len(data)} bytes packed, too large for one "
                            "message", hint="install it on each worker with `cdui plugin install`", status=413)

    def make(request_id: str) -> protocol.PluginPush:
        return protocol.PluginPush(request_id, pid, version, pin, tree, encoded)

    async def one(name: str) -> dict[str, Any]:
        if sshw is not None and name in by_ssh:
            done = await sshw.push_pack(name, pid, version, pin, tree, data)
            if done is not None:
                return {"worker": name, "ok": done[0], "message": done[1], "via": "ssh"}
        if too_large:
            return {"worker": name, "ok": False, "message": f"not sent: {len(data)} bytes packed is too large for "
                    "one message; install it there with `cdui plugin install`"}
        return await _push_one(request.app, name, make)
    results = await asyncio.gather(*(one(n) for n in names))
    return web.json_response({"pack": pid, "sha256": pin, "results": list(results)})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/plugins", list_plugins)
    r.add_post("/api/plugins/reload", reload_plugins)
    r.add_post("/api/plugins/{id}/push", push_plugin)
    r.add_get("/api/plugins/{id}", get_plugin)

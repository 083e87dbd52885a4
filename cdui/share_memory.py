"""The route that turns "Share by memory" on or off for a worker, or for one of its devices.

``POST /api/workers/{name}/share-by-memory {"enabled": true, "device": "cuda:0"}``
(``device`` left out: every device of the worker). The setting is stored in the
worker's row (``workers.share_by_memory``: a JSON list of devices, ``"*"`` for
all; NULL when off), survives restarts and reconnects, and takes effect at the
next dispatch pass; runs already running keep their devices. What sharing by
memory means for admission is in :mod:`cdui.devicesets`.
"""
from __future__ import annotations

import json

from aiohttp import web

from cdui import devicesets
from cdui.appkeys import RUNS, STORE
from cdui.errors import CduiError, NotFound
from cdui.httpjson import DEFAULT_LIMIT, read_object
from cdui.protocol import MAX_NAME


def updated(setting: frozenset[str] | None, enabled: bool, device: str | None) -> frozenset[str] | None:
    """The worker's setting after turning ``device`` (None: every device) on or off."""
    if device is None:
        return frozenset({devicesets.ALL}) if enabled else None
    now = set(setting or ())
    if enabled:
        now.add(device)
    elif devicesets.ALL in now:
        raise CduiError("bad_request", f"every device of this worker shares by memory; {device!r} alone cannot "
                        "be turned off", hint='turn it off for the worker ({"enabled": false} without "device"), '
                                              "then on for the devices that should share")
    else:
        now.discard(device)
    return frozenset(now) or None


async def set_share(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    store, runs = request.app[STORE], request.app[RUNS]
    body = await read_object(request, DEFAULT_LIMIT)
    enabled = body.get("enabled")
    if not isinstance(enabled, bool):
        raise CduiError("bad_request", f"enabled must be true or false, got {enabled!r}",
                        hint='send {"enabled": true} or {"enabled": false}, optionally with "device": "cuda:0"')
    device = body.get("device")
    if device is not None and (not isinstance(device, str) or not device or len(device) > MAX_NAME
                               or device == devicesets.ALL):
        raise CduiError("bad_request", f"device {str(device)[:40]!r} is not a device name",
                        hint="name one device the worker offers, e.g. cuda:0 or cpu; leave it out for all")
    row = await store.read(lambda c: c.execute("SELECT name, share_by_memory FROM workers WHERE name=?",
                                               (name,)).fetchone())
    if row is None:
        raise NotFound("worker", name, hint="list workers with `cdui workers list`")
    setting = updated(devicesets.parse_shared(row["share_by_memory"]), enabled, device)
    text = json.dumps(sorted(setting)) if setting is not None else None
    await store.write(lambda c: c.execute("UPDATE workers SET share_by_memory=? WHERE name=?", (text, name)))
    if setting is None:
        runs.devicebook.shared.pop(name, None)
    else:
        runs.devicebook.shared[name] = setting
    runs.wake()
    return web.json_response({"name": name, "share_by_memory": sorted(setting) if setting is not None else []})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/workers/{name}/share-by-memory", set_share)

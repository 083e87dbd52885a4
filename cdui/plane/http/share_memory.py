"""The routes of the Workers panel's per-worker switches: "Share by memory" (below) and "Follow updates"
(:func:`set_follow_updates`).

The route that turns "Share by memory" on or off for a worker, or for one of its devices.

``POST /api/workers/{name}/share-by-memory {"enabled": true, "device": "cuda:0"}``
(``device`` left out: every device of the worker). The setting is stored in the
worker's row (``workers.share_by_memory``: a JSON list of devices, ``"*"`` for
all; NULL when off), survives restarts and reconnects, and takes effect at the
next dispatch pass; runs already running keep their devices. What sharing by
memory means for admission is in :mod:`cdui.wire.devicesets`.

Only a device the worker offers can be named (so the stored list stays as short
as the worker's devices). The instances of a one-shot credential (``NAME.ID``)
share what their credential shares: set through an instance, the setting is
stored on the credential and applies to every instance.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from cdui.core.errors import CduiError, NotFound
from cdui.plane.appkeys import STORE
from cdui.plane.http.httpjson import DEFAULT_LIMIT, read_object
from cdui.plane.runs import RUNS
from cdui.wire import devicesets
from cdui.wire.protocol import MAX_NAME, MAX_SMALL_LIST

# The most devices one setting names: as many as one agent may offer.
MAX_SHARED = MAX_SMALL_LIST


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
    row = await store.workers.get(name)
    if row is None and await runs.oneshot.names_instance(runs, name):
        name = name.rpartition(".")[0]  # the credential's setting, for every instance
        row = await store.workers.get(name)
    if row is None:
        raise NotFound("worker", name, hint="list workers with `cdui workers list`")
    current = devicesets.parse_shared(row["share_by_memory"])
    if device is not None and not (not enabled and device in (current or ())):  # what is on can be turned off
        offered = offered_devices(row["devices"], runs.executors.values(), name)
        if device not in offered:
            raise CduiError("bad_request", f"worker {name} offers no device {device!r} (it offers "
                                           f"{', '.join(sorted(offered)) or 'none yet'})",
                            hint="name one of its devices, or leave \"device\" out for all of them")
    setting = updated(current, enabled, device)
    if setting is not None and len(setting) > MAX_SHARED:
        raise CduiError("bad_request", f"worker {name} would share {len(setting)} devices by memory, over the limit "
                                       f"of {MAX_SHARED}", hint="turn it on for all its devices (leave \"device\" "
                                                                "out) instead of one by one")
    await store.workers.set_share_by_memory(name, sorted(setting) if setting is not None else None)
    if setting is None:
        runs.devicebook.shared.pop(name, None)
    else:
        runs.devicebook.shared[name] = setting
    runs.wake()
    return web.json_response({"name": name, "share_by_memory": sorted(setting) if setting is not None else []})


def offered_devices(stored: str | None, executors: Iterable[Any], credential: str) -> set[str]:
    """The devices worker ``credential`` offers: those its row records (its last agent's) and
    those of its connected agents, instances included."""
    try:
        devices = json.loads(stored or "[]")
    except ValueError:
        devices = []
    out = {d for d in devices if isinstance(d, str)} if isinstance(devices, list) else set()
    for ex in executors:
        if getattr(ex, "credential", None) == credential:
            out.update(ex.devices())
    return out


async def set_follow_updates(request: web.Request) -> web.Response:
    """``POST /api/workers/{name}/follow-updates {"enabled": true}``: the owner lets the worker's agent follow
    `cdui update` (docs/updating.md "Workers"). Its next version refusal says so, and an agent left at
    CODEFYUI_AGENT_AUTO_UPDATE=panel (the default) installs the update; one set to 0 never does."""
    name = request.match_info["name"]
    body = await read_object(request, DEFAULT_LIMIT)
    enabled = body.get("enabled")
    if not isinstance(enabled, bool):
        raise CduiError("bad_request", f"enabled must be true or false, got {str(enabled)[:40]!r}",
                        hint='send {"enabled": true} or {"enabled": false}')
    if not await request.app[STORE].workers.set_auto_update(name, enabled):
        raise NotFound("worker", name, hint="list workers with `cdui workers list`")
    return web.json_response({"name": name, "follow_updates": enabled})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/workers/{name}/share-by-memory", set_share)
    app.router.add_post("/api/workers/{name}/follow-updates", set_follow_updates)

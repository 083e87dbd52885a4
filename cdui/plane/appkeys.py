r"""The control plane's shared ``web.AppKey``\ s, in one leaf module.

The keys of values every layer of the control plane reads (the settings, the clock, the store,
the session token, the worker credential check, the tunnel flag, the graph index) are here;
the key of each service is defined beside its class, so that a module that reads one imports
the service's own module, and no module here imports a module that imports it back:
``RUNS`` in :mod:`cdui.plane.runs`, ``WORKERS`` in :mod:`cdui.plane.workers`, ``S3_BACKEND``
in :mod:`cdui.plane.files.s3_plane` and ``HOSTS`` in :mod:`cdui.plane.server`.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from cdui.core.clock import Clock
from cdui.core.config import Config
from cdui.plane.graph_index import GraphIndex
from cdui.plane.looplag import LoopLag
from cdui.plane.store import Store

# Checks a worker credential in ``Authorization: Bearer``; the worker's name, or None.
WorkerAuth = Callable[[web.Request], Awaitable["str | None"]]

CONFIG: web.AppKey[Config] = web.AppKey("config")
CLOCK: web.AppKey[Clock] = web.AppKey("clock")
STORE: web.AppKey[Store] = web.AppKey("store")
SESSION_TOKEN: web.AppKey[str] = web.AppKey("session_token")
# The worker layer's credential check, used by the auth middleware on worker-allowed routes.
WORKER_AUTH: web.AppKey[WorkerAuth] = web.AppKey("worker_auth")
# True on a listener reached through a tunnel: a loopback peer there is not this machine's user.
TUNNEL_LISTENER: web.AppKey[bool] = web.AppKey("tunnel_listener")
# The saved graphs' index (GET /api/graphs lists from it; its helper process is stopped at cleanup).
GRAPH_INDEX: web.AppKey[GraphIndex] = web.AppKey("graph_index")
# How late the event loop runs (cdui/plane/looplag.py): /api/health reports it.
LOOP_LAG: web.AppKey[LoopLag] = web.AppKey("loop_lag")

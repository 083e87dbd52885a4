"""Every ``web.AppKey`` of the control plane's app, in one leaf module.

Route modules (:mod:`cdui.plane.http.api_runs`, :mod:`cdui.plane.http.api_files`,
:mod:`cdui.plane.files.transfer`, the worker routes) read what they need from here instead
of from :mod:`cdui.plane.server`, so that ``server`` can import them without a cycle.
Nothing of cdui is imported at run time: the value types are named for the type
checker only, which is all ``AppKey`` needs them for.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from cdui.core.clock import Clock
    from cdui.core.config import Config
    from cdui.plane.files.s3_plane import S3Backend
    from cdui.plane.graph_index import GraphIndex
    from cdui.plane.runs import RunService
    from cdui.plane.server import HostCheck
    from cdui.plane.store import Store
    from cdui.plane.workers import WorkerManager

# Checks a worker credential in ``Authorization: Bearer``; the worker's name, or None.
WorkerAuth = Callable[[web.Request], Awaitable["str | None"]]

CONFIG: web.AppKey[Config] = web.AppKey("config")
CLOCK: web.AppKey[Clock] = web.AppKey("clock")
STORE: web.AppKey[Store] = web.AppKey("store")
RUNS: web.AppKey[RunService] = web.AppKey("runs")
WORKERS: web.AppKey[WorkerManager] = web.AppKey("workers")
SESSION_TOKEN: web.AppKey[str] = web.AppKey("session_token")
HOSTS: web.AppKey[HostCheck] = web.AppKey("hosts")
# The worker layer's credential check, used by the auth middleware on worker-allowed routes.
WORKER_AUTH: web.AppKey[WorkerAuth] = web.AppKey("worker_auth")
# True on a listener reached through a tunnel: a loopback peer there is not this machine's user.
TUNNEL_LISTENER: web.AppKey[bool] = web.AppKey("tunnel_listener")
# The S3 bucket backend; present only when it is on (CODEFYUI_S3_ENABLED=1, a bucket, boto3).
S3_BACKEND: web.AppKey[S3Backend] = web.AppKey("s3_backend")
# The saved graphs' index (GET /api/graphs lists from it; its helper process is stopped at cleanup).
GRAPH_INDEX: web.AppKey[GraphIndex] = web.AppKey("graph_index")

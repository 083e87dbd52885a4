"""The per-SSH-worker listener: the local end of a worker's reverse forward.

Each SSH worker gets its own Unix socket in a private (0700) temporary folder,
never the server's port, so no other local user can connect to it. It is a
separate small aiohttp app that shares the main app's state (store, run
service, worker manager) and serves only what an agent uses:

- ``GET /ws/worker`` (the worker manager's handler; it admits worker
  credentials only);
- ``POST /api/workers/enroll`` (enrollment tokens), rate limited per SSH
  worker: the source address these requests show is ``ssh:<name>``, so a
  tunnel's failures count against that worker alone;
- with a valid worker credential only: the three input download routes and
  ``POST /api/runs/{id}/artifacts/upload`` (``403`` without one);

and ``404`` for everything else, whatever ``Host`` the request carries. A
session token is refused on every route here. A credential of another worker
is refused too: each tunnel belongs to one worker.

On the server's own port nothing makes a request count as tunnelled: the
main app's ``TUNNEL_LISTENER`` is False and only this app sets it.
"""
from __future__ import annotations

import re
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from cdui.core.errors import CduiError
from cdui.plane.appkeys import SESSION_TOKEN, TUNNEL_LISTENER, WORKER_AUTH
from cdui.plane.http.httpjson import error_middleware

MAX_BODY = 1024 ** 2  # the enrollment body is small; the upload route streams its parts
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TUNNEL_WORKER: web.AppKey[str] = web.AppKey("tunnel_worker")
# (method, the main app's route pattern) of every route a tunnel serves.
# The update routes: an SSH worker's agent follows `cdui update` through its tunnel (docs/updating.md).
ROUTES = (("GET", "/ws/worker"), ("POST", "/api/workers/enroll"), ("GET", "/api/{kind}/download/{name:.+}"),
          ("POST", "/api/runs/{run_id}/artifacts/upload"), ("GET", "/api/worker-update/manifest"),
          ("GET", "/api/worker-update/files/{name}"))
NEEDS_WORKER = re.compile(r"^(GET /api/(files|images|models)/download/.+|POST /api/runs/[^/]+/artifacts/upload"
                          r"|GET /api/worker-update/(manifest|files/[^/]+))$")
SERVED = re.compile(r"^(GET /ws/worker|POST /api/workers/enroll|GET /api/(files|images|models)/download/.+"
                    r"|POST /api/runs/[^/]+/artifacts/upload|GET /api/worker-update/(manifest|files/[^/]+))$")


def _not_found(request: web.Request) -> CduiError:
    return CduiError("not_found", f"no such path on an SSH tunnel: {request.method} {request.path}", status=404)


@web.middleware
async def tunnel_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    app = request.app
    route = f"{request.method} {request.path}"
    if not SERVED.match(route):
        raise _not_found(request)
    session = app[SESSION_TOKEN]
    auth = request.headers.get("Authorization", "")
    bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    offered = [request.headers.get("X-CodefyUI-Token", ""), request.query.get("token", ""), bearer]
    if any(v and secrets.compare_digest(v, session) for v in offered):
        raise CduiError("forbidden", "the session token is not accepted on an SSH tunnel",
                        hint="agents authenticate with their worker credential", status=403)
    me = app[TUNNEL_WORKER]
    if request.path == "/api/workers/enroll":
        # The rate limiter keys failures by this address: one SSH worker's, not every tunnel's.
        return await handler(request.clone(remote=f"ssh:{me}"))
    worker = await app[WORKER_AUTH](request) if bearer else None
    if worker is not None and worker != me:
        raise CduiError("credential_mismatch", f"this tunnel belongs to SSH worker {me!r}; the credential is "
                                               f"worker {worker!r}'s", hint="on the remote host run `cdui agent "
                                               "forget URL` for this slot", status=403)
    if NEEDS_WORKER.match(route):
        if worker is None:
            raise CduiError("forbidden", f"{request.method} {request.path} needs a worker credential on an SSH "
                                         f"tunnel", status=403)
        request = request.clone(remote="127.0.0.1")
        request["auth"] = "worker"
        request["worker"] = worker
        return await handler(request)
    # The agent is behind the tunnel's far end; to this server it connects from its own loopback.
    return await handler(request.clone(remote="127.0.0.1"))


def build_tunnel_app(main: web.Application, worker: str) -> web.Application:
    """An app serving the agent routes of ``main`` for one SSH worker."""
    app = web.Application(middlewares=[error_middleware, tunnel_middleware], client_max_size=MAX_BODY)
    for key, value in main.items():
        app[key] = value
    app[TUNNEL_LISTENER] = True
    app[TUNNEL_WORKER] = worker
    # The main app's own handlers, found by their route, registered here with the same pattern.
    handlers = {(r.method, r.resource.canonical): r.handler for r in main.router.routes() if r.resource is not None}
    for method, pattern in ROUTES:
        handler = handlers.get((method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", pattern)))
        if handler is not None:
            app.router.add_route(method, pattern, handler)
    return app


class TunnelListener:
    """One worker's listener: ``path`` is the Unix socket ssh forwards to."""

    def __init__(self, main: web.Application, worker: str) -> None:
        self.main = main
        self.worker = worker
        self.folder: Path | None = None
        self.runner: web.AppRunner | None = None

    @property
    def path(self) -> str:
        assert self.folder is not None
        return str(self.folder / "s")

    async def start(self) -> str:
        if self.runner is not None:
            return self.path
        # mkdtemp makes the folder 0700: only this OS user can reach the socket in it.
        self.folder = Path(tempfile.mkdtemp(prefix="cdui-ssh-"))
        self.runner = web.AppRunner(build_tunnel_app(self.main, self.worker), access_log=None, shutdown_timeout=5)
        await self.runner.setup()
        await web.UnixSite(self.runner, self.path).start()
        return self.path

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

"""The control plane's HTTP server (aiohttp).

Handlers translate HTTP into calls on :class:`~cdui.plane.runs.RunService` and
friends; they never write to the database themselves. Middlewares, in order:

1. errors: every error leaves as ``{"error": {"code", "message", "hint"?}}``;
2. Host allowlist: ``localhost``, this machine's interface addresses with the
   server's port, and ``CODEFYUI_EXTRA_ALLOWED_HOSTS``; anything else is 421;
3. auth: the session token (``X-CodefyUI-Token`` header) on every route
   except the public ones below. A ``?token=`` query parameter is accepted only
   where a browser cannot send a header (the run event WebSocket and download
   links): URLs end up in history, proxy logs and ``Referer`` headers, so
   everywhere else a query token counts as absent. The web page's session
   cookie counts on those same routes only, from a page of this origin
   (:mod:`cdui.plane.http.web_session`): a cookie would be sent by any page that makes
   the browser call us, so it never stands in for the header elsewhere.

One response hook adds the headers every answer needs: anti-framing and
``nosniff`` on the page, ``Cache-Control: no-store`` on every ``/api/`` answer
(the bootstrap token and run data must not stay in a browser or proxy cache).

``/api/auth/bootstrap`` hands the token only to a loopback connection whose
client socket belongs to the server's own OS user (:mod:`cdui.core.peercred`):
on a shared machine every local user can reach loopback. A request that
carries any proxy's forwarding header is refused too (a proxy on this host may
run as the server's own user), and so is every request with
``CODEFYUI_BOOTSTRAP=0``. Refusals name no user, uid or path: those go to
the log.
"""
from __future__ import annotations

import asyncio
import gc
import ipaddress
import itertools
import json
import logging
import os
import pwd
import re
import resource
import secrets
import signal
import socket
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from cdui import __version__
from cdui.core import envs, project
from cdui.core.atomic import write_private
from cdui.core.clock import Clock, SystemClock
from cdui.core.collector import collect_young_less_often
from cdui.core.config import Config
from cdui.core.errors import CduiError
from cdui.core.layout import WEB_DIR
from cdui.core.netaddr import is_loopback
from cdui.core.peercred import peer_uid
from cdui.core.private import private_dir, restrict_umask
from cdui.core.session_token import fixed_session_token
from cdui.nodes.registry import build_registry
from cdui.plane import metrics, workers
from cdui.plane.appkeys import CLOCK, CONFIG, LOOP_LAG, SESSION_TOKEN, STORE, TUNNEL_LISTENER, WORKER_AUTH
from cdui.plane.canvas import CANVAS, CanvasManager
from cdui.plane.files import s3_plane, transfer
from cdui.plane.http import (
    api_apps,
    api_canvas,
    api_files,
    api_graphs,
    api_outputs,
    api_plugins,
    api_runs,
    api_studies,
    api_sweeps,
    api_worker_log,
    proxies,
    share_memory,
    web_session,
    worker_routes,
    worker_update,
)
from cdui.plane.http.httpjson import Handler, error_middleware
from cdui.plane.looplag import LoopLag
from cdui.plane.runs import RUNS, RunService
from cdui.plane.ssh import ssh_workers
from cdui.plane.store import Store
from cdui.plane.studies import STUDIES, StudyService
from cdui.plane.sweeps import SWEEPS, SweepService
from cdui.plane.workers import WORKERS

log = logging.getLogger(__name__)
# The cyclic garbage collector's full pass (see quiet_full_collections): looked at every
# FULL_COLLECTION_CHECK_S, due once the interpreter's allocated blocks grew by FULL_COLLECTION_GROWTH
# since just after the last pass, and FULL_COLLECTION_MAX_S after it whatever they did.
FULL_COLLECTION_CHECK_S = 10.0
FULL_COLLECTION_GROWTH = 0.10
FULL_COLLECTION_MAX_S = 600.0
# A due full pass waits for a quiet event loop (its last QUIET_SAMPLES lag samples, half a second of them,
# each under QUIET_LAG_MS), looking every QUIET_CHECK_S, for FULL_COLLECTION_WAIT_S at most.
FULL_COLLECTION_WAIT_S = 60.0
QUIET_CHECK_S = 0.5
QUIET_SAMPLES = 10
QUIET_LAG_MS = 2.0
SWITCH_INTERVAL_S = 0.001  # how long a thread holding the GIL keeps the event loop waiting, at most (see serve)

# Routes that need no session token. Worker routes check their own credential.
# /metrics checks its own readers (cdui/plane/metrics.py): a Prometheus server's metrics token, or loopback.
PUBLIC_PATHS = {"/api/health", "/api/health/live", "/metrics", "/api/auth/bootstrap", "/", "/index.html",
                "/favicon.ico", "/api/workers/enroll", "/ws/worker"}
PUBLIC_PREFIXES = ("/web/",)
# What a worker credential may do over plain HTTP: its own runs' inputs and results, nothing of the user's API.
WORKER_ROUTES = re.compile(r"^(GET /api/(files|images|models)/download/.+|POST /api/runs/[^/]+/artifacts/upload"
                           r"|GET /api/worker-update/(manifest|files/[^/]+))$")
# Where a browser cannot send a header: the event WebSocket and download links.
QUERY_TOKEN_ROUTES = re.compile(r"^(/ws/runs/[^/]+|/api/(files|images|models)/download/.+"
                                r"|/api/runs/[^/]+/artifacts/[^/]+/download)$")
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class HostCheck:
    """Which HTTP Host values this server answers to: a page on another host name cannot reach the API
    (DNS rebinding)."""

    def __init__(self, port: int | None, extra: list[str]) -> None:
        # None: the port is the one the request arrived on (its local socket's),
        # so the app needs no port when it is built.
        self.port = port
        self.extra = {h.lower() for h in extra}
        # Host values come from any client: an LRU of the last CACHE_SIZE answers, not one per value ever seen.
        self._cache: OrderedDict[str, bool] = OrderedDict()

    CACHE_SIZE = 256

    def _is_local_ip(self, host: str) -> bool:
        if host in self._cache:
            self._cache.move_to_end(host)
            return self._cache[host]
        ok = False
        try:
            ip = ipaddress.ip_address(host)
            fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.bind((host, 0))  # succeeds only for this machine's own addresses
            ok = True
        except (ValueError, OSError):
            ok = False
        self._cache[host] = ok
        while len(self._cache) > self.CACHE_SIZE:
            self._cache.popitem(last=False)
        return ok

    def allowed(self, host_header: str | None, local_port: int | None = None) -> bool:
        if not host_header:
            return False
        h = host_header.strip().lower()
        if h in self.extra:
            return True
        if h.startswith("["):
            name, closed, rest = h[1:].partition("]")
            if not closed or (rest and not rest.startswith(":")):
                return False  # "[::1" and "[::1]evil" are no host
            port = rest[1:]
        else:
            name, _, port = h.partition(":")
        if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
            return False  # "127.0.0.1:1@evil.example" is not a host and a port
        if name in ("localhost", "127.0.0.1", "::1") or name.endswith(".localhost"):
            return True
        own = self.port if self.port is not None else local_port
        if port and port != str(own):
            return False
        return self._is_local_ip(name)


HOSTS: web.AppKey[HostCheck] = web.AppKey("hosts")
# The open project's name and its git state (cdui/core/project.py), when one is open.
PROJECT: web.AppKey[tuple[str, project.GitCache]] = web.AppKey("project")


@web.middleware
async def host_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    check = request.app[HOSTS]
    if not check.allowed(request.host, _local_port(request)):
        raise CduiError("host_not_allowed", f"Host {request.host!r} is not allowed on this server",
                        hint="add it to CODEFYUI_EXTRA_ALLOWED_HOSTS (host:port) and restart the server",
                        status=421)
    return await handler(request)


def _local_port(request: web.Request) -> int | None:
    """The port of the socket this request arrived on (None off TCP)."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return sock[1] if isinstance(sock, tuple) and len(sock) >= 2 else None


def request_token(request: web.Request) -> str | None:
    token = request.headers.get("X-CodefyUI-Token")
    if token:
        return token
    if QUERY_TOKEN_ROUTES.match(request.path):
        return request.query.get("token") or web_session.cookie_token(request)
    return None


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    # An app's API key opens its invoke and its description, nothing else: not the public worker routes
    # (/ws/worker, enrollment) either, which it is refused on before their own handshake.
    bearer = request.headers.get("Authorization", "")
    if bearer[:7].lower() == "bearer " and bearer[7:].strip().startswith(api_apps.KEY_PREFIX) \
            and path.startswith(("/api/", "/ws/")):
        if not api_apps.KEY_ROUTES.match(f"{request.method} {path}"):
            raise CduiError("forbidden", f"an API key cannot use {request.method} {path}",
                            hint="API keys may only invoke apps (POST /api/apps/{slug}/invoke) and read their "
                                 "description (GET /api/apps/{slug}/openapi.json)", status=403)
        key_id = await request.app[api_apps.APPS].key_auth(request)
        if key_id is None:
            raise CduiError("unauthorized", "unknown or revoked API key",
                            hint="create a key with `cdui keys create NAME` (POST /api/keys) and send it as "
                                 "Authorization: Bearer cdui_...", status=401)
        request["auth"] = "key"
        request[api_apps.API_KEY_ID] = key_id
        return await handler(request)
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or request.method == "OPTIONS":
        return await handler(request)
    token = request_token(request)
    if token and secrets.compare_digest(token, request.app[SESSION_TOKEN]):
        request["auth"] = "session"
        return await handler(request)
    # Worker credentials are accepted where the worker layer says so.
    worker_auth = request.app.get(WORKER_AUTH)
    if worker_auth is not None and request.headers.get("Authorization", "").lower().startswith("bearer "):
        worker = await worker_auth(request)
        if worker is not None:
            if not WORKER_ROUTES.match(f"{request.method} {path}"):
                raise CduiError("forbidden", f"a worker credential cannot use {request.method} {path}",
                                hint="workers may only download their runs' inputs and upload their outputs (and fetch "
                                     "the update bundle)",
                                status=403)
            request["auth"] = "worker"
            request["worker"] = worker
            return await handler(request)
    if not token and "token" in request.query:
        raise CduiError("unauthorized", f"{path} does not accept the session token in the URL (?token=)",
                        hint="send it in the X-CodefyUI-Token header instead; only /ws/runs/{id} and download "
                             "links take ?token=, because URLs end up in logs and browser history", status=401)
    raise CduiError("unauthorized", "missing or wrong session token" if token else "this route needs the session token",
                    hint="send it in the X-CodefyUI-Token header; `cdui api` does this for you, and the web page "
                         "gets it from /api/auth/bootstrap on this machine", status=401)


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: runs for every answer, errors and static files included."""
    path = request.path
    if path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
    elif path in ("/", "/index.html") or path.startswith("/web/"):
        for name, value in PAGE_HEADERS.items():
            response.headers[name] = value


# -- basic routes ------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    """``ok``, or ``degraded`` with the problems (e.g. a full disk) and what to do about them. With
    ``?detail=1`` also ``loop_lag_ms`` and ``loop_lag_max_ms``, how late the event loop ran lately (the p99
    and the longest of the last 10 s, see cdui/plane/looplag.py); without it the answer is exactly the
    documented ``{status, version}``. Degraded answers 503 with the same body: a load balancer or a
    readiness probe reads the status code only, and must send no new work to a server that cannot store it."""
    problems = request.app[STORE].problems()
    body: dict[str, object] = {"status": "degraded" if problems else "ok", "version": __version__}
    if problems:
        body["problems"] = problems
    if request.query.get("detail") == "1":
        lag = request.app[LOOP_LAG]
        body["loop_lag_ms"], body["loop_lag_max_ms"] = lag.p99(), lag.max_ms()
    opened = request.app.get(PROJECT)
    if opened is not None:
        # Which project is open, for a script that checks it talks to the right one before it records
        # a commit. Its name, not its path: this answer is for anyone, and a path names a user.
        name, git = opened
        commit, dirty = await asyncio.to_thread(git.get)
        body["project"] = {"name": name, "git_commit": commit, "git_dirty": dirty}
    return web.json_response(body, status=503 if problems else 200)


async def live(request: web.Request) -> web.Response:
    """200 while the process serves, degraded or not: a liveness probe that restarted the server for a full
    disk would only lose the runs in flight (the disk stays full)."""
    return web.json_response({"status": "live", "version": __version__})


async def bootstrap(request: web.Request) -> web.Response:
    if not is_loopback(request) or request.app.get(TUNNEL_LISTENER, False):
        raise CduiError("not_found", f"no such path: GET {request.path}", status=404)
    # What is refused says nothing of this machine (user names, uids, paths): the asker may be
    # anyone on the network behind a proxy. The details go to the owner's log instead.
    token_file = request.app[CONFIG].user_data / "session-token"
    forwarded = proxies.forwarding_headers(request.headers)
    if forwarded or not request.app[CONFIG]["CODEFYUI_BOOTSTRAP"]:
        # A proxy on this machine connects from loopback as whichever user runs it, often the
        # server's own (one container, everything as root): its clients must not get the token.
        why = (f"it came through a proxy ({', '.join(forwarded)})" if forwarded
               else "CODEFYUI_BOOTSTRAP is 0")
        log.warning("/api/auth/bootstrap refused the session token to %s: %s; the owner reads it from %s",
                    proxies.client_of(request).address, why, token_file)
        raise CduiError("not_owner", "the session token is not handed out on this connection",
                        hint="paste the session token of the user that started the server (the server log "
                             "says where it is)", status=403)
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport else None
    sock = transport.get_extra_info("sockname") if transport else None
    uid = await asyncio.to_thread(peer_uid, peer[:2], sock[:2]) if peer and sock else None
    me = os.getuid()
    if uid != me:
        if uid is None:
            log.warning("/api/auth/bootstrap refused the session token to %s: cannot tell which OS user opened "
                        "the connection%s; the owner reads it from %s", request.remote,
                        "" if sys.platform.startswith("linux") else
                        f" (peer lookup works on Linux only, this is {sys.platform})", token_file)
        else:
            log.warning("/api/auth/bootstrap refused the session token to %s: the connection belongs to OS user "
                        "%s (uid %d), the server runs as %s (uid %d); the owner reads it from %s",
                        request.remote, _user_name(uid), uid, _user_name(me), me, token_file)
        raise CduiError("not_owner", "this connection is not the server's own OS user's, so the session token "
                        "is not handed out",
                        hint="run `cdui api` or the browser as the user that started the server, or paste its "
                             "session token (the server log says where it is)", status=403)
    response = web.json_response({"token": request.app[SESSION_TOKEN]})
    web_session.set_cookie(request, response)
    return response


def _user_name(uid: int) -> str:
    try:
        return repr(pwd.getpwuid(uid).pw_name)
    except (ImportError, KeyError):
        return f"#{uid}"


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(WEB_DIR / "index.html")


def build_app(config: Config, clock: Clock) -> web.Application:
    """Wire the app; no I/O happens here. What needs opening (folders, the
    session-token file, the store, the run service, the worker manager) is
    opened at startup by a ``cleanup_ctx``, which also closes it, in reverse
    order, at cleanup."""
    app = web.Application(middlewares=[error_middleware, host_middleware, auth_middleware],
                          # No route reads more than a graph body at once; the upload routes stream their parts.
                          client_max_size=config["CODEFYUI_MAX_GRAPH_BYTES"] + 64 * 1024)
    app[CONFIG] = config
    app[CLOCK] = clock
    app[HOSTS] = HostCheck(None, config["CODEFYUI_EXTRA_ALLOWED_HOSTS"])
    # A new token at every start, unless CODEFYUI_SESSION_TOKEN_FILE fixes it (the one read here: a bad file
    # stops the start before anything listens).
    token_file = config["CODEFYUI_SESSION_TOKEN_FILE"]
    app[SESSION_TOKEN] = fixed_session_token(Path(token_file)) if token_file else secrets.token_urlsafe(32)
    app[TUNNEL_LISTENER] = False
    if config["CODEFYUI_PROJECT_DIR"]:
        opened = Path(config["CODEFYUI_PROJECT_DIR"])
        app[PROJECT] = (project.name_of(opened) if (opened / project.MANIFEST).is_file() else opened.name,
                        project.GitCache(opened))
    # Real time, whatever the app's clock: it measures the real event loop (a test's fake clock that
    # jumps days ahead would otherwise make it wake millions of times).
    app[LOOP_LAG] = LoopLag(SystemClock())
    store = Store(config.db_path)
    app[STORE] = store
    registry = build_registry(config.custom_nodes_dir, config.plugins_dir, config.plugin_store)
    if registry.packs:  # the packs this control plane validates graphs against (a failed file logs a warning)
        log.info("plugin packs: %s", ", ".join(sorted(registry.packs)))
    runs = RunService(config, store, registry, clock)
    app[RUNS] = runs
    manager = workers.WorkerManager(app)
    app[WORKERS] = manager
    app[WORKER_AUTH] = manager.worker_auth
    runs.add_listener(manager)
    app[SWEEPS] = SweepService(runs)
    runs.add_listener(app[SWEEPS])  # after the manager: a sweep's next runs are released once a slot is freed
    app[STUDIES] = StudyService(app[SWEEPS])
    runs.add_listener(app[STUDIES])  # after the sweeps': a study resumes once its trials' variants are up to date
    app[CANVAS] = CanvasManager(runs)

    # Startup in this order, cleanup in reverse: the run service stops its runs
    # (the workers' too, through the manager's listener) before the manager lets
    # go of its connections, and both before the store closes.
    app.cleanup_ctx.append(_loop_lag_ctx)
    app.cleanup_ctx.append(_files_ctx)
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.append(_workers_ctx)
    app.cleanup_ctx.append(_runs_ctx)
    app.cleanup_ctx.append(_canvas_ctx)  # its processes end before the run service's stop
    app.on_shutdown.append(_close_sockets)
    s3_plane.setup(app)  # after the run service's context: the bucket backend's renewal needs it started

    app.on_response_prepare.append(security_headers)
    app.router.add_get("/api/health", health)
    app.router.add_get("/api/health/live", live)
    app.router.add_get("/api/auth/bootstrap", bootstrap)
    app.router.add_get("/", index)
    if WEB_DIR.is_dir():
        app.router.add_static("/web/", WEB_DIR)
    worker_routes.setup(app)
    share_memory.setup(app)
    transfer.setup(app)
    api_runs.setup(app)
    api_sweeps.setup(app)
    api_studies.setup(app)
    api_files.setup(app)
    api_graphs.setup(app)
    ssh_workers.setup(app)  # after the run service's cleanup_ctx: SSH workers connect once runs are served
    web_session.setup(app)
    api_outputs.setup(app)
    api_worker_log.setup(app)
    worker_update.setup(app)
    api_canvas.setup(app)
    metrics.setup(app)
    api_plugins.setup(app)
    api_apps.setup(app)  # after the run service's context: its warm processes end before the run service stops
    return app


async def _loop_lag_ctx(app: web.Application) -> AsyncIterator[None]:
    app[LOOP_LAG].start()
    yield
    await app[LOOP_LAG].stop()


async def _files_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    private_dir(config.user_data)
    write_private(config.user_data / "session-token", app[SESSION_TOKEN])
    config.layout.ensure()
    yield


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    store = app[STORE]
    store.open()
    yield
    store.close()


async def _workers_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[WORKERS].close()


async def _runs_ctx(app: web.Application) -> AsyncIterator[None]:
    runs = app[RUNS]
    await runs.start()
    yield
    # A graceful stop by signal has already stopped the runs while the sockets
    # were still read (see _run_until_signal); close() runs its body once.
    await runs.close()


async def _canvas_ctx(app: web.Application) -> AsyncIterator[None]:
    app[CANVAS].start()
    yield
    await app[CANVAS].close()


async def _close_sockets(app: web.Application) -> None:
    """aiohttp's shutdown step for long-lived connections: it waits for every
    handler before the cleanups run, and a worker's WebSocket never ends by
    itself. The runs are stopped first (once; by a signal they already were,
    while the sockets were still read), which also ends every run's live
    stream; then the worker sockets close."""
    await app[RUNS].close()
    await app[WORKERS].close()


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one: every agent's WebSocket holds a descriptor,
    and the usual soft limit (1,024) would refuse connections long before the CPU is busy."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("the limit on open files stays %d (hard limit %d): %s", soft, hard, exc)


def serve(config: Config, host: str, port: int) -> None:
    """Run the server in the foreground until SIGINT/SIGTERM (graceful stop)."""
    restrict_umask()
    raise_open_files_limit()
    # The event loop shares the interpreter with the database's writer thread and the reader threads:
    # whenever one of them holds the GIL, the loop waits for the switch interval (5 ms by default) before
    # it may run again. Under a dispatch backlog that wait is in every request's answer time.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = build_app(config, SystemClock())

    async def on_startup(app: web.Application) -> None:
        collections.append(quiet_full_collections(app[LOOP_LAG]))

    def listening() -> None:
        # Only once the port is bound: a server that cannot listen (the port taken) must not have said it
        # does, nor left a server.json that sends `cdui api` and the tests to whoever holds the port.
        info = {"url": f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}",
                "host": host, "port": port, "pid": os.getpid(), "version": __version__}
        write_private(config.user_data / "server.json", json.dumps(info))
        log.info("cdui %s listening on http://%s:%d (user data %s)", __version__, host, port, config.user_data)

    collections: list[asyncio.Task[None]] = []

    async def on_cleanup(app: web.Application) -> None:
        for task in collections:
            task.cancel()
        await asyncio.gather(*collections, return_exceptions=True)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    asyncio.run(_run_until_signal(app, host, port, config["CODEFYUI_SHUTDOWN_GRACE_S"] + 5, listening))


def quiet_full_collections(lag: LoopLag | None = None) -> asyncio.Task[None]:
    """Keep the cyclic garbage collector's full passes off the busy event loop as far as they can be.

    A full pass looks at every tracked object and holds the event loop meanwhile: under a dispatch
    backlog (thousands of queued runs, hundreds of connections) that was 40-90 ms every few seconds,
    the largest delay any request saw. What exists once the server has started (modules, the node
    registry, the app) lives as long as the server, so it is frozen out of every later pass; the
    automatic full passes are replaced by one made when memory has grown, when the loop is
    quiet (see :func:`full_collections`; the young generations are still collected, the youngest
    less often than Python's default, see :mod:`cdui.core.collector`, so most cyclic garbage goes
    within a few batches of events)."""
    gc.collect()
    gc.freeze()
    collect_young_less_often()  # a flood's batches of live events set off far fewer young collections
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 2 ** 31 - 1)
    return asyncio.get_running_loop().create_task(full_collections(lag, SystemClock()), name="full-collections")


async def full_collections(lag: LoopLag | None, clock: Clock, collect: Callable[[], object] = gc.collect,
                           size: Callable[[], int] = sys.getallocatedblocks) -> None:
    """A full pass (``collect``) when one is due, once the event loop is quiet (``lag``'s latest samples, see
    :func:`loop_quiet`) or ``FULL_COLLECTION_WAIT_S`` later at the latest: a pass holds the loop 50-100 ms
    under a backlog and 300 ms with 5,000 agents connected, and it need not be the moment a request
    arrives. Python's collector cannot be run in slices; the bound keeps memory from growing behind a loop
    that is never quiet.

    Due, looked at every ``FULL_COLLECTION_CHECK_S``: once ``size()`` (the interpreter's allocated blocks)
    grew by ``FULL_COLLECTION_GROWTH`` since just after the last pass, which is where cyclic garbage that
    outlived the young collections shows, or ``FULL_COLLECTION_MAX_S`` after the last pass whatever it did.
    This is Python's own rule for its automatic full passes (made once what reached the oldest generation
    grew by a quarter), on a cheaper measure. A pass a minute whatever happened cost a server with 5,000
    agents heartbeating 0.5 % of a core and a 300 ms stall every minute for nothing."""
    after, last = size(), clock.monotonic()
    while True:
        await clock.sleep(FULL_COLLECTION_CHECK_S)
        if size() < after * (1 + FULL_COLLECTION_GROWTH) and clock.monotonic() - last < FULL_COLLECTION_MAX_S:
            continue
        waited = 0.0
        while lag is not None and waited < FULL_COLLECTION_WAIT_S and not loop_quiet(lag):
            await clock.sleep(QUIET_CHECK_S)
            waited += QUIET_CHECK_S
        collect()
        after, last = size(), clock.monotonic()


def loop_quiet(lag: LoopLag) -> bool:
    """Whether the loop's latest QUIET_SAMPLES lag samples (half a second) were each under QUIET_LAG_MS."""
    latest = list(itertools.islice(reversed(lag.samples), QUIET_SAMPLES))
    return len(latest) == QUIET_SAMPLES and max(latest) < QUIET_LAG_MS


async def _run_until_signal(app: web.Application, host: str, port: int, shutdown_timeout: float,
                            listening: Callable[[], None] = lambda: None) -> None:
    """Serve until SIGINT/SIGTERM, then stop the runs *before* aiohttp's own shutdown.

    aiohttp's runner begins its shutdown by marking every connection closing,
    and from then on it discards whatever arrives on them, WebSocket frames
    included. A worker's final events (its run ``cancelled``) and heartbeats
    would be dropped unread, the run would wait out the whole grace and end
    ``interrupted``. So the runs are stopped first, while every socket is still
    read; only then does the runner close connections and run the cleanups."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def handover() -> None:
        # SIGUSR2, sent by `cdui update` before it starts the new version: runs on workers go on, and the next
        # start adopts them as after any restart, instead of being told to stop.
        app[WORKERS].handover = True
        stop.set()
    loop.add_signal_handler(envs.HANDOVER_SIGNAL, handover)
    try:
        await web.TCPSite(runner, host, port).start()
        listening()
        await stop.wait()
        log.info("stopping%s: asking active runs to stop", " for a restart, leaving worker runs to be adopted"
                 if app[WORKERS].handover else "")
        await app[RUNS].close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, envs.HANDOVER_SIGNAL):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
